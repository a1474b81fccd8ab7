"""Files to index: found under the paths given and read one at a time, each file that cannot be read skipped
with its reason, so one bad file (or one folder entry out of reach) does not cost a whole folder."""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from ..types import Document
from .chunk import SUFFIXES, read_documents


def iter_files(paths: Iterable[str | Path], on_error: Callable[[OSError], None] | None = None,
               on_other: Callable[[Path, list[Path]], None] | None = None) -> Iterator[Path]:
    """Files to index: the paths themselves, and supported files below any folder, sorted. An entry of a folder
    that cannot be listed or checked (a path longer than the system takes) goes to ``on_error``, so the rest of
    the folder is still found (default: raised); the files of a folder passed over for their type (hidden ones
    aside) go to ``on_other(folder, files)`` once it is walked."""
    for raw in paths:
        if os.fspath(raw) == "":  # Path("") is ".": an unset setting would index the working folder
            raise InputError("the path is empty")
        path = Path(raw).expanduser()
        if path.is_dir():
            others: list[Path] = []
            yield from sorted(_walk(path, on_error or _raise, others))
            if others and on_other is not None:
                on_other(path, others)
        elif path.is_file():
            yield path
        elif path.exists():  # reading a pipe or /dev/zero never ends
            raise InputError(f"{path} is not a regular file or folder (a pipe, a device or a socket): not read")
        else:
            raise InputError(f"no such file or folder: {path}")


def _walk(folder: Path, on_error: Callable[[OSError], None], others: list[Path]) -> Iterator[Path]:
    for root, _, names in os.walk(folder, onerror=on_error):
        others += [Path(root, n) for n in names if Path(n).suffix.lower() not in SUFFIXES and not n.startswith(".")]
        for path in (Path(root, name) for name in names if Path(name).suffix.lower() in SUFFIXES):
            try:
                if path.is_file():
                    yield path
            except OSError as exc:
                on_error(exc)


def _raise(exc: OSError) -> None:
    raise exc


def read_files(paths: Iterable[str | Path], strict: bool = False,
               on_skip: Callable[[Path, str], None] | None = None) -> Iterator[tuple[Path, list[Document]]]:
    """Each readable file under ``paths`` with its documents, one file at a time. A file that cannot be
    read (missing, unreadable, malformed) is reported to ``on_skip(path, reason)`` (default: a warning) and
    skipped, so one bad file does not cost a whole folder; ``strict`` raises on the first one. Raises
    InputError when every file was skipped."""
    report = on_skip or warn_skip
    read = skipped = 0

    def skip(path: Path, exc: Exception) -> None:
        nonlocal skipped
        if strict:
            raise exc
        skipped += 1
        report(path, str(exc))

    def pass_over(folder: Path, files: list[Path]) -> None:  # a folder of Word files: said, not "added 0 passages"
        nonlocal skipped
        skipped += len(files)
        kinds = ", ".join(sorted({f.suffix.lower() or f.name for f in files})[:8])
        report(folder, f"{len(files)} file(s) of a type not read ({kinds}); edge-rag reads {' '.join(SUFFIXES)}")

    for raw in paths:
        try:
            files = list(iter_files([raw], lambda exc: skip(Path(exc.filename), exc), pass_over))
        except (InputError, OSError) as exc:  # the path itself does not exist, or names none (a name too long)
            skip(Path(raw), exc)
            continue
        for path in files:
            try:
                docs = read_documents(path)
            except (InputError, OSError) as exc:  # OSError: permissions, I/O — this file's fault only
                skip(path, exc)
                continue
            read += 1
            yield path, docs
    if skipped and not read:
        raise InputError(f"nothing indexed: all {skipped} file(s) were skipped (see the warnings above)")


def read_paths(paths: Iterable[str | Path], strict: bool = False,
               on_skip: Callable[[Path, str], None] | None = None) -> list[Document]:
    """Every document of ``read_files``, in one list."""
    return [d for _, docs in read_files(paths, strict, on_skip) for d in docs]


def warn_skip(path: Path, reason: str) -> None:
    warnings.warn(f"skipped {path}: {reason}", stacklevel=3)
