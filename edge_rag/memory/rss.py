"""Resident memory of this process: now, and its high-water mark."""
from __future__ import annotations

import sys
from pathlib import Path

import psutil

MB = 1024 * 1024


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (the kernel's high-water mark).

    Linux: VmHWM of /proc/self/status, not ru_maxrss, which survives fork + exec and so reports a
    parent's peak in a freshly started child (a worker launched by a big test or benchmark process)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (MB if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB elsewhere
    except ImportError:  # Windows
        return psutil.Process().memory_info().peak_wset / MB
