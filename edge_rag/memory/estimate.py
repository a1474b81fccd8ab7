"""Memory estimates, in MB, one per component, with the calibration constants they rest on.

Every constant was fitted to peak RSS measured in fresh processes (``python -m benchmarks.memory``)
on x86-64, 2 cores, glibc, with the gemma bundle; each sits at or slightly above the worst measurement,
so estimates err high, never low.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from ..documents.chunk import PARAGRAPH_WINDOW_CHARS
from ..documents.indexing import INDEX_BATCH_PASSAGES
from ..errors import MAX_QUESTION_CHARS
from ..storage.cache import MAX_ANSWER_BYTES
from ..storage.hnsw import COMMIT_GROWTH
from ..storage.store_db import CONTEXT_NEIGHBOURS
from .gguf import GGUFInfo
from .rss import MB, rss_mb

# Calibration (MB = MiB throughout). End to end: `python -m benchmarks.memory --help`; the
# per-component numbers came from fresh processes loading one component at a time, as quoted.

# python + numpy + onnxruntime + tokenizers + hnswlib + edge_rag + llama_cpp imported: 72.3 MB
# (`python -c "import edge_rag, llama_cpp; from edge_rag.memory import rss_mb; print(rss_mb())"`).
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
# `generator_estimate` prices. After a prompt of n_ctx - 70 tokens + 64 new ones, with flash attention (as
# Generator runs it) it measured +28.0 / 33.7 / 42.4 MB at n_ctx 1024 / 4096 / 8192 (n_batch 512, Gemma-3 270M);
# without, +33.2 / 82.1 / 147.2 (`python -m benchmarks.experiments.flash_attention`).
N_BATCH_MAX = 512  # Generator uses n_batch = min(512, n_ctx)

# Index + store: 10k / 50k passages of 150 chars into a Store (hnswlib M=16, 384-d) measured
# 31.5 / 104.7 MB: hnswlib's level-0 record (vector + 2M links + label) plus ~480 B of label map,
# locks, upper levels and capacity slack per passage, and SQLite's page cache.
INDEX_OVERHEAD_BYTES = 600
STORE_FIXED_MB = 12.0
# Texts held in Python while indexing, priced from the documents' own sizes (sys.getsizeof: 1, 2 or 4 bytes a
# character): the documents to add, held whole from reading to their last commit, and the texts of one commit in
# hand: its passages (copies of the documents' text) and their contexts (store_db.contexts: each passage's text
# joined into the contexts of up to 2 × CONTEXT_NEIGHBOURS others), (1 + 2c) × the commit's passage bytes. A commit
# (and every encoder batch in it) stops once it holds the plan's commit_bytes, so at one passage more; the first
# document of a commit may continue stored passages, 2c of which are read back. A passage is at most a paragraph window.
PASSAGE_MAX_BYTES = 4 * PARAGRAPH_WINDOW_CHARS + 80
PY_STR_OVERHEAD_BYTES = 64
# A PostgreSQL store (pgstore.py) keeps vectors and graph on the server; the device holds the client.
# With edge_rag imported, opening a PgStore (psycopg + its bundled libpq, psycopg_pool, pgvector) and
# checking out all 4 pool connections added 15.9 MB RSS (3 fresh processes, identical).
PG_CLIENT_MB = 18.0

# The answer cache (storage/cache.py) keeps Config.cache_size answers in memory: each a JSON string of at most
# MAX_ANSWER_BYTES (ASCII: json.dumps escapes the rest), under its question (up to 4 bytes a character), with the
# corpus version, a tuple and the LRU's node. An answer is ~2 KB, but a kiosk's cache fills with what it is asked.
CACHE_ENTRY_BYTES = MAX_ANSWER_BYTES + 4 * MAX_QUESTION_CHARS + 1024

# The HARD tier needs 2000 context chars + question + 128 new tokens. Measured with the gemma
# tokenizer on SQuAD: the one-shot template is 69 tokens, English text ≥ 4.35 chars/token, the
# longest HARD prompt 550 tokens → 678 with the answer. 512 would cut HARD contexts; 1024 holds them.
MIN_N_CTX = 1024


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


def reader_estimate(onnx_bytes: int, dim: int, batch_tokens: int, max_seq_len: int) -> Estimate:
    """The neural reader: the encoder's MiniLM shape with a span head, run in batches of the same
    ``batch_tokens`` (NeuralReader is given the encoder's batch), so the encoder's measured model applies."""
    return Estimate("reader", encoder_estimate(onnx_bytes, dim, batch_tokens, max_seq_len).parts)


def generator_estimate(info: GGUFInfo, n_ctx: int) -> Estimate:
    """llama.cpp on a GGUF, as Generator runs it (mmap, n_batch = min(512, n_ctx), full-size SWA cache, flash
    attention).

    weights  = GGUF file bytes × GGUF_FILE_FACTOR (mmapped pages all touched + repacked copies)
    vocab    = n_vocab × GEN_VOCAB_BYTES_PER_TOKEN + GEN_FIXED_MB
    KV cache = n_ctx × n_layer × n_head_kv × (key_length + value_length) × 2 bytes (f16)
    compute  = n_batch × (n_ctx + 2 × n_head × key_length + 3 × n_ff + 8 × n_embd) × 4 bytes + n_vocab × 4 × 2:
               a ubatch's attention masks (full and sliding-window, f16), its queries and attention output,
               FFN gate/up/act, hidden states, and the logits (one output row, plus llama-cpp-python's copy).
               Flash attention never holds a ubatch's n_head × n_ctx scores.
    """
    n_batch = min(N_BATCH_MAX, n_ctx)
    kv = n_ctx * info.n_layer * info.n_head_kv * (info.key_length + info.value_length) * 2
    compute = (n_batch * (n_ctx + 2 * info.n_head * info.key_length + 3 * info.n_ff + 8 * info.n_embd) * 4
               + info.n_vocab * 8)
    return Estimate("generator", {
        "weights": info.file_bytes * GGUF_FILE_FACTOR / MB,
        "vocab": info.n_vocab * GEN_VOCAB_BYTES_PER_TOKEN / MB + GEN_FIXED_MB,
        "KV cache": kv / MB,
        "compute": compute / MB,
    })


def index_estimate(passages: int, dim: int, m: int, remote: bool = False, text_bytes: int = 0,
                   commit_bytes: int = 0) -> Estimate:
    """hnswlib index + SQLite store, the texts held in Python while indexing, and the vectors of the commit in hand
    (indexing.commit_step: at most g / (1 + g) of the passages, g = hnsw.COMMIT_GROWTH, + one batch).

    index     = passages × (dim × 4 + (2M + 1) × 4 + 8 + INDEX_OVERHEAD_BYTES) + STORE_FIXED_MB
    documents = text_bytes (the documents being added, as Python holds them)
    in hand   = (1 + 2c) × (min(text_bytes, commit_bytes + W) + 2c × W) + passages × 2 × str overhead, W =
                min(PASSAGE_MAX_BYTES, text_bytes): every text of a commit, and of the 2c stored passages before it,
                is held once and joined into at most 2c contexts
    ``remote`` (a PostgreSQL store): the index lives on the server, the device holds PG_CLIENT_MB instead;
    ``passages`` then counts only what this process is about to add, committed a batch at a time.
    """
    per = dim * 4 + (2 * m + 1) * 4 + 8 + INDEX_OVERHEAD_BYTES
    held = INDEX_BATCH_PASSAGES + (0 if remote else COMMIT_GROWTH / (1 + COMMIT_GROWTH) * passages)
    store = {"PostgreSQL client": PG_CLIENT_MB} if remote else {"vectors + graph": passages * per / MB + STORE_FIXED_MB}
    spread = 1 + 2 * CONTEXT_NEIGHBOURS
    w = min(PASSAGE_MAX_BYTES, text_bytes)  # a passage, or a stored one the documents continue, is no longer than they
    in_hand = spread * (min(text_bytes, commit_bytes + w) + 2 * CONTEXT_NEIGHBOURS * w) if text_bytes else 0
    return Estimate("index", {**store, "documents": text_bytes / MB,
                              "texts in hand": (in_hand + passages * 2 * PY_STR_OVERHEAD_BYTES) / MB,
                              "commit in hand": min(held, passages) * dim * 4 / MB})


def cache_estimate(entries: int) -> Estimate:
    """The answer cache full: ``entries`` (Config.cache_size) answers of the largest size it keeps."""
    return Estimate("answer cache", {f"{entries} answers": entries * CACHE_ENTRY_BYTES / MB})
