"""``edge-rag serve``: the HTTP API and kiosk page on Starlette + uvicorn (the ``serve`` extra).

This module only parses options and starts uvicorn; ``app.py`` has the routes, ``lanes.py`` the
threads that answer, ``config.py`` the limits. Importing it does not import Starlette, so the CLI
works on a device without the extra and says what to install when ``serve`` is asked for.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import EdgeRAGError
from .config import MIN_TOKEN_CHARS, TOKEN_ENV, ServeConfig, short

# Encoder threads of the session that indexes uploads (Config.index_threads), opened only by a server that takes
# writes: one core stays with the questions on a 2-core device.
INDEX_THREADS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ServeConfig()
    p.add_argument("--host", default=d.host, type=_address, help="interface to listen on (default loopback only; "
                   f"anything else needs --token, --token-file or ${TOKEN_ENV}); an IPv6 address bare or in brackets")
    p.add_argument("--port", type=_setting("port", int), default=d.port,
                   help="TCP port (0 = any free port, printed at start)")
    p.add_argument("--token", help=f"API token for uploads and removals (default ${TOKEN_ENV}); "
                   "without one (or --token-file) the server is read-only; with one, its memory plan also holds the "
                   "encoder session that indexes uploads")
    p.add_argument("--token-file", type=Path, help="read the API token from this file; the first start "
                   "creates it with a random token (mode 0600) and prints the token once")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another Host name clients use for this server (a LAN name, a reverse proxy); repeatable")
    p.add_argument("--timeout", type=_setting("question_timeout_s", float), default=d.question_timeout_s,
                   help="seconds per question")
    p.add_argument("--max-queue", type=_setting("max_queue", int), default=d.max_queue,
                   help="generations that may wait in line")
    p.add_argument("--title", default=d.title, help="heading of the kiosk page")
    p.add_argument("--idle-reset", type=_setting("idle_reset_s", int), default=d.idle_reset_s,
                   help="seconds before the page resets")
    p.add_argument("--question-log", metavar="FILE.jsonl", help="append every question asked to this file, to "
                   "label and calibrate on (`edge-rag calibrate`); it holds what visitors typed (off by default)")


def _setting(name: str, kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse type for the ServeConfig field ``name``, checked by ServeConfig's own rule as the command line is
    parsed: `--timeout 0` was 'question_timeout_s must be positive', a name the user never typed, with no usage."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None
        try:
            ServeConfig(**{name: value})  # type: ignore[arg-type]  # any field's name
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value
    return parse


def _address(host: str) -> str:
    """--host as bind() takes it: ``[::1]``, as URLs spell it, was 'not loopback' (and bind's 'Name or service not
    known' with a token)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def main(args: argparse.Namespace, open_rag: Callable) -> int:
    """Open the store, bind, serve until SIGTERM / Ctrl-C, then close everything."""
    try:
        from .app import create_app
        from .auth import token_from_file
        from .http import server as http_server
    except ImportError as exc:
        raise EdgeRAGError(f"edge-rag serve needs Starlette and uvicorn ({exc.name} is missing): "
                           "pip install 'edge-rag[serve]'") from exc
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is None and args.token_file is not None:
        token, created = token_from_file(args.token_file.expanduser())
        if created:
            print(f"edge-rag: new API token (saved in {args.token_file}, shown only now): {token}", flush=True)
    try:
        config = ServeConfig(host=args.host, port=args.port, token=token, allowed_hosts=tuple(args.allow_host),
                             question_timeout_s=args.timeout, max_queue=args.max_queue, title=args.title,
                             idle_reset_s=args.idle_reset, question_log=args.question_log)
    except ValueError as exc:
        raise EdgeRAGError(str(exc)) from exc
    if config.token and short(config.token):  # on loopback (refused elsewhere): only this machine's programs may guess
        print(f"edge-rag: warning: the API token is shorter than {MIN_TOKEN_CHARS} characters and may be guessed; "
              "choose a longer one, or name a new --token-file FILE, which the first start fills with a random one",
              file=sys.stderr, flush=True)
    sock = _bind(config.host, config.port)  # bound before loading models: a taken port fails fast
    # writes index beside the questions with a second encoder session: the memory plan prices it, or refuses to start
    rag = open_rag(args, index_threads=INDEX_THREADS if config.token else 0)
    app = create_app(rag, config)
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    writes = "writes need the API token" if config.token else "read-only: no API token"
    # uvicorn finishes open requests on SIGTERM / Ctrl-C (a running indexing job stops at its next commit; the app
    # then closes the store), and re-raises the signal afterwards, to the handler it found. Its own, installed before
    # the "serving" line (a supervisor may send SIGTERM the moment it reads it): a SIGTERM before the event loop ran
    # starts and stops the server. One raising an exception there broke uvicorn's setup midway (its logging config,
    # the loop's self-pipe): tracebacks, and exit 1 in 4 of 10.
    server = http_server(app, config)
    signal.signal(signal.SIGTERM, server.handle_exit)
    try:
        print(f"edge-rag: serving {rag.store.location} ({rag.store.count} passages; {writes}) on "
              f"http://{url_host}:{port}/", flush=True)
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    print("edge-rag: stopped", flush=True)
    return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on connections of a socket made for TCP, and
    # with it on every response on a kept-alive connection waits for the client's delayed ACK (~40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EdgeRAGError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
