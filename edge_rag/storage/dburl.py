"""Which ``--db`` values name a PostgreSQL database, how to print one without its password, and how to connect."""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import StoreError

URL_SCHEMES = ("postgresql://", "postgres://")
SECRET_PARAMS = ("password", "sslpassword")  # libpq's: the role's, and the passphrase of the client's SSL key
_WORD = re.compile(r"\w")  # a password's edge that is a word character ends where one is not (scrub)


def is_remote(db: str | Path) -> bool:
    """True when ``db`` names a PostgreSQL database rather than a folder."""
    return isinstance(db, str) and db.startswith(URL_SCHEMES)


def check_url(url: str) -> str:
    """``url`` if Python can read it as a URL (then ``mask_url`` and ``scrub`` can find its password), else a
    StoreError naming none of it: ``urlsplit`` raised a bare ValueError ("Invalid IPv6 URL") from deep in the store."""
    try:
        urlsplit(url)
    except ValueError as exc:
        raise StoreError(f"cannot open store {url.partition('://')[0]}://***: the URL cannot be read ({exc})") from None
    return url


def conninfo(url: str, defaults: Mapping[str, int | str]) -> str:
    """libpq's connection string for ``url`` with ``defaults`` for the parameters neither the URL nor the environment
    sets (libpq's order: the URL, then its PG* variable, then a default): passed to psycopg as keyword arguments, they
    overrode the URL's own (``?connect_timeout=3`` waited 10 s), and written into the string, the operator's
    PGCONNECT_TIMEOUT (=3 waited 10 s). A connect_timeout of 0 or less is read as unset (_unbounded). Raises psycopg's
    ProgrammingError for a string libpq cannot read, as a connection attempt would."""
    from psycopg import pq
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    given = {key: value for key, value in conninfo_to_dict(url).items() if not _unbounded(key, value)}
    env = {o.keyword.decode(): o.envvar.decode() for o in pq.Conninfo.get_defaults() if o.envvar}
    ours = {key: value for key, value in defaults.items()
            if key not in given and _unbounded(key, os.environ.get(env.get(key, "")))}
    return make_conninfo("", **{**ours, **given})


def _unbounded(key: str, value: object) -> bool:
    """Whether ``value`` leaves ``key`` unset: none given, an empty one (``Environment=PGCONNECT_TIMEOUT=``, which
    libpq refuses: every connection failed once the store's default was left out for it), or a connect_timeout of 0
    or less, libpq's "wait for good", which psycopg waits 130 s for (an open against a port that never answered)."""
    if value is None or not str(value).strip():
        return True
    try:
        return key == "connect_timeout" and int(float(str(value))) <= 0
    except (ValueError, OverflowError):
        return False  # psycopg refuses it when connecting, saying so


def mask_url(db: str | Path) -> str:
    """``db`` fit to print: a URL's password (``user:pw@``, ``?password=`` or ``?sslpassword=``) replaced by ``***``,
    still a URL (``postgresql:///museum?host=/run/postgresql``, a Unix socket's, too); folders are returned as they are."""
    if not is_remote(db):
        return str(db)
    parts = urlsplit(str(db))
    userinfo, at, host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        parts = parts._replace(netloc=f"{userinfo.partition(':')[0]}:***@{host}")
    query = "&".join(f"{key}=***" if _secret(key := q.partition("=")[0]) else q
                     for q in parts.query.split("&")) if parts.query else ""
    masked = urlunsplit(parts._replace(query=query))
    return masked if parts.netloc else masked.replace(":", "://", 1)  # urlunsplit drops the // before no host


def scrub(message: str, url: str) -> str:
    """``message`` with the URL's password, wherever it appears whole (plain or %-decoded), replaced by ***: not inside
    a longer word (a password ``e`` made "conn***ction fail***d", ``ss`` "pa***word"), where it is no password."""
    parts = urlsplit(url)
    secrets = {parts.password or ""} | {v for key, _, v in (q.partition("=") for q in parts.query.split("&")) if _secret(key)}
    for secret in sorted(filter(None, secrets | {unquote(s) for s in secrets}), key=len, reverse=True):
        message = re.sub(r"(?<!\w)" * bool(_WORD.match(secret[0])) + re.escape(secret)
                         + r"(?!\w)" * bool(_WORD.match(secret[-1])), "***", message)
    return message


def _secret(key: str) -> bool:
    """Whether a URL's query ``key`` names a secret: libpq reads keys %-decoded (``pass%77ord=`` sets the password;
    was printed as typed), and one in other capitals (``PASSWORD=``, which libpq refuses) was typed to hold one."""
    return unquote(key).lower() in SECRET_PARAMS
