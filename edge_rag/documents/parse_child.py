"""PDF and HTML are parsed in a child process with limits on its memory, its output and its time.

Why: the parsers are native code that a hostile file can steer. A 0.6 MB PDF whose content stream inflates
to 420 MB took a server past 6 GB (its budget: 2 GB); 1,000,000 nested ``<div>`` kept lexbor busy for
hours, and a running parse kept the server from stopping. The child gets ``PARSE_MEMORY_MB`` of address
space (RLIMIT_AS: the allocation past it fails and the child dies, the parent does not notice), writes at
most ``PARSE_TEXT_MB`` of sections (RLIMIT_FSIZE on its output file: a JSON line each, read back one at a time),
may use ``PARSE_SECONDS`` + ``PARSE_SECONDS_PER_MB`` per MB of the file of CPU time (RLIMIT_CPU) and is killed
after ``WALL_FACTOR`` times that (a child blocked, not computing; a parse that waits for the CPU of a busy device is
no attack).
Past any limit the file is refused with an InputError naming it and the limit, so folder indexing skips
it and an upload answers 422.
``Parser.stop`` kills the running children (a server shutting down does not wait for them).
"""
from __future__ import annotations

import json
import math
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..errors import InputError
from . import ingest

PARSE_MEMORY_MB = 512  # address space of the child: Python and the parser libraries take ~60 MB of it
PARSE_TEXT_MB = 64  # sections written back (JSON); a PDF with more text than this is not a venue's document
PARSE_SECONDS = 10.0  # of CPU time
PARSE_SECONDS_PER_MB = 1.0
WALL_FACTOR = 3
EXIT_REFUSED = 3  # the child refused the file; stderr says why
_ROOT = str(Path(__file__).resolve().parents[2])  # the child imports this edge_rag, wherever it came from
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from edge_rag.documents.parse_child import main; sys.exit(main(sys.argv[2:]))"


class Parser:
    """Starts parse children and keeps track of them; ``stop`` kills them and refuses new ones."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def read(self, path: Path, cpu_s: int | None = None) -> list[ingest.Section]:
        """``ingest.read(path)`` in a child process; InputError naming the file when it passes a limit."""
        cpu_s = cpu_s or math.ceil(PARSE_SECONDS + PARSE_SECONDS_PER_MB * path.stat().st_size / 2**20)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            args = [str(path), str(PARSE_MEMORY_MB), str(PARSE_TEXT_MB), str(cpu_s)]
            child = subprocess.Popen([sys.executable, "-c", _CHILD, _ROOT, *args], stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=err)
            code = self._wait(child, WALL_FACTOR * cpu_s)
            if code == 0:  # a section a line: the whole output held at once, bytes and text, was twice the sections
                out.seek(0)
                return [(title, text) for title, text in map(json.loads, out)]
            err.seek(0)
            raise InputError(self._refusal(path, code, cpu_s, err.read(2000).decode("utf-8", "replace")))

    def stop(self) -> None:
        """Kill every running child (their files are refused) and refuse new parses."""
        with self._lock:
            self._stopped = True
            for child in self._running:
                child.kill()

    def _wait(self, child: subprocess.Popen, timeout: float) -> int | None:
        """The child's exit code, or None when it ran out of time (it is killed)."""
        with self._lock:
            self._running.add(child)
            if self._stopped:
                child.kill()
        try:
            return child.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:  # also on KeyboardInterrupt: no child outlives its parse
            child.kill()
            child.wait()
            with self._lock:
                self._running.discard(child)

    def _refusal(self, path: Path, code: int | None, cpu_s: int, stderr: str) -> str:
        if code is None:
            return f"{path} was still being parsed after {WALL_FACTOR * cpu_s} s; refused"
        if code == -signal.SIGXCPU:
            return f"{path} took more than {cpu_s} s of CPU time to parse; refused"
        if code == EXIT_REFUSED:
            return stderr.strip()
        if code == -signal.SIGXFSZ:
            return f"{path} holds more than {PARSE_TEXT_MB} MB of text; split it into smaller files"
        if code == -signal.SIGKILL and self._stopped:
            return f"{path} was not read: parsing was stopped (the server is shutting down)"
        return (f"{path} needs more than {PARSE_MEMORY_MB} MB of memory to parse (a compression bomb?) or "
                f"crashes the parser (exit {code}); refused")


def main(argv: list[str]) -> int:
    """The child: set the limits, parse, write the sections to stdout, a JSON line each (exit 0), or why not to
    stderr."""
    path, memory_mb, text_mb, cpu_s = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (text_mb << 20, text_mb << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU at cpu_s, even if the parent died
    try:
        sections = ingest.read(path)
    except MemoryError:
        return 1  # reported as over the memory limit
    except Exception as exc:  # noqa: BLE001 - InputError, or the parser's own error on a malformed file
        sys.stderr.write(str(exc) if isinstance(exc, InputError) else f"{path} cannot be parsed: {exc!r}"[:500])
        return EXIT_REFUSED
    for section in sections:
        sys.stdout.write(json.dumps(section) + "\n")
    return 0
