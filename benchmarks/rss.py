"""Peak RSS for the worker processes, without importing edge_rag (whose imports would be measured too).

On Linux ru_maxrss survives fork + exec (it lives in the signal struct), so a worker would report its
parent's peak; VmHWM in /proc/self/status belongs to the new address space and starts from zero.
"""
from __future__ import annotations

import resource
import sys
from pathlib import Path


def peak_rss_mb() -> float:
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 1024)
