"""Who may change what the kiosk answers: a write token, sent as ``Authorization: Bearer <token>``.

Without a token the server is read-only (uploads and removals answer 403 saying how to enable them).
The token comes from ``--token`` / ``$EDGE_RAG_TOKEN``, or from a token file that the first start creates
with a random token (mode 0600, printed once). Comparison is constant-time (``hmac.compare_digest``).
"""
from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ..errors import EdgeRAGError

READ_ONLY = ("this server is read-only: start it with --token TOKEN, $EDGE_RAG_TOKEN or --token-file FILE "
             "to accept uploads and removals")


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


def require_writer(request: Request, token: str | None) -> None:
    """403 on a read-only server, 401 unless the request carries ``Authorization: Bearer <token>``."""
    if token is None:
        raise HTTPException(403, READ_ONLY)
    scheme, _, sent = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip().encode(), token.encode()):
        raise HTTPException(401, "writes need the API token: send 'Authorization: Bearer <token>'")
