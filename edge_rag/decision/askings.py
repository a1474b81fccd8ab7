"""Which logged askings of a labelled question are draws of what visitors ask (the operator's labels, labels.py).

The certificate's bound takes each labelled question it is measured on for an independent draw of the questions
visitors ask: a question many visitors ask counts as often as they ask it. A visitor asking the same again at once
(a double tap, a retry after a refusal) is not another draw: counted each, 3 askings a visit held alpha in 78-84%
of Monte-Carlo draws where 95% was promised. The log keeps no visitor, so the same question again within REPEAT_S
of its last counted asking is taken for the same visitor's.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable, Container, Iterable, Iterator

REPEAT_S = 300  # the same question again within this of its last counted asking: the same visitor asking again


def visits(logged: Iterable[tuple[str, str]], key: Callable[[str], str | None],
           keys: Container[str]) -> Iterator[tuple[str, str, str]]:
    """(key, question as typed, when) of each asking in ``logged`` ((question, when), oldest first) whose ``key``
    is in ``keys``, but for one within REPEAT_S of the same question's last counted asking. An asking whose time is
    missing or not a time counts."""
    last: dict[str, datetime.datetime | None] = {}
    for question, asked in logged:
        if (k := key(question)) is None or k not in keys:
            continue
        when, before = _when(asked), last.get(k)
        if when is None or before is None or not 0 <= (when - before).total_seconds() <= REPEAT_S:
            last[k] = when  # from the asking counted: measured from the last asking, a question asked every
            yield k, question, asked  # 90 s all day was one chain, one draw (40 visits in an hour counted once)


def _when(asked: str) -> datetime.datetime | None:
    try:
        when = datetime.datetime.fromisoformat(asked)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)
