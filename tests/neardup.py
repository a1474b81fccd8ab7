"""A bulk load of near-duplicate text: files of templated sentences that differ in a word or a number.

Issue #26: the sample corpus plus ~17,000 such passages made HNSW search at ef 64 miss "Tickets and
Prices" entirely (best hit at distance 0.85 while exact search finds it at 0.15).
"""
from __future__ import annotations

import random

TEMPLATES = (
    "Locker {n} on level {a} of the {w} wing is checked every {b} minutes by the {r} team.",
    "Exhibit case {n} in the {w} gallery holds {a} items lent by the {r} collection since {y}.",
    "Visitor survey form {n} rated the {w} display {a} out of {b} on a {r} afternoon.",
    "Maintenance log entry {n}: the {w} lift on floor {a} was inspected by the {r} crew in {y}.",
    "Volunteer rota {n} puts {a} helpers at the {w} desk from {b} o'clock on {r} days.",
)
WORDS = ("north", "south", "east", "west", "upper", "lower", "old", "new", "main", "side")
CREWS = ("morning", "evening", "weekend", "weekday", "holiday", "night", "spring", "autumn")


def near_duplicate_docs(files: int = 110, per_file: int = 100, seed: int = 0) -> list[tuple[str, str]]:
    """(title, text) of ``files`` documents of ``per_file`` templated sentences each, seeded."""
    rnd = random.Random(seed)
    docs = []
    for f in range(files):
        template = TEMPLATES[f % len(TEMPLATES)]
        sentences = [template.format(n=f * per_file + i, a=rnd.randint(1, 9), b=rnd.randint(10, 60),
                                     w=rnd.choice(WORDS), r=rnd.choice(CREWS), y=rnd.randint(1990, 2024))
                     for i in range(per_file)]
        docs.append((f"Operations log {f + 1}", " ".join(sentences)))
    return docs
