"""The question as the full-text indexes read it: its content words, OR-ed.

Both stores index each passage's title and text with an English stemmer (SQLite FTS5 ``porter unicode61``,
PostgreSQL ``to_tsvector('english', ...)``) and rank by their own term statistics (BM25, ``ts_rank_cd``). A
question is reduced to its content words (``text.keywords``: lower-case word characters, stop words dropped) and
any of them may match: questions paraphrase, so requiring every word would miss. Only word characters reach a
query string, so no question can inject the engines' query syntax. A question with no such word (all stop
words, emoji) has no lexical query, and retrieval falls back to dense.
"""
from __future__ import annotations

from .text import keywords

MAX_TERMS = 32  # a long question's extra words add cost, not recall


def query_terms(question: str) -> list[str]:
    """The question's content words, in a fixed order (sorted, so one question always makes one query)."""
    return sorted(keywords(question))[:MAX_TERMS]


def fts5_query(terms: list[str]) -> str:
    """SQLite FTS5 MATCH syntax: every term a quoted string, OR-ed."""
    return " OR ".join(f'"{t}"' for t in terms)


def tsquery(terms: list[str]) -> str:
    """PostgreSQL to_tsquery syntax: every term quoted, OR-ed."""
    return " | ".join(f"'{t}'" for t in terms)
