"""Certified selective answering: Clopper-Pearson, Learn-then-Test, the calibration artifact."""
import json
import math
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from edge_rag.decision import certify
from edge_rag.decision.certify import (
    CALIBRATION_ASSET,
    MAX_FILE_BYTES,
    PGVECTOR_CALIBRATION_ASSET,
    Calibration,
    Combiner,
    RiskTable,
    binom_cdf,
    bounded_by,
    clopper_pearson_upper,
)
from edge_rag.errors import BundleError

DELTA = 0.05


@pytest.mark.parametrize("n", [1, 5, 40, 1000])
def test_clopper_pearson_zero_errors_closed_form(n):
    """0 errors of n: P(Bin(n, u) = 0) = (1 - u)^n = delta, so u = 1 - delta^(1/n)."""
    assert clopper_pearson_upper(0, n, DELTA) == pytest.approx(1 - DELTA ** (1 / n), abs=1e-12)


def test_clopper_pearson_edges():
    assert clopper_pearson_upper(0, 0, DELTA) == 1.0  # no data says nothing
    assert clopper_pearson_upper(7, 7, DELTA) == 1.0
    with pytest.raises(ValueError):
        clopper_pearson_upper(3, 2, DELTA)


@pytest.mark.parametrize("k,n,delta", [(1, 10, 0.05), (5, 50, 0.1), (30, 200, 0.05), (120, 1284, 0.01),
                                       (3, 20, 0.2)])
def test_clopper_pearson_matches_the_beta_quantile(k, n, delta):
    stats = pytest.importorskip("scipy.stats", reason="scipy is the reference (installed with the dev extra)")
    assert clopper_pearson_upper(k, n, delta) == pytest.approx(stats.beta.ppf(1 - delta, k + 1, n - k), abs=1e-9)


def test_bounded_by_says_what_the_bound_says():
    """The one-CDF test a certificate is chosen by agrees with computing the bound, on random counts and levels
    (and the edges: no data, every answer wrong)."""
    rng = np.random.default_rng(0)
    cases = [(0, 0, 0.5, 0.05), (0, 0, 1.0, 0.05), (4, 4, 0.9, 0.05), (4, 4, 1.0, 0.05)]
    for _ in range(200):  # the bisection it is checked against costs O(errors) per step: kept small for qemu
        n = int(rng.integers(1, 400))
        cases.append((int(rng.integers(0, n + 1)), n, float(rng.uniform(0.01, 0.99)), float(rng.choice([0.01, 0.05, 0.1]))))
    for errors, n, alpha, delta in cases:
        assert bounded_by(errors, n, alpha, delta) == (clopper_pearson_upper(errors, n, delta) <= alpha), (errors, n)


def test_binom_cdf_small_exact():
    assert binom_cdf(1, 3, 0.5) == pytest.approx(0.5)  # (1 + 3) / 8
    assert binom_cdf(0, 2, 0.3) == pytest.approx(0.49)


@pytest.mark.parametrize("p", [0.02, 0.1, 0.3])
def test_clopper_pearson_covers(p):
    """Monte-Carlo: the true proportion exceeds the upper bound in <= delta of the draws (+ 3 s.e.)."""
    trials, n = 4000, 60
    errors = np.random.default_rng(int(p * 1000)).binomial(n, p, trials)
    bounds = {k: clopper_pearson_upper(int(k), n, DELTA) for k in np.unique(errors)}
    misses = np.mean([bounds[k] < p for k in errors])
    assert misses <= DELTA + 3 * math.sqrt(DELTA * (1 - DELTA) / trials)


def _table(answered, errors, n_cal=1000):
    return RiskTable(tuple(np.linspace(0.9, 0.1, len(answered))), tuple(answered), tuple(errors), n_cal)


def test_ltt_picks_the_most_permissive_threshold_whose_bound_holds():
    table = _table([100, 200, 400, 800], [2, 6, 20, 160])  # error 2%, 3%, 5%, 20%
    cert = table.choose(0.1, DELTA)
    assert cert.threshold == table.thresholds[2] and cert.n_answered == 400 and cert.n_errors == 20
    assert cert.upper <= 0.1 and cert.coverage == 0.4 and cert.error == 0.05
    assert clopper_pearson_upper(160, 800, DELTA) > 0.1  # the next one fails


def test_ltt_stops_at_the_first_failure():
    """Fixed-sequence testing never skips a failed hypothesis, even if a later one would pass."""
    table = _table([100, 120, 600], [1, 40, 6])  # the middle threshold fails, the last would pass alone
    cert = table.choose(0.1, DELTA)
    assert cert.threshold == table.thresholds[0] and cert.n_answered == 100


def test_ltt_certifies_nothing_when_the_first_threshold_fails():
    cert = _table([10, 500], [0, 5]).choose(0.1, DELTA)  # 10 answers cannot certify 10% (upper 0.26)
    assert cert.threshold == math.inf and cert.n_answered == 0 and cert.coverage == 0.0


def test_lower_alpha_never_answers_more():
    rng = np.random.default_rng(0)
    scores = rng.random(2000)
    wrong = rng.random(2000) > scores  # higher score, fewer errors
    table = RiskTable.count(scores, wrong, np.linspace(0.9, 0, 91))  # start where ~200 are answered
    covered = [table.choose(a, DELTA).coverage for a in (0.05, 0.1, 0.2, 0.3, 0.5)]
    assert covered == sorted(covered) and covered[-1] > covered[0]


def test_risk_table_counts_nan_as_never_answered():
    table = RiskTable.count(np.array([0.9, math.nan, 0.5, 0.2]), np.array([False, True, True, False]),
                            np.array([0.8, 0.4, 0.0]))
    assert table.n_answered == (1, 2, 3) and table.n_errors == (0, 1, 1) and table.n_cal == 4


def test_combiner_is_monotone_in_each_weight():
    c = Combiner((2.0, 0.0, 1.0, 0.5, -1.5), -0.5, (0.5, 0.0, 0.5, 0.5, 0.1), (0.1, 1.0, 0.1, 0.2, 0.3))
    x = {"span_score": 0.5, "margin": 0.0, "top_cosine": 0.5, "overlap@1": 0.5, "negated": 0.0}
    low, high = (c({**x, "span_score": s}) for s in (0.4, 0.6))
    assert 0.0 < low < c(x) < high < 1.0
    assert c({**x, "overlap@1": 0.3}) < c(x) < c({**x, "overlap@1": 0.9})
    assert c({**x, "negated": 1.0}) < c(x)


def test_a_combiner_reads_the_features_it_was_fitted_on():
    """A calibration file from before overlap@1 names three features: it scores without the later ones."""
    old = Combiner((2.0, 0.0, 1.0), -0.5, (0.5, 0.0, 0.5), (0.1, 1.0, 0.1), ("span_score", "margin", "top_cosine"))
    x = {"span_score": 0.6, "margin": 0.0, "top_cosine": 0.5}
    assert old(x) == old({**x, "overlap@1": 0.9, "negated": 1.0}) > 0.5


def test_malformed_calibration_names_the_file(tmp_path):
    bad = tmp_path / "calibration.json"
    bad.write_text(json.dumps({"readers": {"rules": {"combiner": {}}}}))
    with pytest.raises(BundleError, match="calibration.json"):
        Calibration.load(bad)
    with pytest.raises(BundleError, match="missing"):
        Calibration.load(tmp_path / "absent.json")


def test_a_damaged_calibration_names_a_fix_a_device_can_make(tmp_path, monkeypatch):
    """Every damaged calibration said "rebuild it with `python -m convert calibrate`": on a device there is no convert
    package, torch or SQuAD. The shipped one is reinstalled with edge-rag, an own one made again on the device."""
    own = tmp_path / "own.json"
    own.write_text(CALIBRATION_ASSET.read_text(encoding="utf-8")[:20_000], encoding="utf-8")  # a copy cut short
    with pytest.raises(BundleError, match=r"own.json is missing or malformed .*make it again \(`edge-rag calibrate`\)"):
        Calibration.load(own)
    monkeypatch.setattr(certify, "CALIBRATION_ASSET", own.resolve())  # the package's own file, cut short
    with pytest.raises(BundleError, match="own.json is missing or malformed .*reinstall edge-rag"):
        Calibration.load(own)


def test_a_huge_file_given_as_a_calibration_is_refused_unread(tmp_path):
    """`--calibration` naming the bundle's 253 MB GGUF by mistake read it whole before failing (575 MB peak RSS
    for `edge-rag ask`, outside the memory plan, which is made after): now at most MAX_FILE_BYTES are read."""
    huge = tmp_path / "generator.gguf"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)  # sparse: nothing written
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="generator.gguf is missing or malformed"):
            Calibration.load(huge)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * MAX_FILE_BYTES + (1 << 20), peak


def test_a_calibration_file_nested_deeper_than_json_reads_is_named(tmp_path):
    """A hostile or garbled file of 200,000 nested brackets: `edge-rag ask --calibration` and `serve`'s start
    (the operator's certificate, restored) printed a bare RecursionError traceback (exit 1)."""
    deep = tmp_path / "calibration.json"
    deep.write_text('{"readers": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(BundleError, match="calibration.json is missing or malformed"):
        Calibration.load(deep)


def _neural(raw: dict) -> dict:
    return raw["readers"]["neural"]


def _counts(key: str, value: object) -> Callable[[dict], None]:
    return lambda raw: _neural(raw)["table"].update({key: [value] * len(_neural(raw)["table"][key])})


HOSTILE: dict[str, Callable[[dict], None]] = {
    "half an error": _counts("n_errors", 0.5),  # certified answering every candidate at alpha 0.05
    "errors as false": _counts("n_errors", False),  # so did this
    "more answered than asked": lambda raw: _neural(raw)["table"].update(
        n_answered=[10**6] * len(_neural(raw)["table"]["n_answered"]), n_errors=[0] * len(_neural(raw)["table"]["n_errors"])),
    "negative errors": _counts("n_errors", -1),  # a bare ValueError when the path opened
    "answered sets that do not nest": lambda raw: _neural(raw)["table"].update(
        n_answered=_neural(raw)["table"]["n_answered"][::-1], n_errors=[0] * len(_neural(raw)["table"]["n_errors"])),
    "fewer counts than thresholds": lambda raw: _neural(raw)["table"].update(n_errors=[0, 0]),
    "no multi-hop table for the kind model": lambda raw: _neural(raw)["kinds"].update(tables={}),  # single-hop's decided
    "negative generated errors": lambda raw: _neural(raw)["gpt"].update(errors=-3),
    "a combiner with one weight": lambda raw: _neural(raw)["combiner"].update(weights=[1.0]),  # failed every question
    "a feature nothing computes": lambda raw: _neural(raw)["combiner"]["features"].__setitem__(0, "shoe_size"),
    "n_cal as text": lambda raw: _neural(raw)["table"].update(n_cal="1247"),
    "source as text": lambda raw: raw.update(source="x"),
    "the Config as a list": lambda raw: raw["source"].update(config=[1]),
    "a list among the kinds of passages": lambda raw: raw["source"].update(passages=[["sentence:20"]]),  # every question
    "the kind of store as a number": lambda raw: raw["source"].update(backend=1),
    "readers as a list": lambda raw: raw.update(readers=[]),
}


@pytest.mark.parametrize("asset", (CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET), ids=lambda p: p.name)
def test_the_shipped_calibrations_pass_the_file_check(asset):
    assert set(Calibration.load(asset).readers) == {"rules", "neural"}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_calibration_file_whose_counts_cannot_be_counts_is_an_error_never_a_certificate(tmp_path, name):
    """Counts no calibration set gives, or entries of the wrong shape, are a BundleError naming the file when it is
    loaded: read as they came, some certified answering every candidate, and a kind model without its kind's
    table decided multi-hop questions by the single-hop threshold."""
    raw = json.loads(CALIBRATION_ASSET.read_text(encoding="utf-8"))
    HOSTILE[name](raw)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(BundleError, match="calibration.json is missing or malformed"):
        Calibration.load(path)


def test_each_kind_s_certificate_holds_its_alpha_where_one_pooled_certificate_does_not():
    """Monte Carlo over calibration draws (what the per-kind certificate of edge_rag.decision.kind rests on). A
    large kind whose answers are wrong less often the higher they score, and a small one wrong 60% of the time at
    every score (as multi-hop answers were). Certified per kind, each kind's true error among answered exceeds
    alpha in <= delta of the draws; certified on the pooled counts, most draws certify a threshold, and at every one
    of them the small kind's error exceeds alpha."""
    rng = np.random.default_rng(1)
    alpha, trials, grid = 0.3, 200, np.linspace(0.95, 0.0, 20)

    def true_error(kind: str, t: float) -> float:  # over scores uniform on [t, 1]
        return 0.4 * (1 - t) if kind == "single" else 0.6  # P(wrong | s) = 0.8 (1 - s), or 0.6

    def draw(kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        s = rng.random(n)
        return s, rng.random(n) < (0.8 * (1 - s) if kind == "single" else 0.6)

    missed, pooled_certified = {"single": 0, "multi": 0, "pooled, multi": 0}, 0
    for _ in range(trials):
        drawn = {"single": draw("single", 400), "multi": draw("multi", 60)}
        for kind, (s, w) in drawn.items():
            cert = RiskTable.count(s, w, grid).choose(alpha, DELTA)
            missed[kind] += math.isfinite(cert.threshold) and true_error(kind, cert.threshold) > alpha
        pooled = RiskTable.count(*(np.concatenate(x) for x in zip(*drawn.values())), grid).choose(alpha, DELTA)
        pooled_certified += math.isfinite(pooled.threshold)
        missed["pooled, multi"] += math.isfinite(pooled.threshold) and true_error("multi", pooled.threshold) > alpha
    allowed = DELTA + 3 * math.sqrt(DELTA * (1 - DELTA) / trials)
    assert missed["single"] / trials <= allowed and missed["multi"] / trials <= allowed
    assert missed["pooled, multi"] == pooled_certified > trials / 2
