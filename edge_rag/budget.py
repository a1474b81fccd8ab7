"""Process memory: current and peak RSS (psutil / getrusage)."""
from __future__ import annotations

import sys

import psutil

MB = 1024 * 1024


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (the kernel's high-water mark where available)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (MB if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux
    except ImportError:  # Windows
        return psutil.Process().memory_info().peak_wset / MB
