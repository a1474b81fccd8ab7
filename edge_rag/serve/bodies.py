"""Request bodies: read up to a limit (413 past it), parsed as JSON (400 when it is not)."""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import Message


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it passes ``limit`` bytes (declared or actually sent)."""
    if int(request.headers.get("content-length") or 0) > limit:
        raise HTTPException(413, f"the request body is over the {limit} byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"the request body is over the {limit} byte limit")
    return bytes(body)


def limited(request: Request, limit: int) -> Request:
    """``request`` whose body ends in 413 once more than ``limit`` bytes have come in, whatever its headers declared:
    a client may send a small Content-Length and a chunked body of any size (the server frames it by
    Transfer-Encoding)."""
    received = 0

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise HTTPException(413, f"the request body is over the {limit} byte limit")
        return message

    return Request(request.scope, receive)


def parse_json(body: bytes) -> object:
    """The parsed body, or 400: malformed, too deeply nested or with a number too long to convert."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        reason = "is nested too deeply" if isinstance(exc, RecursionError) else f"is not JSON: {exc}"
        raise HTTPException(400, f"the body {reason}"[:300]) from None
