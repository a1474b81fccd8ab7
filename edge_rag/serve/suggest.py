"""Suggested questions for the kiosk page: ones this corpus can actually answer.

Candidates are the packaged sample questions, then "<title>?" for the corpus's document titles; each is
kept only if ``decide`` (milliseconds, no generation) would not refuse it. Recomputed when the corpus
changes, or the certificate deciding (the operator's /admin "Apply": it may refuse what it answered).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..pipeline import EdgeRAG
from ..types import Route

SAMPLE_QUESTIONS = Path(__file__).resolve().parent.parent / "sample" / "questions.json"
TITLES = 50  # document titles tried as questions
_memo: dict[tuple[int, str, int], list[str]] = {}


def suggestions(rag: EdgeRAG, n: int) -> list[str]:
    """Up to ``n`` questions the corpus answers (RAG or GPT route), in a stable order."""
    key = (id(rag), rag.certified.cache_version(rag.store), n)  # the corpus's version and the certificate's
    if key not in _memo:
        _memo.clear()  # only the current corpus's list is kept
        _memo[key] = _answerable(rag, _candidates(rag), n)
    return _memo[key]


def _candidates(rag: EdgeRAG) -> list[str]:
    samples = [q["question"] for q in json.loads(SAMPLE_QUESTIONS.read_text(encoding="utf-8"))]
    return samples + [f"{title}?" for title in rag.store.titles(TITLES)]


def _answerable(rag: EdgeRAG, candidates: list[str], n: int) -> list[str]:
    keep: list[str] = []
    for question in candidates:
        if len(keep) >= n:
            break
        if question not in keep and rag.decide(question).route is not Route.REFUSE:
            keep.append(question)
    return keep
