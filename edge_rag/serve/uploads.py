"""Uploaded files: saved in a temporary folder of this server, parsed before the 202 (their documents wait in that
folder for the upload's job, not in memory), known by the client's path.

Identity: the documents of an uploaded file have the source ``upload:`` + the path the client sent (a
browser's folder upload sends ``a/same.txt``), in lower case and composed form (NFC). Two files of one name in
different folders are two files; ``Tours.TXT`` uploaded again as ``tours.txt`` replaces it, as on the
case-insensitive file systems such files come from (the kiosk must not answer from the old price list). One upload
naming a file twice is refused.

Temporary folders carry the server's pid: a server killed mid-upload leaves its folder behind, and the next
start removes every folder whose process is gone and that no server holds (an flock while the folder lives: a server in
another pid namespace, a container sharing /tmp, sees no process under a live one's pid).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from ..documents.chunk import read_documents
from ..documents.parse_child import Parser
from ..errors import InputError
from ..storage.fileio import held, hold, left_by_a_gone_process
from ..types import Document

UPLOAD_SUFFIXES = (".txt", ".md", ".json", ".jsonl", ".pdf", ".html", ".htm")
UPLOAD_SOURCE = "upload:"  # + the client's path in lower case: the source of uploaded documents
MAX_FILENAME_BYTES = 255  # one path component on every common file system
MAX_PATH_BYTES = 1024
TEMP_PREFIX = "edge-rag-upload-"  # + pid + "-" + random
DOCUMENTS = "documents.parsed"  # beside each uploaded file: its documents, a JSON line each (no upload suffix)
COPY_CHUNK = 1 << 20  # an upload is saved from the parser's spooled file a MiB at a time
_SEPARATORS = re.compile(r"[/\\]")


def upload_folder() -> tuple[Path, int]:
    """A temporary folder for one upload: its files, then their documents until its job has indexed them. The job
    removes it (or the upload, if it goes no further; ``Folders``). With the descriptor that holds its flock until then
    (a file system without flock: none held, the folder kept by the others as if held)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    fd = os.open(folder, os.O_RDONLY)
    hold(fd)
    return folder, fd


def remove_stale_folders() -> None:
    """Remove upload folders left by servers that were killed (their process is gone, and with it their lock)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = folder.name[len(TEMP_PREFIX):].split("-")[0]
        with contextlib.suppress(OSError):  # gone meanwhile
            if pid.isascii() and pid.isdigit() and left_by_a_gone_process(int(pid), folder.stat().st_mtime) \
                    and not held(folder):
                shutil.rmtree(folder, ignore_errors=True)


class Folders:
    """A server's upload folders, each removed once its job is done with it, or at the server's shutdown (the jobs it
    drops never run)."""

    def __init__(self) -> None:
        self._waiting: dict[Path, int] = {}  # each folder's descriptor, holding its lock
        self._lock = threading.Lock()

    async def save_and_parse(self, files: list[UploadFile], parser: Parser,
                             parsing: Executor) -> tuple[Path, list[tuple[str, Path]]]:
        """``save_files`` into a new ``upload_folder``, every file parsed there on ``parsing`` (one bad file, an
        InputError, adds nothing) and its documents stashed beside it; the folder is removed if any of it fails."""
        folder, fd = upload_folder()
        try:
            saved = await save_files(files, folder)
            await asyncio.get_running_loop().run_in_executor(parsing, _parse_all, saved, parser)
        except BaseException:
            _remove(folder, fd)
            raise
        with self._lock:
            self._waiting[folder] = fd
        return folder, saved

    @contextlib.contextmanager
    def done(self, folder: Path) -> Iterator[None]:
        """``folder`` removed when the block (its job) ends, however it ends."""
        try:
            yield
        finally:
            with self._lock:
                fd = self._waiting.pop(folder, None)
            if fd is not None:
                _remove(folder, fd)

    def remove_all(self) -> None:
        with self._lock:
            for folder, fd in self._waiting.items():
                _remove(folder, fd)
            self._waiting.clear()


def _remove(folder: Path, fd: int) -> None:
    """The folder removed, then its lock let go."""
    shutil.rmtree(folder, ignore_errors=True)
    os.close(fd)


def _parse_all(saved: list[tuple[str, Path]], parser: Parser) -> None:
    for name, path in saved:  # one file's documents in memory at a time
        stash(parse(name, path, parser), path)


def stash(docs: list[Document], path: Path) -> None:
    """Keep the documents parsed from ``path`` beside it (one JSON line each) until its job reads them: kept in memory,
    the uploads queued behind a long one held all their text, which no memory plan priced (it prices the documents of
    the upload being indexed): 20 uploads of 2 MB raised RSS by 120 MB, 92 with their documents on disk."""
    with open(path.with_name(DOCUMENTS), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(dataclasses.astuple(d)) + "\n" for d in docs)


def unstash(path: Path) -> list[Document]:
    """The documents ``stash`` kept for ``path``."""
    with open(path.with_name(DOCUMENTS), encoding="utf-8") as f:
        return [Document(*json.loads(line)) for line in f]


async def save_files(files: list[UploadFile], folder: Path) -> list[tuple[str, Path]]:
    """(client path, saved file) of each upload, each file under its own base name (titles come from it)
    in its own folder; 4xx for a bad name or a file sent twice."""
    saved: list[tuple[str, Path]] = []
    seen: dict[str, str] = {}
    for n, f in enumerate(files):
        name = client_path(f.filename or "")
        if name.casefold() in seen:
            raise HTTPException(400, f"{name[:80]!r} and {seen[name.casefold()][:80]!r} are the same file (names "
                                     "are compared ignoring case); send it once")
        seen[name.casefold()] = name
        path = folder / f"{n:03d}" / name.rsplit("/", 1)[-1]
        path.parent.mkdir()
        await run_in_threadpool(_copy, f, path)
        saved.append((name, path))
    return saved


def _copy(upload: UploadFile, path: Path) -> None:
    """The upload's spooled file into ``path`` a chunk at a time, off the event loop: read whole and written on it, a
    20 MB upload was held whole in memory and every request waited for its write (a health poll: 54 ms -> 316 ms)."""
    upload.file.seek(0)
    with open(path, "wb") as out:
        shutil.copyfileobj(upload.file, out, COPY_CHUNK)


def client_path(filename: str) -> str:
    """The client's relative path, '/'-separated, without empty, '.' or '..' parts, in Unicode's composed form (NFC:
    a Mac may send 'é' as 'e' + accent, where another machine sends one character); 4xx for a bad name."""
    parts = [p for p in _SEPARATORS.split(unicodedata.normalize("NFC", filename)) if p not in ("", ".", "..")]
    base = parts[-1] if parts else ""
    if Path(base).suffix.lower() not in UPLOAD_SUFFIXES:
        raise HTTPException(415, f"{base[:80] or 'a file'}: only {' '.join(UPLOAD_SUFFIXES)} files are indexed")
    name = "/".join(parts)
    if (len(base.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES or "\x00" in name
            or len(name.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES):
        raise HTTPException(400, f"file name {base[:40]!r}… is over {MAX_FILENAME_BYTES} bytes (its path over "
                                 f"{MAX_PATH_BYTES}) or holds a NUL")
    return name


def source_of(name: str) -> str:
    """The source of a file's documents: uploading a file of that path again (in any case) replaces them."""
    return UPLOAD_SOURCE + name.casefold()


def parse(name: str, path: Path, parser: Parser) -> list[Document]:
    """The documents of the saved file ``path``; errors name it as the client did, not by its temporary path."""
    try:
        docs = read_documents(path, parser)
    except InputError as exc:
        raise InputError(str(exc).replace(str(path), name)) from None
    return [replace(d, source=source_of(name)) for d in docs]
