import math

import numpy as np
import pytest

from edge_rag.bounds import BettingSequence
from edge_rag.config import Config
from edge_rag.gate import GATES, evidence_gate, relevance, sequential_gate

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


def test_distance_gate_is_the_seeds_ceiling():
    config = CONFIG.with_(gate="distance")
    result = evidence_gate([0.1, 0.2], config)  # d_min = sqrt(1.6) = 1.265 <= 1.5
    assert result.passed and result.lower_bound == pytest.approx(0.2)
    assert result.threshold == pytest.approx(-0.125)  # cosine at distance 1.5: refuses almost nothing
    assert not evidence_gate([-0.2, -0.3], config).passed  # d_min = sqrt(2.4) = 1.549
    assert evidence_gate(out_of_domain(5), config).passed  # why the statistical gates exist
    assert not evidence_gate(out_of_domain(5), config.with_(refuse_distance=1.2)).passed


@pytest.mark.parametrize("gate", BOUND_GATES)
def test_bound_gates_on_realistic_scores(gate):
    config = CONFIG.with_(gate=gate)
    result = evidence_gate(in_domain(40), config)
    assert result.passed and result.lower_bound >= 0.3 and result.n == 40 and result.method == gate
    assert result.threshold == 0.3 and "lower bound" in result.reason
    assert not evidence_gate(out_of_domain(40), config).passed


def test_few_passages_only_azuma_and_betting_certify():
    """At the HARD tier's k = 10, Hoeffding's and Bernstein's slack (0.39, >= 0.96) exceed the margin."""
    passed = {g: evidence_gate(in_domain(10), CONFIG.with_(gate=g)).passed for g in BOUND_GATES}
    assert passed == {"hoeffding": False, "azuma": True, "bernstein": False, "betting": True}


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
