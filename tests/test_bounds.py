import math
import zlib

import numpy as np
import pytest

from edge_rag.decision.bounds import (
    BettingSequence,
    azuma,
    betting,
    betting_sequence,
    empirical_bernstein,
    hoeffding,
)

DELTA = 0.05
TRIALS = 2000


def test_hoeffding_closed_form():
    b = hoeffding([0.6] * 25, DELTA)  # sqrt(ln 20 / 50)
    assert b.mean == pytest.approx(0.6) and b.eps == pytest.approx(0.2447747, abs=1e-6)
    assert b.lower == pytest.approx(0.6 - 0.2447747, abs=1e-6)


def test_azuma_closed_form():
    b = azuma([0.5] * 10, DELTA, c=0.2)  # 0.2 sqrt(2 ln 20 / 10)
    assert b.eps == pytest.approx(0.1548091, abs=1e-6) and b.lower == pytest.approx(0.5 - 0.1548091, abs=1e-6)


def test_bernstein_closed_form():
    b = empirical_bernstein([0.4, 0.6] * 5, DELTA)  # V = 0.1 / 9: sqrt(2 V ln 40 / 10) + 7 ln 40 / 27
    assert b.mean == pytest.approx(0.5)
    assert b.eps == pytest.approx(0.0905401 + 0.9563762, abs=1e-6)
    assert b.lower == 0.0  # clipped


def test_bernstein_single_score_says_nothing():
    b = empirical_bernstein([0.9], DELTA)
    assert b.eps == math.inf and b.lower == 0.0


def test_lower_is_clipped_to_unit_interval():
    assert hoeffding([0.0, 0.1], DELTA).lower == 0.0
    assert 0.0 <= azuma([1.0] * 100, DELTA).lower <= 1.0


@pytest.mark.parametrize("bad", [[], [0.5, 1.2], [-0.1], [math.nan]])
def test_rejects_scores_outside_unit_interval(bad):
    for bound in (hoeffding, azuma, empirical_bernstein, betting):
        with pytest.raises(ValueError):
            bound(bad, DELTA)


def _reference_capital(x, m, delta, truncation=0.75):
    """K_n(m) straight from the paper, one score at a time, in plain Python."""
    capital, total, squares = 1.0, 0.0, 0.0
    for t, xt in enumerate(x, start=1):
        var_before = (0.25 + squares) / t  # sigma^2_{t-1}, with one fake observation of variance 1/4
        bet = min(math.sqrt(2 * math.log(1 / delta) / (var_before * t * math.log(1 + t))), truncation / m)
        capital *= 1 + bet * (xt - m)
        total += xt
        squares += (xt - (0.5 + total) / (t + 1)) ** 2
    return capital


def test_betting_matches_paper_formula():
    x = np.random.default_rng(1).beta(8, 2, 12)
    grid = np.arange(1, 21) / 20
    lower, upper = betting_sequence(x, DELTA, grid_size=20)
    for n in range(1, 13):
        rejected = [m for m in grid if _reference_capital(x[:n], m, DELTA) >= 1 / DELTA]
        assert lower[n - 1] >= max(rejected, default=0.0) - 1e-12  # running intersection may keep older ones
    assert lower[-1] == pytest.approx(max(m for m in grid if _reference_capital(x, m, DELTA) >= 1 / DELTA))
    mirrored = [m for m in grid if _reference_capital(1 - x, m, DELTA) >= 1 / DELTA]
    assert upper[-1] == pytest.approx(1 - max(mirrored, default=0.0))


def test_betting_sequence_incremental_equals_batch():
    x = np.random.default_rng(2).uniform(0.4, 0.8, 25)
    lower, upper = betting_sequence(x, DELTA)
    sequence = BettingSequence(DELTA)
    steps = [(sequence.update(v), sequence.upper) for v in x]
    np.testing.assert_allclose([s[0] for s in steps], lower)
    np.testing.assert_allclose([s[1] for s in steps], upper)
    assert sequence.n == 25 and betting(x, DELTA).lower == pytest.approx(lower[-1])
    assert np.all(np.diff(lower) >= 0) and np.all(np.diff(upper) <= 0) and np.all(lower <= upper)


# Monte-Carlo coverage: i.i.d. samples from [0, 1] distributions with a known mean, wide, skewed, tight and
# Bernoulli (the worst case for variance-free bounds). A bound at level 1 - delta may miss (lower > mean) in
# at most delta of the trials, up to Monte-Carlo slack: 3 standard errors of a proportion delta over TRIALS.
SLACK = 3 * math.sqrt(DELTA * (1 - DELTA) / TRIALS)
DISTRIBUTIONS = {
    "beta(2,2)": (lambda rng, shape: rng.beta(2, 2, shape), 0.5),
    "beta(5,2)": (lambda rng, shape: rng.beta(5, 2, shape), 5 / 7),
    "beta(1,8)": (lambda rng, shape: rng.beta(1, 8, shape), 1 / 9),
    "beta(60,40)": (lambda rng, shape: rng.beta(60, 40, shape), 0.6),
    "beta(0.3,0.3)": (lambda rng, shape: rng.beta(0.3, 0.3, shape), 0.5),
    "bernoulli(0.1)": (lambda rng, shape: (rng.random(shape) < 0.1).astype(float), 0.1),
    "bernoulli(0.5)": (lambda rng, shape: (rng.random(shape) < 0.5).astype(float), 0.5),
    "bernoulli(0.9)": (lambda rng, shape: (rng.random(shape) < 0.9).astype(float), 0.9),
}
FIXED_N = {"hoeffding": hoeffding, "azuma": azuma, "bernstein": empirical_bernstein}


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("n", [5, 30])
def test_fixed_n_bounds_cover(dist, n):
    draw, mean = DISTRIBUTIONS[dist]
    scores = draw(np.random.default_rng(zlib.crc32(f"{dist}:{n}".encode())), (TRIALS, n))
    for name, bound in FIXED_N.items():
        misses = np.mean([bound(s, DELTA).lower > mean for s in scores])
        assert misses <= DELTA + SLACK, (name, dist, n, misses)


def test_azuma_with_an_assumed_small_c_undercovers():
    """c < 1 is an assumption about the spread: near-binary scores break it (and show the harness can fail)."""
    scores = np.random.default_rng(3).beta(0.3, 0.3, (TRIALS, 20))
    assert np.mean([azuma(s, DELTA, c=0.2).lower > 0.5 for s in scores]) > DELTA + SLACK  # ~0.09


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_betting_covers_uniformly_over_n(dist):
    """The true mean is outside [lower_n, upper_n] at *any* n = 1..40 in at most delta of the trials."""
    draw, mean = DISTRIBUTIONS[dist]
    scores = draw(np.random.default_rng(zlib.crc32(dist.encode())), (TRIALS, 40))
    lower, upper = betting_sequence(scores, DELTA, grid_size=100)  # coarser grid: still valid, 10x faster
    assert np.mean((lower > mean).any(axis=-1)) <= DELTA + SLACK
    assert np.mean((upper < mean).any(axis=-1)) <= DELTA + SLACK


@pytest.mark.parametrize("n", [10, 20, 50])
def test_betting_tighter_than_hoeffding_at_low_variance(n):
    scores = np.random.default_rng(n).beta(600, 400, (50, n))  # mean 0.6, sd 0.015
    lower = betting_sequence(scores, DELTA)[0][:, -1]
    assert np.all(lower > [hoeffding(s, DELTA).lower for s in scores])


def test_bernstein_tighter_than_hoeffding_at_low_variance_only_for_large_n():
    """Its 7 ln(2/delta) / (3(n-1)) term alone exceeds Hoeffding's eps until n ~ 60 at delta = 0.05."""
    rng = np.random.default_rng(4)
    for n, tighter in [(10, False), (50, False), (100, True), (200, True)]:
        s = rng.beta(600, 400, n)
        assert (empirical_bernstein(s, DELTA).lower > hoeffding(s, DELTA).lower) is tighter, n
