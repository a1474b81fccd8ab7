"""Extractive answerer of the RAG route (EverydayGPT §5–6): rules and regexes, no model, < 1 ms a question.

classify the question (``question``) -> rank the context's sentences (``rank``) -> cut a short span from
the best one (``span``) -> Eq. 1 confidence on its sentence (``confidence``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...types import Passage
from .confidence import ETA_NONE, ETA_PARTIAL, ETA_TYPED, confidence
from .question import Expect, QuestionType, classify, expectation, parse_question
from .rank import bridge, rank, signal
from .span import choose, span, yes_no

__all__ = ["Expect", "Extraction", "QuestionType", "classify", "expectation", "extract"]


@dataclass(frozen=True)
class Extraction:
    """An extractive answer, the sentence it came from, and its Eq. 1 confidence."""

    answer: str | None
    confidence: float
    sentence: str
    qtype: QuestionType
    passage_id: int | None



def extract(question: str, passages: Sequence[Passage]) -> Extraction:
    """Answer from the passages (in rank order) without a model; answer None when nothing matches."""
    q = parse_question(question)
    q_stems = set(q.stems | q.head)
    sentences = rank(q, passages) if q_stems else []
    if not sentences:
        return Extraction(None, 0.0, "", q.qtype, None)
    best = max(sentences, key=lambda s: s.score)
    if not q_stems & (best.stems | best.title_stems):
        return Extraction(None, 0.0, "", q.qtype, None)
    answer: str | None
    if q.qtype is QuestionType.YES_NO:
        answer, typed = yes_no(q, best, sentences), True
    elif q.options:
        answer, typed = choose(q, q.options, sentences), True
    else:
        best = bridge(best, q, sentences)
        answer, typed = span(best, q)
    if not answer:
        return Extraction(None, 0.0, best.text, q.qtype, best.passage.id)
    eta = ETA_TYPED if typed else ETA_PARTIAL if signal(best.text, q) else ETA_NONE
    return Extraction(answer, confidence(best, q_stems, eta), best.text, q.qtype, best.passage.id)
