"""``edge-rag doctor``: does the store's approximate search still find what exact search finds?

HNSW recall falls as a corpus grows, and falls hard after a bulk load of near-duplicate text (issue #26).
``check_recall`` takes a seeded sample of the stored vectors as queries, runs the store's own ``search``
and an exact (brute-force) search for each, and reports recall@k: the share of the exact top k that the
store returned. A mean hides a passage the graph cannot reach (issue #43: mean 0.990, worst query 0.0,
39 passages no question could find), so it also judges the worst query (``WORST_FLOOR``) and, with
``reach``, searches every passage with its own vector: one not in its own top k is unreachable, and one is
too many. Works on both stores: the exact side reads the vectors from the hnswlib index (embedded) or scans
the table without its index, every query in one pass (pgvector).

The embedded store's vectors are read ``CHUNK`` at a time, each chunk scored against every query at once: hnswlib's
``get_items`` builds a Python float per component with the GIL held, so reading all 26k vectors at once took
~0.5 GB and stalled every other thread of the server for seconds (issue #43); a chunk is ~4 MB and milliseconds.
On the embedded store it also runs FTS5's integrity check of the full-text index against the passages: bit rot in its
pages passes the quick_check made at every open, and full-text searches would return other passages.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from . import hnsw, store_db, store_fts_index
from .readonly import writable
from .stores import PassageStore

RECALL_FLOOR = 0.95
WORST_FLOOR = 0.5  # one query that misses half its exact top k: a region of the graph search does not reach
SAMPLE = 100
K = 10
CHUNK = 256  # vectors read from the hnswlib index per hold of the store's lock
OUT_OF_LINE = ("vectors stored outside their rows (a store written before edge-rag kept them in the row), so every "
               "search scans the whole table: run `VACUUM FULL edge_rag_passages` once, at a quiet time (it locks "
               "the table while it rewrites it and rebuilds its indexes)")
FULL_TEXT_DAMAGED = ("the full-text index disagrees with the passages (FTS5 integrity-check: damaged pages), so "
                     "full-text searches return wrong passages: re-index, or rebuild it from the passages with "
                     f"`sqlite3 passages.sqlite \"INSERT INTO {store_fts_index.FTS_TABLE}({store_fts_index.FTS_TABLE}) "
                     "VALUES('rebuild')\"` while nothing writes the store")

Exact = Callable[[np.ndarray, int], list[list[int]]]  # (queries, k) → each query's exact top-k ids


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
    exact_ms: float  # per query, the whole exact pass divided by the queries
    unreachable: int | None = None  # passages not in their own vector's top k (None: not checked)
    out_of_line: bool | None = None  # pgvector: vectors outside their rows, so every search scans the table
    full_text_damaged: bool | None = None  # embedded: the full-text index fails FTS5's integrity check

    @property
    def misses(self) -> bool:
        """Whether search misses what exact search finds: low recall, a query far below it, unreachable passages."""
        return self.recall < RECALL_FLOOR or self.worst < WORST_FLOOR or bool(self.unreachable)

    @property
    def ok(self) -> bool:
        return not self.misses and not self.out_of_line and not self.full_text_damaged

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok, "floor": RECALL_FLOOR, "worst_floor": WORST_FLOOR}

    def summary(self) -> str:
        faults = [f"recall below {RECALL_FLOOR:.2f}"] if self.recall < RECALL_FLOOR else []
        faults += [f"a query below {WORST_FLOOR:.1f}"] if self.worst < WORST_FLOOR else []
        faults += [f"{self.unreachable} passages unreachable"] if self.unreachable else []
        faults += [OUT_OF_LINE] if self.out_of_line else []
        faults += [FULL_TEXT_DAMAGED] if self.full_text_damaged else []
        reach = "" if self.unreachable is None else f"; {self.unreachable} unreachable by their own vector"
        return (f"recall@{self.k} {self.recall:.3f} against exact search over {self.queries} stored vectors "
                f"(worst query {self.worst:.1f}; {self.passages} passages{reach}, ef_search {self.ef_search}; "
                f"search p50 {self.search_ms_p50:.2f} ms, exact {self.exact_ms:.1f} ms a query): "
                + ("ok" if self.ok else "WARNING: " + ", ".join(faults)))


def check_recall(store: PassageStore, sample: int = SAMPLE, k: int = K, seed: int = 0,
                 reach: bool = False) -> RecallReport:
    """recall@k of ``store.search`` on ``sample`` of its own vectors (seeded), against exact search; with
    ``reach``, also how many passages their own vector does not find (``unreachable``: every passage searched,
    seconds per 10k)."""
    queries, exact = _probe(store, sample, seed)
    t = time.perf_counter()
    truths = exact(queries, k) if len(queries) else []
    exact_ms = (time.perf_counter() - t) * 1000 / max(len(queries), 1)
    recalls, search_ms = [], []
    for vector, truth in zip(queries, truths):
        t = time.perf_counter()
        found = {p.id for p in store.search(vector, k)}
        search_ms.append((time.perf_counter() - t) * 1000)
        recalls.append(len(found & set(truth)) / max(len(truth), 1))
    count = store.count
    return RecallReport(count, len(queries), k, hnsw.ef_for(count, k, getattr(store, "ef_search", 0)),
                        float(np.mean(recalls)) if recalls else 1.0, min(recalls, default=1.0),
                        statistics.median(search_ms) if search_ms else 0.0,
                        exact_ms,
                        len(unreachable(store, k)) if reach else None,
                        _out_of_line(store, count), _full_text_damaged(store))


def unreachable(store: PassageStore, k: int = K) -> list[int]:
    """Ids of the passages ``store.search`` does not return for their own vector: the graph's misses
    (``reachability.sweep``, on pgvector ``sweep_pg``), searched again the way questions are (with the exact half)."""
    misses = store.graph_misses(k)
    return [i for i, v in misses.items() if i not in {p.id for p in store.search(np.asarray(v, np.float32), k)}]


def _probe(store: PassageStore, sample: int, seed: int) -> tuple[np.ndarray, Exact]:
    """Query vectors sampled from the store (one a row), and its exact search."""
    from .store import Store

    if isinstance(store, Store):
        return _embedded(store, sample, seed)
    return _postgres(store, sample, seed)


def _embedded(store, sample: int, seed: int) -> tuple[np.ndarray, Exact]:
    """Sampled vectors read back from the hnswlib index; exact = dot products (they are unit vectors) against every
    stored vector, read CHUNK at a time (ids and vectors in one hold of the lock: a commit may land in between)."""
    with store._lock:
        ids = np.array([r[0] for r in store.db.execute("SELECT id FROM passages ORDER BY id")], dtype=np.int64)
        picks = np.sort(np.random.default_rng(seed).choice(len(ids), min(sample, len(ids)), replace=False))
        queries = _items(store, ids[picks])

    def exact(queries: np.ndarray, k: int) -> list[list[int]]:
        best = np.full((len(queries), 0), -1, dtype=np.int64)
        best_scores = np.zeros((len(queries), 0), dtype=np.float32)
        after = -1
        while True:
            with store._lock:
                chunk = np.array([r[0] for r in store.db.execute(
                    "SELECT id FROM passages WHERE id > ? ORDER BY id LIMIT ?", (after, CHUNK))], dtype=np.int64)
                vectors = _items(store, chunk)
            if not len(chunk):
                return [[int(i) for i in row] for row in best]
            after = int(chunk[-1])
            scores = np.hstack([best_scores, queries @ vectors.T])
            labels = np.hstack([best, np.broadcast_to(chunk, (len(queries), len(chunk)))])
            top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            best, best_scores = np.take_along_axis(labels, top, 1), np.take_along_axis(scores, top, 1)

    return queries, exact


def _items(store, ids: np.ndarray) -> np.ndarray:
    """The vectors of ``ids`` from the store's index (the caller holds its lock), one a row."""
    if not len(ids):
        return np.zeros((0, store.dim), dtype=np.float32)
    return np.asarray(store.index.get_items(ids), dtype=np.float32)


def _out_of_line(store, count: int) -> bool | None:
    """pgvector: whether the ``count`` vectors sit outside their rows (pgsql.vectors_out_of_line); None for the
    embedded store."""
    from .store import Store

    if isinstance(store, Store):
        return None
    from .pgsql import vectors_out_of_line

    with store._errors("cannot check"), store.pool.connection() as conn:
        return vectors_out_of_line(conn, count, store.dim)


def _full_text_damaged(store) -> bool | None:
    """The embedded store: whether its full-text index fails FTS5's integrity check (store_fts_index.damaged), on a
    connection of its own; None for pgvector, and in a folder this process may not write (the check is an INSERT)."""
    from .store import Store

    if not isinstance(store, Store) or not writable(store.folder):
        return None
    db = store_db.second_connection(store.folder)
    try:
        return store_fts_index.damaged(db)
    finally:
        db.close()


def _postgres(store, sample: int, seed: int) -> tuple[np.ndarray, Exact]:
    """A seeded sample of stored embeddings; exact = every query's top k by the same distance without the index, all
    queries in one statement per pgsql.EXACT_SPAN ids (pgsql.EXACT), the spans' best merged here."""
    from .pgsql import EXACT, EXACT_SPAN, PASSAGES

    with store._errors("cannot check"), store.pool.connection() as conn, conn.transaction():
        conn.execute("SELECT setseed(%s)", (seed / 2**31,))
        rows = conn.execute(f"SELECT embedding FROM {PASSAGES} ORDER BY random() LIMIT %s", (sample,)).fetchall()

    def exact(queries: np.ndarray, k: int) -> list[list[int]]:
        found: list[list[tuple[float, int]]] = [[] for _ in queries]
        with store._errors("cannot check"), store.pool.connection() as conn, conn.transaction():
            lo, hi = conn.execute(f"SELECT coalesce(min(id), 0), coalesce(max(id), -1) FROM {PASSAGES}").fetchone()
            for at in range(int(lo), int(hi) + 1, EXACT_SPAN):
                params = {"lo": at, "hi": at + EXACT_SPAN, "k": k, "q": [np.asarray(v, np.float32) for v in queries]}
                for i, pid, dist in conn.execute(EXACT, params):
                    found[i - 1].append((float(dist), int(pid)))
        return [[pid for _, pid in sorted(best)[:k]] for best in found]

    vectors = [np.asarray(r[0].to_numpy(), dtype=np.float32) for r in rows]
    return np.array(vectors, dtype=np.float32).reshape(len(vectors), store.dim), exact
