"""``edge-rag doctor``: does the store's approximate search still find what exact search finds?

HNSW recall falls as a corpus grows, and falls hard after a bulk load of near-duplicate text (issue #26).
``check_recall`` takes a seeded sample of the stored vectors as queries, runs the store's own ``search``
and an exact (brute-force) search for each, and reports recall@k: the share of the exact top k that the
store returned. Below ``RECALL_FLOOR`` it warns. Works on both stores: the exact side reads the vectors
from the hnswlib index (embedded) or scans the table without its index (pgvector).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from . import hnsw
from .stores import PassageStore

RECALL_FLOOR = 0.95
SAMPLE = 100
K = 10

Exact = Callable[[np.ndarray, int], list[int]]


@dataclass(frozen=True)
class RecallReport:
    """recall@k of ``queries`` sampled vectors against exact search, and what the searches cost."""

    passages: int
    queries: int
    k: int
    ef_search: int  # the breadth the store searched with (hnsw.ef_for its size)
    recall: float
    worst: float  # the lowest recall of one query
    search_ms_p50: float
    exact_ms_p50: float

    @property
    def ok(self) -> bool:
        return self.recall >= RECALL_FLOOR

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok, "floor": RECALL_FLOOR}

    def summary(self) -> str:
        verdict = "ok" if self.ok else f"WARNING: below {RECALL_FLOOR:.2f}"
        return (f"recall@{self.k} {self.recall:.3f} against exact search over {self.queries} stored vectors "
                f"(worst query {self.worst:.1f}; {self.passages} passages, ef_search {self.ef_search}; "
                f"search p50 {self.search_ms_p50:.2f} ms, exact {self.exact_ms_p50:.1f} ms): {verdict}")


def check_recall(store: PassageStore, sample: int = SAMPLE, k: int = K, seed: int = 0) -> RecallReport:
    """recall@k of ``store.search`` on ``sample`` of its own vectors (seeded), against exact search."""
    queries, exact = _probe(store, sample, seed)
    recalls, search_ms, exact_ms = [], [], []
    for vector in queries:
        t = time.perf_counter()
        found = {p.id for p in store.search(vector, k)}
        search_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        truth = exact(vector, k)
        exact_ms.append((time.perf_counter() - t) * 1000)
        recalls.append(len(found & set(truth)) / max(len(truth), 1))
    count = store.count
    return RecallReport(count, len(queries), k, hnsw.ef_for(count, k, getattr(store, "ef_search", 0)),
                        float(np.mean(recalls)) if recalls else 1.0, min(recalls, default=1.0),
                        statistics.median(search_ms) if search_ms else 0.0,
                        statistics.median(exact_ms) if exact_ms else 0.0)


def _probe(store: PassageStore, sample: int, seed: int) -> tuple[list[np.ndarray], Exact]:
    """Query vectors sampled from the store, and its exact search."""
    from .store import Store

    if isinstance(store, Store):
        return _embedded(store, sample, seed)
    return _postgres(store, sample, seed)


def _embedded(store, sample: int, seed: int) -> tuple[list[np.ndarray], Exact]:
    """The live vectors read back from the hnswlib index; exact = dot products (they are unit vectors)."""
    with store._lock:
        ids = np.array([r[0] for r in store.db.execute("SELECT id FROM passages ORDER BY id")], dtype=np.int64)
        vectors = np.asarray(store.index.get_items(ids), dtype=np.float32) if len(ids) else np.zeros((0, store.dim))
    picks = np.random.default_rng(seed).choice(len(ids), min(sample, len(ids)), replace=False)

    def exact(vector: np.ndarray, k: int) -> list[int]:
        scores = vectors @ vector
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        return [int(i) for i in ids[top]]

    return [vectors[i] for i in picks], exact


def _postgres(store, sample: int, seed: int) -> tuple[list[np.ndarray], Exact]:
    """A seeded sample of stored embeddings; exact = the same ORDER BY with index scans off (a full scan)."""
    from .pgsql import PASSAGES

    with store._errors("cannot check"), store.pool.connection() as conn, conn.transaction():
        conn.execute("SELECT setseed(%s)", (seed / 2**31,))
        rows = conn.execute(f"SELECT embedding FROM {PASSAGES} ORDER BY random() LIMIT %s", (sample,)).fetchall()

    def exact(vector: np.ndarray, k: int) -> list[int]:
        with store._errors("cannot check"), store.pool.connection() as conn, conn.transaction():
            conn.execute("SET LOCAL enable_indexscan = off")
            found = conn.execute(f"SELECT id FROM {PASSAGES} ORDER BY embedding <=> %s LIMIT %s",
                                 (np.asarray(vector, np.float32), k)).fetchall()
        return [int(r[0]) for r in found]

    return [np.asarray(r[0].to_numpy(), dtype=np.float32) for r in rows], exact
