"""Requests that change state must come from the kiosk's own address: no CSRF, no DNS rebinding.

Every request other than GET/HEAD/OPTIONS is checked before it reaches a route:

- ``Host`` must name the address the connection came in on (its IP, or ``localhost`` on loopback, or
  this machine's host name), or one of ``--allow-host``, with the served port: a page on another site
  that rebinds its DNS name to this device sends its own name and is refused;
- ``Origin``, when sent (browsers always send it on a cross-site POST, form posts included), must be
  ``http(s)://`` + that same Host: a form on any other page is refused.

Clients that are not browsers (curl, httpx) send no Origin and pass on Host alone.
"""
from __future__ import annotations

import ipaddress
import json
import socket
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class SameOrigin:
    """ASGI middleware refusing non-GET requests whose Host or Origin is not this server (403 JSON)."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.names = {h.lower() for h in allowed_hosts} | {socket.gethostname().lower(), socket.getfqdn().lower()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            reason = self.refusal(scope)
            if reason:
                body = json.dumps({"error": reason, "status": 403}).encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> str | None:
        """Why this request is refused, or None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        server = scope.get("server") or ("", 0)
        if not self._is_server(host, server[0], server[1]):
            return f"Host {host!r} is not this server's address; requests that change state must be sent to it"
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in (f"http://{host}".lower(), f"https://{host}".lower()):
            return f"requests from {origin!r} may not change this server's state (Origin is not {host!r})"
        return None

    def _is_server(self, host: str, ip: str, port: int) -> bool:
        try:
            parts = urlsplit(f"//{host}")
            name, given = (parts.hostname or "").lower(), parts.port
        except ValueError:  # a port that is not a number
            return False
        if given is not None and given != port:
            return False
        return name in self.names | {ip.lower()} | (set(LOOPBACK_NAMES) if _loopback(ip) else set())


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False
