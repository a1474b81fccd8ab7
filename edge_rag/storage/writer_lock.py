"""One writer per store: an exclusive ``flock`` on a lock file in the store folder.

Held for a whole indexing run; the holder's pid is written into the file so a second writer can say
who it is waiting for. ``flock`` locks belong to an open file, so a second ``WriterLock`` in the same
process conflicts too, and the kernel drops the lock if the holder dies (a crash never leaves a store
locked).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import StoreBusy, StoreError, check_seconds
from .readonly import writable

LOCK_FILE = "writer.lock"


def acquire(folder: Path, timeout: float) -> int:
    """The locked file's descriptor; waits up to ``timeout`` s, then StoreBusy naming the holder."""
    check_seconds(timeout, "lock_timeout")  # NaN never ends a wait
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # another user's file, a folder in its place: was a bare traceback
        why = "" if writable(folder) else (
            "; the store folder is read-only here: it answers questions, indexing and removing need it writable")
        raise StoreError(f"cannot open the store's writer lock {folder / LOCK_FILE}: {exc.strerror}{why}") from exc
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                who = ("another store object of this process (another EdgeRAG on the same folder)"
                       if holder == str(os.getpid()) else f"another process (pid {holder})")
                raise StoreBusy(
                    f"store {folder} is being written by {who}; waited {timeout:g} s — retry when it is done, "
                    "or wait longer (EdgeRAG's lock_timeout, --wait SECONDS)"
                ) from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):  # only for the message above: a full disk fails the commit, and says so
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release(fd: int) -> None:
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextlib.contextmanager
def held(lock: threading.RLock, wait: bool, store: str) -> Iterator[None]:
    """A store's in-process writers' ``lock`` held; without ``wait``, a StoreBusy at once if another thread holds it
    (a caller that must not wait for an indexing run, whose commits are about to move the version anyway)."""
    if not lock.acquire(blocking=wait):
        raise StoreBusy(f"store {store} is being written by another thread; retry when it is done")
    try:
        yield
    finally:
        lock.release()
