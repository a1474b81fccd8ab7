"""The store's SQLite file: schema, durable settings and the checks made when it opens.

A lost or emptied database beside an existing index is an error, never a silent new store, and
``PRAGMA quick_check`` runs at every open so a damaged page is reported before any answer uses it.
"""
from __future__ import annotations

import re
import sqlite3
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from ..errors import REINDEX, StoreError, full_disk_is_an_error
from ..types import Document
from . import hnsw, store_fts_index
from .readonly import check_current, uri, writable
from .store_fts_index import FTS_DDL, FTS_TABLE, FTS_TRIGGERS

DB_FILE = "passages.sqlite"
INDEX_GLOB = "vectors*.hnsw"
INDEX_NAME = re.compile(r"vectors\.[0-9]+\.[0-9a-f]+\.hnsw")  # what a commit names its file (Store._commit)
COUNTS = ("dim", "version", "next_id", "index_size")  # meta values read as whole numbers
UNREACHABLE = "unreachable"  # the meta key of the passages a commit found unreachable (reachability.py)
# The meta key of the store's identity: a random id made with the store. An operator may drop a store and make it again
# at the same place while devices keep it open; its versions then restart at 1, and caches keyed on the version alone
# took the new store's version 1 for the old one's (answers of the old corpus, its certificate). A store from before it
# has none (''); an embedded one gets one at its next open.
STORE_ID = "store_id"


def new_identity() -> str:
    return uuid.uuid4().hex


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    doc_id TEXT PRIMARY KEY, title TEXT NOT NULL, source TEXT, sha TEXT, complete INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS passages (
    id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL REFERENCES documents(doc_id),
    title TEXT NOT NULL, text TEXT NOT NULL, position INTEGER NOT NULL, crc INTEGER, context TEXT);
CREATE INDEX IF NOT EXISTS passages_doc ON passages(doc_id);
CREATE TABLE IF NOT EXISTS deleted (id INTEGER PRIMARY KEY);
"""
# Columns added since the first store format; older stores get them on open (NULL = not recorded).
_ADDED_COLUMNS = {"documents": {"sha": "TEXT", "complete": "INTEGER NOT NULL DEFAULT 1"},
                  "passages": {"crc": "INTEGER", "context": "TEXT"}}

# The full-text index (SQLite FTS5, BM25) over each passage's title, text and context (store_fts_index); a store
# from before it (or before its context column) gets the table and a rebuild from its passages, once, in one
# transaction, when it is opened.
TITLE_WEIGHT = 0.5  # BM25 weight of a passage's title against its text (1.0)
# A passage's context: the text of the passages of its document within CONTEXT_NEIGHBOURS positions, indexed beside
# its own text at CONTEXT_WEIGHT. A sentence holds few of a question's words, the ones around it often hold the rest:
# pooled train/val R@1 0.756 -> 0.789, HotpotQA both-in-top-5 no worse (`python -m benchmarks.context_index`;
# docs/decisions/context-column.md).
CONTEXT_NEIGHBOURS = 2
CONTEXT_WEIGHT = 0.5


@dataclass(frozen=True)
class Part:
    """Consecutive passages of one document: ``texts`` at positions ``start``…; ``last`` if they end it."""

    doc: Document
    start: int
    texts: list[str]
    last: bool
    sha: str = ""  # content hash of the whole document (recorded with its first part)


@dataclass(frozen=True)
class DocumentState:
    """What the store holds of a document."""

    sha: str | None
    source: str
    complete: bool
    passages: int


def passage_crc(doc_id: str, title: str, text: str) -> int:
    return zlib.crc32(f"{doc_id}\0{title}\0{text}".encode())


def commit_rows(parts: Sequence[Part], first: int) -> tuple[list[tuple], list[tuple], list[tuple], int]:
    """The rows one commit writes for ``parts``, passage ids from ``first`` on: passages, new documents, documents
    completed by this commit, and the next free id."""
    rows, docs, done, pid = [], [], [], first
    for part in parts:
        if part.start == 0:
            docs.append((part.doc.doc_id, part.doc.title, part.doc.source, part.sha, int(part.last)))
        elif part.last:
            done.append((part.doc.doc_id,))
        for pos, text in enumerate(part.texts, part.start):
            rows.append((pid, part.doc.doc_id, part.doc.title, text, pos, passage_crc(part.doc.doc_id, part.doc.title, text)))
            pid += 1
    return rows, docs, done, pid


def contexts(neighbours: Sequence[tuple[int, int, str]], c: int = CONTEXT_NEIGHBOURS) -> dict[int, str]:
    """Each passage's context from (id, position, text) of one document, in position order: the texts within ``c``
    positions of it, in order."""
    text = {pos: t for _, pos, t in neighbours}
    return {pid: " ".join(text[q] for q in range(pos - c, pos + c + 1) if q != pos and q in text)
            for pid, pos, _ in neighbours}


Neighbours = Callable[[str, int, int], Sequence[tuple[int, int, str]]]


def commit_contexts(groups: Iterable[tuple[str, list[tuple[int, int, str]]]], stored: Neighbours
                    ) -> tuple[dict[int, str], list[tuple[str, int]]]:
    """Both stores' contexts for one commit: each new passage's (by id), and (context, id) of the stored passages
    before a group whose right neighbours it adds — a long document comes in several commits (indexing.py), and the
    last passages of one get the rest of their context with the next. ``groups``: per document, its new (id,
    position, text), in order (one part of a document per commit); ``stored(doc_id, lo, hi)``: its stored (id,
    position, text) at positions lo..hi, in order."""
    c, out, updates = CONTEXT_NEIGHBOURS, dict[int, str](), list[tuple[str, int]]()
    for doc_id, new in groups:
        start = new[0][1]
        before = list(stored(doc_id, start - 2 * c, start - 1)) if start > 0 else []
        context = contexts(before + new, c)
        out.update((pid, context[pid]) for pid, _, _ in new)
        updates += [(context[pid], pid) for pid, pos, _ in before if pos >= start - c]
    return out, updates


def write_commit(db: sqlite3.Connection, remove: Sequence[str], gone: Sequence[int], rows: Sequence[tuple],
                 docs: Sequence[tuple], done: Sequence[tuple], meta: dict[str, object]) -> None:
    """One commit's changes, inside the caller's transaction: documents ``remove`` out (their passage ids
    ``gone`` recorded as deleted), ``commit_rows``'s rows in (with their contexts), and ``meta`` (which names the
    index file)."""
    marks = ",".join("?" * len(remove))
    db.execute(f"DELETE FROM passages WHERE doc_id IN ({marks})", list(remove))
    db.execute(f"DELETE FROM documents WHERE doc_id IN ({marks})", list(remove))
    db.executemany("INSERT INTO deleted VALUES (?)", [(g,) for g in gone])
    db.executemany("INSERT OR REPLACE INTO documents VALUES (?,?,?,?,?)", docs)
    db.executemany("UPDATE documents SET complete = 1 WHERE doc_id = ?", done)
    groups = ((doc_id, [(r[0], r[4], r[3]) for r in group]) for doc_id, group in groupby(rows, key=lambda r: r[1]))
    new, updates = commit_contexts(groups, lambda doc_id, lo, hi: db.execute(
        "SELECT id, position, text FROM passages WHERE doc_id = ? AND position BETWEEN ? AND ? ORDER BY position",
        (doc_id, lo, hi)).fetchall())
    db.executemany("INSERT INTO passages (id, doc_id, title, text, position, crc, context) VALUES (?,?,?,?,?,?,?)",
                   [(*r, new[r[0]]) for r in rows])
    db.executemany("UPDATE passages SET context = ? WHERE id = ?", updates)
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, str(v)) for k, v in meta.items()])
    store_fts_index.merge(db, len(rows) + len(gone))


def check_files(folder: Path, create: bool) -> None:
    """StoreError if ``folder`` is no folder, or ``passages.sqlite`` is missing or empty while an index exists (or at
    all, unless ``create``); makes the folder."""
    blocked = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:  # mkdir failed with a bare FileExistsError (NotADirectoryError, a file above it)
        raise StoreError(f"{blocked} is a file, not a store folder: name a folder (edge-rag index --db DIR makes it)")
    hnsw.check_folder(folder)  # before the folder is made or anything encoded for it
    db = folder / DB_FILE
    db_empty = not db.is_file() or db.stat().st_size == 0
    if db_empty and folder.is_dir() and any(folder.glob(INDEX_GLOB)):
        state = "is empty" if db.is_file() else "is missing"
        raise StoreError(f"{db} {state} but {folder} holds a vector index: the passages are lost; "
                         "restore the file from a backup or delete the folder and re-index")
    if not create and db_empty:
        raise StoreError(f"no passage store at {folder} ({DB_FILE} missing or empty); "
                         "index documents into it first (edge-rag index --db ...)")
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or full disk, a folder of another user's
        raise StoreError(f"cannot make the store folder {folder}: {exc.strerror}") from exc


BUSY_TIMEOUT_S = 60.0  # how long an open or a statement waits for another process's transaction


def connect(folder: Path) -> sqlite3.Connection:
    """The checked database, schema up to date (older stores get the newer columns, NULL = unknown)."""
    path = folder / DB_FILE
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            with full_disk_is_an_error(folder):  # opening makes the WAL files
                return _open(path)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise StoreError(f"{path} is not a readable SQLite database: {exc}") from exc
            # SQLite fails at once, without waiting, when two connections set up a new store together (the
            # WAL switch or a schema write meets the other's fresh commit): open again until the deadline.
            if time.monotonic() >= deadline:
                raise StoreError(f"{path} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s: {exc}") from exc
            time.sleep(0.05)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a readable SQLite database: {exc}") from exc


def _fts_current(db: sqlite3.Connection) -> bool:
    return "context" in {r[1] for r in db.execute(f"PRAGMA table_info({FTS_TABLE})")}


def _add_fts(db: sqlite3.Connection) -> None:
    """The full-text index and its triggers, filled from the stored passages (their contexts first), all in one
    write transaction (two processes opening an old store at once: the second finds it made). An index from
    before the context column is dropped and made again."""
    if _fts_current(db):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if not _fts_current(db):
            for name in FTS_TRIGGERS:
                db.execute(f"DROP TRIGGER IF EXISTS {name}")
            db.execute(f"DROP TABLE IF EXISTS {FTS_TABLE}")
            rows = db.execute("SELECT doc_id, id, position, text FROM passages ORDER BY doc_id, position")
            for _, group in groupby(rows.fetchall(), key=lambda r: r[0]):
                context = contexts([r[1:] for r in group])
                db.executemany("UPDATE passages SET context = ? WHERE id = ?", [(t, i) for i, t in context.items()])
            for statement in FTS_DDL:
                db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def second_connection(folder: Path, create: bool = False) -> sqlite3.Connection:
    """One more connection to the store ``connect`` opened (checked, schema as it found or made it), with the
    same durable settings: a writer's own, so that searches keep theirs while it commits, or a full-text
    search's (``store_fts.Readers``). Only ``create`` makes the file: one removed under a running store made a
    new empty database ("no such table", and the folder's passages lost at the next open)."""
    # A writer in another process may hold the database for a while (a commit fsyncs on an SD card):
    # wait for it rather than fail; the writer lock (writer_lock.py) decides who writes.
    db = sqlite3.connect(uri(folder / DB_FILE, "rwc" if create else "rw"), uri=True, check_same_thread=False,
                         timeout=BUSY_TIMEOUT_S)
    db.execute("PRAGMA synchronous=FULL")  # a returned commit is on disk: the old index may go
    db.execute("PRAGMA foreign_keys=ON")
    return db


def _open(path: Path) -> sqlite3.Connection:
    db, read_only = second_connection(path.parent, create=True), not writable(path.parent)
    try:
        if not read_only:
            db.execute("PRAGMA journal_mode=WAL")  # a race with another opening process: connect opens again
        check = db.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            raise StoreError(f"{path} is corrupt (quick_check: {'; '.join(r[0] for r in check[:3])}); {REINDEX}")
        if read_only:  # nothing to make or bring up to date: SQLite would say "attempt to write a readonly database"
            check_current(db, path, {**_ADDED_COLUMNS, "meta": (), "deleted": (), FTS_TABLE: ("context",)})
            return db
        db.executescript(_SCHEMA)
        for table, columns in _ADDED_COLUMNS.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for name, decl in columns.items():
                if name not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        if db.execute("SELECT 1 FROM meta WHERE key = ?", (STORE_ID,)).fetchone() is None:
            db.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (STORE_ID, new_identity()))  # another may race
        db.commit()
        store_fts_index.repair(db)
        _add_fts(db)
    except BaseException:
        db.close()
        raise
    return db


def document(db: sqlite3.Connection, doc_id: str) -> DocumentState | None:
    """The stored state of the document ``doc_id`` (None: not stored)."""
    row = db.execute("SELECT sha, COALESCE(source, ''), complete, (SELECT COUNT(*) FROM passages p "
                     "WHERE p.doc_id = d.doc_id) FROM documents d WHERE doc_id = ?", (doc_id,)).fetchone()
    return None if row is None else DocumentState(row[0], row[1], bool(row[2]), row[3])


def checked(rows: list[tuple], folder: Path) -> list[tuple]:
    """Passage rows (id, doc_id, title, text, position, crc) without their crc; StoreError for one that fails it."""
    for pid, doc_id, title, text, _, crc in rows:
        if crc is not None and passage_crc(doc_id, title, text) != crc:
            raise StoreError(f"passage {pid} in {folder / DB_FILE} fails its checksum (corrupt); {REINDEX}")
    return [row[:5] for row in rows]


def max_id(db: sqlite3.Connection) -> int:
    """The highest passage id ever used (-1: none): stores written before ``next_id`` was kept start after it."""
    row = db.execute("SELECT MAX(m) FROM (SELECT MAX(id) m FROM passages UNION ALL SELECT MAX(id) FROM deleted)")
    return -1 if (v := row.fetchone()[0]) is None else int(v)


def remove_orphans(folder: Path, keep: str | None) -> None:
    """Index files no commit points at (``keep`` is the committed one): left by a crash before or right after a
    commit."""
    for path in folder.glob(INDEX_GLOB):
        if path.name != keep:
            path.unlink()
    for path in folder.glob(f".{INDEX_GLOB}.*.tmp"):  # the atomic-rename temp files of old stores
        path.unlink()

