"""A store folder this process may not write (a read-only mount, media, another user's store): read, never written.

SQLite makes a -wal and a -shm file beside a WAL database to read it, and cannot in such a folder. It reads it
through those of a writer that has it open (a process that may write the folder: its commits are followed), else as
a file that does not change (``immutable``: no writer has it open). An immutable connection reads the database alone:
a -wal holding frames beside no -shm (a writer killed between its commit and the checkpoint that copies it into the
database, a copy made without the -shm) may hold commits it would not see, and the store is refused until its owner
opens it once. SQLite says reading an immutable file that changes
is undefined (its page cache goes stale, a checkpoint tears its reads): a connection here (``Reopened``) is used only
while the database and its -wal and -shm are as they were when it opened, and is opened again once another process
opened the store to write (its owner indexing) or wrote it, so the next read follows that commit.
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import StoreError

WAL_HEADER = 32  # bytes of a -wal before its first frame
CLOSING_S = 0.1  # a writer closing the store removes its -shm a moment before its -wal: looked at again after this


def writable(folder: Path) -> bool:
    """Whether this process may write ``folder`` (a missing one is made, or fails to be, as any other)."""
    return not folder.is_dir() or os.access(folder, os.W_OK)


def uri(path: Path, mode: str) -> str:
    """The URI that opens the database ``path`` in ``mode`` (ro, rw, rwc), read-only if its folder is not writable
    (StoreError if the file is missing there: SQLite said only "unable to open database file", as if damaged)."""
    name = path.absolute().as_uri()
    if writable(path.parent):
        return f"{name}?mode={mode}"
    if not path.is_file():
        raise StoreError(f"{path} is missing and the folder is read-only here: no store can be opened or made in it")
    wal, shm = (path.with_name(path.name + end) for end in ("-wal", "-shm"))
    for _ in range(2):
        if shm.exists():
            return f"{name}?mode=ro"
        if not _frames(wal):
            return f"{name}?mode=ro&immutable=1"
        time.sleep(CLOSING_S)
    raise StoreError(f"{wal} may hold commits not yet in {path.name} (a writer stopped before it copied them there, or "
                     f"the store was copied without {shm.name}), and the folder is read-only here: open it once where "
                     "it may be written (edge-rag doctor --db ...), which brings them in")


def _frames(wal: Path) -> bool:
    """Whether the -wal ``wal`` holds frames (commits, or what a checkpoint copied already: it cannot tell)."""
    try:
        return wal.stat().st_size > WAL_HEADER
    except FileNotFoundError:
        return False


class Reopened:
    """A connection ``first`` opens to the database ``path`` (given its folder); in a folder this process may not
    write, ``again`` opens it again once the file or its -wal or -shm changed (see the module docstring). The file
    made again there (another inode) is another store's: the connection stays on the one it opened, as it would in a
    writable folder (``store_load.check_on_disk`` says so). The caller serialises ``get``."""

    def __init__(self, path: Path, first: Callable[[Path], sqlite3.Connection],
                 again: Callable[[Path], sqlite3.Connection]) -> None:
        self.path, self._again, self._watch = path, again, not writable(path.parent)
        self._seen, self.db = files(path), first(path.parent)  # seen before the open: a change meanwhile opens again

    def get(self) -> sqlite3.Connection:
        """The connection, opened again first if another process opened or wrote the file since it was opened."""
        if self._watch and (now := files(self.path)) != self._seen and now[0][0] == self._seen[0][0]:
            db = self._again(self.path.parent)  # opened first: one that fails leaves this one, tried again next
            self.db.close()
            self._seen, self.db = now, db
        return self.db


def files(path: Path) -> tuple[tuple[int, int, int], ...]:
    """The identity (inode, size, modification time; 0s: no file) of the database ``path`` and of its -wal and -shm:
    a writer makes the -wal and -shm as it opens the store, and writes the database as its commits are checkpointed
    into it."""
    def identity(file: Path) -> tuple[int, int, int]:
        try:
            st = file.stat()
        except FileNotFoundError:
            return 0, 0, 0
        return st.st_ino, st.st_size, st.st_mtime_ns
    return tuple(identity(path.with_name(path.name + end)) for end in ("", "-wal", "-shm"))


def check_current(db: sqlite3.Connection, path: Path, columns: dict[str, Iterable[str]]) -> None:
    """StoreError unless the database ``path``, opened read-only, has every table of ``columns`` with those columns:
    an older store gets them when opened where it may be written."""
    for table, names in columns.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if not have or not set(names) <= have:
            raise StoreError(f"{path} is from an older edge-rag and its folder is read-only here: open it once where "
                             "it may be written (edge-rag doctor --db ...), which brings it up to date")
