"""Resident memory of this process: now, and its high-water mark."""
from __future__ import annotations

import sys
from pathlib import Path

import psutil

MB = 1024 * 1024
STATUS = Path("/proc/self/status")


def rss_mb() -> float:
    return usage_mb()[0]


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (the kernel's high-water mark)."""
    return usage_mb()[1]


def usage_mb() -> tuple[float, float]:
    """Resident memory now and its peak so far, from one read of /proc/self/status on Linux (VmRSS, VmHWM).

    Every Answer samples it: psutil.Process() and a second read of the file took p50 0.20-0.28 ms right after a
    question on a busy 2-core x86, this 0.06-0.10 ms (``python -m benchmarks.experiments.route_costs``). VmRSS is
    the figure psutil reports; VmHWM rather than ru_maxrss, which survives fork + exec and so reports a parent's
    peak in a freshly started child (a worker launched by a big test or benchmark process)."""
    if STATUS.is_file():
        fields = dict(line.split(":", 1) for line in STATUS.read_text().splitlines() if line.startswith("Vm"))
        if "VmRSS" in fields and "VmHWM" in fields:
            return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024  # kB
    rss = psutil.Process().memory_info().rss / MB
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss, peak / (MB if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB elsewhere
    except ImportError:  # Windows
        return rss, psutil.Process().memory_info().peak_wset / MB
