"""Plan the whole process into one memory budget before loading anything.

``plan`` estimates every component from what is cheap to know up front (file sizes, the GGUF header,
the config), picks the largest ``n_ctx`` and encoder batch that fit ``memory_budget_mb``, and otherwise
raises a BudgetError naming the component that does not fit. The total is a sum: the worst order is
generator loaded first, then indexing on top of it, and users can do that (in the server, with writes, indexing runs
in a second encoder session beside the questions: Config.index_threads prices it). llama.cpp is planned only where a
question may be generated: the certified default, whose calibration does not certify generated answers, never
loads it.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import Config
from ..errors import BudgetError, BundleError
from ..models import bundle as B
from ..reading.reader import MAX_SEQ_LEN as READER_SEQ_LEN
from ..reading.reader import reader_file
from ..storage.store import DB_FILE
from .estimate import (
    ENCODER_HEADS,
    MIN_N_CTX,
    Estimate,
    cache_estimate,
    encoder_estimate,
    generator_estimate,
    index_estimate,
    reader_estimate,
    runtime_base_estimate,
)
from .gguf import read_gguf
from .rss import MB

INDEXING_ENCODER = "indexing encoder"  # the plan's part for Config.index_threads' session
# The passage text one indexing commit may hold (indexing.index), largest first: the plan takes the largest that fits.
# Smaller commits hold less text and its contexts, but rewrite the embedded store's index file more often.
COMMIT_BYTES = tuple(64 << 20 >> k for k in range(7))  # 64 MB .. 1 MB


@dataclass(frozen=True)
class Plan:
    """What fits: the settings to load with, and each component's estimate (MB)."""

    budget_mb: int
    n_ctx: int
    encode_batch_tokens: int
    passages: int
    components: tuple[Estimate, ...]
    batches: tuple[int, ...]  # the encoder batches plan() may choose, largest first
    # (n_ctx, batch) -> every component but the index, priced as plan() priced them (the same runtime base)
    price: Callable[[int, int], tuple[Estimate, ...]] = field(repr=False, compare=False)
    remote_index: bool = False  # the store is on PostgreSQL: its index is not counted on the device
    commit_bytes: int = COMMIT_BYTES[0]  # passage text one indexing commit (and batch) holds, at most (+ one passage)

    @property
    def generator(self) -> bool:
        """Whether llama.cpp is planned (EdgeRAG loads it only then)."""
        return any(c.name == "generator" for c in self.components)

    @property
    def total_mb(self) -> float:
        return sum(c.mb for c in self.components)

    def component(self, name: str) -> Estimate:
        return next(c for c in self.components if c.name == name)

    def apply(self, config: Config) -> Config:
        """``config`` with this plan's n_ctx and encode_batch_tokens."""
        return config.with_(n_ctx=self.n_ctx, encode_batch_tokens=self.encode_batch_tokens)

    def with_passages(self, passages: int, config: Config, dim: int, text_bytes: int = 0) -> Plan:
        """This plan for a store of ``passages``, while ``text_bytes`` of documents are held to be indexed, at the
        largest encoder batch, then the largest commit, with which they fit (a larger index or longer documents leave
        less for the batch's activations: the caller runs its sessions at the batch and commits at the bytes this
        plan gives); n_ctx stays (llama.cpp may hold its KV cache already). BudgetError (before anything is encoded)
        if it fits at none, with the numbers of the smallest."""
        for batch in self.batches:
            for commit in COMMIT_BYTES:
                index = index_estimate(passages, dim, config.hnsw_m, self.remote_index, text_bytes, commit)
                parts = (*self.price(self.n_ctx, batch), index)
                if sum(c.mb for c in parts) <= self.budget_mb:
                    return replace(self, passages=passages, encode_batch_tokens=batch, components=parts,
                                   commit_bytes=commit)
        raise BudgetError(_no_fit(parts, self.budget_mb, self.n_ctx, batch, passages, text_bytes))

    def room(self, held: int, config: Config, dim: int) -> int:
        """How many passages more than ``held`` the budget can index (the largest n ``with_passages`` accepts)."""
        return _largest(lambda n: self.with_passages(held + n, config, dim))

    def text_room(self, held: int, config: Config, dim: int) -> int:
        """How many bytes of documents the budget can hold to index into a store of ``held`` passages."""
        return _largest(lambda n: self.with_passages(held, config, dim, n))

    def __str__(self) -> str:
        lines = [f"memory plan: ~{self.total_mb:.0f} of {self.budget_mb} MB (n_ctx {self.n_ctx}, "
                 f"encode_batch_tokens {self.encode_batch_tokens}, {self.passages} passages)"]
        lines += [f"  {c.name:<16} {c.mb:6.0f} MB  ({c.describe()})" for c in self.components]
        if self.remote_index:
            lines.append("  the vector index is on the PostgreSQL server: not counted on this device")
        return "\n".join(lines)


def plan(bundle: B.Bundle, config: Config, passages: int = 0, base_mb: float | None = None,
         remote_index: bool = False, generator: bool = True, encoder: Path | None = None) -> Plan:
    """Largest encode_batch_tokens, then largest n_ctx, that fit ``config.memory_budget_mb``.

    Loads nothing: stats files and reads the GGUF header. n_ctx candidates are config.n_ctx and the
    powers of two below it, not below MIN_N_CTX (or config.n_ctx if that is smaller) nor above the
    model's training context; encoder batches halve from config.encode_batch_tokens down to
    max_seq_len. The batch is kept large first (indexing speed) because n_ctx above MIN_N_CTX buys
    nothing the tiers use. ``passages``: how many the store will hold (present + about to be added).
    Raises BudgetError naming the first component that overflows, in the order runtime base,
    generator, encoder, the neural reader when the config reads with it (Config.reads_neural), the indexing
    encoder when config.index_threads asks for one (the server with writes), the answer cache full, index
    (fixed costs first, largest first, so the message names what dominates, and a store too big names the index).
    ``base_mb`` replaces the measured runtime base (tests, or planning for another process).
    ``remote_index``: the store is a PostgreSQL database, so the index is priced as its client only.
    ``generator``: whether llama.cpp is loaded at all (without it, n_ctx stays config.n_ctx, unused).
    ``encoder``: the encoder file the sessions load (verify.select_encoder's choice: the fp32 twin, ~4× the int8
    file, where int8 fails verification here); default the bundle's encoder.
    """
    info = read_gguf(bundle.require(B.ROLE_GENERATOR))
    encoder_bytes = (encoder or bundle.require(B.ROLE_ENCODER)).stat().st_size
    router = bundle.path(B.ROLE_ROUTER)
    onnx_bytes = encoder_bytes + (router.stat().st_size if router else 0)
    enc = bundle.encoder
    if "dim" not in enc:
        raise BundleError(f"the manifest of {bundle.root} gives no encoder dim; rebuild the bundle")
    dim = int(enc["dim"])
    seq = min(config.max_seq_len, int(enc.get("max_seq_len", config.max_seq_len)))
    heads, ffn = int(enc.get("heads", ENCODER_HEADS)), enc.get("ffn")
    base = runtime_base_estimate() if base_mb is None else Estimate("runtime base", {"python + libraries": base_mb})
    index = index_estimate(passages, dim, config.hnsw_m, remote_index)
    # The neural reader is loaded only where the certified decision reads with it (on first use, planned up front).
    reader = reader_file(bundle) if config.reads_neural else None
    reader_bytes = reader.stat().st_size if reader is not None and reader.is_file() else 0
    cache = (cache_estimate(config.cache_size),) if config.cache_size else ()

    def price(n_ctx: int, batch: int) -> tuple[Estimate, ...]:
        encoder = encoder_estimate(onnx_bytes, dim, batch, seq, heads, ffn)
        # The server's second session (EdgeRAG.indexing_encoder): the encoder alone (no router), at the same batch.
        second = encoder_estimate(encoder_bytes, dim, batch, seq, heads, ffn) if config.index_threads else None
        indexing = (replace(second, name=INDEXING_ENCODER),) if second else ()
        reader_part = (reader_estimate(reader_bytes, dim, batch, READER_SEQ_LEN),) if reader_bytes else ()
        llm = (generator_estimate(info, n_ctx),) if generator else ()
        return base, *llm, encoder, *reader_part, *indexing, *cache  # errors name the first over, the index last

    budget = config.memory_budget_mb
    ctxs = _n_ctx_candidates(config.n_ctx, info.context_length) if generator else [config.n_ctx]
    batches = tuple(_batch_candidates(config.encode_batch_tokens, seq))
    for batch in batches:
        for n_ctx in ctxs:
            parts = (*price(n_ctx, batch), index)
            if sum(c.mb for c in parts) <= budget:
                return Plan(budget, n_ctx, batch, passages, parts, batches, price, remote_index)
    raise BudgetError(_no_fit((*price(ctxs[-1], batches[-1]), index), budget, ctxs[-1], batches[-1], passages))


def _largest(fits: Callable[[int], object]) -> int:
    """The largest n ≥ 0 for which ``fits(n)`` raises no BudgetError (0 if none)."""
    lo, hi = 0, 1 << 40
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            fits(mid)
            lo = mid
        except BudgetError:
            hi = mid - 1
    return lo


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


def _no_fit(parts: tuple[Estimate, ...], budget: int, n_ctx: int, batch: int, passages: int, text_bytes: int = 0) -> str:
    """The message for the first component that overflows, with the numbers."""
    total = sum(c.mb for c in parts)
    used, before = 0.0, []
    for c in parts:
        if used + c.mb > budget:
            break
        used += c.mb
        before.append(f"{c.name} {c.mb:.0f}")
    what = {"generator": f" at n_ctx {n_ctx}", "encoder": f" at encode_batch_tokens {batch}",
            INDEXING_ENCODER: f" at encode_batch_tokens {batch}",
            "index": f" for {passages} passages" + (f" and {text_bytes / MB:.0f} MB of documents to index held in memory"
                                                    if text_bytes else "")}.get(c.name, "")
    after = f" after {', '.join(before)}" if before else ""
    return (f"{c.name} needs ~{c.mb:.0f} MB ({c.describe()}{what}) but only {max(budget - used, 0):.0f} MB "
            f"of the {budget} MB budget remain{after}; the smallest plan needs ~{total:.0f} MB: raise "
            f"memory_budget_mb (--memory-mb) to at least {int(total) + 1}")


def stored_passages(db: str | Path) -> int:
    """Passages already in the store folder ``db`` (0 if none), read without loading its index."""
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

