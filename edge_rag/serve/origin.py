"""Every request must come from the kiosk's own address: no CSRF, no DNS rebinding, no cross-site reads.

Every request, GET included, is checked before it reaches a route (a GET asks a question, which lands in the
question log, and ``/api/health`` names the bundle's path):

- ``Host`` must name the address the connection came in on (its IP, or ``localhost`` on loopback, or
  this machine's host name), or one of ``--allow-host``, with the served port: a page on another site
  that rebinds its DNS name to this device sends its own name and is refused;
- ``Origin``, when sent (browsers send it on every cross-origin fetch and on a cross-site POST, form posts
  included), must be ``http(s)://`` + that same Host: a script or form on any other page is refused;
- ``Sec-Fetch-Site``, when sent (every current browser), must say the request comes from this origin or from
  no page at all, except for a link that opens one of the kiosk's pages (a top-level GET of a document outside
  ``/api/``): an ``<img>``, ``<script>`` or ``<iframe>`` on another page pointing at ``/api/ask/stream`` sends no
  Origin and is refused here (a frame's navigation is a navigation too: its destination says ``iframe``).

Clients that are not browsers (curl, httpx) send neither header and pass on Host alone.
"""
from __future__ import annotations

import ipaddress
import json
import socket
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

OWN_SITES = ("same-origin", "none")  # Sec-Fetch-Site values of the kiosk's own page, or a typed URL / bookmark
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class SameOrigin:
    """ASGI middleware refusing requests whose Host, Origin or fetch site is not this server (403 JSON)."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.names = {h.lower() for h in allowed_hosts} | {socket.gethostname().lower(), socket.getfqdn().lower()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            reason = self.refusal(scope)
            if reason:
                body = json.dumps({"error": reason, "status": 403}).encode()
                await send({"type": "http.response.start", "status": 403,  # not even shown in another site's frame
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-security-policy", b"frame-ancestors 'none'"),
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
            return f"Host {host[:80]!r} is not this server's address; requests must be sent to it"
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in (f"http://{host}".lower(), f"https://{host}".lower()):
            return f"requests from {origin[:80]!r} are refused (Origin is not {host!r})"
        site = headers.get("sec-fetch-site")
        if site is not None and site not in OWN_SITES and not _opens_a_page(scope, headers):
            return f"requests from another site's page are refused (Sec-Fetch-Site {site[:20]!r})"
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


def _opens_a_page(scope: Scope, headers: dict[str, str]) -> bool:
    """A link from another site that opens a page of the kiosk in a window of its own: never an API route (it would
    ask a question, which lands in the question log), never a frame (``frame-ancestors`` keeps pages out of those)."""
    return (headers.get("sec-fetch-mode") == "navigate" and headers.get("sec-fetch-dest") == "document"
            and scope.get("method") == "GET" and not str(scope.get("path", "")).startswith("/api/"))


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False
