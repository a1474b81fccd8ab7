"""`make test`'s runner (tests/isolated.py): two files at a time, each file's output whole, one summary line."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from isolated import PYCACHE, longest_first, prune_bytecode, split_jobs

from edge_rag.config import default_threads

RUNNER = Path(__file__).resolve().parent / "isolated.py"
# Each file waits for the other to have started: run one after the other, the first would wait in vain and fail.
MEETS = """
import time
from pathlib import Path

def test_{me}_meets_{other}():
    print("{me}-output")
    Path("{me}.started").touch()
    deadline = time.monotonic() + 120
    while not Path("{other}.started").exists():
        assert time.monotonic() < deadline, "{other} never ran beside {me}"
        time.sleep(0.05)
"""
FAILS = """
def test_fails():
    print("c-output")
    assert 1 == 2
"""


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), *args], cwd=folder, capture_output=True, text=True,
                          timeout=600)


def test_two_files_run_side_by_side_and_each_output_is_whole(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(MEETS.format(me="a", other="b"))
    (tmp_path / "test_b.py").write_text(MEETS.format(me="b", other="a"))
    (tmp_path / "test_c.py").write_text(FAILS)
    done = _run(tmp_path, "test_a.py", "test_b.py", "test_c.py", "-s")
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"2 passed, 1 failed in 0 min \d+ s \(2 files at a time\)", lines[-1]), done.stdout
    assert lines[-2] == "files with failures: test_c.py", done.stdout
    assert done.returncode == 1
    starts = [i for i, line in enumerate(lines) if "test session starts" in line]
    assert len(starts) == 3
    for begin, end in zip(starts, starts[1:] + [len(lines) - 2]):  # one file's session: its output and result
        block = "\n".join(lines[begin:end])
        [me] = [m for m in "abc" if f"test_{m}.py" in block]
        assert f"{me}-output" in block and not {f"test_{o}.py" for o in "abc" if o != me} & set(block.split())


def test_exitfirst_starts_no_file_after_a_failure(tmp_path: Path) -> None:
    (tmp_path / "test_c.py").write_text(FAILS)
    (tmp_path / "test_d.py").write_text("def test_ok():\n    pass\n")
    done = _run(tmp_path, "--jobs", "1", "-x", "test_c.py", "test_d.py")
    assert done.stdout.splitlines()[-1].startswith("0 passed, 1 failed in ") and "test_d.py" not in done.stdout, done.stdout


def test_longest_files_first_and_never_timed_ones_after_them() -> None:
    known = {"tests/test_a.py": 3.0, "tests/test_b.py": 90.0, "tests/test_c.py": 12.5}
    files = ["tests/test_new.py", "tests/test_a.py", "tests/test_b.py", "tests/test_c.py", "tests/test_all.py"]
    assert longest_first(files, known) == ["tests/test_b.py", "tests/test_c.py", "tests/test_a.py", "tests/test_all.py",
                                           "tests/test_new.py"]


def test_jobs_option_is_the_runners_own() -> None:
    assert split_jobs(["-x", "--jobs", "3", "-k", "store"]) == (3, ["-x", "-k", "store"])
    assert split_jobs(["--jobs=1"]) == (1, [])
    assert split_jobs(["-q"]) == (2, ["-q"])


def test_each_file_gets_its_share_of_the_cores_as_its_thread_budget(tmp_path: Path, monkeypatch) -> None:
    """Two files at a time on two cores: one compute thread each (OMP_NUM_THREADS, which edge-rag's ``threads = 0``,
    torch and numpy's BLAS take); a budget the user set is kept."""
    (tmp_path / "test_t.py").write_text("import os\ndef test_t():\n    print('budget', os.environ['OMP_NUM_THREADS'])\n")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = default_threads()  # OMP_NUM_THREADS unset: the CPUs this process may use
    assert f"budget {max(1, cores // 2)}" in _run(tmp_path, "-s", "test_t.py").stdout
    assert f"budget {cores}" in _run(tmp_path, "--jobs", "1", "-s", "test_t.py").stdout
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert "budget 3" in _run(tmp_path, "-s", "test_t.py").stdout


def test_plugins_only_for_files_that_use_them(tmp_path: Path) -> None:
    """Hypothesis's pytest plugin imports all of Hypothesis at every session's end (1.4 s of CPU), anyio's imports
    anyio at every session's start (0.3 s): a file that uses neither runs without both; a file that uses one keeps
    it (Hypothesis's health checks and failing-example report; anyio's marker and backend fixtures)."""
    probe = ("def test_{me}(request):\n    has = request.config.pluginmanager.has_plugin\n"  # anyio spelt apart:
             "    print('{me} plugins', has('hypothesispytest'), has('any' + 'io'))\n")  # a file naming it keeps it
    (tmp_path / "test_plain.py").write_text(probe.format(me="plain"))
    (tmp_path / "test_prop.py").write_text("from hypothesis import given\n" + probe.format(me="prop"))
    (tmp_path / "test_async.py").write_text("import pytest\npytestmark = pytest.mark.anyio\n" + probe.format(me="async"))
    out = _run(tmp_path, "-s", "test_plain.py", "test_prop.py", "test_async.py").stdout
    assert "plain plugins False False" in out and "prop plugins True False" in out, out
    assert "async plugins False True" in out, out


def test_each_file_keeps_its_bytecode_under_the_test_cache(tmp_path: Path, monkeypatch) -> None:
    """~70 processes would each compile edge_rag again where PYTHONDONTWRITEBYTECODE is set: each file's process
    writes bytecode under tests/.cache/pycache instead (the tree stays clean); a prefix the user set is kept."""
    (tmp_path / "test_b.py").write_text("import sys\ndef test_b():\n"
                                        "    print('bytecode', sys.dont_write_bytecode, sys.pycache_prefix)\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    assert f"bytecode False {PYCACHE}" in _run(tmp_path, "-s", "test_b.py").stdout
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "own"))
    assert f"bytecode False {tmp_path / 'own'}" in _run(tmp_path, "-s", "test_b.py").stdout


def test_bytecode_of_folders_gone_since_is_pruned(tmp_path: Path) -> None:
    """A test's temporary install leaves its bytecode under the prefix when the install is deleted: the runner drops
    what no longer has a source folder and keeps the rest (the prefix mirrors absolute paths)."""
    prefix, kept = tmp_path / "prefix", tmp_path / "kept"
    kept.mkdir()
    for folder in (kept, tmp_path / "gone" / "pkg"):
        mirror = prefix / folder.relative_to("/")
        mirror.mkdir(parents=True)
        (mirror / "mod.cpython-311.pyc").write_bytes(b"bytecode")
    prune_bytecode(prefix)
    assert (prefix / kept.relative_to("/") / "mod.cpython-311.pyc").is_file()
    assert not (prefix / tmp_path.relative_to("/") / "gone").exists()
