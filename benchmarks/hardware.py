"""What the numbers were measured on: CPU, cores, RAM, OS, library versions, the model bundle."""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

import psutil

from edge_rag.bundle import Bundle

PACKAGES = ("edge-rag", "numpy", "onnxruntime", "hnswlib", "llama_cpp_python", "tokenizers", "psutil",
            "torch", "sentence-transformers", "faiss-cpu")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def profile(threads: int, bundle: Bundle) -> dict:
    """Machine, software and model identity; load average is recorded because a busy host skews latency."""
    return {
        "cpu": cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "threads_used": threads or os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "arch": platform.machine(),
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": versions(),
        "bundle": {
            "path": str(bundle.root),
            "profile": bundle.manifest.get("profile"),
            "encoder": {k: bundle.encoder.get(k) for k in ("name", "precision", "dim", "pooling")},
            "generator": {k: bundle.generator.get(k) for k in ("name", "quantization", "prompt_style")},
            "router": bundle.manifest.get("router"),
            "files": [{k: f[k] for k in ("name", "role", "size", "sha256")} for f in bundle.files()],
        },
    }
