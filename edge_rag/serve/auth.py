"""Who may change what the kiosk answers: a write token, sent as ``Authorization: Bearer <token>``.

Without a token the server is read-only (uploads and removals answer 403 saying how to enable them).
The token comes from ``--token`` / ``$EDGE_RAG_TOKEN``, or from a token file that the first start creates
with a random token (mode 0600, printed once). Comparison is constant-time (``hmac.compare_digest``), and wrong
tokens slow their address down (``Tries``).
"""
from __future__ import annotations

import hmac
import ipaddress
import math
import os
import secrets
import stat
from collections import OrderedDict
from pathlib import Path
from time import monotonic

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..errors import EdgeRAGError

# Said to every request that needs the token, reads too (deep health, the operator's page): "writes need the API
# token" answered a curl of /api/health?deep=1 sent with an empty $TOKEN.
READ_ONLY = ("this server is read-only: start it with --token TOKEN, $EDGE_RAG_TOKEN or --token-file FILE "
             "to accept uploads, removals, deep health checks and the operator page")
FREE_TRIES = 10  # wrong tokens an address may send before it waits (a typo or two, an old tab, a changed token)
MAX_WAIT_S = 60.0  # the longest wait: one guess a minute, and staff at the guesser's address are not shut out longer
ADDRESSES = 4096  # addresses remembered (a few hundred KB at most); past it, the one quiet the longest is forgotten


def token_from_file(path: Path) -> tuple[str, bool]:
    """The token kept in ``path`` and whether it was just created (a fresh random token, mode 0600).
    A file others may read is refused: anyone who reads it can change the answers."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if not path.is_file():  # a folder, a pipe (read forever), a dangling link
            raise EdgeRAGError(f"token file {path} is not a file: name a file (the first start creates it)") from None
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise EdgeRAGError(f"token file {path} is readable by other users (mode {mode & 0o777:o}); "
                               f"chmod 600 {path}") from None
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgeRAGError(f"cannot read token file {path}: {exc}") from None
        if not token:
            raise EdgeRAGError(f"token file {path} is empty; delete it to have a new token made") from None
        return token, False
    except OSError as exc:
        raise EdgeRAGError(f"cannot create token file {path}: {exc.strerror}") from exc
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token, True


class Tries:
    """Wrong tokens per client address (the TCP peer's, an IPv6 one's /64: ``counted``; uvicorn is told to trust no
    X-Forwarded-For, which a script on the kiosk's own browser may set). Past FREE_TRIES, each one makes the address
    wait before a token of its is read again, twice as long each time up to MAX_WAIT_S: guessing ran at 800 tokens a
    second. A right token clears it; staff who share the address are back within MAX_WAIT_S of the last wrong one.
    Questions read no token. Used on the event loop only (every route that reads a token runs there), so it needs no
    lock."""

    def __init__(self) -> None:
        self._wrong: OrderedDict[str, tuple[int, float]] = OrderedDict()  # address → (wrong tokens, wait until)

    def check(self, address: str) -> None:
        wait = math.ceil(self._wrong.get(address, (0, 0.0))[1] - monotonic())
        if wait > 0:
            raise HTTPException(429, f"too many wrong API tokens from {address}: the next one is read in {wait} s",
                                headers={"Retry-After": str(wait)})

    def failed(self, address: str) -> None:
        count = min(self._wrong.pop(address, (0, 0.0))[0] + 1, FREE_TRIES + 64)  # 2.0 ** 1024 overflows
        wait = 0.0 if count <= FREE_TRIES else min(2.0 ** (count - FREE_TRIES - 1), MAX_WAIT_S)
        self._wrong[address] = (count, monotonic() + wait)
        if len(self._wrong) > ADDRESSES:
            self._wrong.popitem(last=False)  # the address quiet the longest

    def passed(self, address: str) -> None:
        self._wrong.pop(address, None)


def counted(host: str) -> str:
    """The address wrong tokens count for: an IPv6 host's /64, the least a device is given, in which it may take any
    address (privacy addresses rotate in it), so each guess could come from a new address with its FREE_TRIES."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv4Address):
        return host
    if ip.ipv4_mapped:  # ::ffff:a.b.c.d, an IPv4 client of a dual-stack socket
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


def require_writer(request: Request, token: str | None) -> None:
    """403 on a read-only server, 401 unless the request carries ``Authorization: Bearer <token>`` (writes, and the
    reads only the operator may make), 429 while its address waits after too many wrong ones (``Tries``)."""
    if token is None:
        raise HTTPException(403, READ_ONLY)
    scheme, _, sent = request.headers.get("authorization", "").partition(" ")
    if not hasattr(request.app.state, "tries"):  # the app's own (every route it serves), made at its first token
        request.app.state.tries = Tries()
    tries, address = request.app.state.tries, counted(request.client.host if request.client else "")
    if scheme.lower() == "bearer" and sent.strip():
        tries.check(address)
        if hmac.compare_digest(sent.strip().encode(), token.encode()):
            tries.passed(address)
            return
        tries.failed(address)
    raise HTTPException(401, "this needs the API token: send 'Authorization: Bearer <token>'")
