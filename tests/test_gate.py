import math

import numpy as np
import pytest

from edge_rag.config import Config
from edge_rag.decision.bounds import BettingSequence
from edge_rag.decision.gate import GATES, evidence_gate, relevance, sequential_gate

CONFIG = Config(gate_threshold=0.3)  # delta 0.05, tau_rel 0.3 (stricter than the default), refuse_distance 1.5
BOUND_GATES = ("hoeffding", "azuma", "bernstein", "betting")


def in_domain(n):
    return np.linspace(0.7, 0.55, n)  # MiniLM cosines of on-topic passages, in rank order


def out_of_domain(n):
    return np.linspace(0.2, 0.05, n)


def test_relevance_clips_cosines():
    np.testing.assert_allclose(relevance([-0.3, 0.0, 0.42, 1.0]), [0.0, 0.0, 0.42, 1.0])


def test_unknown_gate_lists_valid_names():
    with pytest.raises(ValueError, match="hoeffding, azuma, bernstein, betting"):
        evidence_gate([0.5], CONFIG.with_(gate="chebyshev"))


def test_none_always_passes():
    for scores in ([], [-0.5], out_of_domain(5)):
        result = evidence_gate(scores, CONFIG.with_(gate="none"))
        assert result.passed and math.isnan(result.lower_bound) and result.method == "none"


@pytest.mark.parametrize("gate", [g for g in GATES if g != "none"])
def test_no_passages_fail_with_a_reason(gate):
    for check in (evidence_gate, sequential_gate):
        result = check([], CONFIG.with_(gate=gate))
        assert not result.passed and result.n == 0 and "no passages" in result.reason


def test_distance_gate_is_the_seeds_squared_l2_ceiling():
    config = CONFIG.with_(gate="distance")
    result = evidence_gate([0.3, 0.2], config)  # d_min = 2 - 2 * 0.3 = 1.4 <= 1.5
    assert result.passed and result.lower_bound == pytest.approx(0.3)
    assert result.threshold == pytest.approx(0.25)  # cosine at squared distance 1.5, as in the seed's FAISS L2
    assert not evidence_gate([0.2, 0.1], config).passed  # d_min = 1.6
    assert not evidence_gate(out_of_domain(5), config).passed
    assert evidence_gate(out_of_domain(5), config.with_(refuse_distance=1.7)).passed


@pytest.mark.parametrize("gate", BOUND_GATES)
def test_bound_gates_on_realistic_scores(gate):
    config = CONFIG.with_(gate=gate)
    result = evidence_gate(in_domain(200), config)  # Azuma with c = 1 needs ~100 scores to clear 0.3 here
    assert result.passed and result.lower_bound >= 0.3 and result.n == 200 and result.method == gate
    assert result.threshold == 0.3 and "lower bound" in result.reason
    assert not evidence_gate(out_of_domain(40), config).passed


def test_few_passages_only_betting_passes():
    """At the HARD tier's k = 10 the slack of Hoeffding (0.39), Azuma with c = 1 (0.77) and Bernstein (>= 0.96)
    exceeds the margin; the betting sequence adapts to the low variance."""
    passed = {g: evidence_gate(in_domain(10), CONFIG.with_(gate=g)).passed for g in BOUND_GATES}
    assert passed == {"hoeffding": False, "azuma": False, "bernstein": False, "betting": True}


def test_sequential_gate_certifies_relevant_stream_early():
    result = sequential_gate(np.linspace(0.9, 0.8, 30), CONFIG.with_(gate="betting"))
    assert result.passed and 2 <= result.n <= 6 and result.lower_bound >= 0.3
    assert result.reason.startswith("certified")


def test_sequential_gate_refutes_irrelevant_stream_early():
    result = sequential_gate(np.linspace(0.05, 0.0, 30), CONFIG.with_(gate="betting"))
    assert not result.passed and result.n < 30 and result.reason.startswith("refuted")


def test_sequential_gate_records_n_at_the_stop():
    scores = in_domain(30)
    result = sequential_gate(scores, CONFIG.with_(gate="betting"))
    sequence = BettingSequence(CONFIG.gate_delta)
    lowers = [sequence.update(x) for x in scores]
    first = next(i for i, lower in enumerate(lowers) if lower >= 0.3)
    assert result.n == max(first + 1, 2) and result.lower_bound == lowers[result.n - 1]


def test_sequential_gate_undecided_uses_all_scores():
    result = sequential_gate([0.35, 0.3, 0.28], CONFIG.with_(gate="betting"))
    assert not result.passed and result.n == 3 and result.reason.startswith("undecided")


def test_sequential_gate_falls_back_for_fixed_n_bounds():
    config = CONFIG.with_(gate="hoeffding")
    assert sequential_gate(in_domain(40), config) == evidence_gate(in_domain(40), config)
