"""The edge-rag wheel of this checkout, built from a copy of what it packs.

setuptools builds a local folder in place (its ``build/`` and ``*.egg-info`` in the checkout), so two builds at once
(``make pi-check`` beside ``make test``, or two test files at a time) would write the same folder, and a stale file
left in ``build/lib`` would be packed. A copy of the packaging inputs in a temporary folder has neither problem.
The wheel is kept in ``home()/wheels`` keyed by those inputs' names and bytes: a build costs ~5 s of CPU, and
`make test` (test_install, test_aarch64) and `make pi-check` ask for the same wheel of an unchanged checkout.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge_rag.models.registry import home

CHECKOUT = Path(__file__).resolve().parent.parent
PACKED = ("pyproject.toml", "README.md", "edge_rag", "convert", "benchmarks", "evaluation")  # what setuptools reads


def _inputs_key() -> str:
    """sha256 over the name and bytes of every file ``PACKED`` copies (a change to any builds the wheel again)."""
    key = hashlib.sha256()
    for name in PACKED:
        top = CHECKOUT / name
        files = sorted(p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if top.is_dir() \
            else [top]
        for path in files:
            key.update(str(path.relative_to(CHECKOUT)).encode() + b"\0" + path.read_bytes())
    return key.hexdigest()[:16]


def checkout_wheel(out: Path) -> Path:
    """The wheel in the folder ``out``, copied from ``home()/wheels`` or built there; returns its path.
    RuntimeError with pip's output if the build fails."""
    cache = home() / "wheels"
    done = cache / f"edge-rag-{_inputs_key()}"
    if not done.is_dir():
        tmp = cache / f".{done.name}.{os.getpid()}"
        try:
            _build(tmp)
            with contextlib.suppress(OSError):  # another process landed the same wheel first
                os.replace(tmp, done)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for stale in cache.glob("edge-rag-*"):  # wheels of older checkouts, unused for a week
            if stale.stat().st_mtime < time.time() - 7 * 86400:
                shutil.rmtree(stale, ignore_errors=True)
    os.utime(done)
    [wheel] = done.glob("edge_rag-*.whl")
    Path(out).mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(wheel, Path(out) / wheel.name))


def _build(out: Path) -> None:
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
