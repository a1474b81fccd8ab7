"""Errors a user can act on: each names the file, component or input at fault."""
import errno
import sqlite3


class EdgeRAGError(Exception):
    """Base class of every error edge-rag raises on purpose."""


class BundleError(EdgeRAGError):
    """The model bundle is missing a file, or a file is corrupt or truncated."""


class StoreError(EdgeRAGError):
    """The passage store or its vector index is missing, corrupt, or out of step."""


class DiskFullError(StoreError):
    """The disk holding the store is full: the batch in hand was not committed, what was committed before stays."""


class InputError(EdgeRAGError, ValueError):
    """A question or document that cannot be used (empty, too long, undecodable)."""


class BudgetError(EdgeRAGError):
    """The memory budget cannot hold a component; the message names it and the numbers."""


class ConfigError(EdgeRAGError, ValueError):
    """A Config field holds a value outside what it allows; the message names the field and the allowed values."""


def is_disk_full(exc: BaseException) -> bool:
    """True for the errors of a write to a full disk: SQLite's SQLITE_FULL, or ENOSPC / EDQUOT from the OS."""
    if isinstance(exc, sqlite3.Error):  # sqlite_errorcode: Python 3.11+; 3.10 has only the message
        code = getattr(exc, "sqlite_errorcode", None)
        return code & 0xFF == sqlite3.SQLITE_FULL if code is not None else "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


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
