"""uvicorn as ``edge-rag serve`` runs it: a deadline for request headers, and writes told at once when it stops.

uvicorn has no timeout for a request's headers (its keep-alive timer runs only between requests, and every byte
received cancels it), so 50 clients sending one header byte every 5 s kept 50 connections open for good. Here
each request's headers must be complete within ``ServeConfig.header_timeout_s`` of its first byte (or of the
connection, for the first request), else the connection is closed; bodies and responses are not timed (an upload
over a slow link, a long answer stream). uvicorn also drains open requests before the app hears it is stopping;
a running indexing job is told first, so it ends at its next commit instead of running to the end.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from .config import ServeConfig


class HeaderDeadline(H11Protocol):
    """h11 with a deadline for each request's headers (``header_timeout_s``, set per server by ``server``)."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._timed_cycle:
            self._disarm()  # its headers arrived: a new request-response cycle began

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._timed_cycle = self.cycle  # the cycle before this request's headers
        self._deadline = self.loop.call_later(self.header_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class Server(uvicorn.Server):
    """uvicorn calling ``on_stop`` as its shutdown begins, before it waits for open requests to finish."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_stop = on_stop

    async def shutdown(self, sockets=None) -> None:
        self.on_stop()
        await super().shutdown(sockets=sockets)


def server(app: Starlette, config: ServeConfig) -> Server:
    """The uvicorn server for ``app`` (made by ``create_app``) under ``config``."""
    protocol = type("HeaderDeadlineProtocol", (HeaderDeadline,), {"header_timeout_s": config.header_timeout_s})
    # uvicorn annotates the grace as int but hands it to asyncio.wait_for, which takes any seconds
    # no X-Forwarded-For is taken, even from loopback (uvicorn's default): a kiosk's own browser sent any address
    # it liked, and the wrong tokens counted per address (auth.Tries) were counted nowhere
    return Server(uvicorn.Config(app, log_level="warning", lifespan="on", http=protocol, proxy_headers=False,
                                 timeout_graceful_shutdown=config.shutdown_grace_s),  # type: ignore[arg-type]
                  app.state.stop)
