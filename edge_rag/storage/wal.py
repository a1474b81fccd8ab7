"""SQLite's WAL mode, switched on by processes that open one new file at once (a kiosk server and a CLI run)."""
from __future__ import annotations

import sqlite3
import time

RETRY_S = 0.01


def wal_mode(db: sqlite3.Connection, timeout: float) -> None:
    """Put ``db`` in WAL mode, waiting up to ``timeout`` seconds for other connections. Two opening a new file both
    hold a shared lock and want the exclusive one the switch takes: SQLite fails one of them at once ('database is
    locked'), not through its busy handler (its rule against deadlock). 4 of 400 answer caches opened by 4 threads
    at once failed, and the message said to delete the cache; the switch is now tried again until ``timeout``. (The
    passage store retries its whole open instead: store_db.connect.)"""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_S)
