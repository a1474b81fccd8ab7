"""The passage store the pipeline talks to, and which backend a ``--db`` value opens.

Two backends keep the same contract: the embedded store (``store.py``: SQLite + an hnswlib file in a
folder, the default) and PostgreSQL with pgvector (``pgstore.py``) for a fleet of devices sharing one
corpus, or a corpus larger than a device's memory budget. ``--db kiosk-db`` opens a folder,
``--db postgresql://user@host/dbname`` a database. Both refuse vectors from another encoder, add a
batch in one transaction (a crash mid-batch leaves no half-added document) and let one writer at a time.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .dburl import is_remote
from .types import Document, Passage

if TYPE_CHECKING:
    from .config import Config

class PassageStore(Protocol):
    """What ``EdgeRAG`` needs from a store."""

    @property
    def count(self) -> int: ...

    @property
    def version(self) -> int:
        """Bumped by every change; caches keyed on it go stale when documents change."""
        ...

    def has_document(self, doc_id: str) -> bool: ...

    def search(self, vector: np.ndarray, k: int) -> list[Passage]:
        """Top-k passages by cosine similarity, best first, with ``score`` set."""
        ...

    def passages(self, ids: Sequence[int]) -> list[Passage]:
        """Passages by id, in the order given."""
        ...

    def add(self, documents: Sequence[Document], units: Sequence[Sequence[str]], vectors: np.ndarray,
            source: str = "") -> int:
        """Add documents with their passage texts and one vector per passage, all or nothing."""
        ...

    def remove(self, doc_ids: Sequence[str]) -> int:
        """Remove documents and their passages, all or nothing; returns the passages removed."""
        ...

    def writing(self) -> AbstractContextManager[None]:
        """Hold the store's one-writer lock for a whole indexing run (reentrant)."""
        ...

    def close(self) -> None: ...


def open_store(db: str | Path, dim: int, encoder_id: str, config: Config) -> PassageStore:
    """The store ``db`` names: a PostgreSQL URL opens pgvector, anything else the embedded folder store."""
    if is_remote(db):
        from .pgstore import PgStore

        return PgStore(str(db), dim, encoder_id, config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search)
    from .store import Store

    return Store(db, dim, encoder_id, config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search)
