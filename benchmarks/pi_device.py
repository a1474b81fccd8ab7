"""Runs on the (emulated) device: ``python -m benchmarks.pi_device MODULE ARGS...`` runs ``python -m MODULE
ARGS...`` and then prints the process's peak RSS as the last line of stderr (``{"peak_rss_mb": ...}``).

Measured inside the process (VmHWM) because a parent's ``ru_maxrss`` for a child also counts the
parent's own peak (it survives fork + exec); under qemu-user the figure is the emulator process's,
guest and emulator together.
"""
from __future__ import annotations

import json
import runpy
import sys

from benchmarks.rss import peak_rss_mb


def main(argv: list[str]) -> int:
    module, sys.argv = argv[0], argv
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    print(json.dumps({"peak_rss_mb": round(peak_rss_mb(), 1)}), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
