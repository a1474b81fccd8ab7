"""The kiosk's own questions, kept for ``edge-rag calibrate`` (opt-in: ``edge-rag serve --question-log FILE``).

A certificate covers questions drawn like its calibration questions, and a kiosk's visitors are that draw. Every
question the server accepts is appended to a JSON-lines file as ``{"question": ..., "asked": ...}`` (UTC time; no
address, no answer). Someone who knows the documents then adds ``"answer"`` to each line — the text, a list of
acceptable texts, or null where the documents hold none — and calibrates on the file. The device's own answers are
left out on purpose: labels copied from them would certify the device by its own word. The file holds what
visitors typed, verbatim (only questions the server accepted, so at most the page's question length), readable by
the server's user alone (mode 0600): tell visitors, and delete it once calibrated.
"""
from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import EdgeRAGError

log = logging.getLogger("edge_rag")
MAX_BYTES = 32_000_000  # ~150,000 questions; then it stops growing (a script on the kiosk's browser may ask forever)
READ_BYTES = MAX_BYTES + 1_000_000  # read as far as the log grows
BLOCK = 1 << 16  # read back from the end a block at a time
MAX_LINE = 1 << 16  # a line the server wrote is a question of at most a few KB


class QuestionLog:
    """Appends accepted questions to ``path`` (None: keeps nothing); one line per question, whole or not at all
    but for a crash mid-write, which ``edge-rag calibrate`` reports by line number."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()  # questions arrive on many threads; lines must not interleave
        self._failed = False
        if path is not None:
            try:
                _end_cut_line(path)
            except OSError as exc:
                raise EdgeRAGError(f"cannot write the question log {path}: {exc}") from exc

    def add(self, question: str) -> None:
        """Keep ``question``; a failed write (disk full, the file at MAX_BYTES) is logged once and never fails the
        question."""
        if self.path is None:
            return
        asked = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        line = json.dumps({"question": question, "asked": asked}, ensure_ascii=False) + "\n"
        with self._lock:
            try:
                _append(self.path, line.encode())
            except OSError as exc:
                if not self._failed:
                    log.warning("cannot append to the question log %s: %s", self.path, exc)
                self._failed = True


def lines(path: Path | None) -> Iterator[tuple[str, str]]:
    """(question as typed, when asked) of every whole line of the log, oldest first (a line cut by a crash, or not
    a question, is skipped); nothing when there is no log yet. Read up to MAX_BYTES, as far as the log grows, a line
    at a time (split at newlines only: U+2028 is inside a string); read whole, then decoded and split, a full log
    rose peak RSS by 160 MB, twice the 83 MB of what it returns."""
    for line in _opened(path, _forward):
        if (entry := _entry(line)) is not None:
            yield entry


def newest(path: Path | None) -> Iterator[tuple[str, str]]:
    """As ``lines``, newest first, read back from the log's end in blocks, holding a block and a line at a time: the
    operator's listing finds its page, then reads on to count how often its questions were asked."""
    for line in _opened(path, _backward):
        if (entry := _entry(line)) is not None:
            yield entry


def _opened(path: Path | None, reader: Callable[[BinaryIO], Iterator[bytes]]) -> Iterator[bytes]:
    if path is None:
        return
    try:
        with open(path, "rb") as f:
            yield from reader(f)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EdgeRAGError(f"cannot read the question log {path}: {exc}") from exc


def _forward(f: BinaryIO) -> Iterator[bytes]:
    left = READ_BYTES
    while left > 0 and (line := f.readline(left)):
        left -= len(line)
        yield line


def _backward(f: BinaryIO) -> Iterator[bytes]:
    """The lines of the log's first READ_BYTES, last first; a "line" past MAX_LINE bytes is no question the server
    wrote and is dropped unread (else a file of one huge line would be held whole)."""
    pos, tail, dropping = min(f.seek(0, os.SEEK_END), READ_BYTES), b"", False
    while pos > 0:
        step = min(BLOCK, pos)
        pos -= step
        f.seek(pos)
        *head, last = (f.read(step) + tail).split(b"\n")[::-1]  # head: this block's whole lines, newest first
        for line in head:
            if not dropping:
                yield line
            dropping = False
        tail = last
        if len(tail) > MAX_LINE:
            tail, dropping = b"", True
    if not dropping:
        yield tail


def _entry(line: bytes) -> tuple[str, str] | None:
    try:
        entry = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    if isinstance(entry, dict) and isinstance(entry.get("question"), str):
        return entry["question"], str(entry.get("asked", ""))
    return None


def _end_cut_line(path: Path) -> None:
    """Create the log, or end the line a crash cut short (power lost mid-write): else the next question appended
    is glued to it, and skipped with it."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                cut = f.read(1) != b"\n"
            if cut:
                os.write(fd, b"\n")
    finally:
        os.close(fd)


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` whole or not at all: a line the disk filled up in the middle of is cut off again (left, the
    first question appended once there was space again was glued to it, and both were skipped)."""
    fd = _open(path)
    try:
        end = os.fstat(fd).st_size
        if end + len(data) > MAX_BYTES:
            raise OSError(f"it has reached {MAX_BYTES // 1_000_000} MB; questions are no longer kept")
        try:
            if os.write(fd, data) < len(data):  # a short write: the disk filled up mid-line
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    """A descriptor appending to ``path``, created readable by this user only; an older file is made so too."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd
