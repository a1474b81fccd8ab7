"""A reentrant lock taken in the order it was asked for.

``threading.RLock`` is not fair: a thread that releases it and takes it again at once (a store commit
inserting its vectors chunk by chunk) nearly always wins over a thread woken to take it, so a search
could wait for every chunk of a commit, seconds, instead of one. Here a thread that asks queues behind
those already waiting.
"""
from __future__ import annotations

import threading
from collections import deque


class FairLock:
    """A reentrant lock, first come first served; a context manager."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[int] = deque()  # threads waiting, in the order they asked
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> FairLock:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return self
            self._queue.append(me)
            try:
                self._cond.wait_for(lambda: self._owner is None and self._queue[0] == me)
            finally:
                self._queue.remove(me)
                self._cond.notify_all()  # the next in line may take it (or, on an error, still can)
            self._owner, self._depth = me, 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()
