"""Per-question metrics and their aggregation; pure functions so tests can check them by hand.

Retrieval is judged at document level (gold evidence = documents) while the store returns sentence
passages, so a passage counts as relevant when its document is gold.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from evaluation.metrics import best_em, best_f1, normalize_answer

__all__ = ["best_em", "best_f1", "bootstrap_ci", "context_precision", "context_recall", "cosine", "faithfulness",
           "mean", "percentiles", "precision_at_k", "recall_at_k", "reciprocal_rank", "shares"]


def recall_at_k(ranked_docs: Sequence[str], gold: set[str] | frozenset[str], k: int) -> float:
    """Share of gold documents with at least one passage among the top k."""
    return len(gold & set(ranked_docs[:k])) / len(gold) if gold else 0.0


def precision_at_k(ranked_docs: Sequence[str], gold: set[str] | frozenset[str], k: int) -> float:
    """Share of the top-k passages that come from a gold document (divided by k, as usual)."""
    return sum(d in gold for d in ranked_docs[:k]) / k


def reciprocal_rank(ranked_docs: Sequence[str], gold: set[str] | frozenset[str]) -> float:
    """1 / rank of the first passage from a gold document; 0 when none is retrieved."""
    return next((1.0 / r for r, d in enumerate(ranked_docs, 1) if d in gold), 0.0)


def context_precision(used_docs: Sequence[str], gold: set[str] | frozenset[str]) -> float | None:
    """Share of the passages put in the context that come from gold documents (None: empty context)."""
    return sum(d in gold for d in used_docs) / len(used_docs) if used_docs else None


def context_recall(used_docs: Sequence[str], gold: set[str] | frozenset[str]) -> float | None:
    """Share of gold documents represented in the context (None: no gold evidence defined)."""
    return len(gold & set(used_docs)) / len(gold) if gold else None


def faithfulness(answer: str | None, context: str) -> float | None:
    """Share of the answer's normalised tokens that occur in the context (None: no answer)."""
    tokens = normalize_answer(answer or "").split()
    if not tokens:
        return None
    found = set(normalize_answer(context).split())
    return sum(t in found for t in tokens) / len(tokens)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


def mean(values: Sequence[float | None]) -> float | None:
    """Mean of the defined values (None when there are none)."""
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


# A p95 of fewer samples is their largest or an interpolation towards it (10 of them: 0.55 of the way from the 9th
# to the 10th): it is not quoted
MIN_P95_SAMPLES = 20


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50 / p95 / mean of a latency sample and its size n; p95 None under MIN_P95_SAMPLES."""
    if not len(values):
        return {"p50": None, "p95": None, "mean": None, "n": 0}
    arr = np.asarray(values, dtype=float)
    p95 = float(np.percentile(arr, 95)) if arr.size >= MIN_P95_SAMPLES else None
    return {"p50": float(np.percentile(arr, 50)), "p95": p95, "mean": float(arr.mean()), "n": int(arr.size)}


def shares(labels: Sequence[str]) -> dict[str, float]:
    """Share of each label, e.g. the route mix."""
    counts = Counter(labels)
    return {k: v / len(labels) for k, v in sorted(counts.items())} if labels else {}


def bootstrap_ci(deltas: Sequence[float], resamples: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of paired per-question deltas with a percentile-bootstrap CI (questions resampled)."""
    arr = np.asarray(deltas, dtype=float)
    if arr.size == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(resamples, arr.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return {"mean": float(arr.mean()), "lo": float(lo), "hi": float(hi), "n": int(arr.size)}
