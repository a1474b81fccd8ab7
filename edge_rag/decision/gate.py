"""Evidence gate (cautious-rag): a HEURISTIC threshold on how high a query's top cosines are. It certifies nothing.

The gate maps the retrieved passages' cosines to relevance r_i = clip(cosine_i, 0, 1), runs a lower confidence
bound L of bounds.py over them and passes iff L >= tau_rel (config.gate_threshold). The bounds certify the mean
of i.i.d. draws from a population; the top-k cosines of ONE query, read in rank order, are sorted order
statistics of a fixed list, not such draws, so the gate's delta is not a probability of anything: it passed
96% of answerable and 96% of unanswerable SQuAD questions, and 16% of pure-noise synthetic queries. It is kept
only as the seed path's configurable filter (Config(certified=False)); the default decision is certify.py's
threshold, which does hold a guarantee (error among answered, over exchangeable calibration questions).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from ..config import Config
from . import bounds

_BOUNDS: dict[str, Callable[[np.ndarray, Config], bounds.Bound]] = {
    "hoeffding": lambda r, config: bounds.hoeffding(r, config.gate_delta),
    "azuma": lambda r, config: bounds.azuma(r, config.gate_delta, config.azuma_c),
    "bernstein": lambda r, config: bounds.empirical_bernstein(r, config.gate_delta),
    "betting": lambda r, config: bounds.betting(r, config.gate_delta),
}
GATES = ("none", "distance", *_BOUNDS)
Scores: TypeAlias = Sequence[float] | np.ndarray  # cosine similarities of the retrieved passages


@dataclass(frozen=True)
class GateResult:
    """What the gate decided and why; lower_bound and threshold are NaN when the gate computed none."""

    passed: bool
    lower_bound: float
    threshold: float
    n: int  # scores the gate looked at
    method: str
    reason: str


def relevance(scores: Scores) -> np.ndarray:
    """r_i = clip(cosine_i, 0, 1)."""
    return np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)


def _gate_name(config: Config) -> str:
    if config.gate not in GATES:
        raise ValueError(f"unknown evidence gate {config.gate!r}; valid gates: {', '.join(GATES)}")
    return config.gate


def _no_evidence(config: Config, method: str) -> GateResult:
    return GateResult(False, 0.0, config.gate_threshold, 0, method, "no passages retrieved: no evidence")


def evidence_gate(scores: Scores, config: Config) -> GateResult:
    """Gate the n retrieved passages' cosine scores with config.gate.

    - none: always passes (no bound computed).
    - distance: the seeds' ceiling, passes iff d_min = min_i (2 - 2 s_i) (squared L2) <= config.refuse_distance;
      lower_bound is the max relevance and threshold the cosine the ceiling corresponds to, 1 - d / 2.
    - hoeffding, azuma, bernstein, betting: passes iff the bound's lower end L >= config.gate_threshold.
    """
    method, r = _gate_name(config), relevance(scores)
    if method == "none":
        return GateResult(True, math.nan, math.nan, r.size, method, "no evidence gate")
    if r.size == 0:
        return _no_evidence(config, method)
    if method == "distance":
        d_min = max(0.0, 2.0 - 2.0 * float(np.max(scores)))
        passed = d_min <= config.refuse_distance
        reason = f"d_min {d_min:.3f} {'<=' if passed else '>'} ceiling {config.refuse_distance:.3f}"
        return GateResult(passed, float(r.max()), 1.0 - config.refuse_distance / 2, r.size, method, reason)
    lower, tau = _BOUNDS[method](r, config).lower, config.gate_threshold
    passed = lower >= tau
    reason = (
        f"lower bound {lower:.3f} {'>=' if passed else '<'} tau_rel {tau:.3f} "
        f"({method}, n={r.size}, 1-delta={1 - config.gate_delta:g})"
    )
    return GateResult(passed, lower, tau, r.size, method, reason)


def sequential_gate(scores_in_rank_order: Scores, config: Config, n_min: int = 2) -> GateResult:
    """Feed scores one at a time to the betting confidence sequence; stop once it decides.

    Certifies (passes) as soon as the lower bound >= tau_rel, refutes as soon as the upper bound < tau_rel,
    never before n_min scores; GateResult.n records the scores used. Only the betting sequence is valid
    under such data-dependent stopping, so any other gate falls back to evidence_gate over all scores.
    The scores come in rank order, not i.i.d.: the "bound" is a statistic of the retrieved list, no guarantee.
    """
    method = _gate_name(config)
    if method != "betting":
        return evidence_gate(scores_in_rank_order, config)
    r, tau = relevance(scores_in_rank_order), config.gate_threshold
    if r.size == 0:
        return _no_evidence(config, method)
    sequence = bounds.BettingSequence(config.gate_delta)
    for x in r:
        sequence.update(float(x))
        if sequence.n >= n_min and (sequence.lower >= tau or sequence.upper < tau):
            break
    lower, upper, n = sequence.lower, sequence.upper, sequence.n
    if lower >= tau:
        reason = f"certified: lower bound {lower:.3f} >= tau_rel {tau:.3f} after {n} of {r.size} scores"
    elif upper < tau:
        reason = f"refuted: upper bound {upper:.3f} < tau_rel {tau:.3f} after {n} of {r.size} scores"
    else:
        reason = f"undecided after all {n} scores: lower {lower:.3f} < tau_rel {tau:.3f} <= upper {upper:.3f}"
    return GateResult(lower >= tau, lower, tau, n, method, reason)
