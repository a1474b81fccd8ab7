"""The question as the full-text indexes read it: its content words, OR-ed.

Both stores index each passage's title, text and context (its neighbours' text, store_db.CONTEXT_NEIGHBOURS, at a
lower weight) with an English stemmer (SQLite FTS5 ``porter unicode61``,
PostgreSQL ``to_tsvector('english', ...)``) and rank by their own term statistics (BM25, ``ts_rank_cd``). A
question is reduced to its content words (``query_words``: lower-case words, stop words dropped, as
``text.keywords`` but whole in every script) and any of them may match: questions paraphrase, so requiring every word would miss. A number written with a decimal
point or thousands separators ("3.7", "26,000") is also a term of its own, which each engine reads as it read the
passages (FTS5: the phrase "3 7"; PostgreSQL: the number 3.7): its digits alone, "3" OR "7", matched any 3 and any 7
in SQLite, and never a "3.7" in PostgreSQL, which indexes the number whole. Only word characters and those
separators reach a query string, so no question can inject the engines' query syntax. A question with no such word
(all stop words, emoji) has no lexical query, and retrieval falls back to dense.

Ranking every passage that holds any of the words costs time in proportion to their postings: at 100k passages
common words ("one", "new", "film": 5-20% of passages each) make an OR-ed question score thousands of passages.
So the candidates are the passages holding the question's *rarest* words, up to ``POSTINGS_BUDGET`` postings (at
least the rarest word; ``Config.lexical_budget``), and every word still scores them. What that costs in R@1, on every
SQuAD 1.1 train article indexed (92,182 sentence passages with their context column) and 2,000 questions of the
articles ``benchmarks.fusion`` tunes on: nothing at 2,000 postings (hybrid R@1 0.717, as exact search), 0.3 points at
1,000 (0.714), 0.5 at 500; hybrid p50 3.33 ms at 2,000, 2.65 at 1,000, 12.83 exact (``python -m
benchmarks.lexical_budget --real``; docs/decisions/lexical-budget.md). A store smaller than the budget is searched exactly.
Each store remembers its words' postings (``Postings``) until its next commit: a question's words are counted once.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Hashable

from ..documents.text import INVISIBLE, STOPWORDS

MAX_TERMS = 32  # terms one full-text query holds at most: a long question's rarest (``rarest``)
POSTINGS_BUDGET = 2_000  # passages a lexical search scores at most, roughly (benchmarks/lexical_budget.py)
POSTINGS_CACHE = 20_000  # terms whose postings a store remembers (~2 MB)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)+")  # "3.7", "26,000", "1,000,000": one term each


def query_terms(question: str) -> list[str]:
    """The question's content words, and its numbers written with separators, in a fixed order (sorted, so one
    question always makes one query). All of them: a store keeps the ``rarest`` once it has counted them."""
    content = {w for w in query_words(question) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())}
    return sorted(content | set(_NUMBER.findall(question)))


def query_words(question: str) -> list[str]:
    r"""Lower-case words of the question in NFC, each whole with its combining marks, as the engines read a passage's
    words: ``\w`` holds no mark, so "संग्रहालय" (Devanagari, Thai, Tamil, Arabic with vowel marks) was the fragments
    "रह" and "लय", which PostgreSQL's index never holds. Invisible marks in a word (a pasted "cloak\u200broom") are
    dropped, as in passages, and "İ" is "i" (Python lower-cases it to "i" and a combining dot, no word PostgreSQL's
    index holds; SQLite drops the dot). "_" splits words, as in both engines: "_the_" (Markdown emphasis) and
    "opening_hours" were kept whole, so their stop words reached the query and matched nearly every passage."""
    text = unicodedata.normalize("NFC", question.translate(INVISIBLE))
    kept = (c if c.isalnum() or unicodedata.category(c)[0] == "M" else " " for c in text)
    return "".join(kept).lower().replace("i\u0307", "i").split()


def rarest(terms: list[str], postings: list[int], n: int = MAX_TERMS) -> tuple[list[str], list[int]]:
    """The ``n`` terms the fewest passages hold, but at least one (ties by term), with their postings, in ``terms``'
    order: the words BM25 weighs most (a word no passage holds scores nothing). A long question ("we walked the
    gardens, admired the paintings ... when does it close?") was cut to its alphabetically first 32 words, and the
    words that named its subject were often among those dropped."""
    held = [i for i in range(len(terms)) if postings[i] > 0]
    keep = sorted(sorted(held, key=lambda i: (postings[i], terms[i]))[:n])
    return [terms[i] for i in keep], [postings[i] for i in keep]


def candidate_terms(terms: list[str], postings: list[int], budget: int = POSTINGS_BUDGET
                    ) -> tuple[list[str], list[str]]:
    """``terms`` split by their postings (how many passages hold each) into the rarest, whose passages are the
    candidates (postings summing to at most ``budget``, and at least one term), and the rest, which only score them."""
    order = sorted(range(len(terms)), key=lambda i: (postings[i], terms[i]))
    rare: list[str] = []
    total = 0
    for i in order:
        if rare and total + postings[i] > budget:
            break
        rare.append(terms[i])
        total += postings[i]
    return rare, [t for t in terms if t not in rare]


class Postings:
    """How many passages hold each term, remembered while the store's ``key`` (its version, a time bucket) stays:
    counting a common word costs up to 0.1 ms (SQLite) each question, and the split into rare and common terms
    needs no exact count."""

    def __init__(self) -> None:
        self._key: Hashable = None
        self._counts: dict[str, int] = {}

    def of(self, terms: list[str], key: Hashable, count: Callable[[list[str]], list[int]]) -> list[int]:
        """Each term's postings; ``count`` counts those not remembered under ``key``."""
        counts = self._counts  # searches in other threads may start a new dict meanwhile, never change this one
        if key != self._key or len(counts) > POSTINGS_CACHE:
            counts, self._key = {}, key
            self._counts = counts
        if missing := [t for t in dict.fromkeys(terms) if t not in counts]:
            counts.update(zip(missing, count(missing)))
        return [counts[t] for t in terms]


def fts5_query(terms: list[str]) -> str:
    """SQLite FTS5 MATCH syntax: every term a quoted string, OR-ed."""
    return " OR ".join(f'"{t}"' for t in terms)


def tsquery(terms: list[str]) -> str:
    """PostgreSQL to_tsquery syntax: every term quoted, OR-ed, a term with an accent in NFD too. PostgreSQL's index
    holds a word as written, and a document given as a string ("Cafe" and a combining accent, as macOS writes it) is
    indexed as given (files are read in NFC): "café" found none of them; SQLite's FTS5 drops the accents either way."""
    return " | ".join(f"'{v}'" for t in terms for v in dict.fromkeys((t, unicodedata.normalize("NFD", t))))
