"""Loading the last commit whole while another process may be committing the next one.

A writer commits a new index file's name with its passages in one transaction, then removes the previous file
(store.py). A reader therefore reads the store's record, its passage ids and its deleted ids in one read transaction:
a WAL snapshot, taken without waiting for the writer, in which all of them are of one commit, and the file that commit
names holds exactly its vectors (every commit saves under a new name). Read one statement at a time, they mixed two
commits ('... disagree; re-index'). A newer commit may still land meanwhile and remove the file the snapshot names:
the reader then loads again from a fresh snapshot. A failure while the store's version stays put is damage.
"""
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import hnswlib

from ..errors import REINDEX, StoreError
from . import hnsw, reachability
from .readonly import uri
from .store_db import DB_FILE, STORE_ID
from .store_meta import Committed, read_meta

LEGACY_INDEX_FILE = "vectors.hnsw"  # the single index file of stores written before the commit order
LOAD_TRIES = 10  # snapshots tried while commits keep removing the file just read (each retry: a newer commit landed)


Loaded = tuple[hnswlib.Index, str | None, int, reachability.Exact]  # a commit's index, file name, version, misses


def load_committed(db: sqlite3.Connection, folder: Path, dim: int, m: int, ef_construction: int,
                   admit: Callable[[int], None] | None = None) -> Loaded:
    """The last commit's index, its file name, the store version and the passages the index does not reach, all of
    one commit; StoreError if the store is damaged, or if commits kept landing for LOAD_TRIES loads in a row. ``admit``
    is told the commit's passage count before its index is read, and may refuse it by raising (the memory plan of the
    process loading it)."""
    for _ in range(LOAD_TRIES):
        with _snapshot(db):
            meta = read_meta(db, folder)
            name = index_name(meta)
            if admit is not None:
                admit(db.execute("SELECT COUNT(*) FROM passages").fetchone()[0])
            try:
                index = load_index(db, folder, name, meta, dim, m, ef_construction)
                return index, name, int(meta.get("version", 0)), reachability.Exact.recorded(index, meta)
            except StoreError as exc:
                error = exc
        if read_meta(db, folder).get("version") == meta.get("version"):
            raise error  # no newer commit: the one read is damaged
    raise StoreError(f"store {folder} keeps changing under this reader; try again")


def index_name(meta: dict[str, str]) -> str | None:
    """The index file the commit of ``meta`` names (None: no commit yet)."""
    return meta.get("index_file", LEGACY_INDEX_FILE if "index_sha256" in meta else None)


def check_on_disk(folder: Path, identity: str, loaded: int) -> Committed:
    """The last commit as a new reader of ``folder`` finds it (the asking process searches version ``loaded``);
    StoreError unless that is the store of identity ``identity``, whole as far as its record shows: the database
    readable (not removed, overwritten or truncated: SQLite checks its header and size), its record, and the index
    file the last commit names at the size it recorded. A running store reads its pages
    through its own connection's cache and its index from memory: damage to the files shows only to the next reader
    (another process, the next start). Bounded: the record, its passage count and a stat, no hash and no load
    (a health poll's check); quick_check at open reads every page."""
    meta, passages = _fresh(folder)
    if meta.get(STORE_ID, "") != identity:
        raise StoreError(f"{folder / DB_FILE} is another store's since this one opened it (made again there): "
                         "restart to answer from it")
    if (name := index_name(meta)) is None:
        return Committed.of(meta, passages, loaded)
    path = folder / name
    try:
        size: int | None = path.stat().st_size
    except FileNotFoundError:
        size = None
    # whole, or another process committed meanwhile (it removed the file read): the next check reads its
    if size == int(meta["index_size"]) or _fresh(folder)[0].get("version") != meta.get("version"):
        return Committed.of(meta, passages, loaded)
    found = "is missing" if size is None else f"holds {size:,} bytes"
    raise StoreError(f"index {path} {found}, its commit recorded {int(meta['index_size']):,}; {REINDEX}")


def _fresh(folder: Path) -> tuple[dict[str, str], int]:
    """The store's record and passage count, of one commit, as a new read-only connection reads them (none is made
    if the file is gone)."""
    path = folder / DB_FILE
    try:
        db = sqlite3.connect(uri(path, "ro"), uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{path} cannot be opened ({exc}): it was removed or made unreadable; {REINDEX}") from exc
    try:
        with _snapshot(db):
            return read_meta(db, folder), db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]
    finally:
        db.close()


@contextlib.contextmanager
def _snapshot(db: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: its first read fixes the commit every later one sees (WAL; no writer is waited for)."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.rollback()  # it only read


def load_index(db: sqlite3.Connection, folder: Path, name: str | None, meta: dict[str, str], dim: int, m: int,
               ef_construction: int) -> hnswlib.Index:
    """The committed index file ``name`` in ``folder`` (None: none yet, an empty index), checked against the
    passages (read in the caller's snapshot): its live labels are exactly their ids. A commit marks its removals
    deleted after it saved its file (``Store._commit``), so they are marked here, from the ``deleted`` table."""
    count = db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]
    if name is None:
        if count:
            raise StoreError(f"store {folder} has {count} passages but no index record; {REINDEX}")
        return hnsw.new(dim, m, ef_construction)
    path = folder / name
    index = hnsw.load(path, dim, int(meta["index_size"]), meta["index_sha256"])
    deleted = {r[0] for r in db.execute("SELECT id FROM deleted")}
    labels = set(index.get_ids_list())
    for label in labels & deleted:
        with contextlib.suppress(RuntimeError):  # marked in the file already
            index.mark_deleted(label)
    live = labels - deleted
    stored = {r[0] for r in db.execute("SELECT id FROM passages")}
    if live != stored:
        raise StoreError(f"index {path} ({len(live)} vectors) and {DB_FILE} ({len(stored)} passages) disagree; "
                         f"{REINDEX}")
    return index
