"""Passage store: text and metadata in SQLite, vectors in an hnswlib index saved beside it.

``passages.sqlite`` holds documents, passages and a meta table (dimension, count, corpus version,
the encoder's hash, and the size and sha256 of the saved index). ``vectors.hnsw`` is written
atomically (temp, fsync, rename) before the SQLite transaction that records it commits, and on
open both must agree — the index file's size and hash, its count and its ids — or a StoreError says
what is wrong, instead of hnswlib reading a corrupt file or answers pointing at missing passages.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import hnswlib
import numpy as np

from .errors import StoreError
from .fileio import atomic_path, sha256_file
from .types import Document, Passage

DB_FILE = "passages.sqlite"
INDEX_FILE = "vectors.hnsw"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (doc_id TEXT PRIMARY KEY, title TEXT NOT NULL, source TEXT);
CREATE TABLE IF NOT EXISTS passages (
    id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL REFERENCES documents(doc_id),
    title TEXT NOT NULL, text TEXT NOT NULL, position INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS passages_doc ON passages(doc_id);
"""


class Store:
    """Open (or create) the store in ``folder`` for vectors of ``dim`` floats from encoder ``encoder_id``."""

    def __init__(
        self,
        folder: str | Path,
        dim: int,
        encoder_id: str = "",
        m: int = 16,
        ef_construction: int = 200,
        ef_search: int = 64,
    ) -> None:
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dim, self.m, self.ef_construction, self.ef_search = dim, m, ef_construction, ef_search
        try:
            self.db = sqlite3.connect(self.folder / DB_FILE, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.folder / DB_FILE} is not a readable SQLite database: {exc}") from exc
        meta = self._meta()
        if "dim" in meta and int(meta["dim"]) != dim:
            raise StoreError(f"store {self.folder} holds {meta['dim']}-d vectors, the encoder makes {dim}-d")
        if encoder_id and meta.get("encoder", encoder_id) != encoder_id:
            raise StoreError(
                f"store {self.folder} was indexed with another encoder ({meta['encoder'][:12]}…); "
                "re-index into a new folder"
            )
        self.encoder_id = encoder_id or meta.get("encoder", "")
        self.index = self._load_index(meta)

    # -- reading -------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]

    @property
    def version(self) -> int:
        """Bumped by every add; caches keyed on it go stale when documents change."""
        return int(self._meta().get("version", 0))

    def has_document(self, doc_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM documents WHERE doc_id=?", (doc_id,)).fetchone() is not None

    def search(self, vector: np.ndarray, k: int) -> list[Passage]:
        """Top-k passages by cosine similarity, best first, with ``score`` set."""
        k = min(k, self.count)
        if k <= 0:
            return []
        self.index.set_ef(max(self.ef_search, k))
        labels, dists = self.index.knn_query(vector.reshape(1, -1), k=k)
        scores = {int(i): 1.0 - float(d) for i, d in zip(labels[0], dists[0])}
        return [replace(p, score=scores[p.id]) for p in self.passages(list(scores))]

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        """Passages by id, in the order given."""
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            f"SELECT id, doc_id, title, text, position FROM passages WHERE id IN ({marks})", list(ids)
        ).fetchall()
        by_id = {r[0]: Passage(*r) for r in rows}
        return [by_id[i] for i in ids if i in by_id]

    # -- writing -------------------------------------------------------------------------------
    def add(self, documents: Sequence[Document], units: Sequence[Sequence[str]], vectors: np.ndarray,
            source: str = "") -> int:
        """Add documents, their passage texts (``units[i]`` for ``documents[i]``) and one vector per
        passage (in the same order). Returns the number of passages added."""
        n = sum(len(u) for u in units)
        if n != len(vectors):
            raise ValueError(f"{n} passages but {len(vectors)} vectors")
        if n == 0:
            return 0
        first = (self.db.execute("SELECT MAX(id) FROM passages").fetchone()[0] or -1) + 1
        ids = np.arange(first, first + n)
        rows, pid = [], first
        for doc, texts in zip(documents, units):
            for pos, text in enumerate(texts):
                rows.append((pid, doc.doc_id, doc.title, text, pos))
                pid += 1
        try:
            with self.db:  # one transaction: rolled back if saving the index fails
                self.db.executemany(
                    "INSERT INTO documents(doc_id, title, source) VALUES (?,?,?)",
                    [(d.doc_id, d.title, source) for d, u in zip(documents, units) if u],
                )
                self.db.executemany("INSERT INTO passages VALUES (?,?,?,?,?)", rows)
                if self.index.get_current_count() + n > self.index.get_max_elements():
                    self.index.resize_index(max(2 * self.index.get_max_elements(), self.index.get_current_count() + n))
                self.index.add_items(np.asarray(vectors, dtype=np.float32), ids)
                size, digest = self._save_index()
                self._set_meta(dim=self.dim, encoder=self.encoder_id, count=self.count,
                               version=self.version + 1, index_size=size, index_sha256=digest)
        except BaseException:
            self.index = self._load_index(self._meta())  # drop the in-memory additions
            raise
        return n

    def close(self) -> None:
        self.db.close()

    # -- internals -----------------------------------------------------------------------------
    def _meta(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT key, value FROM meta").fetchall())

    def _set_meta(self, **values: object) -> None:
        self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, str(v)) for k, v in values.items()])

    def _new_index(self, capacity: int = 1024) -> hnswlib.Index:
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.init_index(max_elements=capacity, M=self.m, ef_construction=self.ef_construction, random_seed=0)
        return index

    def _save_index(self) -> tuple[int, str]:
        path = self.folder / INDEX_FILE
        with atomic_path(path) as tmp:
            self.index.save_index(str(tmp))
            size, digest = tmp.stat().st_size, sha256_file(tmp)
        return size, digest

    def _load_index(self, meta: dict[str, str]) -> hnswlib.Index:
        path = self.folder / INDEX_FILE
        count = self.count
        if "index_sha256" not in meta:
            if count:
                raise StoreError(f"store {self.folder} has {count} passages but no index record; re-index")
            return self._new_index()
        if not path.is_file():
            raise StoreError(f"vector index {path} is missing; re-index the documents")
        if path.stat().st_size != int(meta["index_size"]) or sha256_file(path) != meta["index_sha256"]:
            raise StoreError(f"vector index {path} is corrupt or truncated (size/hash mismatch); re-index")
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.load_index(str(path), max_elements=max(count, 1))
        ids = set(index.get_ids_list())
        stored = {r[0] for r in self.db.execute("SELECT id FROM passages")}
        if ids != stored:
            raise StoreError(
                f"index {path} ({len(ids)} vectors) and {DB_FILE} ({len(stored)} passages) disagree; re-index"
            )
        return index
