"""Parity reports: JSON next to every artifact plus a readable one-line-per-figure summary."""
from __future__ import annotations

import json
from pathlib import Path


def write_report(artifact: str | Path, report: dict) -> Path:
    """Write ``<artifact>.parity.json`` and print a summary; returns the report path."""
    path = Path(str(artifact) + ".parity.json")
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
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
