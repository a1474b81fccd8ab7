"""A store folder this process may not write (a read-only mount, media, another user's store): read, never written.

SQLite makes a -wal and a -shm file beside a WAL database to read it, and cannot in such a folder. It reads it
through those of a writer that has it open (a process that may write the folder: its commits are followed), else as
a file that does not change (``immutable``: no writer has it open; one that opens it later, its owner indexing, is
seen once this process starts again).
"""
from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from ..errors import StoreError


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
    return f"{name}?mode=ro" + ("" if path.with_name(f"{path.name}-shm").exists() else "&immutable=1")


def check_current(db: sqlite3.Connection, path: Path, columns: dict[str, Iterable[str]]) -> None:
    """StoreError unless the database ``path``, opened read-only, has every table of ``columns`` with those columns:
    an older store gets them when opened where it may be written."""
    for table, names in columns.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if not have or not set(names) <= have:
            raise StoreError(f"{path} is from an older edge-rag and its folder is read-only here: open it once where "
                             "it may be written (edge-rag doctor --db ...), which brings it up to date")
