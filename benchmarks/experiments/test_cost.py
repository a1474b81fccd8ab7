"""What each test file costs: wall seconds and the CPU seconds (user + sys) of its pytest process and everything it
waited for (qemu, pip, servers), one file at a time, run exactly as tests/isolated.py runs it.

Wall time on a shared box moves with the other load; CPU seconds barely do, so a change that makes a file cheaper
shows in both. Usage (from the checkout root): ``python -m benchmarks.experiments.test_cost tests/test_fuzz.py ...``
(``--durations=10`` and other pytest options after ``--``). One JSON line per file.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time


def cost(path: str, options: list[str]) -> dict:
    """Run ``path`` in its own pytest process; its wall and CPU seconds, exit code and summary line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, path],
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = done.stdout.strip().splitlines()
    return {"file": path, "wall_s": round(wall, 1), "user_s": round(after.ru_utime - before.ru_utime, 1),
            "sys_s": round(after.ru_stime - before.ru_stime, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "exit": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:],
            "slowest": [line for line in lines if line.split(" ")[0].endswith("s") and " call " in line
                        or " setup " in line][:12]}


def main(argv: list[str]) -> int:
    files, _, options = (argv[: argv.index("--")], None, argv[argv.index("--") + 1:]) if "--" in argv else (argv, None, [])
    failed = 0
    for path in files:
        row = cost(path, options)
        failed |= row["exit"] not in (0, 5)
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
