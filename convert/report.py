"""Parity reports: JSON next to every artifact plus a readable one-line-per-figure summary."""
from __future__ import annotations

import json
from pathlib import Path

from edge_rag.storage.fileio import atomic_write_text, sha256_file


def write_report(artifact: str | Path, report: dict) -> Path:
    """Write ``<artifact>.parity.json`` and print a summary; returns the report path. The report holds the artifact's
    sha256: a file put where a checked one was (another export, a run cut short between the two writes) is not
    vouched for by the report of the one it replaced (``of_file``)."""
    path = Path(str(artifact) + ".parity.json")
    report = {**report, "sha256": sha256_file(artifact)}
    atomic_write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")  # half a report failed convert bundle
    status = "PASS" if report.get("passed") else "FAIL"
    print(f"[{status}] {Path(artifact).name}")
    for key, value in sorted(report.items()):
        if isinstance(value, (int, float, str, bool)) and key != "passed":
            print(f"    {key:<28} {value:.6g}" if isinstance(value, float) else f"    {key:<28} {value}")
    return path


def read_report(artifact: str | Path) -> dict | None:
    """The parity report written beside ``artifact``, or None when it has none."""
    path = Path(str(artifact) + ".parity.json")
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def of_file(artifact: str | Path, report: dict) -> bool:
    """Whether ``report`` is of the file now at ``artifact`` (a report older than the hash it holds is taken as is)."""
    return report.get("sha256", None) in (None, sha256_file(artifact))
