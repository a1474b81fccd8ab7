"""Passage store: text and metadata in SQLite, vectors in an hnswlib index saved beside it.

A kiosk loses power and runs for months on an SD card, so every write follows one commit order:

1. the changed index is saved under a **new** name (``vectors.<version>.<tag>.hnsw``) and fsynced;
2. the passages, the new file's name, size and sha256 are committed in **one** SQLite transaction
   (``synchronous=FULL``: the commit is on disk when it returns);
3. only then is the previous index file removed.

A crash at any point leaves the last committed state intact: before step 2 the new file is an orphan, after it the old
one is; the next writer removes orphans when it takes the lock. One process writes at a time (``flock`` on
``writer.lock`` in the store folder); it reloads the index under the lock before extending it, so a second writer never
overwrites the first one's passages. Readers (opening a store too) never take the lock: they see the last committed
index and reload it when another process commits a newer one, each load from one snapshot (``store_load``).

Questions never wait for a commit's file or transaction (and no copy of the index is made: a commit costs no extra RAM).
hnswlib may not search while it inserts, so a commit adds its vectors ``ADD_CHUNK`` at a time under the search lock (a
``FairLock``: a waiting search goes before the next chunk); saving, fsyncing and hashing the file (seconds, growing with
the index) only read the index, as searches do, and the transaction runs on the writer's own connection (WAL: searches
read theirs meanwhile), both without the lock; only the switch to the new commit takes it again. Searches skip the
commit's labels until then (``_pending_from``), and its removals are marked deleted at the switch (opening marks them
from the ``deleted`` table): a passage is searchable while committed. Full-text searches take no lock (``store_fts``).

Opening checks the index file's size and sha256 against the committed record and its ids against the passages (the
database itself: ``store_db``; the index: ``store_load``); every passage read is checked against its CRC32.
"""
from __future__ import annotations

import contextlib
import sqlite3
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import check_seconds, full_disk_is_an_error
from ..retrieval.lexical import POSTINGS_BUDGET
from ..types import Passage, in_order
from . import hnsw, reachability, readonly, store_db, store_load, writer_lock
from .fair_lock import FairLock
from .fileio import fsync_dir
from .passage_kinds import KINDS_KEY, read_kinds, sqlite_kinds_after
from .store_db import DB_FILE, STORE_ID, DocumentState, Part, check_files, commit_rows, connect
from .store_fts import FullText
from .store_meta import Committed, check_meta, read_meta

__all__ = ["COMMIT_STEPS", "DB_FILE", "DocumentState", "Part", "Store"]

# Named points of the commit sequence, in order; ``Store.fault_hook`` is called at each (crash tests).
COMMIT_STEPS = ("begin", "index_saved", "rows_written", "committed", "old_index_removed")
ADD_CHUNK = 32  # vectors inserted per hold of the search lock (~20-30 ms at 25k passages on 2 cores)


class Store:
    """The store in ``folder`` for vectors of ``dim`` floats from encoder ``encoder_id``. ``create=False`` opens an
    existing store only (a mistyped path is an error, not a new empty store). ``lock_timeout`` is how long a writer
    waits for another process's write to finish (0: fail at once); ``passage_kind``: the kind of the passages it adds."""

    commit_growth = hnsw.COMMIT_GROWTH  # indexing commits in steps of this share of the store (index file rewrites)
    graph_misses = reachability.misses  # PassageStore

    def __init__(self, folder: str | Path, dim: int, encoder_id: str = "", m: int = 16, ef_construction: int = 200,
                 ef_search: int = 64, create: bool = True, lock_timeout: float = 0.0, passage_kind: str = "") -> None:
        self.folder = Path(folder).expanduser()
        self.location = str(self.folder)  # what messages call the store (a PgStore: its URL without the password)
        self.dim, self.m, self.ef_construction, self.ef_search = dim, m, ef_construction, ef_search
        self.lock_timeout, self.passage_kind = check_seconds(lock_timeout, "lock_timeout"), passage_kind
        self.fault_hook: Callable[[str], None] | None = None
        self.admit: Callable[[int], None] | None = None  # told another process's commit's passages before they load
        self._lock = FairLock()  # index + connection: held briefly by readers and by steps of a commit
        self._pending_from: int | None = None  # first label of the commit in progress: not searchable yet
        self._write_lock = threading.RLock()  # one writing thread per process, held for a whole run
        self._write_db: sqlite3.Connection | None = None  # the writer's own connection: searches read self.db
        self._lock_fd: int | None = None
        self._write_depth, self._counted, self.closed = 0, (-1, 0), False  # writing()'s nesting; search's last count
        check_files(self.folder, create)
        self._db = readonly.Reopened(self.folder / DB_FILE, connect, store_db.second_connection)
        self._text = FullText(self.folder)
        check_meta(meta := read_meta(self.db, self.folder), dim, encoder_id, str(self.folder), "folder")
        self.encoder_id = encoder_id or meta.get("encoder", "")
        self.identity = meta.get(STORE_ID, "")  # the file it opened is this store's for the life of its connection
        self.index, self.index_file, self._version, self._exact = self._load_committed()

    # -- reading -------------------------------------------------------------------------------
    @property
    def db(self) -> sqlite3.Connection:  # searches' (callers hold _lock): reopened as readonly.py says
        return self._db.get()

    @property
    def passage_kinds(self) -> frozenset[str]:  # PassageStore
        with self._lock:
            return read_kinds(read_meta(self.db, self.folder).get(KINDS_KEY))

    @property
    def count(self) -> int:
        with self._lock:
            return self.db.execute("SELECT COUNT(*) FROM passages").fetchone()[0]

    @property
    def version(self) -> int:
        """Bumped by every commit, when searches first see it; caches keyed on it go stale when documents change."""
        with self._lock:
            self._follow()
            return self._version

    @property
    def stamp(self) -> tuple[str, int]:  # PassageStore
        return self.identity, self.version

    def check(self) -> Committed:  # PassageStore; what it searches now: _version, read as an int without the lock
        return store_load.check_on_disk(self.folder, self.identity, self._version)

    def has_document(self, doc_id: str) -> bool:
        return (state := self.document(doc_id)) is not None and state.complete

    def document(self, doc_id: str) -> DocumentState | None:
        with self._lock:
            return store_db.document(self.db, doc_id)

    def documents_from(self, source: str) -> list[str]:  # PassageStore
        with self._lock:
            return [r[0] for r in self.db.execute("SELECT doc_id FROM documents WHERE source = ?", (source,))]

    def titles(self, limit: int) -> list[str]:  # PassageStore
        with self._lock:
            return [r[0] for r in self.db.execute("SELECT title FROM documents WHERE title != '' ORDER BY rowid LIMIT ?", (limit,))]

    def search(self, vector: np.ndarray, k: int) -> list[Passage]:  # PassageStore
        with self._lock:
            self._follow()
            if self._counted[0] != self._version:  # COUNT(*) costs 0.3 ms at 100k passages: once per commit
                self._counted = (self._version, self.count)
            k = min(k, self._counted[1])
            if k <= 0:
                return []
            labels, dists = self._exact.search(self.index, vector, k, self.ef_search, self._pending_from)
            scores = {int(i): 1.0 - float(d) for i, d in zip(labels, dists)}
            return [replace(p, score=scores[p.id]) for p in self.passages(list(scores))]

    def search_text(self, terms: Sequence[str], k: int, budget: int = POSTINGS_BUDGET) -> list[tuple[int, float]]:
        """Top-k passage ids by BM25 over title, text and context (store_fts), best first, with the BM25 score;
        without the search lock, beside a dense search (retrieve.py)."""
        return self._text.search(list(terms), k, self._version, budget)

    def scored(self, vector: np.ndarray, ids: Sequence[int]) -> list[Passage]:
        """Passages by id with the exact cosine of their vectors as ``score`` (lexical hits dense missed); an id
        not in this process's index (another process's commit not loaded yet) is left out."""
        with self._lock:
            cosines = hnsw.cosines(self.index, vector, ids)
        return [replace(p, score=cosines[p.id]) for p in self.passages([i for i in ids if i in cosines])]

    def passages(self, ids: Sequence[int]) -> list[Passage]:  # PassageStore; a failed checksum raises StoreError
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self.db.execute(f"SELECT id, doc_id, title, text, position, crc FROM passages WHERE id IN ({marks})",
                                   list(ids)).fetchall()
        return in_order((Passage(*row) for row in store_db.checked(rows, self.folder)), ids)

    # -- writing -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self, wait: bool = True) -> Iterator[None]:
        """Hold this store's writer lock (reentrant): other processes' writers wait ``lock_timeout`` seconds (none if
        not ``wait``), then fail with a StoreError. The index is reloaded first if another process committed, and index
        files no commit names are removed: only under the lock, where no other process's new file can be one."""
        with writer_lock.held(self._write_lock, wait, str(self.folder)):
            if self._write_depth == 0:
                self._lock_fd = writer_lock.acquire(self.folder, self.lock_timeout if wait else 0)
            self._write_depth += 1
            try:  # a reload that fails (a closed or damaged store) releases the lock: it was held until exit
                if self._write_depth == 1:
                    with self._lock:
                        self._follow()
                    store_db.remove_orphans(self.folder, self.index_file)
                yield
            finally:
                self._write_depth -= 1
                self._release()  # at the outermost exit only

    def add(self, parts: Sequence[Part], vectors: np.ndarray, remove: Sequence[str] = ()) -> int:
        """Commit ``parts`` (one vector per passage text, in order) and remove the documents ``remove``
        in one transaction. Returns the number of passages added."""
        n = sum(len(p.texts) for p in parts)
        if n != len(vectors):
            raise ValueError(f"{n} passages but {len(vectors)} vectors")
        if not parts and not remove:
            return 0
        with self.writing(), full_disk_is_an_error(self.folder):
            self._commit(parts, np.asarray(vectors, dtype=np.float32), list(remove))
        return n

    def remove(self, doc_ids: Sequence[str]) -> int:  # PassageStore
        with self.writing(), full_disk_is_an_error(self.folder):
            marks = ",".join("?" * len(doc_ids))
            with self._lock:
                n = self.db.execute(f"SELECT COUNT(*) FROM passages WHERE doc_id IN ({marks})", list(doc_ids)).fetchone()[0]
            self._commit([], np.zeros((0, self.dim), np.float32), list(doc_ids))
        return n

    def close(self) -> None:
        self.admit = None  # it holds the EdgeRAG: a cycle kept a closed one's models in memory until gc ran
        self._text.close()
        with self._lock:
            self._db.db.close()
            self.closed = True
        self._release()

    def _release(self) -> None:
        """Unless a thread writes (it does as its run ends: under its commit another writer took the lock and removed
        its new file; sqlite3 closed under its transaction crashed), the writer lock and, closed, its connection go."""
        if self._write_lock.acquire(blocking=False):
            if self._write_depth == 0 and self._lock_fd is not None:
                writer_lock.release(self._lock_fd)
                self._lock_fd = None
            if self._write_depth == 0 and self.closed and self._write_db is not None:
                self._write_db.close()
            self._write_lock.release()

    # -- the commit sequence -------------------------------------------------------------------
    def _commit(self, parts: Sequence[Part], vectors: np.ndarray, remove: list[str]) -> None:
        """The commit order of the module docstring. The search lock is held for each chunk of inserts and
        for the switch to the new commit, never while the file or the transaction is written."""
        self._step("begin")
        old_file, new_file, landed = self.index_file, None, False
        try:
            with self._lock:
                first = int(read_meta(self.db, self.folder).get("next_id", store_db.max_id(self.db) + 1))
                marks = ",".join("?" * len(remove))
                gone = [r[0] for r in self.db.execute(f"SELECT id FROM passages WHERE doc_id IN ({marks})", remove)]
                live = [r[0] for r in self.db.execute(f"SELECT id FROM passages WHERE doc_id NOT IN ({marks})", remove)]
                self._pending_from = first
                needed = self.index.get_current_count() + len(vectors)
                if needed > self.index.get_max_elements():
                    self.index.resize_index(max(2 * self.index.get_max_elements(), needed))
            rows, docs, done, pid = commit_rows(parts, first)
            for at in range(0, len(vectors), ADD_CHUNK):
                with self._lock:
                    chunk = vectors[at:at + ADD_CHUNK]
                    self.index.add_items(chunk, np.arange(first + at, first + at + len(chunk)), replace_deleted=True)
            orphans = reachability.sweep(self.index, live + list(range(first, first + len(vectors))), self.ef_search,
                                         lambda: self._lock)
            version = self._version + 1
            new_file = f"vectors.{version}.{uuid.uuid4().hex[:8]}.hnsw"
            size, digest = hnsw.save(self.index, self.folder / new_file)  # no lock: it reads the index, as searches do
            self._step("index_saved")
            if self._write_db is None:
                self._write_db = store_db.second_connection(self.folder)
            with self._write_db:  # one transaction: the passages and the name of the index that holds them
                store_db.write_commit(self._write_db, remove, gone, rows, docs, done, dict(
                    dim=self.dim, encoder=self.encoder_id, version=version, next_id=pid, index_file=new_file,
                    index_size=size, index_sha256=digest, **reachability.record(orphans),
                    **(sqlite_kinds_after(self._write_db, self.passage_kind) if rows else {})))
                self._step("rows_written")
            landed = True
            with self._lock:  # the switch: from here on searches see the commit
                self.index_file, self._version, self._pending_from = new_file, version, None
                self._exact = reachability.Exact(self.index, orphans)
                for label in gone:  # only now: removed passages stay searchable until their commit
                    self.index.mark_deleted(label)
            self._step("committed")
        except BaseException as exc:
            if new_file is not None and not landed:
                (self.folder / new_file).unlink(missing_ok=True)
            traceback.clear_frames(exc.__traceback__)  # its frames hold the grown index (hnsw.save's: a full disk)
            with self._lock:  # drop in-memory changes, the grown index first: one in memory, as the plan prices
                self.index, self._pending_from, self._version = hnsw.new(self.dim, self.m, self.ef_construction), None, -1
                self.index, self.index_file, self._version, self._exact = self._load_committed()  # or at next search
            raise
        if old_file is not None:
            (self.folder / old_file).unlink(missing_ok=True)
            fsync_dir(self.folder)
        with contextlib.suppress(sqlite3.Error):  # into passages.sqlite too: a lost -wal then loses no commit
            self._write_db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self._step("old_index_removed")

    def _step(self, name: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(name)

    def _load_committed(self, admit: Callable[[int], None] | None = None) -> store_load.Loaded:
        """The last commit, read from one snapshot (store_load): another process may be committing meanwhile."""
        return store_load.load_committed(self.db, self.folder, self.dim, self.m, self.ef_construction, admit)

    def _follow(self) -> None:
        """Reload the index if another process committed (caller holds _lock; not in this store's own commit). ``admit``
        (the plan) may refuse it; if not, the stale index goes first: one in memory, as the plan prices, not two."""
        if self._pending_from is not None or int(read_meta(self.db, self.folder).get("version", 0)) == self._version:
            return
        def admit(passages: int) -> None:
            if self.admit is not None:
                self.admit(passages)
            self.index = hnsw.new(self.dim, self.m, self.ef_construction)  # a failed load: empty, loaded again next
        self.index, self.index_file, self._version, self._exact = self._load_committed(admit)
