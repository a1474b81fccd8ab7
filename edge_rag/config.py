"""One frozen, validated config holding every default of the pipeline (the seed papers' values unless noted).

Seeds: EverydayGPT (memory budget, dedupe, confidence-gated routing, generation), cautious-rag (evidence
gate), the edge-RAG thesis (sentence passages, tier router, correction, rerank signals).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from .errors import ConfigError
from .retrieval.lexical import POSTINGS_BUDGET


class Tier(str, Enum):
    """Budget tier chosen by the router from the query embedding (thesis §4.3)."""

    EASY = "EASY"
    MEDIUM = "MEDIUM"
    HARD = "HARD"


TIERS: tuple[Tier, ...] = tuple(Tier)  # cost order, and the router's class order (its logits' columns)
INT_MAX = 2**31 - 1  # the largest count a field takes: they reach SQLite, hnswlib, llama.cpp (2**63 failed each ask)


def default_threads() -> int:
    """Threads for ``threads = 0``: ``OMP_NUM_THREADS`` when set, the usual per-process budget (processes side by
    side each take their share: `make test` runs two files at a time on two cores, where one onnxruntime thread each
    does the same encodes for 0-30% less CPU than two that wait on each other, benchmarks/experiments/thread_cost.py),
    else the CPUs this process may run on (a cgroup cpuset or ``taskset`` can leave fewer than the machine has)."""
    budget = os.environ.get("OMP_NUM_THREADS", "")
    if budget.isdigit() and int(budget) > 0:
        return int(budget)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class TierSpec:
    """What a tier may spend: passages, context characters, new tokens, and whether to rerank."""

    k: int
    context_chars: int
    max_new_tokens: int
    rerank: bool

    def __post_init__(self) -> None:
        for name in ("k", "context_chars", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
                raise ConfigError(f"TierSpec.{name}={value!r}: allowed values are integers >= 1 and <= {INT_MAX}")
        if not isinstance(self.rerank, bool):
            raise ConfigError(f"TierSpec.rerank={self.rerank!r}: allowed values are True, False")


class Tiers(Mapping[Tier, TierSpec]):
    """Every tier's budget, immutable and hashable (so Config is), read like a dict: ``tiers[Tier.HARD]``."""

    def __init__(self, specs: Mapping[Tier | str, TierSpec]) -> None:
        try:
            table = {Tier(t): s for t, s in specs.items()}
        except (AttributeError, ValueError) as exc:
            raise ConfigError(f"tiers={specs!r}: allowed values map each of {_names(TIERS)} to a TierSpec") from exc
        if set(table) != set(TIERS) or not all(isinstance(s, TierSpec) for s in table.values()):
            raise ConfigError(f"tiers={specs!r}: allowed values map each of {_names(TIERS)} to a TierSpec")
        self._specs = tuple(table[t] for t in TIERS)

    def __getitem__(self, tier: Tier) -> TierSpec:
        return self._specs[TIERS.index(Tier(tier))]

    def __iter__(self) -> Iterator[Tier]:
        return iter(TIERS)

    def __len__(self) -> int:
        return len(TIERS)

    def __hash__(self) -> int:
        return hash(self._specs)

    def __repr__(self) -> str:
        return f"Tiers({dict(self)!r})"


DEFAULT_TIERS = Tiers({
    Tier.EASY: TierSpec(k=1, context_chars=300, max_new_tokens=64, rerank=False),
    Tier.MEDIUM: TierSpec(k=3, context_chars=500, max_new_tokens=96, rerank=True),
    Tier.HARD: TierSpec(k=10, context_chars=900, max_new_tokens=128, rerank=True),
})
GATES = ("none", "distance", "hoeffding", "azuma", "bernstein", "betting")  # evidence gates (edge_rag.decision.gate)
PASSAGE_MODES = ("sentence", "paragraph")
RETRIEVALS = ("hybrid", "dense", "lexical", "none")  # Config.retrieval
READERS = ("neural", "rules")  # Config.reader: the trained extractive reader | the EverydayGPT rule extractor


@dataclass(frozen=True)
class Config:
    """Every tunable of the pipeline. Derive variants with ``config.with_(field=value)``.

    Each field's comment is its meaning in the documentation's Config reference (generated from this source by
    docs/reference_gen.py); why a default is what it is: docs/decisions/."""

    # -- which stages run (all on: the adaptive, cautious pipeline; the benchmarks switch them off one by one)
    # "hybrid": the dense and the full-text (BM25) search, fused; "dense" | "lexical": one of them; "none": no context
    retrieval: str = "hybrid"
    router: bool = True  # tier budgets from router.onnx (else fixed k = baseline_k in fallback_tier's budget)
    correction: bool = True  # a weak best match on EASY/MEDIUM keeps correction_extra_k more passages
    rerank: bool = True  # reorder MEDIUM/HARD passages by cosine, keyword and title overlap (the rerank_* weights)
    compression: bool = True  # dedupe + sentence-level compression to the tier's char budget
    cgr: bool = True  # decide RAG | GPT | REFUSE (else always GPT)
    certified: bool = True  # True: reader + calibrated threshold (certified error); False: the seeds' CGR (Eq. 1 tau, gate)
    reader: str = "neural"  # "neural" (trained extractive reader, reader.onnx) | "rules" (EverydayGPT extractor)

    # -- memory
    memory_budget_mb: int = 2048  # for the whole process: the plan fits n_ctx and the encoder batch into it, or refuses
    rss_per_stage: bool = False  # Answer.rss_mb after every stage (else one sample, "end"): costs time

    # -- encoder (MiniLM ONNX)
    max_seq_len: int = 256  # tokens per text (sentence-transformers' max_seq_length for MiniLM)
    # Batches are bounded in padded tokens, not rows: ORT's arena grows with batch×seq (1.6 GB at 32×256).
    encode_batch_tokens: int = 2048
    threads: int = 0  # 0 = OMP_NUM_THREADS if set, else every core this process may use
    # threads of a second encoder session that indexes beside the questions (`edge-rag serve` with writes: 1), priced
    # in the memory plan as "indexing encoder"; 0 = none (plain EdgeRAG indexes with the question encoder)
    index_threads: int = 0

    # -- chunking
    passage_mode: str = "sentence"  # "sentence" (thesis) or "paragraph"
    min_sentence_chars: int = 20  # shorter fragments are merged into their neighbour

    # -- retrieval (hnswlib or pgvector HNSW, cosine space)
    hnsw_m: int = 16  # graph degree of the HNSW index
    hnsw_ef_construction: int = 200  # search breadth while building the graph
    hnsw_ef_search: int = 64  # search breadth up to 1,000 vectors, widened per doubling beyond (hnsw.ef_for)
    baseline_k: int = 5  # the fixed-k baseline (thesis, LangChain-style)
    # hybrid fusion: each passage scores cosine + lexical_weight / (fusion_k + its BM25 rank) (docs/decisions/fusion.md)
    fusion_k: int = 1
    lexical_weight: float = 0.4  # weight of the BM25 rank bonus in the hybrid fusion
    # postings one lexical search scores at most: the passages holding the question's rarest words, ranked by all of
    # them (docs/decisions/lexical-budget.md)
    lexical_budget: int = POSTINGS_BUDGET

    # -- router tiers
    tiers: Tiers = DEFAULT_TIERS  # each tier's passages, context characters, new tokens, rerank (a plain dict is frozen)
    fallback_tier: Tier = Tier.MEDIUM  # used (and recorded) when no router.onnx is available
    tier_override: Tier | None = None  # force one tier, router on or off (oracle labelling, "always HARD" kiosks)

    # -- correction (thesis)
    correction_threshold: float = 0.52  # a top-1 cosine below this on a non-HARD tier is a weak match
    correction_extra_k: int = 5  # passages a weak match adds

    # -- rerank h(q, p) weights (ours; the thesis names the three signals)
    rerank_dense_weight: float = 0.6  # weight of the passage's cosine
    rerank_lexical_weight: float = 0.3  # weight of its keyword overlap with the question
    rerank_title_weight: float = 0.1  # weight of its title's overlap with the question

    # -- compression and dedupe
    # sentences below this relevance (term overlap + 0.5 x cosine) are dropped even when the tier's budget has room
    # (chosen on the router's train/val part: docs/decisions/tiers.md)
    compression_floor: float = 0.3
    dedupe_prefix_chars: int = 120  # passages whose first N normalised characters repeat are dropped (EverydayGPT)

    # -- evidence gate of the seeds' path (certified=False): a heuristic, not a certificate (gate.py)
    gate: str = "betting"  # none | distance | hoeffding | azuma | bernstein | betting
    gate_delta: float = 0.05  # the bound's level (the top cosines are not i.i.d., so it certifies nothing)
    gate_threshold: float = 0.25  # tau_rel on r = clip(cosine, 0, 1): a threshold on how high the top cosines are
    gate_max_n: int = 20  # cosines the gate may look at (one knn query; sequential gates stop earlier)
    azuma_c: float = 1.0  # bound on martingale differences: 1 is the only value [0, 1] scores guarantee

    # -- certified selective answering: among answered questions error <= max_error_rate w.p. >= 1 - delta
    # alpha, by the rule written into convert/calibrate.py (the smallest alpha certified at delta 0.05 answering
    # >= 25% of calibration; docs/decisions/default-alpha.md). Lower it only after calibrating a better reader.
    max_error_rate: float = 0.4
    delta: float = 0.05  # the certificate holds with probability >= 1 - delta over the calibration draw
    reader_passages: int = 1  # the search's top hits the neural reader reads (docs/decisions/reader-window.md)
    reader_window: int = 2  # each hit widened by this many sentences either side (same document; read.READ_MAX_CHARS)

    # -- confidence-gated routing of the seeds' path (EverydayGPT Def. 2); distances d = 2 - 2 cosine
    refuse_distance: float = 1.5  # delta_d: d_min above this is out of domain (cosine < 0.25)
    gpt_distance: float = 1.0  # GPT path only when d_min <= this (cosine >= 0.5)
    rag_confidence: float = 0.5  # tau: extractive answer accepted when c >= tau

    # -- generation (EverydayGPT §4.3)
    top_k: int = 50  # sample from the 50 likeliest tokens (0: the whole vocabulary)
    temperature: float = 0.4  # 0 for benchmarks / deterministic runs
    repeat_ngram: int = 3  # sliding-window n-gram repetition detector
    repeat_window: int = 48  # tokens the detector looks back over
    n_ctx: int = 1024  # the largest llama.cpp context the memory plan may choose (it tries powers of two below it too)
    seed: int = 0  # sampling seed

    # -- cache
    cache_size: int = 256  # answers kept (LRU), priced full in the memory plan; 0 turns the cache off
    persistent_cache: bool = False  # also keep answers in <db>/answers.sqlite across restarts

    def __post_init__(self) -> None:
        """Check every field now, so a bad value fails here naming the field, not at the first ask."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _CHOICES:
                _check_choice(f.name, value, _CHOICES[f.name])
            elif f.name in _RANGES:
                _check_range(f.name, value, *_RANGES[f.name])
            elif f.type == "bool" and not isinstance(value, bool):
                raise ConfigError(f"{f.name}={value!r}: allowed values are True, False")
        if not isinstance(self.tiers, Tiers):
            object.__setattr__(self, "tiers", Tiers(self.tiers))
        for name in ("fallback_tier", "tier_override"):
            value = getattr(self, name)
            if value is None and name == "tier_override":
                continue
            try:
                object.__setattr__(self, name, Tier(value))
            except ValueError:
                raise ConfigError(f"{name}={value!r}: allowed values are {_names(TIERS)}") from None

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed (the config itself is frozen), checked like a new one."""
        return replace(self, **changes)

    def tier(self, tier: Tier) -> TierSpec:
        return self.tiers[tier]

    @property
    def certified_decision(self) -> bool:
        """Whether the reader's candidate and the calibrated threshold decide (else GPT always, or the seeds' gate)."""
        return self.cgr and self.certified

    @property
    def reads_neural(self) -> bool:
        """Whether questions go through the trained reader: what EdgeRAG plans memory for and warms up."""
        return self.certified_decision and self.reader == "neural"


# What each field allows. Numbers: (low, high, low inclusive, high inclusive, integer); None = unbounded.
_CHOICES: dict[str, tuple[str, ...]] = {"gate": GATES, "passage_mode": PASSAGE_MODES, "reader": READERS,
                                        "retrieval": RETRIEVALS}
_INT, _REAL = True, False
_RANGES: dict[str, tuple[float | None, float | None, bool, bool, bool]] = {
    "memory_budget_mb": (1, None, True, True, _INT),
    "max_seq_len": (2, None, True, True, _INT),  # [CLS] and [SEP]: a tokenizer ignores a shorter truncation
    "encode_batch_tokens": (1, None, True, True, _INT),
    "lexical_budget": (1, None, True, True, _INT),
    "threads": (0, 1024, True, True, _INT),  # more would reach onnxruntime's C++ as an overflow, blamed on the model
    "index_threads": (0, 1024, True, True, _INT),
    "min_sentence_chars": (0, None, True, True, _INT),
    "hnsw_m": (2, None, True, True, _INT),
    "hnsw_ef_construction": (1, None, True, True, _INT), "hnsw_ef_search": (1, None, True, True, _INT),
    "baseline_k": (1, None, True, True, _INT),
    "fusion_k": (0, None, True, True, _INT),
    "lexical_weight": (0.0, None, True, True, _REAL),
    "correction_threshold": (-1.0, 1.0, True, True, _REAL),  # a cosine
    "correction_extra_k": (0, None, True, True, _INT),
    "rerank_dense_weight": (0.0, None, True, True, _REAL), "rerank_lexical_weight": (0.0, None, True, True, _REAL),
    "rerank_title_weight": (0.0, None, True, True, _REAL),
    "compression_floor": (0.0, None, True, True, _REAL),
    "dedupe_prefix_chars": (1, None, True, True, _INT),
    "gate_delta": (0.0, 1.0, False, False, _REAL),
    "gate_threshold": (0.0, 1.0, True, True, _REAL),  # a mean relevance in [0, 1]
    "gate_max_n": (1, None, True, True, _INT),
    "azuma_c": (0.0, None, False, True, _REAL),
    "refuse_distance": (0.0, 4.0, True, True, _REAL),  # squared L2 between unit vectors lies in [0, 4]
    "gpt_distance": (0.0, 4.0, True, True, _REAL),
    "max_error_rate": (0.0, 1.0, False, True, _REAL),
    "delta": (0.0, 1.0, False, False, _REAL),
    "reader_passages": (1, None, True, True, _INT),
    "reader_window": (0, 1000, True, True, _INT),  # past any document (2w + 1 ids were fetched: 10**9, no memory)
    "rag_confidence": (0.0, 1.0, True, True, _REAL),
    "top_k": (0, None, True, True, _INT),  # 0 = llama.cpp samples from the whole vocabulary
    "temperature": (0.0, None, True, True, _REAL),
    "repeat_ngram": (1, None, True, True, _INT), "repeat_window": (1, None, True, True, _INT),
    "n_ctx": (1, None, True, True, _INT),
    "seed": (0, 2**32 - 2, True, True, _INT),  # llama.cpp's is 32 bits, and 2**32 - 1 (or -1) means a random one
    "cache_size": (0, None, True, True, _INT),
}


def _names(values: tuple) -> str:
    return ", ".join(str(getattr(v, "value", v)) for v in values)


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}: allowed values are {_names(allowed)}")


def _check_range(name: str, value: object, low: float | None, high: float | None, low_in: bool, high_in: bool,
                 integer: bool) -> None:
    kind, high = ("an integer", INT_MAX if high is None else high) if integer else ("a number", high)
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)  # abs: an int past a float's range, or NaN
          and (isinstance(value, int) if integer else abs(value) <= sys.float_info.max)
          and (low is None or (value >= low if low_in else value > low))
          and (high is None or (value <= high if high_in else value < high)))
    if not ok:
        lo = "" if low is None else f"{'>=' if low_in else '>'} {low}"
        hi = "" if high is None else f"{'<=' if high_in else '<'} {high}"
        raise ConfigError(f"{name}={value!r}: allowed values are {kind} {' and '.join(x for x in (lo, hi) if x)}"
                          .rstrip())
