"""Errors a user can act on: each names the file, component or input at fault."""
import contextlib
import errno
import functools
import inspect
import math
import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar, cast

MIN_FREE_BYTES = 1 << 20  # an I/O error on a disk with less free space than this is taken for a full disk
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # the OS's "no space left", "disk quota exceeded"
MAX_QUESTION_CHARS = 2000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # control characters count as white space in a question
# Full-width ASCII (U+FF01-FF5E), as a Chinese or Japanese input method types Latin letters and digits: the same
# characters to a visitor, but [UNK] to the encoder and no word of the full-text index ("１９９０" is not "1990").
_FULL_WIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}


# What a damaged store's error says to do: indexing into the same folder opens it first and fails as this did (a
# passage failing its checksum is skipped as indexed already), so "re-index" alone sent a user round in a loop.
REINDEX = "re-index into a new folder (move this one aside: indexing into it again does not repair it)"


class EdgeRAGError(Exception):
    """Base class of every error edge-rag raises on purpose."""


class BundleError(EdgeRAGError):
    """The model bundle is missing a file, or a file is corrupt or truncated."""


class StoreError(EdgeRAGError):
    """The passage store or its vector index is missing, corrupt, or out of step."""


class StoreUnavailable(StoreError):
    """The store's database cannot be reached now, or another session's lock held it past the wait: nothing is wrong
    with the store, and the same call succeeds once it is back (HTTP 503, where a fault of the store is a 500)."""


class StoreBusy(StoreError):
    """Another writer (process, device or store object) holds the store past the wait for it: nothing changed, and the
    same write succeeds when that one is done (HTTP 503)."""


class DiskFullError(StoreError):
    """The disk holding the store is full: the batch in hand was rolled back, what was committed before stays."""


class InputError(EdgeRAGError, ValueError):
    """A question or document that cannot be used (empty, too long, undecodable)."""


class BudgetError(EdgeRAGError):
    """The memory budget cannot hold a component; the message names it and the numbers."""


class ConfigError(EdgeRAGError, ValueError):
    """A Config field holds a value outside what it allows; the message names the field and the allowed values."""


@contextlib.contextmanager
def full_disk_is_an_error(folder: Path) -> Iterator[None]:
    """A write to a full disk under ``folder`` as a DiskFullError: SQLite's "database or disk is full", ENOSPC or
    EDQUOT from the OS, or SQLite's I/O error on a disk with (almost) no space left (it cannot make its WAL files)."""
    try:
        yield
    except (sqlite3.Error, OSError) as exc:
        if not disk_full(exc, folder):
            raise
        raise DiskFullError(f"the disk holding the store {folder} is full: the write in hand was rolled back, what "
                            "was committed before it stays; free some space and try again (indexing the same files "
                            "again adds the rest)") from None


def disk_full(exc: sqlite3.Error | OSError, folder: Path) -> bool:
    """Whether ``exc``, met writing under ``folder``, says its disk is full."""
    if isinstance(exc, OSError):
        return exc.errno in FULL_DISK_ERRNOS
    return "disk is full" in str(exc) or ("I/O error" in str(exc) and shutil.disk_usage(folder).free < MIN_FREE_BYTES)


def check_str(value: object, what: str) -> str:
    """``value`` if it is a str that UTF-8 can encode, else InputError naming ``what`` and the reason
    (lone surrogates come from undecodable bytes, e.g. on the command line, and crash tokenizers)."""
    if not isinstance(value, str):
        raise InputError(f"{what} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid Unicode text (lone surrogate at character {exc.start})") from None
    return value


def check_kinds(what: str, **arguments: tuple) -> None:
    """Each argument ``name=(value, *kinds)`` of ``what`` one of its kinds (None: it may be None), else an InputError
    naming it, the kinds and what it was: a dict for a Config, "5" for a number, failed deep inside as AttributeError
    or TypeError."""
    for name, (value, *kinds) in arguments.items():
        if not (value is None and None in kinds or isinstance(value, tuple(k for k in kinds if k is not None))):
            expected = " or ".join("None" if k is None else k.__name__ for k in kinds)
            raise InputError(f"{what}'s {name} must be {expected}, not {type(value).__name__}: {value!r:.80}")


def check_seconds(value: object, what: str) -> float:
    """``value`` as a wait in seconds: an int or float, finite, 0 or more; else an InputError naming ``what``, at the
    constructor, not at the first write that waits (NaN and inf waited forever for a PostgreSQL store's writer, a
    negative number not at all; True waited one second)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InputError(f"{what} must be a finite number of seconds, 0 or more, not {value!r:.80}")
    return float(value)


def ascii_width(text: str) -> str:
    """``text`` with its full-width letters, digits and signs as ASCII (the identity on any other text)."""
    return text.translate(_FULL_WIDTH)


def check_question(question: object) -> str:
    """A usable question, or InputError saying why not (wrong type, not valid Unicode, empty, too long); full-width
    letters, digits and signs read as ASCII."""
    question = " ".join(ascii_width(_CONTROL.sub(" ", check_str(question, "the question"))).split())
    if not question:
        raise InputError("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question is {len(question)} characters; the limit is {MAX_QUESTION_CHARS}")
    return question


def one_or_many(value: object, kinds: tuple[type, ...], what: str) -> list:
    """``value`` as a list of ``kinds``: one of them alone is a list of it (a str is never iterated: a file name read
    character by character walked "." and "/", a text became one-letter documents); None, anything not iterable,
    or an item of another kind is an InputError naming ``what``."""
    if isinstance(value, kinds):
        return [value]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise InputError(f"{what}: expected one or an iterable of them, not {type(value).__name__}")
    items = list(value)
    for item in items:
        if not isinstance(item, kinds):
            names = " or ".join(f"a {k.__name__}" for k in kinds)
            raise InputError(f"{what}: each must be {names}, not {type(item).__name__}")
    return items


P = ParamSpec("P")
R = TypeVar("R")


class ProcessBound:
    """What holds this process's models, threads and connections (EdgeRAG; ``open_only`` refuses its use in a forked
    child) is never pickled. Sent to a pool's workers (``pool.map(rag.ask, questions)``), an EdgeRAG failed on whichever
    attribute came first ("Can't pickle local object 'plan.<locals>.price'"), which said nothing of what to do."""

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"an {type(self).__name__} cannot be pickled or copied (sent to another process): its models, "
                        "threads and store connections are this process's; open one in each process (a pool's "
                        "initializer), after any fork")


def open_only(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method of an object with ``closed`` and a ``store``: called after ``close()`` it is a StoreError saying so, not
    a raw error from a closed SQLite connection (an ``sqlite3.ProgrammingError``, which no caller catches as ours); so
    is a call (or the stream it returns) that fails because another thread closed the object while it ran. A store
    file found damaged while it runs, or while its stream runs (``ask_stream``), is a StoreError naming the store
    (``store_damage_is_an_error``)."""
    @functools.wraps(method)
    def call(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        with _closed_meanwhile(self, check=True), store_damage_is_an_error(self.store.location):
            result = method(self, *args, **kwargs)
        return cast(R, _guarded(self, result)) if inspect.isgenerator(result) else result
    return call


@contextlib.contextmanager
def store_damage_is_an_error(location: str) -> Iterator[None]:
    """SQLite's own error for a damaged file read at run time (a card failing under a running kiosk, after the
    quick_check at open passed) as a StoreError naming the store: was sqlite3's DatabaseError, HTTP 500 "internal
    error" at the kiosk. SQLITE_CORRUPT and SQLITE_NOTADB raise DatabaseError itself; an unreadable sector, I/O error;
    a file removed meanwhile, a new connection's "unable to open" (store_db.second_connection makes none)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if type(exc) is not sqlite3.DatabaseError and not any(s in str(exc) for s in ("disk I/O", "unable to open")):
            raise
        raise StoreError(f"the store {location} cannot be read ({exc}): its file is damaged; {REINDEX}") from exc


def _guarded(owner: Any, events: Any) -> Generator:
    """A stream's events: they are computed as it is read (``ask`` reads ``ask_stream``), after ``call`` returned."""
    with _closed_meanwhile(owner), store_damage_is_an_error(owner.store.location):
        return (yield from events)


@contextlib.contextmanager
def _closed_meanwhile(owner: Any, check: bool = False) -> Iterator[None]:
    """The StoreError of a closed ``owner`` if it is closed (``check``), or once an error comes while it is; of one
    used in a forked child (its ``pid`` another process's): a lock another thread held at the fork is held there
    forever, and SQLite connections must not cross a fork (one answered from a store its parent had closed)."""
    closed = StoreError(f"this {type(owner).__name__} was closed; open the store again to use it")
    if check and owner.closed:
        raise closed
    if getattr(owner, "pid", None) not in (None, os.getpid()):  # its stream too: read in a child, it fails here
        raise StoreError(f"this {type(owner).__name__} was opened in process {owner.pid}, before a fork: its locks, "
                         "threads and SQLite connections are that process's; open one in each process (after the fork)")
    try:
        yield
    except Exception:
        if owner.closed:  # what failed was the closed store, connection or model
            raise closed from None
        raise
