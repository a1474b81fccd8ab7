"""The passage store the pipeline talks to, and which backend a ``--db`` value opens.

Two backends keep the same contract, each with a vector index and a full-text index written in the same
commit: the embedded store (``store.py``: SQLite with FTS5 + an hnswlib file in a folder, the default) and PostgreSQL with pgvector (``pgstore.py``) for a fleet of devices sharing one
corpus, or a corpus larger than a device's memory budget. ``--db kiosk-db`` opens a folder,
``--db postgresql://user@host/dbname`` a database. Both refuse vectors from another encoder, commit a
batch in one transaction (a crash mid-batch leaves the last committed state), record each document's
content hash and whether all its passages are in (``DocumentState``), and let one writer at a time.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import StoreError
from ..retrieval.lexical import POSTINGS_BUDGET
from ..types import Passage
from .dburl import is_remote
from .passage_kinds import kind_of
from .store_db import DocumentState, Part
from .store_meta import Committed

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["DocumentState", "Part", "PassageStore", "open_store"]


class Stamped(Protocol):
    """What a certificate's check of the store reads (CertifiedPath.check_store): a PassageStore, or its last commit
    as ``check`` found it (a health poll's, which loads no index)."""

    @property
    def stamp(self) -> tuple[str, int]: ...

    @property
    def passage_kinds(self) -> frozenset[str]: ...


class PassageStore(Protocol):
    """What ``EdgeRAG`` and ``indexing`` need from a store."""

    commit_growth: float  # indexing commits in steps of this share of the store (indexing.commit_step)

    @property
    def location(self) -> str:
        """The store as messages name it: a folder, or a URL with its password masked."""
        ...

    @property
    def count(self) -> int: ...

    @property
    def passage_kinds(self) -> frozenset[str]:
        """The kinds of the passages committed since the store recorded them (passage_kinds.py; empty: none,
        unrecorded or unknown)."""
        ...

    @property
    def version(self) -> int:
        """Bumped by every commit; caches keyed on it go stale when documents change."""
        ...

    @property
    def stamp(self) -> tuple[str, int]:
        """The store's identity (made with it: store_db.STORE_ID) and its version, read together: what caches key
        on. A store dropped and made again at the same place restarts its versions, under another identity."""
        ...

    def check(self) -> Committed:
        """The last commit as a new reader finds it, read without the search lock or loading the index; StoreError
        if the store cannot be read so (its files removed, overwritten, truncated or made again since it opened; the
        database unreachable): bounded, for a health poll."""
        ...

    def has_document(self, doc_id: str) -> bool: ...

    def document(self, doc_id: str) -> DocumentState | None: ...

    def documents_from(self, source: str) -> list[str]:
        """Ids of the documents indexed from ``source`` (a file path)."""
        ...

    def titles(self, limit: int) -> list[str]:
        """Up to ``limit`` non-empty document titles, in the order the documents were first stored."""
        ...

    def search(self, vector: np.ndarray, k: int) -> list[Passage]:
        """Top-k passages by cosine similarity, best first, with ``score`` set."""
        ...

    def search_text(self, terms: Sequence[str], k: int, budget: int = POSTINGS_BUDGET) -> list[tuple[int, float]]:
        """Top-k (passage id, full-text score) among the passages holding the rarest of ``terms`` (``budget``
        postings), scored by all of them, best first (lexical.py)."""
        ...

    def scored(self, vector: np.ndarray, ids: Sequence[int]) -> list[Passage]:
        """Passages by id, in the order given, each with the exact cosine of its stored vector to the query as
        ``score`` (the lexical hits dense search missed); an id without a vector here is left out."""
        ...

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        """Passages by id, in the order given."""
        ...

    def graph_misses(self, k: int) -> dict[int, np.ndarray]:
        """The passages the vector index's graph does not return in their own vector's top ``k``, with that vector
        (reachability.py; ``search`` also searches the recorded ones exactly: doctor.unreachable checks it)."""
        ...

    def add(self, parts: Sequence[Part], vectors: np.ndarray, remove: Sequence[str] = ()) -> int:
        """Commit ``parts`` (one vector per passage text) and remove documents ``remove``, all or nothing."""
        ...

    def remove(self, doc_ids: Sequence[str]) -> int:
        """Remove documents and their passages, all or nothing; returns the passages removed."""
        ...

    def writing(self, wait: bool = True) -> AbstractContextManager[None]:
        """Hold the store's one-writer lock for a whole indexing run (reentrant); not ``wait``: a StoreError at once
        if another thread or process is writing."""
        ...

    def close(self) -> None: ...


def open_store(db: str | Path, dim: int, encoder_id: str, config: Config, create: bool = True,
               lock_timeout: float = 0.0) -> PassageStore:
    """The store ``db`` names: a PostgreSQL URL opens pgvector, anything else the embedded folder store.
    ``create=False`` refuses a ``db`` that holds no store; ``lock_timeout``: how long a writer waits. The
    passages this store adds are recorded as of ``config``'s kind (passage_kinds.kind_of)."""
    if os.fspath(db) == "":  # Path("") is ".": the store would be made in the working folder
        raise StoreError("no store named: db is empty; name a folder, or postgresql://user@host/dbname")
    args = (dim, encoder_id, config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search)
    if is_remote(db):
        from .pgstore import PgStore

        return PgStore(str(db), *args, create=create, lock_timeout=lock_timeout, passage_kind=kind_of(config))
    from .store import Store

    return Store(db, *args, create=create, lock_timeout=lock_timeout, passage_kind=kind_of(config))
