"""`make test`: the suite with one pytest process per test file, two files at a time, then one summary line.

The memory planner counts this process's resident memory as its runtime base (it plans the whole process),
so a single pytest process that has loaded torch, llama.cpp and a dozen stores would fail the budget of
every EdgeRAG built late in the run. One process per file keeps each file's figures those of a process
that holds what that file loads, as on a device; resident memory is per process, so files running side by
side do not change each other's figures. The longest files start first (their wall times in the last run
here, tests/.cache/durations.json, else the estimates in tests/durations.json), so no long file is left
running alone at the end. Each file's output is printed whole when it ends. Each file gets its share of the
cores as its thread budget (``OMP_NUM_THREADS``, unless set: onnxruntime, llama.cpp, torch and numpy's BLAS
take it), so two files at a time on two cores run one compute thread each instead of two that wait on each other.
A file runs without the pytest plugins it does not use (``PLUGINS``): Hypothesis's imports all of Hypothesis at the
end of every session (1.4 s of CPU per file here, ~90 s over the suite), anyio's imports anyio and its asyncio backend
at the start of every session (0.3 s of CPU for a file that does not import anyio itself; no test here is an
anyio test).

Arguments are passed to every pytest run (`make test ARGS="-k store -x"`), except ``--jobs N`` (files at a
time, default 2); a file with no selected test (exit 5) is not a failure; with ``-x`` no file starts after
one failed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from edge_rag.config import default_threads

TESTS = Path(__file__).resolve().parent
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected)")
JOBS = 2
SEED_DURATIONS = TESTS / "durations.json"  # committed: seconds per file, for the order of a first run
DURATIONS = TESTS / ".cache" / "durations.json"  # this machine's last wall time per file
PYCACHE = TESTS / ".cache" / "pycache"  # the children's compiled bytecode (PYTHONPYCACHEPREFIX)
# pytest plugins (entry points every session loads) and what in a test file's source says it uses them
PLUGINS = {"hypothesispytest": r"^\s*(import|from) hypothesis\b", "anyio": r"\banyio\b|\bfree_(tcp|udp)_port\b"}


def durations() -> dict[str, float]:
    """Seconds per test file: this machine's last runs over the committed estimates."""
    known: dict[str, float] = {}
    for path in (SEED_DURATIONS, DURATIONS):
        if path.is_file():
            known |= json.loads(path.read_text(encoding="utf-8"))
    return known


def record(timed: dict[str, float]) -> None:
    """Merge ``timed`` into this machine's durations (a whole new file: a run stopped midway leaves the old)."""
    DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(DURATIONS.read_text(encoding="utf-8")) if DURATIONS.is_file() else {}
    tmp = DURATIONS.with_name(f"{DURATIONS.name}.{os.getpid()}")
    tmp.write_text(json.dumps(previous | timed, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, DURATIONS)


def longest_first(files: list[str], known: dict[str, float]) -> list[str]:
    """Files by their last wall time, longest first; files never timed after them (the long ones are listed in
    tests/durations.json), in name order."""
    return sorted(files, key=lambda f: (-known.get(f, 0.0), f))


def plugin_options(path: str) -> list[str]:
    """pytest options for the file at ``path``: each plugin of PLUGINS off unless the file uses it."""
    source = Path(path.split("::")[0]).read_text(encoding="utf-8", errors="replace")
    return [o for name, used in PLUGINS.items() if not re.search(used, source, re.M) for o in ("-p", f"no:{name}")]


def child_environment(jobs: int) -> dict[str, str]:
    """The environment of each file's process: ``OMP_NUM_THREADS`` its share of the cores this process may use
    (``default_threads``, as the runtime counts them), unless already set; and compiled bytecode kept under
    ``PYCACHE`` (unless ``PYTHONPYCACHEPREFIX`` is set) even where ``PYTHONDONTWRITEBYTECODE`` is: the tree stays
    clean as that setting wants, and ~70 processes, their CLI subprocesses and the emulated aarch64 interpreter do not
    each compile edge_rag again."""
    share = max(1, default_threads() // jobs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(share)),
            "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX", str(PYCACHE))}


def prune_bytecode(prefix: Path) -> None:
    """Remove the bytecode under ``prefix`` of folders that no longer exist: the tests' temporary installs and
    virtualenvs compile into it too (~5 MB a run), and would pile up run after run."""
    for folder, subdirs, _ in os.walk(prefix):
        source = Path("/", Path(folder).relative_to(prefix))
        gone = {d for d in subdirs if not (source / d).exists()}
        for d in gone:
            shutil.rmtree(Path(folder, d), ignore_errors=True)
        subdirs[:] = [d for d in subdirs if d not in gone]


def split_jobs(argv: list[str]) -> tuple[int, list[str]]:
    """``--jobs N`` (or ``--jobs=N``) out of ``argv``; the rest is for pytest."""
    jobs, rest, args = JOBS, [], iter(argv)
    for a in args:
        if a == "--jobs" or a.startswith("--jobs="):
            value = a.partition("=")[2] or next(args, "")
            if not value.isdigit() or int(value) < 1:
                raise SystemExit(f"isolated.py: --jobs needs a positive integer, got {value!r}")
            jobs = int(value)
        else:
            rest.append(a)
    return jobs, rest


def main(argv: list[str]) -> int:
    jobs, argv = split_jobs(argv)
    paths = [a for a in argv if Path(a.split("::")[0]).exists()]
    options = [a for a in argv if a not in paths]
    suite = {str(p.relative_to(TESTS.parent)) for p in TESTS.glob("test_*.py")}
    files = paths or sorted(suite)
    known = durations()
    stop_on_failure = "-x" in options or "--exitfirst" in options
    stop = threading.Event()
    env = child_environment(jobs)
    began = time.monotonic()

    def run(f: str) -> tuple[subprocess.CompletedProcess | None, float]:
        if stop.is_set():
            return None, 0.0
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_options(f), *options,
                               f],
                              capture_output=True, text=True, env=env)
        if done.returncode not in (0, 5) and stop_on_failure:
            stop.set()
        return done, time.monotonic() - start

    totals: dict[str, int] = {}
    failed_files, timed = [], {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run, f): f for f in longest_first(files, known)}
        for future in as_completed(futures):
            done, seconds = future.result()
            if done is None:
                continue
            f = futures[future]
            sys.stdout.write(done.stdout)
            sys.stdout.flush()
            sys.stderr.write(done.stderr)
            sys.stderr.flush()
            summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            for n, kind in COUNTS.findall(summary):
                kind = "errors" if kind.startswith("error") else kind
                totals[kind] = totals.get(kind, 0) + int(n)
            if done.returncode not in (0, 5):
                failed_files.append(f)
            elif not options and f in suite:  # a whole suite file's wall time orders the next run
                timed[f] = round(seconds, 1)
    if timed:
        record(timed)
    if env["PYTHONPYCACHEPREFIX"] == str(PYCACHE):  # a prefix the user set is theirs to keep
        prune_bytecode(PYCACHE)
    if failed_files:
        print("files with failures: " + ", ".join(failed_files))
    extra = "".join(f", {totals[k]} {k}" for k in ("errors", "skipped") if totals.get(k))
    wall = time.monotonic() - began
    print(f"{totals.get('passed', 0)} passed, {totals.get('failed', 0)} failed{extra} in {wall // 60:.0f} min "
          f"{wall % 60:.0f} s ({jobs} files at a time)")
    return 1 if failed_files else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
