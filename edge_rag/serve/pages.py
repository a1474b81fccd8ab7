"""The kiosk's and the operator's pages (edge_rag/static/) and the headers every one of their files is served with."""
from __future__ import annotations

from pathlib import Path

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).resolve().parent.parent / "static"
# The page runs only its own script and style and talks only to this server: text a visitor types, an uploaded
# document or a question log that found its way into an answer cannot load or run anything else, and no other
# site can frame the kiosk to steer its touches.
PAGE_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "Content-Security-Policy": "default-src 'self'; object-src 'none'; base-uri 'none'; "
                                           "form-action 'self'; frame-ancestors 'none'"}


class PageFiles(StaticFiles):
    """``/static/``: the pages' files with the pages' headers, so ``/static/index.html`` and ``/static/admin.html``
    cannot be framed by another site either."""

    def __init__(self) -> None:
        super().__init__(directory=STATIC)

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response
