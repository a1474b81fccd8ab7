"""What each test file costs: wall seconds and the CPU seconds (user + sys) of its pytest process and everything it
waited for (qemu, pip, servers), one file at a time, run exactly as tests/isolated.py runs it.

Wall time on a shared box moves with the other load; CPU seconds barely do, so a change that makes a file cheaper
shows in both. Usage (from the checkout root): ``OMP_NUM_THREADS=1 python -m benchmarks.experiments.test_cost
tests/test_fuzz.py ...`` (the thread budget tests/isolated.py gives each file on two cores; ``--durations=10`` and other
pytest options after ``--``). One JSON line per file.
"""
from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the runner's own rule for its options
from isolated import plugin_options  # noqa: E402

DURATION = re.compile(r"\d+\.\d+s (setup|call|teardown) ")


def cost(path: str, options: list[str]) -> dict:
    """Run ``path`` in its own pytest process; its wall and CPU seconds, exit code and summary line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_options(path), *options,
                           path],
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = done.stdout.strip().splitlines()
    return {"file": path, "wall_s": round(wall, 1), "user_s": round(after.ru_utime - before.ru_utime, 1),
            "sys_s": round(after.ru_stime - before.ru_stime, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "exit": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:],
            "slowest": [line for line in lines if DURATION.match(line)][:12]}  # pytest's --durations lines


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    files, options = argv[:split], argv[split + 1:]
    failed = 0
    for path in files:
        row = cost(path, options)
        failed |= row["exit"] not in (0, 5)
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
