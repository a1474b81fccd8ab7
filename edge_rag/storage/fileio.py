"""Atomic file writes: temp file in the same folder, fsync, rename — a crash never leaves half a file."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

_WRITING: set[str] = set()  # names of the temps this process is writing now
_WRITING_LOCK = threading.Lock()
_STARTED = time.time()  # this process was running by then


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success fsync it and rename it over ``path``. The temps that killed
    writers of ``path`` left are removed first: each kill mid-write left one more for good (5 kills, 5 MB of them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    # Not mkstemp: its 0600 mode would leave bundles and stores unreadable to a kiosk's service user.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with _WRITING_LOCK:  # before it exists: another thread's remove_stale_temps must never take it for stale
        _WRITING.add(tmp.name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        try:
            hold(fd)  # while it is written: live to a writer that cannot see this pid
            yield Path(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.close(fd)
    finally:
        with _WRITING_LOCK:
            _WRITING.discard(tmp.name)


def remove_stale_temps(path: Path) -> None:
    """Remove ``atomic_path``'s temps for ``path`` whose process is gone: only its own naming, never another file's
    temp, never one a live process (this one included) is writing."""
    ours = re.compile(rf"\.{re.escape(path.name)}\.([0-9]+)\.[0-9a-f]{{8}}\.tmp")
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:  # unlisted: the write says what is wrong
        for entry in entries:
            if (found := ours.fullmatch(entry.name)) and _stale(entry, int(found[1])):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _stale(entry: os.DirEntry, pid: int) -> bool:
    """A temp of a gone process that this process is not writing (it may have this one's pid) and no process holds
    (one in another pid namespace, a container sharing the folder, runs under a pid this one does not see: its live
    temp was removed, and its write failed with FileNotFoundError)."""
    with _WRITING_LOCK:
        if entry.name in _WRITING:
            return False
    return left_by_a_gone_process(pid, entry.stat().st_mtime) and not held(entry.path)


def hold(fd: int) -> None:
    """Lock ``fd`` (a temp, an upload's folder) for as long as it stays open: ``held`` then says a process still uses
    it. A file system without flock: none taken, and ``held`` keeps it as if held."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX)


def held(path: str | Path) -> bool:
    """Whether a process holds the lock ``atomic_path`` takes on its temp ``path`` (or an upload on its folder; yes
    if it cannot be opened or locked at all)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # the lock, if taken, with it
    return False


def left_by_a_gone_process(pid: int, changed: float) -> bool:
    """Whether a file or folder named with ``pid``, last changed at ``changed``, was left by a process that is gone:
    one with another pid that runs no process, or one that had this process's pid before it started (a container's
    entrypoint has pid 1 at every start: each one killed left what it was writing for good)."""
    return changed < _STARTED if pid == os.getpid() else not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # a number no pid can be (a name anyone may give a file in a shared folder)
        return False
    return True


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
