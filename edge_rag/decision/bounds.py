"""One-sided lower confidence bounds for the mean of scores in [0, 1] (cautious-rag).

What every bound here certifies, and only that: given scores X_1..X_n drawn i.i.d. (or exchangeably
sampled, or as a martingale for Azuma) from ONE population with mean mu, P(mu < lower) <= delta over the
draw of the sample. The guarantee is about that population's mean; it says nothing about a list of scores
that is not such a sample (e.g. the sorted top-k cosines of one query: see gate.py). Hoeffding, Azuma and
Bernstein are fixed-n bounds: valid for an n decided before looking, not when n depends on the scores.
The betting confidence sequence is anytime-valid (uniformly over n), so a sampler may stop when it likes.
tests/test_bounds.py checks each one's one-sided miss rate <= delta by Monte-Carlo. Pure numpy: device side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

GRID_SIZE = 1000  # candidate means m = 1/G, 2/G, ..., 1 of the betting sequence (resolution 0.001)
TRUNCATION = 0.75  # bets capped at TRUNCATION / m: one score costs <= 3/4 of the capital (paper: 1/2 or 3/4)


@dataclass(frozen=True)
class Bound:
    """Sample mean, slack eps and lower = clip(mean - eps, 0, 1); eps is inf when n says nothing."""

    mean: float
    eps: float
    lower: float


def _as_scores(scores: ArrayLike, batched: bool = False) -> np.ndarray:
    """Scores as floats in [0, 1], non-empty along the last axis (1-D unless batched)."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim == 0 or x.shape[-1] == 0 or (x.ndim != 1 and not batched):
        shape = "an array" if batched else "a 1-D array"
        raise ValueError(f"need {shape} with at least one score, got shape {x.shape}")
    if not np.all((x >= 0.0) & (x <= 1.0)):
        raise ValueError("scores must lie in [0, 1] (map cosines to relevance first)")
    return x


def _bound(mean: float, eps: float) -> Bound:
    return Bound(mean=mean, eps=eps, lower=min(1.0, max(0.0, mean - eps)))


def hoeffding(scores: ArrayLike, delta: float) -> Bound:
    """Hoeffding (1963) for independent scores in [0, 1]: eps = sqrt(ln(1/delta) / (2n)).

    Certifies the common mean of i.i.d. [0, 1] scores (or of a sample drawn without replacement)."""
    x = _as_scores(scores)
    return _bound(float(x.mean()), math.sqrt(math.log(1 / delta) / (2 * x.size)))


def azuma(scores: ArrayLike, delta: float, c: float = 1.0) -> Bound:
    """Azuma-Hoeffding for martingale differences |X_i - E[X_i | past]| <= c: eps = c sqrt(2 ln(1/delta) / n).

    For scores in [0, 1] the only c that holds whatever the distribution is c = 1 (the default); a smaller c
    is an assumption about the scores' spread and the bound under-covers when it fails (c = 0.2 missed its
    level 10-22% of the time on near-binary scores). With c = 1 it is Hoeffding with twice the exponent's
    width (4x looser in eps^2), kept for martingale data that is not independent.
    """
    x = _as_scores(scores)
    return _bound(float(x.mean()), c * math.sqrt(2 * math.log(1 / delta) / x.size))


def empirical_bernstein(scores: ArrayLike, delta: float) -> Bound:
    """Empirical Bernstein (Maurer & Pontil 2009, Thm 4): certifies the mean of i.i.d. [0, 1] scores,
    tight when the sample variance is small.

    eps = sqrt(2 V ln(2/delta) / n) + 7 ln(2/delta) / (3(n - 1)), V the sample variance (ddof=1). One score
    has no variance estimate, so n = 1 gives eps = inf and lower = 0. The 7/(3(n-1)) term dominates at small
    n: at delta = 0.05 the bound is looser than Hoeffding below n ~ 60 even for constant scores.
    """
    x = _as_scores(scores)
    n, log_term = x.size, math.log(2 / delta)
    if n == 1:
        return _bound(float(x[0]), math.inf)
    var = float(x.var(ddof=1))
    return _bound(float(x.mean()), math.sqrt(2 * var * log_term / n) + 7 * log_term / (3 * (n - 1)))


# -- betting confidence sequence (Waudby-Smith & Ramdas 2023, "Estimating means of bounded random
# variables by betting"). For each candidate mean m, a gambler starts with capital 1 and bets
# K_t(m) = prod_i (1 + lambda_i(m) (x_i - m)) that the mean exceeds m. If m is the true mean, K_t(m) is a
# nonnegative martingale, so by Ville's inequality it ever reaches 1/delta with probability <= delta: every
# m whose capital reached 1/delta is rejected, at all n simultaneously. The bets lambda_i(m) >= 0 shrink
# as m grows, so K_t(m) falls with m and the rejected means form an interval [0, lower). The upper bound
# is the same construction on 1 - x, whose plug-in bets equal those on x. Each side errs with probability
# <= delta on its own, so a gate that certifies on the lower bound and refutes on the upper one is wrong
# with probability <= delta.


def _grid(size: int) -> np.ndarray:
    return np.arange(1, size + 1) / size


def _plugin_bets(x: np.ndarray, delta: float) -> np.ndarray:
    """Predictable plug-in bets along the last axis: lambda_t uses only x_1..x_{t-1} (the paper's PrPl).

    lambda_t = sqrt(2 ln(1/delta) / (var_{t-1} t ln(1 + t))), with mean and variance estimates regularised
    by one fake observation of mean 1/2 and variance 1/4.
    """
    t = np.arange(1, x.shape[-1] + 1)
    mean = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)
    var = (0.25 + np.cumsum((x - mean) ** 2, axis=-1)) / (t + 1)
    var_before = np.concatenate([np.full(x.shape[:-1] + (1,), 0.25), var[..., :-1]], axis=-1)
    return np.sqrt(2 * math.log(1 / delta) / (var_before * t * np.log1p(t)))


def _log_growth(x: np.ndarray, bets: np.ndarray, grid: np.ndarray, truncation: float) -> np.ndarray:
    """log(1 + lambda(m) (x - m)) per grid point m, lambda(m) = min(bet, truncation / m) keeps 1 + ... > 0."""
    return np.log1p(np.minimum(bets[..., None], truncation / grid) * (x[..., None] - grid))


def _largest_rejected(log_capital: np.ndarray, grid: np.ndarray, delta: float) -> np.ndarray:
    """Largest grid mean whose capital reached 1/delta, 0 if none: the true mean lies above it."""
    return np.where(log_capital >= math.log(1 / delta), grid, 0.0).max(axis=-1)


def _running_lower(x: np.ndarray, delta: float, grid_size: int, truncation: float) -> np.ndarray:
    grid = _grid(grid_size)
    log_capital = np.cumsum(_log_growth(x, _plugin_bets(x, delta), grid, truncation), axis=-2)
    return np.maximum.accumulate(_largest_rejected(log_capital, grid, delta), axis=-1)


def betting_sequence(
    scores: ArrayLike, delta: float, grid_size: int = GRID_SIZE, truncation: float = TRUNCATION
) -> tuple[np.ndarray, np.ndarray]:
    """Running (lower, upper) bounds after each score, valid simultaneously for every n.

    Works along the last axis, so a batch of streams shaped (..., n) is one call. Bounds are rounded
    outwards to the grid and are running intersections (the lower never falls, the upper never rises).
    """
    x = _as_scores(scores, batched=True)
    lower = _running_lower(x, delta, grid_size, truncation)
    return lower, 1.0 - _running_lower(1.0 - x, delta, grid_size, truncation)


def betting(
    scores: ArrayLike, delta: float, grid_size: int = GRID_SIZE, truncation: float = TRUNCATION
) -> Bound:
    """The betting sequence's lower bound after all scores, as a Bound (eps = mean - lower)."""
    x = _as_scores(scores)
    mean, lower = float(x.mean()), float(_running_lower(x, delta, grid_size, truncation)[-1])
    return Bound(mean=mean, eps=mean - lower, lower=lower)


class BettingSequence:
    """The betting confidence sequence fed one score at a time; gives the same bounds as betting_sequence."""

    def __init__(self, delta: float, grid_size: int = GRID_SIZE, truncation: float = TRUNCATION):
        self.delta, self.truncation = delta, truncation
        self.grid = _grid(grid_size)
        self.scores: list[float] = []
        self.log_capital = np.zeros((2, grid_size))  # row 0 bets on x (lower bound), row 1 on 1 - x (upper)
        self.lower, self.upper = 0.0, 1.0

    @property
    def n(self) -> int:
        return len(self.scores)

    def update(self, score: float) -> float:
        """Add one score in [0, 1]; returns the new lower bound (self.upper is updated too)."""
        x = float(_as_scores([score])[0])
        self.scores.append(x)
        bet = _plugin_bets(np.asarray(self.scores), self.delta)[-1]
        self.log_capital += _log_growth(np.array([x, 1.0 - x]), np.full(2, bet), self.grid, self.truncation)
        lower, mirrored = _largest_rejected(self.log_capital, self.grid, self.delta)
        self.lower, self.upper = max(self.lower, float(lower)), min(self.upper, 1.0 - float(mirrored))
        return self.lower
