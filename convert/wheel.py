"""The edge-rag wheel of this checkout, built from a copy of what it packs.

setuptools builds a local folder in place (its ``build/`` and ``*.egg-info`` in the checkout), so two builds at once
(``make pi-check`` beside ``make test``, or two test files at a time) would write the same folder, and a stale file
left in ``build/lib`` would be packed. A copy of the packaging inputs in a temporary folder has neither problem.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
PACKED = ("pyproject.toml", "README.md", "edge_rag", "convert", "benchmarks", "evaluation")  # what setuptools reads


def checkout_wheel(out: Path) -> Path:
    """Build the wheel into the folder ``out``; returns its path. RuntimeError with pip's output if it fails."""
    with tempfile.TemporaryDirectory(prefix="edge-rag-source-") as tmp:
        for name in PACKED:
            if (CHECKOUT / name).is_dir():
                shutil.copytree(CHECKOUT / name, Path(tmp) / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(CHECKOUT / name, Path(tmp) / name)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                               "-w", str(out), tmp], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the edge-rag wheel exited {done.returncode}:\n{done.stdout[-3000:]}")
    [wheel] = Path(out).glob("edge_rag-*.whl")
    return wheel
