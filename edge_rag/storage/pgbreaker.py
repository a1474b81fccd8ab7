"""A PostgreSQL store's circuit breaker: once a call finds the database unreachable, calls fail at once.

A kiosk asks its questions one at a time (the serve's fast lane), and during an outage each waited the pool's
connection timeout (pgsql.CONNECT_TIMEOUT_S) before its 503: five asked at once heard after 10, 20, 30, 40 and 50 s,
each waiting on the others' work. Once a call has found the database unreachable, the breaker opens: calls fail
with a StoreUnavailable at once, while one thread of its own connects every PROBE_EVERY_S, and at once when a call
asks (as one connection attempt would, at most PROBE_WAIT_S); the first that succeeds closes it, and calls go to the
pool again. The pool's own retries back off 1, 2, 4 s apart, which is why it is not the probe: a shorter wait for the
pool failed the first questions after the database was back. Nor does the first call of an outage wait the pool's
timeout to find it: a pool that hands no connection within POOL_FIRST_WAIT_S makes one attempt of the probe's, whose
failure opens the breaker (10.0 s to the first 503 of an outage -> 0.5 s, the server stopped; the pool is only slow
or busy if it succeeds, and the call waits on).
"""
from __future__ import annotations

import heapq
import itertools
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from functools import partial
from typing import Any

PROBE_EVERY_S = 1.0
PROBE_WAIT_S = 2  # libpq's connect_timeout (whole seconds, 2 at least), whatever the URL's: pg_breaker
POOL_FIRST_WAIT_S = 0.5  # how long a call waits for the pool before one connection attempt tells whether it is down
ASK_WAIT_S = 0.5  # how long a call while open waits for the attempt it asked for (a refused one takes milliseconds)


class Breaker:
    """Open once ``lost(exc)`` says a call's error ``exc`` (of type ``error``) means the database cannot be reached,
    closed again once ``probe()`` (a connection attempt) returns; ``unreachable(why)`` is the error calls meanwhile
    fail with."""

    def __init__(self, error: type[Exception], lost: Callable[[Exception], bool], probe: Callable[[], None],
                 unreachable: Callable[[str], Exception]) -> None:
        self._error, self._lost, self._probe, self._unreachable = error, lost, probe, unreachable
        self._state = threading.Condition()
        self._wake, self._stopped = threading.Event(), threading.Event()
        self._started = self._finished = 0  # the probe's attempts
        self._probing = False
        self._held = 0  # the pool's connections calls hold now (_pooled)
        self._cuts, self._seq = threading.Condition(), itertools.count()
        self._due: list[tuple[float, int, list]] = []  # cut()'s bounds, soonest first: (when, order, [conn, shut])
        self._watchdog: threading.Thread | None = None
        self.down: str | None = None  # why the last call failed, while open

    def check(self) -> None:
        """Fail at once while the database is known unreachable: a call asks the probe to try now and waits for that
        attempt at most ASK_WAIT_S, so the first question after the database is back is answered, not failed."""
        if self.down is None:
            return
        with self._state:
            attempt = self._started + 1
            self._wake.set()
            self._state.wait_for(lambda: self.down is None or self._finished >= attempt, ASK_WAIT_S)
            if (down := self.down) is None:
                return
        raise self._unreachable(f"not tried, the last call found it unreachable ({down}) and it has not answered since")

    @contextmanager
    def guarding(self) -> Iterator[None]:
        """Around a call: failed at once while open; opens it if the call finds the database unreachable."""
        self.check()
        try:
            yield
        except self._error as exc:
            if self._lost(exc):
                self._open(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise

    @contextmanager
    def connection(self, pool, bound: float | None, wait: float | None = None) -> Iterator:
        """A connection of ``pool`` for one call, through the breaker, within ``wait`` seconds (default: the pool's
        timeout); a call with a ``bound`` (a read) is ``cut`` there (a writer waits its turn)."""
        waited = self._pooled(pool, pool.timeout if wait is None else wait)
        with self.guarding(), waited as conn, nullcontext() if bound is None else self.cut(conn, bound):
            yield conn

    @contextmanager
    def _pooled(self, pool, wait: float) -> Iterator:
        """``pool.connection(wait)``, but if none comes within POOL_FIRST_WAIT_S while calls hold fewer than all its
        connections, one connection attempt (the probe's) first: failed, the database is unreachable and the call fails
        now (it waited the pool's whole timeout, 10 s a kiosk visitor waited for the first 503 of an outage); succeeded,
        the pool is slow and the call waits on. A pool whose every connection calls hold is busy, not down: an attempt
        beside them was refused by a role's or server's connection limit, which opened the breaker on a working store."""
        with ExitStack() as stack:
            try:
                conn = stack.enter_context(pool.connection(min(POOL_FIRST_WAIT_S, wait)))
            except self._error:
                if self._stopped.is_set():  # the store closed (its pool with it): nothing to tell
                    raise
                try:
                    if self._held < pool.max_size:  # all held: their calls' own errors (a read's cut) tell an outage
                        self._probe()
                except Exception as exc:  # noqa: BLE001 - whatever it says, no connection can be made now
                    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise self._unreachable(f"no connection within {POOL_FIRST_WAIT_S:g} s, and an attempt "
                                            f"failed: {why}") from None
                conn = stack.enter_context(pool.connection(max(wait - POOL_FIRST_WAIT_S, 0.0)))
            with self._state:
                self._held += 1
            try:
                yield conn
            finally:
                with self._state:
                    self._held -= 1

    def checked(self, check: Callable[[Any], None]) -> Callable[[Any], None]:
        """The pool's ``check`` of a connection it hands out, ``cut`` after PROBE_WAIT_S (it waited for good on a
        stopped server; a connection that fails it is replaced)."""
        def bounded(conn) -> None:
            with self.cut(conn, PROBE_WAIT_S):
                check(conn)
        return bounded

    @contextmanager
    def cut(self, conn, bound: float) -> Iterator[None]:
        """Shut ``conn``'s socket once the block has waited ``bound`` seconds: a server that stopped answering
        (stopped, a paused VM, a network split whose peer still acknowledges) held a question for good, no keepalive
        or TCP timeout ending a wait on a peer that acknowledges, and the server's shutdown with it. One thread
        watches every block's bound (_watching): a threading.Timer each started 6-10 threads a question."""
        due = [conn, False]  # the connection (None once the block is done), whether it was shut
        with self._cuts:
            heapq.heappush(self._due, (time.monotonic() + bound, next(self._seq), due))
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watching, name="edge-rag-cut", daemon=True)
                self._watchdog.start()
            if self._due[0][2] is due:  # sooner than the watchdog waits for
                self._cuts.notify()
        try:
            yield
        except self._error:
            if due[1]:
                raise self._unreachable(f"it did not answer within {bound:g} s") from None
            raise
        finally:
            with self._cuts:  # after this, the watchdog never shuts it (a pool may hand it to another call)
                due[0] = None
                while self._due and self._due[0][2][0] is None:
                    heapq.heappop(self._due)

    def _watching(self) -> None:
        """Shut the socket of every block past its bound, under the lock a block ends under: the call waiting on it
        fails at once (the pool then drops the connection)."""
        with self._cuts:
            while not self._stopped.is_set():
                while self._due and self._due[0][0] <= time.monotonic():
                    due = heapq.heappop(self._due)[2]
                    if due[0] is not None:
                        due[1] = True
                        with suppress(OSError, self._error), socket.socket(fileno=os.dup(due[0].pgconn.socket)) as sock:
                            sock.shutdown(socket.SHUT_RDWR)
                self._cuts.wait(self._due[0][0] - time.monotonic() if self._due else None)

    def close(self) -> None:
        """Stop probing and watching (the store is closed)."""
        self._stopped.set()
        self._wake.set()
        with self._cuts:
            self._cuts.notify()

    def _open(self, why: str) -> None:
        with self._state:
            self.down, probing, self._probing = why, self._probing, True
        if not probing and not self._stopped.is_set():
            threading.Thread(target=self._probing_loop, name="edge-rag-probe", daemon=True).start()

    def _probing_loop(self) -> None:
        """Every PROBE_EVERY_S, or at once when a call asks, one connection attempt; the first that succeeds closes."""
        up = False
        while not up and not self._stopped.is_set():
            self._wake.wait(PROBE_EVERY_S)
            self._wake.clear()
            with self._state:
                self._started += 1
            try:
                self._probe()
                up = True
            except Exception:  # noqa: BLE001 - still unreachable, whatever the error says: try again
                pass
            with self._state:
                self._finished += 1
                if up:
                    self.down, self._probing = None, False
                self._state.notify_all()


# The server's own refusal of a login, which libpq reports with no SQLSTATE (none reaches the client before the
# session exists): another attempt gets the same. Its English words, so a server with other lc_messages is told as
# before, as a database that cannot be reached now.
_REFUSED = re.compile(r'FATAL:\s+(password authentication failed|(database|role) ".*" does not exist|no pg_hba|'
                      r'role ".*" is not permitted to log in|permission denied for database)')


def refused_login(exc: Exception) -> bool:
    """Whether ``exc`` is the server refusing this URL's user, password or database, not a server out of reach."""
    return getattr(exc, "sqlstate", None) is None and _REFUSED.search(str(exc)) is not None


# libpq's refusal of a URL's option before it connects ('invalid integer value "99x" for connection option "port"',
# 'invalid sslmode value: "bogus"'), with no SQLSTATE either: told as a database that cannot be reached now (retry,
# 503 in serve), though every attempt gets the same.
_INVALID = re.compile(r'invalid (integer value "[^"]*" for connection option|\w+ value: "|port number: ")')


def invalid_option(exc: Exception) -> bool:
    """Whether ``exc`` is libpq refusing a value of the URL's options (port, sslmode, keepalives...)."""
    return getattr(exc, "sqlstate", None) is None and _INVALID.search(str(exc)) is not None


def lost(psycopg, exc: Exception) -> bool:
    """Whether ``exc`` says the database could not be reached: no connection, or the server ended it."""
    return isinstance(exc, psycopg.OperationalError) and not invalid_option(exc) and \
        (exc.sqlstate or "08").startswith(("08", "57P"))


def pg_breaker(psycopg, conninfo: str) -> Breaker:
    """A PostgreSQL store's breaker: its probe is one connection attempt to ``conninfo``, at most PROBE_WAIT_S even
    when the URL's connect_timeout is longer (the store would hear as much later that the database was back)."""
    probe = partial(psycopg.connect, conninfo, autocommit=True, connect_timeout=PROBE_WAIT_S)
    return Breaker(psycopg.OperationalError, partial(lost, psycopg), lambda: probe().close(), psycopg.OperationalError)
