"""Passages the vector search cannot reach: searched with its own vector, a passage not in its top k.

HNSW finds a vector only along links from the graph's entry point. After a bulk load of near-duplicate text (issue
#43: the sample corpus + 26,001 templated sentences) the links between the museum's passages and the duplicates'
cluster are pruned to a few, and some passages were returned for no query at all, not even their own vector (39 of
the museum's 468 in the issue's build; 18 of them and one duplicate in one here, pgvector 4-24; ef 366). Graph
parameters (M, ef_construction) are inputs of the shipped calibration, so they stay: the embedded store finds such
passages at every commit (``sweep``), pgvector at the end of every indexing run (``record_pg``), and both search them
exactly beside the graph; ``edge-rag doctor`` counts what is still missed (``doctor.unreachable``).
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import hnswlib
import numpy as np

from . import hnsw
from .store_db import UNREACHABLE as KEY  # the labels a commit found unreachable (a JSON list)

K = 10  # a passage is reachable when its own vector's top K holds it (exact duplicates share the top places)
CHUNK = 256  # self-searches per hold of the search lock (~0.1 s at 25k passages): questions go between chunks
FIRST_EF = 16  # the cheap first pass: what it finds is reachable at any larger ef; the rest is searched again


def sweep(index: hnswlib.Index, labels: Sequence[int], ef_search: int, lock: Callable[[], AbstractContextManager],
          k: int = K) -> list[int]:
    """The ``labels`` their own vector does not find in ``index`` at the breadth questions get (``hnsw.ef_for``):
    a pass at FIRST_EF, then the misses at full breadth (~6x cheaper than all at full breadth). hnswlib may not
    search while it inserts: each chunk holds ``lock()``."""
    ef = hnsw.ef_for(index.get_current_count(), k, ef_search)
    todo, k = np.asarray(labels, dtype=np.int64), min(k, len(labels))
    for width in (min(FIRST_EF, ef), ef):
        missed = []
        for at in range(0, len(todo), CHUNK):
            chunk = todo[at:at + CHUNK]
            with lock():
                found = hnsw.knn_many(index, index.get_items(chunk, return_type="numpy"), k, width)
            missed.append(chunk[~(found == chunk[:, None]).any(axis=1)])
        todo = np.concatenate(missed) if missed else todo[:0]
    return [int(i) for i in todo]


def record(labels: Sequence[int]) -> dict[str, str]:
    """The meta entry that records ``labels`` as unreachable, committed with the index they were found in."""
    return {KEY: json.dumps(sorted(labels))}


def recorded(meta: dict[str, str]) -> list[int]:
    """The labels ``record`` recorded in a store's meta (none in a store from before the record)."""
    return json.loads(meta.get(KEY, "[]"))


def record_pg(store) -> list[int]:
    """``sweep_pg``, recorded for searches on every device to search exactly (PgStore.writing runs it at the end of a
    run that changed the store; run it after rebuilding the index by hand)."""
    found = sweep_pg(store)
    with store._errors("cannot record"), store._connection(write=True) as conn, conn.transaction():
        store._lock(conn)
        store._set_meta(conn, **record(found))
    store.recount()
    return found


def sweep_pg(store, k: int = K) -> list[int]:
    """``sweep`` on pgvector: every passage's own top k through the HNSW index on the server, a pass at FIRST_EF,
    then the misses at the breadth ``search`` uses."""
    from .pgsql import UNREACHABLE

    def misses(ids: list[int] | None, ef: int) -> list[int]:
        """Those of ``ids`` (None: every passage) not in their own top k at breadth ``ef``."""
        with store._errors("cannot check"), store.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(max(ef, k)),))
            return [int(r[0]) for r in conn.execute(UNREACHABLE, {"ids": ids, "k": k})]

    return misses(misses(None, FIRST_EF), hnsw.ef_for(store.count, k, store.ef_search))


def misses(store, k: int = K) -> dict[int, np.ndarray]:
    """``Store.graph_misses``: ``sweep`` over every passage of the embedded ``store``, with their vectors."""
    with store._lock:
        ids = [r[0] for r in store.db.execute("SELECT id FROM passages ORDER BY id")]
    found = sweep(store.index, ids, store.ef_search, lambda: store._lock, k)
    with store._lock:
        return {i: store.index.get_items([i], return_type="numpy")[0] for i in found}


def misses_pg(store, k: int = K) -> dict[int, np.ndarray]:
    """``PgStore.graph_misses``: ``sweep_pg``, with the passages' vectors."""
    from .pgsql import PASSAGES

    found = sweep_pg(store, k)
    with store._errors("cannot check"), store.pool.connection() as conn:
        rows = conn.execute(f"SELECT id, embedding FROM {PASSAGES} WHERE id = ANY(%s)", (found,)).fetchall()
    return {int(i): e.to_numpy() for i, e in rows}


class Exact:
    """The passages the graph does not reach (``sweep``), searched exactly beside it: their labels and vectors
    (unit length, as hnswlib keeps them for cosine), one row per distinct vector: a passage repeated verbatim (a footer
    on every page) is unreachable in every copy beyond the K a search returns, and a row each held 10 MB at 30k
    passages with 10% repeated, unpriced by the plan. A label removed since is left out."""

    @classmethod
    def recorded(cls, index: hnswlib.Index, meta: dict[str, str]) -> Exact:
        """The ones recorded in the store's ``meta`` (none in a store from before the record)."""
        return cls(index, recorded(meta))

    def __init__(self, index: hnswlib.Index, labels: Sequence[int]) -> None:
        kept, rows, distinct = [], [], dict[bytes, int]()
        for label in labels:
            with contextlib.suppress(RuntimeError):  # "Label not found": deleted
                vector = np.asarray(index.get_items([label], return_type="numpy")[0], dtype=np.float32).tobytes()
                rows.append(distinct.setdefault(vector, len(distinct)))
                kept.append(int(label))
        self.labels, self.rows = np.asarray(kept, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        self.vectors = np.frombuffer(b"".join(distinct), dtype=np.float32).reshape(-1, index.dim)

    def search(self, index: hnswlib.Index, query: np.ndarray, k: int, ef_search: int,
               below: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k labels and cosine distances: the graph's (``hnsw.knn``, of labels under ``below``) and these
        passages' exact ones, the best k of both (ties: the graph's first, then these in order)."""
        labels, dists = hnsw.knn(index, query.reshape(1, -1).astype(np.float32), k, ef_search, below=below)
        if not len(self.labels):
            return labels, dists
        q = query.reshape(-1) / max(float(np.linalg.norm(query)), 1e-12)
        new = ~np.isin(self.labels, labels.astype(np.int64))
        found = np.concatenate([labels.astype(np.int64), self.labels[new]])
        far = np.concatenate([dists, (1.0 - self.vectors @ q)[self.rows][new]])
        best = np.argsort(far, kind="stable")[:k]
        return found[best], far[best].astype(np.float32)
