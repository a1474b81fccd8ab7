"""Threads that run a part of one search beside the caller: hnswlib and SQLite let go of the GIL while they search,
so on a device with a spare core a question's dense and full-text searches overlap instead of adding up
(``retrieve.search``; `python -m benchmarks.scale_backends` measures the hybrid search at scale).

There are few threads (each costs RSS: a stack, a malloc arena); a part that finds them all busy runs in its
caller's thread, so no question waits for another's parts.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
THREADS = 2  # per process
_POOLS: dict[int, tuple[ThreadPoolExecutor, threading.Semaphore]] = {}  # by process id


def beside(fn: Callable[..., T], *args: object) -> Future[T]:
    """``fn(*args)`` on a free thread (one set per process: a forked child has none of its parent's threads), or
    now in this thread when none is free."""
    if (pool := _POOLS.get(os.getpid())) is None:
        executor = ThreadPoolExecutor(THREADS, thread_name_prefix="edge-rag-search")
        pool = _POOLS.setdefault(os.getpid(), (executor, threading.Semaphore(THREADS)))
    executor, free = pool
    if free.acquire(blocking=False):
        def run() -> T:
            try:
                return fn(*args)
            finally:
                free.release()
        return executor.submit(run)
    done: Future[T] = Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:  # raised again by done.result(), as from a thread
        done.set_exception(exc)
    return done
