"""Uploaded files: saved in a temporary folder of this server, parsed before the 202, known by the client's path.

Identity: the documents of an uploaded file have the source ``upload:`` + the path the client sent (a
browser's folder upload sends ``a/same.txt``), in lower case. Two files of one name in different folders are
two files; ``Tours.TXT`` uploaded again as ``tours.txt`` replaces it, as on the case-insensitive file systems
such files come from (the kiosk must not answer from the old price list). One upload naming a file twice
is refused.

Temporary folders carry the server's pid: a server killed mid-upload leaves its folder behind, and the next
start removes every folder whose process is gone.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from ..documents.chunk import read_documents
from ..documents.parse_child import Parser
from ..errors import InputError
from ..types import Document

UPLOAD_SUFFIXES = (".txt", ".md", ".json", ".jsonl", ".pdf", ".html", ".htm")
UPLOAD_SOURCE = "upload:"  # + the client's path in lower case: the source of uploaded documents
MAX_FILENAME_BYTES = 255  # one path component on every common file system
MAX_PATH_BYTES = 1024
TEMP_PREFIX = "edge-rag-upload-"  # + pid + "-" + random
_SEPARATORS = re.compile(r"[/\\]")


@contextlib.contextmanager
def upload_folder() -> Iterator[Path]:
    """A temporary folder for one upload, removed when the block ends however it ends."""
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        yield Path(tmp)


def remove_stale_folders() -> None:
    """Remove upload folders left by servers that were killed (their pid is gone)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = folder.name[len(TEMP_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


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
        base = name.rsplit("/", 1)[-1]
        (folder / f"{n:03d}").mkdir()
        (folder / f"{n:03d}" / base).write_bytes(await f.read())
        saved.append((name, folder / f"{n:03d}" / base))
    return saved


def client_path(filename: str) -> str:
    """The client's relative path, '/'-separated, without empty, '.' or '..' parts; 4xx for a bad name."""
    parts = [p for p in _SEPARATORS.split(filename) if p not in ("", ".", "..")]
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
