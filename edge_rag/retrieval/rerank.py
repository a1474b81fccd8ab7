"""Step 6 of the pipeline (thesis §4.3.5, MEDIUM/HARD tiers): reorder retrieved passages by

    h(q, p) = w_dense * cosine(q, p) + w_lex * overlap(q, p.text) + w_title * overlap(q, p.title)

The thesis names the three signals and uses a cross-encoder; we keep h model-free so that reranking
costs microseconds on the device. The dense retriever finds passages *about* the question; the
lexical terms favour those that contain its exact names and numbers, which answers usually sit next to.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..config import Config
from ..documents.text import keywords, overlap
from ..types import Passage


def rerank_scores(question: str, passages: Sequence[Passage], config: Config) -> list[float]:
    """h(q, p) for each passage, in input order."""
    q = keywords(question)
    return [
        config.rerank_dense_weight * p.score
        + config.rerank_lexical_weight * overlap(q, p.text)
        + config.rerank_title_weight * overlap(q, p.title)
        for p in passages
    ]


def rerank(question: str, passages: Sequence[Passage], config: Config) -> list[Passage]:
    """Passages sorted by h(q, p), highest first; ties keep the retriever's order (stable sort).

    Each passage's ``score`` stays its cosine: distances d = sqrt(2 - 2 s), the evidence gate and
    Confidence-Gated Routing are calibrated on cosine, and h (a blend with overlaps) is not one.
    """
    h = rerank_scores(question, passages, config)
    order = sorted(range(len(passages)), key=lambda i: h[i], reverse=True)
    return [passages[i] for i in order]
