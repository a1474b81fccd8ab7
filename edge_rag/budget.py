"""Process memory: measure RSS, and plan the whole process into one budget before loading anything.

DESIGN.md step 13. ``plan`` estimates every component from what is cheap to know up front (file
sizes, the GGUF header, the config), picks the largest ``n_ctx`` and encoder batch that fit
``memory_budget_mb``, and otherwise raises a BudgetError naming the component that does not fit.

The total is a sum: the worst order is generator loaded first, then indexing on top of it, and
users can do that. Every calibration constant below was fitted to peak RSS measured in fresh
processes (``python -m edge_rag.budget``, see ``measure``) on x86-64, 2 cores, glibc, with the gemma
bundle; each sits at or slightly above the worst measurement, so estimates err high, never low.
"""
from __future__ import annotations

import mmap
import sqlite3
import struct
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from . import bundle as B
from .config import Config
from .errors import BudgetError, BundleError

MB = 1024 * 1024


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (the kernel's high-water mark).

    Linux: VmHWM of /proc/self/status, not ru_maxrss, which survives fork + exec and so reports a
    parent's peak in a freshly started child (a worker launched by a big test or benchmark process)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (MB if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB elsewhere
    except ImportError:  # Windows
        return psutil.Process().memory_info().peak_wset / MB


# -----------------------------------------------------------------------------------------------
# Calibration (MB = MiB throughout). End to end: `measure` / `python -m edge_rag.budget --help`; the
# per-component numbers came from fresh processes loading one component at a time, as quoted.

# python + numpy + onnxruntime + tokenizers + hnswlib + edge_rag + llama_cpp imported: 72.3 MB
# (`python -c "import edge_rag, llama_cpp; from edge_rag.budget import rss_mb; print(rss_mb())"`).
RUNTIME_BASE_MB = 75.0
LLAMA_LIB_MB = 7.0  # importing llama_cpp (libllama + libggml) on top of the rest: 6.1 MB

# Encoder weights: a session on the 21.9 MB int8 MiniLM + its tokenizer adds 47.3..50.2 MB of RSS
# (onnxruntime keeps the initializers and pre-packed copies; the rest is the session and tokenizer).
ONNX_FILE_FACTOR = 2.0
ENCODER_FIXED_MB = 8.0
# Encoder activations, priced by the formula in `encoder_estimate` at L = max_seq_len and scaled to
# cover the worst peak-RSS rise over one indexing pass (3 runs each, SQuAD paragraphs; sentences use
# ~70% of it): 46 / 96 / 156 / 231 MB at 256 / 512 / 1024 / 2048 padded tokens per batch, once 302 at
# 2048 with the generator already loaded; 375 at 4096. Per token that is ~0.15 MB, 7× the formula:
# int8 MatMulInteger/GELU temporaries and glibc (the arena-less session's frees are not all returned
# to the OS) dominate, and thread timing makes it noisy, hence a factor at the top of the range.
ENCODER_ACT_FACTOR = 7.0
ENCODER_ACT_FIXED_MB = 30.0
ENCODER_HEADS = 12  # MiniLM-L6 / BERT; the manifest's encoder section may say otherwise ("heads", "ffn")

# Generator (llama.cpp, mmap): RSS after load = 296 MB + KV cache, for n_ctx 512..16384; the weights
# (241.4 MB file, all pages touched) plus CPU_REPACK copies of q4_K tensors (12.7 MB) ≈ file × 1.06,
# and 42 MB of vocab tables, llama.cpp context and llama-cpp-python arrays for a 262k vocab.
GGUF_FILE_FACTOR = 1.06
GEN_VOCAB_BYTES_PER_TOKEN = 144
GEN_FIXED_MB = 8.0
# Compute buffer: llama.cpp reserves ~515 MB (logits for 512 outputs) but a decode touches only what
# `generator_estimate` prices; after a prompt of n_ctx - 70 tokens + 64 new ones it measured
# +28 / 33 / 45 / 79 / 144 / 271 MB at n_ctx 512 / 1024 / 2048 / 4096 / 8192 / 16384 (n_batch 512).
N_BATCH_MAX = 512  # Generator uses n_batch = min(512, n_ctx)

# Index + store: 10k / 50k passages of 150 chars into a Store (hnswlib M=16, 384-d) measured
# 31.5 / 104.7 MB: hnswlib's level-0 record (vector + 2M links + label) plus ~480 B of label map,
# locks, upper levels and capacity slack per passage, and SQLite's page cache.
INDEX_OVERHEAD_BYTES = 600
STORE_FIXED_MB = 12.0
# Passage texts held in Python while indexing (add_files reads every document, then chunks them all):
# str overhead + text, twice (document and passage). Average chars per passage measured on SQuAD:
# 151 (sentence), 870 (paragraph).
PASSAGE_CHARS = {"sentence": 200, "paragraph": 1000}
PY_STR_OVERHEAD_BYTES = 64
# A PostgreSQL store (pgstore.py) keeps vectors and graph on the server; the device holds the client.
# With edge_rag imported, opening a PgStore (psycopg + its bundled libpq, psycopg_pool, pgvector) and
# checking out all 4 pool connections added 15.9 MB RSS (3 fresh processes, identical).
PG_CLIENT_MB = 18.0

# The HARD tier needs 2000 context chars + question + 128 new tokens. Measured with the gemma
# tokenizer on SQuAD: the one-shot template is 69 tokens, English text ≥ 4.35 chars/token, the
# longest HARD prompt 550 tokens → 678 with the answer. 512 would cut HARD contexts; 1024 holds them.
MIN_N_CTX = 1024


# -----------------------------------------------------------------------------------------------
# GGUF header (KV section + tensor infos) with struct only: llama.cpp's vocab_only load costs
# +44 MB RSS and ~1 s for gemma's 262k vocab; this costs a few MB of mmapped pages for ~0.1 s.

GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SMALL_ARRAY = 1024  # scalar arrays up to this length are kept (per-layer head counts); longer are skipped
# ggml tensor type → (elements per block, bytes per block), as gguf-py's GGML_QUANT_SIZES.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}


@dataclass(frozen=True)
class GGUFInfo:
    """What the budget needs from a GGUF header (per-layer arrays reduced to their maximum)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    n_ff: int
    context_length: int
    n_vocab: int
    file_bytes: int
    tensor_bytes: int
    metadata: dict = field(repr=False, default_factory=dict)  # scalars, strings, short tuples, GGUFArray


@dataclass(frozen=True)
class GGUFArray:
    """A long or string array in the header, skipped over: only its element type and length are kept."""

    type: int
    length: int


class _Cursor:
    """Little-endian reads from a buffer; any read past its end raises struct.error."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def read(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.read("Q")
        if self.pos + n > len(self.buf):
            raise struct.error("string runs past the end of the file")
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.read(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown value type {vtype}")
        etype, n = self.read("IQ")
        if etype in _SCALARS and n <= _SMALL_ARRAY:
            return self.read(_SCALARS[etype] * n) if n != 1 else (self.read(_SCALARS[etype]),)
        if etype in _SCALARS:
            self.pos += n * struct.calcsize(_SCALARS[etype])
        elif etype == _STRING:
            if self.pos + 8 * n > len(self.buf):
                raise struct.error("string array runs past the end of the file")
            length = struct.Struct("<Q").unpack_from
            for _ in range(n):
                self.pos += 8 + length(self.buf, self.pos)[0]
        else:
            raise ValueError(f"unsupported array element type {etype}")
        if self.pos > len(self.buf):
            raise struct.error("array runs past the end of the file")
        return GGUFArray(etype, n)


def read_gguf(path: str | Path) -> GGUFInfo:
    """Header of a GGUF file without loading weights; BundleError if it is not one, or truncated."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf)
            if cur.read("4s") != GGUF_MAGIC:
                raise ValueError("not a GGUF file (bad magic)")
            version = cur.read("I")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not supported")
            n_tensors, n_kv = cur.read("QQ")
            meta = {}
            for _ in range(n_kv):
                key = cur.string()
                meta[key] = cur.value(cur.read("I"))
            end = 0
            for _ in range(n_tensors):
                cur.string()
                dims = cur.read("Q" * cur.read("I"))
                dims = (dims,) if isinstance(dims, int) else dims
                ttype, offset = cur.read("IQ")
                count = 1
                for d in dims:
                    count *= d
                block, nbytes = GGML_BLOCKS.get(ttype, (1, 0))  # unknown type: check its offset only
                end = max(end, offset + count // block * nbytes)
            align = int(meta.get("general.alignment", 32))
            data_start = -(-cur.pos // align) * align
    except (OSError, ValueError, struct.error) as exc:
        raise BundleError(f"cannot read GGUF header of {path}: {exc}; rebuild the bundle") from exc
    if data_start + end > size:
        raise BundleError(
            f"GGUF {path} is truncated: its tensors need {data_start + end} bytes, the file has {size};"
            " rebuild the bundle"
        )
    return _gguf_info(path, meta, size, end)


def _gguf_info(path: Path, meta: dict, size: int, tensor_bytes: int) -> GGUFInfo:
    arch = meta.get("general.architecture")

    def get(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise BundleError(f"GGUF {path} has no {arch}.{key}; cannot budget its memory")
        return int(max(value)) if isinstance(value, tuple) else int(value)

    if not isinstance(arch, str):
        raise BundleError(f"GGUF {path} has no general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, GGUFArray) else get("vocab_size")
    n_embd, n_head = get("embedding_length"), get("attention.head_count")
    key_length = get("attention.key_length", n_embd // max(n_head, 1))
    return GGUFInfo(
        arch=arch,
        n_layer=get("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=get("attention.head_count_kv", n_head),
        key_length=key_length,
        value_length=get("attention.value_length", key_length),
        n_ff=get("feed_forward_length", 4 * n_embd),
        context_length=get("context_length", 0),
        n_vocab=int(n_vocab),
        file_bytes=size,
        tensor_bytes=tensor_bytes,
        metadata=meta,
    )


# -----------------------------------------------------------------------------------------------
# Estimates, in MB, one per component; `parts` says where the MB go (for messages and reports).


@dataclass(frozen=True)
class Estimate:
    name: str
    parts: dict[str, float]

    @property
    def mb(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        return " + ".join(f"{k} {v:.0f}" for k, v in self.parts.items() if v >= 0.5)


def runtime_base_estimate() -> Estimate:
    """Interpreter + numpy + onnxruntime + tokenizers + hnswlib + llama.cpp shared libraries.

    The calibrated constant, or this process's RSS now if that is larger (the budget is for the whole
    process, so whatever the caller already holds counts), plus llama.cpp if not imported yet.
    """
    missing = 0.0 if "llama_cpp" in sys.modules else LLAMA_LIB_MB
    return Estimate("runtime base", {"python + libraries": max(RUNTIME_BASE_MB, rss_mb() + missing)})


def encoder_estimate(onnx_bytes: int, dim: int, batch_tokens: int, max_seq_len: int,
                     heads: int = ENCODER_HEADS, ffn: int | None = None) -> Estimate:
    """ONNX encoder (plus router, pass all ONNX bytes) and its activations for one batch.

    weights     = ONNX bytes × ONNX_FILE_FACTOR + ENCODER_FIXED_MB (session, tokenizer)
    activations = ENCODER_ACT_FIXED_MB + ENCODER_ACT_FACTOR × T × (heads × L + ffn + dim) × 4 bytes,
    T = padded tokens per batch (≥ L, as in Encoder), L = max_seq_len: attention scores of a row
    against L positions, the FFN intermediate and the hidden state, float32, per token.
    """
    ffn = ffn or 4 * dim
    tokens = max(batch_tokens, max_seq_len)
    act = ENCODER_ACT_FACTOR * tokens * (heads * max_seq_len + ffn + dim) * 4 / MB
    return Estimate("encoder", {"weights": onnx_bytes * ONNX_FILE_FACTOR / MB + ENCODER_FIXED_MB,
                                "activations": ENCODER_ACT_FIXED_MB + act})


def generator_estimate(info: GGUFInfo, n_ctx: int) -> Estimate:
    """llama.cpp on a GGUF, as Generator runs it (mmap, n_batch = min(512, n_ctx), full-size SWA cache).

    weights  = GGUF file bytes × GGUF_FILE_FACTOR (mmapped pages all touched + repacked copies)
    vocab    = n_vocab × GEN_VOCAB_BYTES_PER_TOKEN + GEN_FIXED_MB
    KV cache = n_ctx × n_layer × n_head_kv × (key_length + value_length) × 2 bytes (f16)
    compute  = n_batch × (2 × n_head × n_ctx + 3 × n_ff + 8 × n_embd) × 4 bytes + n_vocab × 4 × 2:
               KQ scores and softmax of one ubatch, FFN gate/up/act, hidden states, and the logits
               (one output row, plus llama-cpp-python's copy)
    """
    n_batch = min(N_BATCH_MAX, n_ctx)
    kv = n_ctx * info.n_layer * info.n_head_kv * (info.key_length + info.value_length) * 2
    compute = n_batch * (2 * info.n_head * n_ctx + 3 * info.n_ff + 8 * info.n_embd) * 4 + info.n_vocab * 8
    return Estimate("generator", {
        "weights": info.file_bytes * GGUF_FILE_FACTOR / MB,
        "vocab": info.n_vocab * GEN_VOCAB_BYTES_PER_TOKEN / MB + GEN_FIXED_MB,
        "KV cache": kv / MB,
        "compute": compute / MB,
    })


def index_estimate(passages: int, dim: int, m: int, passage_mode: str = "sentence",
                   remote: bool = False) -> Estimate:
    """hnswlib index + SQLite store, and passage texts held in Python while indexing.

    index = passages × (dim × 4 + (2M + 1) × 4 + 8 + INDEX_OVERHEAD_BYTES) + STORE_FIXED_MB
    texts = passages × 2 × (PASSAGE_CHARS[mode] + PY_STR_OVERHEAD_BYTES)
    ``remote`` (a PostgreSQL store): the index lives on the server, the device holds PG_CLIENT_MB
    instead; ``passages`` then counts only what this process is about to add (texts in Python).
    """
    per = dim * 4 + (2 * m + 1) * 4 + 8 + INDEX_OVERHEAD_BYTES
    text = 2 * (PASSAGE_CHARS.get(passage_mode, PASSAGE_CHARS["paragraph"]) + PY_STR_OVERHEAD_BYTES)
    store = {"PostgreSQL client": PG_CLIENT_MB} if remote else {"vectors + graph": passages * per / MB + STORE_FIXED_MB}
    return Estimate("index", {**store, "texts": passages * text / MB})


# -----------------------------------------------------------------------------------------------
# Plan


@dataclass(frozen=True)
class Plan:
    """What fits: the settings to load with, and each component's estimate (MB)."""

    budget_mb: int
    n_ctx: int
    encode_batch_tokens: int
    passages: int
    components: tuple[Estimate, ...]
    remote_index: bool = False  # the store is on PostgreSQL: its index is not counted on the device

    @property
    def total_mb(self) -> float:
        return sum(c.mb for c in self.components)

    def component(self, name: str) -> Estimate:
        return next(c for c in self.components if c.name == name)

    def apply(self, config: Config) -> Config:
        """``config`` with this plan's n_ctx and encode_batch_tokens."""
        return config.with_(n_ctx=self.n_ctx, encode_batch_tokens=self.encode_batch_tokens)

    def with_passages(self, passages: int, config: Config, dim: int) -> Plan:
        """This plan for a store of ``passages``; BudgetError (before anything is encoded) if the larger
        index no longer fits beside what is already planned."""
        index = index_estimate(passages, dim, config.hnsw_m, config.passage_mode, self.remote_index)
        parts = tuple(index if c.name == index.name else c for c in self.components)
        if sum(c.mb for c in parts) > self.budget_mb:
            raise BudgetError(_no_fit(parts, self.budget_mb, self.n_ctx, self.encode_batch_tokens, passages))
        return replace(self, passages=passages, components=parts)

    def __str__(self) -> str:
        lines = [f"memory plan: ~{self.total_mb:.0f} of {self.budget_mb} MB (n_ctx {self.n_ctx}, "
                 f"encode_batch_tokens {self.encode_batch_tokens}, {self.passages} passages)"]
        lines += [f"  {c.name:<12} {c.mb:6.0f} MB  ({c.describe()})" for c in self.components]
        if self.remote_index:
            lines.append("  the vector index is on the PostgreSQL server: not counted on this device")
        return "\n".join(lines)


def plan(bundle: B.Bundle, config: Config, passages: int = 0, base_mb: float | None = None,
         remote_index: bool = False) -> Plan:
    """Largest encode_batch_tokens, then largest n_ctx, that fit ``config.memory_budget_mb``.

    Loads nothing: stats files and reads the GGUF header. n_ctx candidates are config.n_ctx and the
    powers of two below it, not below MIN_N_CTX (or config.n_ctx if that is smaller) nor above the
    model's training context; encoder batches halve from config.encode_batch_tokens down to
    max_seq_len. The batch is kept large first (indexing speed) because n_ctx above MIN_N_CTX buys
    nothing the tiers use. ``passages``: how many the store will hold (present + about to be added).
    Raises BudgetError naming the first component that overflows, in the order runtime base,
    generator, encoder, index (largest fixed costs first, so the message names what dominates).
    ``base_mb`` replaces the measured runtime base (tests, or planning for another process).
    ``remote_index``: the store is a PostgreSQL database, so the index is priced as its client only.
    """
    info = read_gguf(bundle.require(B.ROLE_GENERATOR))
    onnx_bytes = sum(p.stat().st_size for p in (bundle.path(B.ROLE_ENCODER), bundle.path(B.ROLE_ROUTER)) if p)
    enc = bundle.encoder
    dim = int(enc.get("dim", 384))
    seq = min(config.max_seq_len, int(enc.get("max_seq_len", config.max_seq_len)))
    base = runtime_base_estimate() if base_mb is None else Estimate("runtime base", {"python + libraries": base_mb})
    index = index_estimate(passages, dim, config.hnsw_m, config.passage_mode, remote_index)

    def components(n_ctx: int, batch: int) -> tuple[Estimate, ...]:
        encoder = encoder_estimate(onnx_bytes, dim, batch, seq, int(enc.get("heads", ENCODER_HEADS)),
                                   enc.get("ffn"))
        return base, generator_estimate(info, n_ctx), encoder, index  # error names the first that overflows

    budget = config.memory_budget_mb
    ctxs = _n_ctx_candidates(config.n_ctx, info.context_length)
    batches = _batch_candidates(config.encode_batch_tokens, seq)
    for batch in batches:
        for n_ctx in ctxs:
            parts = components(n_ctx, batch)
            if sum(c.mb for c in parts) <= budget:
                return Plan(budget, n_ctx, batch, passages, parts, remote_index)
    raise BudgetError(_no_fit(components(ctxs[-1], batches[-1]), budget, ctxs[-1], batches[-1], passages))


def _n_ctx_candidates(n_ctx: int, trained: int) -> list[int]:
    top = min(n_ctx, trained) if trained else n_ctx
    floor = min(MIN_N_CTX, top)
    out, c = [top], 1 << (top.bit_length() - 1)
    while c >= floor:
        if c < top:
            out.append(c)
        c //= 2
    return out


def _batch_candidates(batch_tokens: int, max_seq_len: int) -> list[int]:
    out = [max(batch_tokens, max_seq_len)]
    while out[-1] // 2 >= max_seq_len:
        out.append(out[-1] // 2)
    return out


def _no_fit(parts: tuple[Estimate, ...], budget: int, n_ctx: int, batch: int, passages: int) -> str:
    """The message for the first component that overflows, with the numbers."""
    total = sum(c.mb for c in parts)
    used, before = 0.0, []
    for c in parts:
        if used + c.mb > budget:
            break
        used += c.mb
        before.append(f"{c.name} {c.mb:.0f}")
    what = {"generator": f" at n_ctx {n_ctx}", "encoder": f" at encode_batch_tokens {batch}",
            "index": f" for {passages} passages"}.get(c.name, "")
    after = f" after {', '.join(before)}" if before else ""
    return (f"{c.name} needs ~{c.mb:.0f} MB ({c.describe()}{what}) but only {max(budget - used, 0):.0f} MB "
            f"of the {budget} MB budget remain{after}; the smallest plan needs ~{total:.0f} MB: raise "
            f"memory_budget_mb to at least {int(total) + 1}")


def stored_passages(db: str | Path) -> int:
    """Passages already in the store folder ``db`` (0 if none), read without loading its index."""
    from .store import DB_FILE

    path = Path(db).expanduser() / DB_FILE
    if not path.is_file():
        return 0
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(con.execute("SELECT COUNT(*) FROM passages").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0  # unreadable: Store raises a StoreError that says why when it opens it


# -----------------------------------------------------------------------------------------------
# Measurement: build the real pipeline in this process and compare peak RSS with the plan. Run it in
# a fresh process (`python -m edge_rag.budget`) — RSS high-water marks never go down.

SAMPLE_DIR = Path(__file__).resolve().parent / "sample"
HARD_CONTEXT_CHARS, HARD_NEW_TOKENS, HARD_K = 2000, 128, 10  # DESIGN.md step 3, HARD tier


def measure(db: str | Path, bundle_dir: str | Path | None = None, config: Config | None = None, corpus: str = "sample",
            questions: int = 20, hard: int = 3, generator_first: bool = False) -> dict:
    """Plan, build EdgeRAG within the plan, index ``corpus`` ("sample" or a SQuAD JSON path), load
    the generator (before indexing if ``generator_first``: the worst order), ``ask`` the questions,
    then generate for the first ``hard`` of them from a HARD-tier context (2000 chars, 128 new tokens)
    so llama.cpp's largest prompt runs whatever route ``ask`` took. Returns the plan, RSS after each
    stage and the peak (MB)."""
    import json

    from .chunk import chunk, iter_files, read_documents
    from .models import default_bundle
    from .pipeline import EdgeRAG

    config = config or Config(temperature=0.0)
    if corpus == "sample":
        docs = [d for p in iter_files([SAMPLE_DIR / "docs"]) for d in read_documents(p)]
        items = json.loads((SAMPLE_DIR / "questions.json").read_text(encoding="utf-8"))
        qs = [q["question"] for q in items if q.get("answer")]
    else:
        from .datasets import load_squad

        docs, qa = load_squad(corpus)
        qs = [q.question for q in qa if q.answers]
    n = sum(len(chunk(d, config.passage_mode, config.min_sentence_chars)) for d in docs)
    bundle = B.Bundle.load(bundle_dir or default_bundle())
    p = plan(bundle, config, passages=n)
    stages = {"start": rss_mb()}
    rag = EdgeRAG(db, bundle=bundle.root, config=p.apply(config))
    stages["encoder + store"] = rss_mb()
    steps = [("generator", lambda: rag.generator), ("index", lambda: rag.add_documents(docs))]
    for name, step in steps if generator_first else steps[::-1]:
        step()
        stages[name] = rss_mb()
    for q in qs[:questions]:
        rag.ask(q)
    stages["ask"] = rss_mb()
    for q in qs[:hard]:
        passages = rag.store.search(rag.encoder.encode_one(q), HARD_K)
        context = "\n".join(f"{x.title}: {x.text}" for x in passages)[:HARD_CONTEXT_CHARS]
        rag.generator.generate(q, context, HARD_NEW_TOKENS, temperature=0.0)
    stages["HARD generations"] = rss_mb()
    rag.close()
    return {"plan": {"budget_mb": p.budget_mb, "n_ctx": p.n_ctx, "encode_batch_tokens": p.encode_batch_tokens,
                     "passages": p.passages, "total_mb": round(p.total_mb, 1),
                     **{c.name: round(c.mb, 1) for c in p.components}},
            "generator_first": generator_first, "questions": min(questions, len(qs)), "hard": min(hard, len(qs)),
            "rss_mb": {k: round(v, 1) for k, v in stages.items()}, "peak_rss_mb": round(peak_rss_mb(), 1)}


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m edge_rag.budget",
                                 description="Plan the memory budget, then measure the real pipeline against it.")
    ap.add_argument("--bundle", help="bundle folder (default: the gemma bundle)")
    ap.add_argument("--corpus", default="sample", help='"sample" or a SQuAD JSON path')
    ap.add_argument("--mode", default="sentence", choices=["sentence", "paragraph"])
    ap.add_argument("--budget", type=int, default=Config.memory_budget_mb, help="memory_budget_mb")
    ap.add_argument("--n-ctx", type=int, default=Config.n_ctx)
    ap.add_argument("--batch-tokens", type=int, default=Config.encode_batch_tokens)
    ap.add_argument("--questions", type=int, default=20, help="questions to ask()")
    ap.add_argument("--hard", type=int, default=3, help="of those, how many also generate from a HARD context")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--generator-first", action="store_true", help="load llama.cpp before indexing (worst order)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    config = Config(temperature=0.0, memory_budget_mb=args.budget, n_ctx=args.n_ctx,
                    encode_batch_tokens=args.batch_tokens, passage_mode=args.mode, threads=args.threads)
    with tempfile.TemporaryDirectory() as db:
        result = measure(db, args.bundle, config, args.corpus, args.questions, args.hard,
                         args.generator_first)
    if args.json:
        print(json.dumps(result))
        return
    p = result["plan"]
    print(f"plan: n_ctx {p['n_ctx']}, encode_batch_tokens {p['encode_batch_tokens']}, {p['passages']} passages; "
          + ", ".join(f"{k} {p[k]:.0f}" for k in ("runtime base", "generator", "encoder", "index")) + " MB")
    print("RSS after: " + ", ".join(f"{k} {v:.0f}" for k, v in result["rss_mb"].items()) + " MB")
    print(f"peak RSS {result['peak_rss_mb']:.0f} MB vs plan {p['total_mb']:.0f} MB "
          f"({p['total_mb'] / result['peak_rss_mb'] - 1:+.0%}); budget {p['budget_mb']} MB")


if __name__ == "__main__":
    main()
