"""How a store's passages were cut, as the store records it: a calibration certifies only the kinds of passages it
measured (calibrated_config.store_change), and a store may hold documents indexed under another Config than the
one asking.

A kind is ``passage_mode:min_sentence_chars`` ("sentence:20" by default). Every commit that adds passages records
its kind in the store's meta (``KINDS_KEY``: the kinds, sorted, comma-separated), in the commit's own transaction. A store
from before the record that holds passages stays unrecorded, and one given passages of no stated kind becomes
unknown for good: what else it holds can no longer be told. Unrecorded and unknown read as no kinds (unchecked).
"""
from __future__ import annotations

import sqlite3

from ..config import Config

KINDS_KEY = "passage_kinds"
UNKNOWN = "?"


def kind_of(config: Config) -> str:
    """The kind of the passages ``config`` cuts."""
    return f"{config.passage_mode}:{config.min_sentence_chars}"


def read_kinds(recorded: str | None) -> frozenset[str]:
    """The kinds a recorded value names (none: unrecorded or unknown)."""
    return frozenset() if recorded == UNKNOWN else frozenset(k for k in (recorded or "").split(",") if k)


def kinds_after(recorded: str | None, kind: str, held: bool) -> dict[str, str]:
    """The meta to write with a commit that adds passages of ``kind`` ("": not stated) to a store that ``held``
    passages and recorded ``recorded`` (None: nothing) before it; {}: leave the record as it is."""
    if (recorded is None and held) or recorded == UNKNOWN:
        return {}
    return {KINDS_KEY: ",".join(sorted(read_kinds(recorded) | {kind})) if kind else UNKNOWN}


def sqlite_kinds_after(db: sqlite3.Connection, kind: str) -> dict[str, str]:
    """``kinds_after`` for the embedded store, read inside its commit's transaction on ``db``, before the commit's rows."""
    recorded = db.execute("SELECT value FROM meta WHERE key = ?", (KINDS_KEY,)).fetchone()
    return kinds_after(recorded and recorded[0], kind, db.execute("SELECT 1 FROM passages LIMIT 1").fetchone() is not None)
