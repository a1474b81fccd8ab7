"""`make test`: the suite with one pytest process per test file, then one summary line.

The memory planner counts this process's resident memory as its runtime base (it plans the whole process),
so a single pytest process that has loaded torch, llama.cpp and a dozen stores would fail the budget of
every EdgeRAG built late in the run. One process per file keeps each file's figures those of a process
that holds what that file loads, as on a device. Arguments are passed to every pytest run
(`make test ARGS="-k store -x"`); a file with no selected test (exit 5) is not a failure.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected)")


def main(argv: list[str]) -> int:
    paths = [a for a in argv if Path(a.split("::")[0]).exists()]
    options = [a for a in argv if a not in paths]
    files = paths or sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.glob("test_*.py"))
    totals: dict[str, int] = {}
    failed_files = []
    for f in files:
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, f],
                             stdout=subprocess.PIPE, text=True)
        sys.stdout.write(run.stdout)
        sys.stdout.flush()
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        for n, kind in COUNTS.findall(summary):
            kind = "errors" if kind.startswith("error") else kind
            totals[kind] = totals.get(kind, 0) + int(n)
        if run.returncode not in (0, 5):
            failed_files.append(f)
            if "-x" in options or "--exitfirst" in options:
                break
    if failed_files:
        print("files with failures: " + ", ".join(failed_files))
    extra = "".join(f", {totals[k]} {k}" for k in ("errors", "skipped") if totals.get(k))
    print(f"{totals.get('passed', 0)} passed, {totals.get('failed', 0)} failed{extra}")
    return 1 if failed_files else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
