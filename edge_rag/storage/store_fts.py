"""The embedded store's full-text search: BM25 over the passages' title, text and context in SQLite FTS5 (``store_db``
keeps the index in the passages' transactions), with the candidate budget of ``lexical.py``.

Full-text searches take no search lock: each runs on a read connection of its own, beside the question's dense
search (``retrieve.search``), and SQLite shows it the last commit.
"""
from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path

from ..retrieval.lexical import POSTINGS_BUDGET, Postings, candidate_terms, fts5_query, rarest
from .readonly import Reopened
from .store_db import CONTEXT_WEIGHT, DB_FILE, FTS_TABLE, TITLE_WEIGHT, second_connection

CONNECTIONS = 4  # full-text searches at once per store


class FullText:
    """Full-text searches of the store in ``folder``; each word's postings counted once per store version."""

    def __init__(self, folder: Path) -> None:
        self.readers = Readers(folder)
        self.postings = Postings()

    def search(self, terms: list[str], k: int, version: Hashable, budget: int = POSTINGS_BUDGET
               ) -> list[tuple[int, float]]:
        """Top-k passage ids by BM25 over title, text and context, best first, the BM25 score made higher-is-better,
        among the passages holding the rarest ``terms`` (``budget`` postings), scored by the MAX_TERMS rarest."""
        if not terms or k <= 0:
            return []
        with self.readers.connection() as db:
            terms, counts = rarest(terms, self.postings.of(terms, version, lambda missing: postings(db, missing)))
            return best_of([query(db, fts, k) for fts in fts_queries(terms, counts, budget)], k) if terms else []

    def close(self) -> None:
        self.readers.close()


class Readers:
    """Read-only connections for full-text searches, one per search at a time: they run beside dense searches
    (retrieve.py), and searches that share one SQLite connection take turns. At most CONNECTIONS are open (each
    holds up to 2 MB of page cache); a search beyond them waits for one, as every search did for the one before."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._idle: list[Reopened] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(CONNECTIONS)
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        with self._slots:
            with self._lock:
                db = self._idle.pop() if self._idle else None
            if db is None:
                db = Reopened(self.folder / DB_FILE, reader, reader)
            try:
                yield db.get()
            finally:
                with self._lock:
                    if not self._closed:
                        self._idle.append(db)
                        db = None
                if db is not None:  # the store closed meanwhile
                    db.db.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for db in self._idle:
                db.db.close()
            self._idle.clear()


def reader(folder: Path) -> sqlite3.Connection:
    """A full-text search's connection: it only reads."""
    db = second_connection(folder)
    db.execute("PRAGMA query_only=ON")
    return db


def postings(db: sqlite3.Connection, terms: Sequence[str]) -> list[int]:
    """How many passages hold each term (its FTS5 doclist, counted)."""
    sql = f"SELECT count(*) FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH ?"
    return [db.execute(sql, (fts5_query([t]),)).fetchone()[0] for t in terms]


def fts_queries(terms: list[str], counts: list[int], budget: int = POSTINGS_BUDGET) -> list[str]:
    """The FTS5 queries whose merged top k (``best_of``) is the top k by the BM25 of all ``terms`` among the
    passages holding the rarest (``budget`` of their postings ``counts``). FTS5 scores the phrases of its query
    only, so: rare AND common scores the candidates holding a common term in full; the rare terms alone score the
    others in full too (a term a passage lacks adds 0) and the rest lower. A passage's better score is its score,
    and the top k is exact: a passage holding no common term is left out of the rare query's k only by k passages
    that score more even so."""
    rare, common = candidate_terms(terms, counts, budget)
    return ([f"({fts5_query(rare)}) AND ({fts5_query(common)})"] if common else []) + [fts5_query(rare)]


def query(db: sqlite3.Connection, fts: str, k: int) -> list[tuple[int, float]]:
    """Top-k (passage id, BM25 over title, text and context) for an FTS5 query, best first; BM25 higher-is-better."""
    return [(int(i), -float(s)) for i, s in db.execute(
        f"SELECT rowid, bm25({FTS_TABLE}, {TITLE_WEIGHT}, 1.0, {CONTEXT_WEIGHT}) AS s FROM {FTS_TABLE} "
        f"WHERE {FTS_TABLE} MATCH ? "
        "ORDER BY s, rowid LIMIT ?", (fts, k))]


def best_of(lists: list[list[tuple[int, float]]], k: int) -> list[tuple[int, float]]:
    """The top k of ranked (id, score) lists, each id at its best score; ties by id."""
    best: dict[int, float] = {}
    for i, s in (hit for hits in lists for hit in hits):
        best[i] = max(s, best.get(i, s))
    return sorted(best.items(), key=lambda hit: (-hit[1], hit[0]))[:k]
