"""Peak RSS for the worker processes, without importing edge_rag (whose imports would be measured too), and a
system's own peak in the harness process (``reset_peak``).

On Linux ru_maxrss survives fork + exec (it lives in the signal struct), so a worker would report its
parent's peak; VmHWM in /proc/self/status belongs to the new address space and starts from zero.
"""
from __future__ import annotations

import contextlib
import ctypes
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


def reset_peak() -> bool:
    """Start the high-water mark again from the resident set now (Linux >= 4.0: "5" to /proc/self/clear_refs), so a
    later ``peak_rss_mb`` is the peak of what ran since, not of an earlier stage of the same process. False where
    it cannot be reset: a later peak is then the whole process's so far."""
    with contextlib.suppress(OSError, AttributeError):  # glibc: heap freed by an earlier stage back to the system
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
