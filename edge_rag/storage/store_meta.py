"""What both stores check in their meta before using it: the vectors' dimension and the encoder that made them; the
embedded store's record read whole and checked."""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..errors import REINDEX, StoreError
from .passage_kinds import KINDS_KEY, read_kinds
from .store_db import COUNTS, DB_FILE, INDEX_NAME, STORE_ID, UNREACHABLE


@dataclass(frozen=True)
class Committed:
    """A store's last commit as a new reader finds it (``PassageStore.check``), read without the search lock and
    without loading its index: what a health poll reports while a process loads it. ``loaded``: the version the
    process searches now (older: another process's commit, which its next search loads)."""

    identity: str
    version: int
    passages: int
    passage_kinds: frozenset[str]
    loaded: int

    @property
    def stamp(self) -> tuple[str, int]:  # as PassageStore's: what CertifiedPath.check_store reads
        return self.identity, self.version

    @classmethod
    def of(cls, meta: dict[str, str], passages: int, loaded: int | None = None) -> Committed:
        version = int(meta.get("version", 0))
        return cls(meta.get(STORE_ID, ""), version, passages, read_kinds(meta.get(KINDS_KEY)),
                   version if loaded is None else loaded)


def check_meta(meta: dict[str, str], dim: int, encoder_id: str, where: str, redo: str) -> None:
    """StoreError unless the store ``where`` holds ``dim``-d vectors of encoder ``encoder_id`` (or nothing yet);
    ``redo``: where to re-index instead."""
    if "dim" in meta and int(meta["dim"]) != dim:
        raise StoreError(f"store {where} holds {meta['dim']}-d vectors, the encoder makes {dim}-d")
    if encoder_id and meta.get("encoder") and meta["encoder"] != encoder_id:
        raise StoreError(f"store {where} was indexed with another encoder ({meta['encoder'][:12]}…); "
                         f"re-index into a new {redo}")


def read_meta(db: sqlite3.Connection, folder: Path) -> dict[str, str]:
    """The store's record (the meta table); StoreError if SQLite cannot read it (a damaged row that quick_check
    passes, such as a key that is no longer UTF-8), or if a value the store parses is not what a commit writes (a
    flipped bit in a count made int() fail with a bare ValueError at every open)."""
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.ProgrammingError:  # a closed connection is no damage to the file
        raise
    except sqlite3.Error as exc:
        raise StoreError(f"{folder / DB_FILE} is corrupt: its store record (meta) is unreadable ({exc}); "
                         f"{REINDEX}") from exc
    bad = next((k for k in COUNTS if k in meta and not (str(meta[k]).isascii() and str(meta[k]).isdigit())), None)
    if bad is None and not _labels(meta.get(UNREACHABLE, "[]")):
        bad = UNREACHABLE
    if bad is None and "index_file" in meta and not INDEX_NAME.fullmatch(meta["index_file"]):
        bad = "index_file"  # a file of this folder: a commit removes the one it replaces
    if bad is not None:
        raise StoreError(f"{folder / DB_FILE} is corrupt: its store record holds {bad} = {meta[bad][:40]!r}; {REINDEX}")
    return meta


def _labels(value: str) -> bool:
    """Whether ``value`` is what reachability.record writes: a JSON list of passage ids."""
    try:
        labels = json.loads(value)
    except (ValueError, RecursionError):
        return False
    return isinstance(labels, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in labels)
