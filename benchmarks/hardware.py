"""What the numbers were measured on: CPU, cores, RAM, OS, library versions, the model bundle."""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

import psutil

from edge_rag.config import default_threads
from edge_rag.models.bundle import Bundle
from edge_rag.models.verify import cpu_features

PACKAGES = ("edge-rag", "numpy", "onnxruntime", "hnswlib", "llama_cpp_python", "tokenizers", "psutil",
            "torch", "sentence-transformers", "faiss-cpu")


# MIDR "CPU part" of Arm Ltd. cores (implementer 0x41): aarch64 kernels print no model name.
ARM_CORES = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
             "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
             "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
             "0xd42": "Cortex-A78AE", "0xd44": "Cortex-X1", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710",
             "0xd49": "Neoverse-N2", "0xd4b": "Cortex-A78C"}
# The aarch64 features that decide int8 / fp16 kernels in onnxruntime and llama.cpp (A72: none of them).
ARM_KERNEL_FEATURES = ("asimddp", "asimdhp", "i8mm", "bf16", "sve", "sve2")


def cpu_model(cpuinfo: str | None = None, board: str | None = None) -> str:
    """x86: the model name. aarch64: the board (device tree, or cpuinfo's "Model" on a Raspberry Pi), the
    cores by part number and the kernel-relevant features, e.g. "Raspberry Pi 5 Model B Rev 1.0: 4x
    Cortex-A76 (asimddp asimdhp)"."""
    if cpuinfo is None:
        cpuinfo, board = _read("/proc/cpuinfo"), _read("/proc/device-tree/model").strip("\x00\n") or None
    fields = [tuple(part.strip() for part in line.split(":", 1)) for line in cpuinfo.splitlines() if ":" in line]
    for key, value in fields:
        if key.lower() in ("model name", "cpu model"):
            return value
    parts = [value for key, value in fields if key == "CPU part"]
    if not parts:
        return platform.processor() or platform.machine()
    cores = " + ".join(f"{parts.count(p)}x {ARM_CORES.get(p, 'CPU part ' + p)}" for p in dict.fromkeys(parts))
    features = next((value.split() for key, value in fields if key == "Features"), [])
    board = board or next((value for key, value in fields if key == "Model"), None)
    kernel = " ".join(f for f in ARM_KERNEL_FEATURES if f in features) or "no dotprod/fp16/i8mm"
    return f"{board + ': ' if board else ''}{cores} ({kernel})"


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


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
        "cpu_features": cpu_features(),  # what numpy's runtime dispatch finds (CPUID / HWCAP)
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "threads_used": threads or default_threads(),
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
