"""The embedded store's full-text index (SQLite FTS5) inside its database: schema, triggers, per-commit merge and
repair. An external-content table kept in step with ``passages`` by triggers, so every commit writes both in its one
transaction (crash-safe like the rest); ``store_db`` makes it for stores from before it, ``store_fts`` searches it.
"""
from __future__ import annotations

import sqlite3

FTS_TABLE = "passages_fts"
# Each commit merges the full-text index's segments, at least as many pages as it changes passages (a passage is
# ~0.05 page), with a positive FTS5 'merge': a level is merged once it holds 'usermerge' (4) segments, so the index
# keeps a few segments on each of O(log n) levels. Never 'merge' < 0 nor 'optimize' per commit: in SQLite 3.40 each
# of them adds a level to the index's structure record once it spans two pages, until (~1,000 commits) SQLite calls
# the record malformed and the store cannot be opened.
FTS_MERGE_MIN_PAGES = 64
# The structure record of an empty FTS5 index (4-byte cookie, then 0 levels, 0 segments, 0 writes): its row in
# ``<table>_data``; a rebuild needs the table, and the table will not load a record SQLite calls malformed.
_STRUCTURE_ROWID = 10
_EMPTY_STRUCTURE = bytes(7)
FTS_TRIGGERS = ("passages_fts_insert", "passages_fts_delete", "passages_fts_update")
_INSERT = f"INSERT INTO {FTS_TABLE}(rowid, title, text, context) VALUES (new.id, new.title, new.text, new.context)"
_DELETE = (f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, title, text, context) "
           "VALUES ('delete', old.id, old.title, old.text, old.context)")
_REBUILD = f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')"
FTS_DDL = [
    f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5(title, text, context, content='passages', content_rowid='id', "
    "tokenize='porter unicode61')",
    f"CREATE TRIGGER passages_fts_insert AFTER INSERT ON passages BEGIN {_INSERT}; END",
    f"CREATE TRIGGER passages_fts_delete AFTER DELETE ON passages BEGIN {_DELETE}; END",
    f"CREATE TRIGGER passages_fts_update AFTER UPDATE OF context ON passages BEGIN {_DELETE}; {_INSERT}; END",
    _REBUILD,
]


def has_fts(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (FTS_TABLE,)).fetchone() is not None


def merge(db: sqlite3.Connection, changed: int) -> None:
    """The commit's bounded merge of the index's segments (``changed``: passages the commit added or removed)."""
    if has_fts(db):
        db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('merge', ?)",
                   (max(FTS_MERGE_MIN_PAGES, changed),))


def repair(db: sqlite3.Connection) -> None:
    """Rebuild the index from the passages if SQLite will not load it (a structure record it calls malformed, as
    the commits of earlier versions left): reset to an empty index, then FTS5's 'rebuild', in one transaction (a
    second process opening it meanwhile finds it whole). The index holds nothing the passages do not."""
    if not has_fts(db) or _loads(db):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if not _loads(db):
            db.execute(f"UPDATE {FTS_TABLE}_data SET block = ? WHERE id = ?", (_EMPTY_STRUCTURE, _STRUCTURE_ROWID))
            db.execute(_REBUILD)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _loads(db: sqlite3.Connection) -> bool:
    try:
        db.execute(f"SELECT rowid FROM {FTS_TABLE} LIMIT 0").fetchall()
    except sqlite3.DatabaseError:
        return False
    return True


def damaged(db: sqlite3.Connection) -> bool:
    """Whether FTS5's integrity check finds the index disagreeing with the passages: bit rot in its pages, which
    quick_check does not read, and searches would return other passages. Run in a transaction it rolls back."""
    try:
        db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")
    except sqlite3.DatabaseError:
        return True
    finally:
        db.rollback()
    return False
