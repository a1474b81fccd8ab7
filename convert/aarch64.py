"""An aarch64 (Raspberry Pi / Jetson class) Python environment on an x86 host, built from the registries only.

Debian's arm64 packages give the interpreter: debootstrap's first stage downloads them with their
dependencies resolved, and every ``.deb`` is unpacked here, so no second stage has to run under
emulation. PyPI gives the aarch64 wheels (pinned to this host's versions, so an x86/aarch64 comparison
differs in the CPU only). The two dependencies PyPI serves as source only, hnswlib and llama-cpp-python,
are cross-compiled with Debian's ``aarch64-linux-gnu`` toolchain: llama.cpp for ARMv8.0-A + NEON
(``-march=armv8-a``, no dotprod), the one build a Cortex-A72 (Pi 4), a Cortex-A76 (Pi 5) and a
Cortex-A78AE (Jetson Orin) all run; ggml's per-CPU variants need ``GGML_BACKEND_DL``, whose backend
folder is an absolute build-time path that a wheel cannot carry. qemu-user runs the interpreter as
one of ``CPUS``. All builds are cached under ``~/.cache/edge-rag/aarch64`` (``EDGE_RAG_AARCH64``),
keyed by what they were built from, and so are the pinned dependencies once installed (~11 s of CPU a run); edge-rag
itself is installed afresh on every run, as on a device.

qemu-user 7.2 shows the guest the host's x86 ``/proc/cpuinfo``, and onnxruntime's cpuinfo crashes on
it (SIGSEGV at import), so every run bind-mounts the emulated CPU's cpuinfo over ``/proc/cpuinfo`` in a
private mount namespace (``unshare``: root, or unprivileged user namespaces).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from edge_rag.storage.fileio import atomic_write_text

from .wheel import checkout_wheel

CACHE = Path(os.environ.get("EDGE_RAG_AARCH64", Path.home() / ".cache" / "edge-rag" / "aarch64"))
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
DEBS = ("python3.11-minimal", "libpython3.11-stdlib", "libpython3.11-dev", "libgomp1")
PYTHON = "usr/bin/python3.11"
SYSCONFIG = "_sysconfigdata__aarch64-linux-gnu"  # Debian's arm64 build configuration (CC, EXT_SUFFIX, ...)
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "linux_aarch64")
RUNTIME = ("numpy", "onnxruntime", "tokenizers", "hnswlib", "psutil", "tqdm")  # pinned to this host's versions
LLAMA_CMAKE_ARGS = ("-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc "
                    "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8-a "
                    "-DLLAVA_BUILD=OFF")  # the multimodal library is never loaded by edge-rag
TOOLS = ("qemu-aarch64", "debootstrap", "aarch64-linux-gnu-g++", "unshare")

# /proc/cpuinfo as the kernel writes it on these cores (MIDR fields, HWCAP names); qemu's CPU model gives
# the matching HWCAPs. cortex-a72: Raspberry Pi 4, NEON without dotprod; cortex-a76: Raspberry Pi 5, with
# dotprod (onnxruntime's int8 kernels then take the sdot/udot path, as on a Jetson Orin's A78AE).
CPUS = {
    "cortex-a72": ("0x0", "0xd08", "3", "fp asimd evtstrm crc32 cpuid"),
    "cortex-a76": ("0x4", "0xd0b", "1", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                                        "asimdrdm lrcpc dcpop asimddp"),
}


def missing_tools() -> list[str]:
    """Host programs the environment needs that are not installed (`make system-packages` installs them)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def _key(*parts: object) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:12]


def _run(cmd: list[str], **kwargs) -> None:
    """Run a build step; on failure raise with its last output lines (the step's own error message)."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[:6])} ...` exited {done.returncode}:\n{done.stdout[-3000:]}")


def _cached(path: Path, build) -> Path:
    """``path`` if a previous run completed it, else ``build(tmp)`` renamed into place (never half-built)."""
    if path.is_dir():
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def sysroot() -> Path:
    """Debian arm64 root with python3.11 (+ headers and libgomp), unpacked without emulation (~25 s, 240 MB)."""
    def build(tmp: Path) -> None:
        root = tmp / "root"
        _run(["debootstrap", "--foreign", "--arch=arm64", "--variant=minbase", "--include=" + ",".join(DEBS),
              SUITE, str(root), MIRROR])
        for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):  # the first stage unpacks only a few
            _run(["dpkg-deb", "-x", str(deb), str(root)])
    return _cached(CACHE / f"sysroot-{_key(SUITE, DEBS)}", build) / "root"


def cpuinfo(cpu: str) -> Path:
    """``/proc/cpuinfo`` of ``cpu`` with this host's core count (what the guest's libraries parse)."""
    variant, part, revision, features = CPUS[cpu]
    cores = os.cpu_count() or 1
    text = "\n".join(f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
                     f"CPU architecture: 8\nCPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: {revision}\n"
                     for i in range(cores))
    text += f"\nModel\t\t: qemu-aarch64 -cpu {cpu}\n"
    path = CACHE / f"cpuinfo-{cpu}-{cores}"
    if not path.is_file() or path.read_text() != text:  # replaced, never rewritten: a running guest has it mounted
        CACHE.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return path


def _pip(*args: str, env: dict | None = None) -> None:
    _run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], env=env)


def _version(name: str) -> str:
    return metadata.version(name)


def hnswlib_wheel(root: Path) -> Path:
    """hnswlib (source-only on PyPI), cross-compiled against the sysroot's Python headers (~1 min)."""
    version = _version("hnswlib")

    def build(tmp: Path) -> None:
        tools = tmp / "venv"
        _run([sys.executable, "-m", "venv", str(tools)])
        _run([str(tools / "bin" / "pip"), "install", "-q", "setuptools", "wheel", "numpy", "pybind11"])
        (tmp / "sysconfig").mkdir()
        shutil.copy(root / "usr/lib/python3.11" / f"{SYSCONFIG}.py", tmp / "sysconfig")
        # CPython's cross-build hooks: the target's sysconfig gives compiler, flags and extension suffix.
        env = {**os.environ, "_PYTHON_HOST_PLATFORM": "linux-aarch64", "_PYTHON_SYSCONFIGDATA_NAME": SYSCONFIG,
               "PYTHONPATH": str(tmp / "sysconfig"), "HNSWLIB_NO_NATIVE": "1",  # no -march=native: any ARMv8
               "CFLAGS": f"-I{root}/usr/include/python3.11 -I{root}/usr/include"}
        _run([str(tools / "bin" / "pip"), "wheel", "-q", "--no-build-isolation", "--no-deps", "--no-cache-dir",
              "--no-binary", "hnswlib", "-w", str(tmp / "wheel"), f"hnswlib=={version}"], env=env)
        shutil.rmtree(tools)
    return _one_wheel(_cached(CACHE / f"hnswlib-{_key(version, SYSCONFIG)}", build))


def llama_wheel() -> Path:
    """llama-cpp-python cross-compiled for ARMv8.0-A (~6 min on 2 cores). It loads its libraries with
    ctypes, so no target Python headers are needed; the wheel is tagged for aarch64."""
    version = _version("llama_cpp_python")  # the host's (pyproject pins it)

    def build(tmp: Path) -> None:
        env = {**os.environ, "CMAKE_ARGS": LLAMA_CMAKE_ARGS, "_PYTHON_HOST_PLATFORM": "linux-aarch64"}
        _pip("wheel", "-q", "--no-deps", "--no-cache-dir", "-w", str(tmp / "wheel"), f"llama-cpp-python=={version}",
             env=env)
    return _one_wheel(_cached(CACHE / f"llama-{_key(version, LLAMA_CMAKE_ARGS)}", build))


def _one_wheel(folder: Path) -> Path:
    [wheel] = (folder / "wheel").glob("*.whl")
    return wheel


@dataclass(frozen=True)
class Env:
    """The emulated device: Debian's arm64 python3.11 under qemu-aarch64 with ``site`` (then ``deps``) on its path."""

    root: Path
    site: Path
    cpu: str = "cortex-a72"
    deps: Path | None = None  # the dependencies' site, after ``site`` on the path

    def command(self, *args: str, cpu: str | None = None) -> list[str]:
        """``python3.11 ARGS`` on the emulated ``cpu`` (default ``self.cpu``), in a mount namespace whose
        /proc/cpuinfo is that CPU's."""
        cpu = cpu or self.cpu
        unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--mount"]
        return [*unshare, "sh", "-c", 'mount --bind "$0" /proc/cpuinfo && exec "$@"', str(cpuinfo(cpu)),
                "qemu-aarch64", "-cpu", cpu, "-L", str(self.root), str(self.root / PYTHON), *args]

    def environ(self, **extra: str) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        path = os.pathsep.join(str(p) for p in (self.site, self.deps) if p)
        return {**keep, "PYTHONPATH": path, "PYTHONNOUSERSITE": "1", **extra}


def install(site: Path, llama: bool, extra: tuple[str, ...] = ()) -> Env:
    """Install the device side (edge-rag from this checkout, no torch) for aarch64 into ``site``, its pinned
    dependencies, the cross-built wheels and ``extra`` into a site cached per that list; ``llama=False`` leaves out
    llama-cpp-python (the RAG route never loads it)."""
    root, ours = sysroot(), site.with_name(site.name + "-wheel")
    edge_rag = checkout_wheel(ours)

    def target(folder: Path) -> list[str]:
        return ["install", "-q", "--target", str(folder), "--python-version", "3.11", "--implementation", "cp",
                "--only-binary=:all:", *[f"--platform={p}" for p in PLATFORMS]]

    _pip(*target(site), "--no-deps", str(edge_rag))
    shutil.rmtree(ours)
    pins = [f"{name}=={_version(name)}" for name in RUNTIME if name != "hnswlib"]
    wheels = [str(w) for w in (hnswlib_wheel(root), *([llama_wheel()] if llama else []))]
    deps = _cached(CACHE / f"deps-{_key(pins, wheels, extra, PLATFORMS)}",
                   lambda tmp: _pip(*target(tmp / "site"), *pins, *wheels, *extra))
    return Env(root, site, deps=deps / "site")
