"""SQuAD answer metrics (EM, token F1) — used by router labelling, tests and benchmarks. Token F1 lives on the
device (``edge_rag.decision.squad_f1``: a certificate counts right and wrong answers by it) and is re-exported here."""
from __future__ import annotations

from edge_rag.decision.squad_f1 import best_f1, f1_score, normalize_answer

__all__ = ["best_em", "best_f1", "exact_match", "f1_score", "normalize_answer"]


def exact_match(prediction: str | None, gold: str) -> float:
    return float(normalize_answer(prediction or "") == normalize_answer(gold))


def best_em(prediction: str | None, golds: list[str]) -> float:
    """EM against the best-matching gold answer (0 when there are none)."""
    return max((exact_match(prediction, g) for g in golds), default=0.0)
