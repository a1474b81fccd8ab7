"""Retrieve: one ranked list from the dense index and the full-text index: each passage's cosine plus a bonus for
its place in the BM25 list.

Dense search finds passages *about* the question; BM25 finds those that share its rare words (names, numbers,
terms), where SQuAD-style answers sit: on unseen articles BM25 put the right paragraph first 92% of the time and
the int8 MiniLM 73%. Kiosk visitors paraphrase more than SQuAD's crowdworkers, so both signals are kept:

    fused(p) = cosine(p) + lexical_weight / (fusion_k + rank_lexical(p))

over the passages of both lists (no bonus for one BM25 did not list; a lexical-only hit gets its exact cosine from
the stored vector). Unlike reciprocal-rank fusion of both ranks (the fusion before), the size of a cosine counts,
not only its rank: a passage well ahead in cosine keeps its place against one BM25 ranks a little higher. The
form and weights were chosen on train/val articles only (``python -m benchmarks.fusion``;
docs/decisions/fusion.md). Every passage of the list keeps its cosine as ``score`` (what the router, correction, rerank and the
decision read), its BM25 score as ``lexical`` and ``fused``. Lexical mode keeps BM25's order (fused = the bonus
alone). The out-of-domain distance stays dense: ``nearest`` is the dense search's best passage, since a shared
word is no evidence that a question is in domain.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace

import numpy as np

from ..config import Config
from ..storage.stores import PassageStore
from ..types import Passage
from .lexical import query_terms
from .threads import beside


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
    return begin(store, question, k, config).finish(vector)


def begin(store: PassageStore, question: str, k: int, config: Config) -> Search:
    """``search`` begun before the question's vector is known: its lexical search needs the question's words only,
    so the pipeline begins it first and it runs beside the question's encoding, off the critical path where a core is
    free. On a busy 2-core x86 (load 2.5-4.5, the encoder's two threads taking both cores) a question's encode +
    retrieve p50 took 0.91-1.02× as long as encoding, then searching (five runs of 400-865 SQuAD questions,
    ``python -m benchmarks.experiments.route_costs``)."""
    terms = query_terms(question) if config.retrieval != "dense" else []
    return Search(store, k, config, beside(store.search_text, terms, k, config.lexical_budget) if terms else None)


@dataclass(frozen=True)
class Search:
    """A search whose lexical half (``pending``; None: no query words, or dense mode) runs beside the caller."""

    store: PassageStore
    k: int
    config: Config
    pending: Future[list[tuple[int, float]]] | None

    def finish(self, vector: np.ndarray) -> Retrieved:
        """The dense search for ``vector``, fused with the lexical one's hits."""
        store, k, mode = self.store, self.k, self.config.retrieval
        dense = store.search(vector, k)  # lexical mode: only its nearest, unless no word matches
        lexical = dict(self.pending.result()) if self.pending is not None else {}
        nearest = dense[0] if dense else None
        if not lexical:
            return Retrieved(dense, nearest)
        known = with_cosines(store, vector, dense, lexical)
        order = ([] if mode == "lexical" else [p.id for p in dense]) + list(lexical)  # ties keep this order
        cosines = {pid: 0.0 if mode == "lexical" else known[pid].score for pid in order if pid in known}
        ranked = fuse(cosines, list(lexical), self.config.fusion_k, self.config.lexical_weight)[:k]
        return Retrieved([replace(known[pid], lexical=lexical.get(pid, 0.0), fused=score) for pid, score in ranked],
                         nearest)


def with_cosines(store: PassageStore, vector: np.ndarray, dense: Sequence[Passage],
                 lexical: Mapping[int, float]) -> dict[int, Passage]:
    """The dense hits and the lexical hits by id, each with its cosine (exact, from the stored vectors, for
    lexical-only hits). A lexical hit without a vector here (the full-text index is read without the search
    lock: a commit of another process this one has not loaded yet, or a removal) is left out."""
    known = {p.id: p for p in dense}
    known.update((p.id, p) for p in store.scored(vector, [pid for pid in lexical if pid not in known]))
    return known


def fuse(cosines: Mapping[int, float], lexical: Sequence[int], fusion_k: float,
         lexical_weight: float) -> list[tuple[int, float]]:
    """(id, fused score) of every id of ``cosines``, best first: its cosine plus ``lexical_weight / (fusion_k +
    rank)`` for its rank in the ``lexical`` id list; ties keep the order of ``cosines``."""
    bonus = {pid: lexical_weight / (fusion_k + rank) for rank, pid in enumerate(lexical, 1)}
    return sorted(((pid, c + bonus.get(pid, 0.0)) for pid, c in cosines.items()), key=lambda kv: -kv[1])
