"""Retrieve: one ranked list from the dense index and the full-text index, fused by weighted reciprocal rank.

Dense search finds passages *about* the question; BM25 finds those that share its rare words (names, numbers,
terms), where SQuAD-style answers sit: on unseen articles BM25 put the right paragraph first 92% of the time and
the int8 MiniLM 73%. Kiosk visitors paraphrase more than SQuAD's crowdworkers, so both signals are kept:

    fused(p) = 1 / (fusion_k + rank_dense(p)) + lexical_weight / (fusion_k + rank_lexical(p))

(a list that does not hold p adds nothing). The weights were chosen on train/val articles only
(``python -m benchmarks.fusion``; README "Hybrid retrieval"). Every passage of the list keeps its cosine as
``score`` (what the router, correction, rerank and the decision read; a lexical-only hit gets its exact cosine
from the stored vector), its BM25 score as ``lexical`` and ``fused``. The out-of-domain distance stays dense:
``nearest`` is the dense search's best passage, since a shared word is no evidence that a question is in domain.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .config import Config
from .lexical import query_terms
from .stores import PassageStore
from .threads import beside
from .types import Passage


@dataclass(frozen=True)
class Retrieved:
    """The fused ranked list and the dense search's nearest passage (None: nothing stored)."""

    passages: list[Passage]
    nearest: Passage | None

    @property
    def d_min(self) -> float:
        """The nearest passage's squared L2 distance (Passage.distance); NaN when nothing is stored."""
        return self.nearest.distance if self.nearest is not None else math.nan


def search(store: PassageStore, vector: np.ndarray, question: str, k: int, config: Config) -> Retrieved:
    """The top ``k`` passages by ``config.retrieval``: "dense", "lexical" or "hybrid" (both, fused). A question
    with no indexable word, or whose words match nothing, is answered from the dense list alone. The lexical
    search runs in a thread beside the dense one (hnswlib and SQLite both let go of the GIL while they search):
    a hybrid search costs the slower of the two, not their sum."""
    mode = config.retrieval
    terms = query_terms(question) if mode != "dense" else []
    pending = beside(store.search_text, terms, k) if terms else None
    dense = store.search(vector, k)  # lexical mode: only its nearest, unless no word matches
    lexical = pending.result() if pending is not None else []
    nearest = dense[0] if dense else None
    if not lexical:
        return Retrieved(dense, nearest)
    ranked = fuse([p.id for p in dense] if mode != "lexical" else [], [i for i, _ in lexical], config.fusion_k,
                  config.lexical_weight)[:k]
    return Retrieved(_passages(store, vector, ranked, dense, dict(lexical)), nearest)


def fuse(dense: Sequence[int], lexical: Sequence[int], fusion_k: float, lexical_weight: float) -> list[tuple[int, float]]:
    """Weighted reciprocal-rank fusion of two ranked id lists: (id, fused score), best first; ties keep the dense
    order, then the lexical one."""
    fused: dict[int, float] = {}
    for weight, ids in ((1.0, dense), (lexical_weight, lexical)):
        for rank, pid in enumerate(ids, 1):
            fused[pid] = fused.get(pid, 0.0) + weight / (fusion_k + rank)
    return sorted(fused.items(), key=lambda kv: -kv[1])


def _passages(store: PassageStore, vector: np.ndarray, ranked: list[tuple[int, float]], dense: list[Passage],
              lexical: dict[int, float]) -> list[Passage]:
    """The fused ids as Passages with their cosine (exact, from the stored vectors, for lexical-only hits), BM25
    score and fused score. A lexical hit without a vector here (the full-text index is read without the search
    lock: a commit of another process this one has not loaded yet, or a removal) is left out."""
    known = {p.id: p for p in dense}
    known.update((p.id, p) for p in store.scored(vector, [pid for pid, _ in ranked if pid not in known]))
    return [replace(known[pid], lexical=lexical.get(pid, 0.0), fused=score) for pid, score in ranked if pid in known]
