"""Step 1 of the pipeline: a repeated question is answered from memory, skipping encode to generate.

An LRU of ``config.cache_size`` answers keyed by the question as the pipeline reads it, optionally mirrored in a
SQLite file so answers survive restarts. Every entry records the corpus version it was computed on;
an entry from another version is a miss, so adding documents invalidates the cache without a sweep.
A stored entry carries the CRC32 of its key, version and answer: one that fails it (bit rot on an SD card turned a
cached "10:00" into "00:00", served as certified) is a miss, answered again, as is an entry from before the CRC.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import sqlite3
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

from ..config import Config, Tier
from ..errors import StoreError
from ..types import Answer, PassageRef, Route
from .readonly import writable
from .wal import wal_mode

# One row per question; ``used`` is a counter bumped on every put and hit, so LRU order survives restarts.
_COLUMNS = {"key", "corpus_version", "answer", "used", "crc"}
_SCHEMA = """CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY, corpus_version TEXT NOT NULL, answer TEXT NOT NULL, used INTEGER NOT NULL, crc INTEGER)"""
_SELECT = "SELECT answer, crc FROM answers WHERE key = ? AND corpus_version = ?"
_TOUCH = "UPDATE answers SET used = (SELECT MAX(used) + 1 FROM answers) WHERE key = ?"
_INSERT = "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, (SELECT COALESCE(MAX(used), 0) + 1 FROM answers), ?)"
_EVICT = "DELETE FROM answers WHERE key NOT IN (SELECT key FROM answers ORDER BY used DESC LIMIT ?)"
OPEN_WAIT_S = 5.0  # how long opening waits for another process (sqlite3's default busy timeout)
# An answer is ~2 KB (its context at most a tier's context_chars); with compression off its context is whole passages,
# and one unbroken 390 KB "sentence" made a 395 KB answer: cache_size 256 of them would hold 100 MB outside the plan.
MAX_ANSWER_BYTES = 64 * 1024  # a larger answer is answered again each time, never kept
log = logging.getLogger("edge_rag")


def cache_key(question: str) -> str:
    """The question as the pipeline reads it (check_question's spacing): the cased reader reads case and closing
    punctuation, so one question lower-cased or without its "?" is another answer ("Where is the US office?" read
    "Boston", "where is the us office" refused; keyed on the lower-cased form, each was served the other's)."""
    return " ".join(question.split())


def _damaged(e: BaseException | None) -> bool:
    """SQLite's "file is not a database" or "database disk image is malformed" (not a lock, I/O, a missing folder)."""
    return type(e) is sqlite3.DatabaseError  # its subclasses are locks, I/O, constraints, misuse


def _crc(key: str, version: str, text: str) -> int:
    return zlib.crc32(f"{key}\0{version}\0{text}".encode())


def answer_from_dict(d: dict) -> Answer:
    """Inverse of ``Answer.to_dict`` (enums, passage refs, None back to NaN); unknown keys are ignored
    so that a cache written by an older or newer version still loads."""
    known = {f.name for f in dataclasses.fields(Answer)}
    kw = {k: v for k, v in d.items() if k in known}
    kw["route"] = Route(kw["route"])
    kw["tier"] = Tier(kw["tier"])
    kw["passages"] = [PassageRef(**p) for p in kw.get("passages", [])]
    for key in ("lower_bound", "threshold", "d_min"):
        if kw.get(key) is None:
            kw[key] = math.nan
    return Answer(**kw)


class AnswerCache:
    """LRU of answers in memory, optionally persisted (and bounded the same way) in a SQLite file."""

    def __init__(self, config: Config, path: str | Path | None = None):
        self.capacity = config.cache_size
        # cache_size 0 turns the cache off, file and all: with persistent_cache on, each question wrote its answer to
        # the file and deleted it again (20 questions: 40 row writes, 330 KB through the WAL on an SD card)
        self.path = Path(path) if path is not None and self.capacity > 0 else None
        # key -> (corpus version, Answer JSON); JSON so no caller can mutate a cached answer in place
        self._memory: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()  # one cache may serve several threads
        self._db: sqlite3.Connection | None = None
        self._failed = False  # a write to the file failed: said once
        if self.path is not None and not writable(self.path.parent):  # a read-only store still answers, and fast
            log.warning("answer cache %s: its folder is read-only here; answers are kept in memory only", self.path)
            self.path = None
        if self.path is not None:
            try:
                self._open()
            except StoreError as exc:
                if not _damaged(exc.__cause__):
                    raise
                self._start_afresh(exc)

    def _open(self) -> None:
        """Connect to the file, made if absent, and check its table."""
        assert self.path is not None
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=OPEN_WAIT_S)
            wal_mode(self._db, OPEN_WAIT_S)  # a server and a CLI run may open it at once
        except sqlite3.Error as e:
            raise self._error(e) from e
        # WAL + synchronous=NORMAL: one fsync per checkpoint, not per put; a crash loses at most
        # the last answers, which a cache can afford.
        for sql in ("PRAGMA synchronous=NORMAL", _SCHEMA):
            self._sql(sql)
        columns = {row[1] for row in self._sql("PRAGMA table_info(answers)")}
        if columns == _COLUMNS - {"crc"}:  # a cache from before the CRC: its entries are misses
            self._sql("ALTER TABLE answers ADD COLUMN crc INTEGER")
            columns.add("crc")
        if columns != _COLUMNS:
            raise StoreError(
                f"answer cache {self.path}: table 'answers' has columns {sorted(columns)}, "
                f"expected {sorted(_COLUMNS)}; delete the file to start a fresh cache"
            )

    def _start_afresh(self, exc: StoreError) -> None:
        """A damaged file (a torn write, bit rot) is deleted and made again: a cache can lose its answers, but a
        kiosk must not fail to start, nor to answer, for it."""
        log.warning("answer cache %s is damaged (%s): a fresh one is started", self.path, exc.__cause__)
        if self._db is not None:
            self._db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self._open()

    def get(self, question: str, corpus_version: str) -> Answer | None:
        """The stored answer (a fresh copy with ``cache_hit=True``) or None on a miss."""
        key = cache_key(question)
        with self._lock:
            entry = self._memory.get(key)
            if (entry is None or entry[0] != corpus_version) and self._db is not None:
                try:
                    rows = self._sql(_SELECT, (key, corpus_version))
                except StoreError as exc:  # damaged since it was opened
                    if not _damaged(exc.__cause__):
                        raise
                    self._start_afresh(exc)
                    rows = []
                intact = rows and rows[0][1] == _crc(key, corpus_version, rows[0][0])
                entry = (corpus_version, rows[0][0]) if intact else None
            if entry is None or entry[0] != corpus_version:
                return None
            text = entry[1]
            self._remember(key, corpus_version, text)
            if self._db is not None:
                self._write(_TOUCH, (key,))
        answer = answer_from_dict(json.loads(text))
        answer.cache_hit = True
        return answer

    def put(self, question: str, answer: Answer, corpus_version: str) -> None:
        if self.capacity <= 0 and self._db is None:
            return  # caching off: nothing would be kept, so nothing is serialised (~0.2 ms of a question)
        key, text = cache_key(question), json.dumps(answer.to_dict())
        if len(text) > MAX_ANSWER_BYTES:
            return
        with self._lock:
            self._remember(key, corpus_version, text)
            if self._db is not None and self._write(_INSERT, (key, corpus_version, text, _crc(key, corpus_version, text))):
                self._write(_EVICT, (self.capacity,))

    def clear(self) -> None:
        with self._lock:
            self._memory.clear()
            if self._db is not None:
                self._sql("DELETE FROM answers")

    def close(self) -> None:
        with self._lock:  # not beside another thread's statement: sqlite3 closing under it crashed the process
            if self._db is not None:
                self._db.close()
                self._db = None

    def __len__(self) -> int:
        return len(self._memory)

    def _remember(self, key: str, version: str, text: str) -> None:
        self._memory[key] = (version, text)
        self._memory.move_to_end(key)
        while len(self._memory) > self.capacity:
            self._memory.popitem(last=False)

    def _sql(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run one statement in its own transaction and return its rows; failures name the file."""
        assert self._db is not None
        try:
            with self._db:  # commits on success, rolls back on error
                return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise self._error(e) from e

    def _write(self, sql: str, params: tuple) -> bool:
        """Whether the file took this write: one that fails (disk full, the file locked past OPEN_WAIT_S) is logged
        once and never fails the question, already answered (the kept answer is in memory)."""
        assert self._db is not None
        try:
            with self._db:
                self._db.execute(sql, params)
            return True
        except sqlite3.Error as e:
            if not self._failed:
                log.warning("answer cache %s: cannot keep answers in it (%s); they are kept in memory", self.path, e)
            self._failed = True
            return False

    def _error(self, e: sqlite3.Error) -> StoreError:
        return StoreError(
            f"answer cache {self.path} is not a usable SQLite database ({e}); delete it to start a fresh cache"
        )
