"""One frozen config holding every default of DESIGN.md (the seeds' values unless noted)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


class Tier(str, Enum):
    """Budget tier chosen by the router from the query embedding (thesis §4.3)."""

    EASY = "EASY"
    MEDIUM = "MEDIUM"
    HARD = "HARD"


@dataclass(frozen=True)
class TierSpec:
    """What a tier may spend: passages, context characters, new tokens, and whether to rerank."""

    k: int
    context_chars: int
    max_new_tokens: int
    rerank: bool


DEFAULT_TIERS: dict[Tier, TierSpec] = {
    Tier.EASY: TierSpec(k=2, context_chars=600, max_new_tokens=64, rerank=False),
    Tier.MEDIUM: TierSpec(k=5, context_chars=1200, max_new_tokens=96, rerank=True),
    Tier.HARD: TierSpec(k=10, context_chars=2000, max_new_tokens=128, rerank=True),
}


@dataclass(frozen=True)
class Config:
    """Every tunable of the pipeline. Derive variants with ``config.with_(field=value)``."""

    # -- which stages run. All on = the adaptive, cautious pipeline; the benchmarks switch them off
    # one by one for the seeds' baselines (router=False and the rest off = the fixed-k baseline).
    retrieval: bool = True  # False = GPT-only, no context
    router: bool = True  # tier budgets from router.onnx (else fixed k = baseline_k, whole passages)
    correction: bool = True
    rerank: bool = True
    compression: bool = True  # dedupe + sentence-level compression to the tier's char budget
    cgr: bool = True  # decide RAG | GPT | REFUSE (else always GPT)
    certified: bool = True  # certified selective answering (certify.py); False = the seeds' CGR (Eq. 1 tau, gate)
    reader: str = "neural"  # "neural" (trained extractive reader, reader.onnx) | "rules" (EverydayGPT extractor)

    # -- memory budget (MB) for the whole process; EverydayGPT runs in < 2 GB
    memory_budget_mb: int = 2048

    # -- encoder (MiniLM ONNX): sentence-transformers uses max_seq_length 256
    max_seq_len: int = 256
    # Batches are bounded in padded tokens, not rows: ORT's arena grows with batch×seq (1.6 GB at 32×256).
    encode_batch_tokens: int = 2048
    threads: int = 0  # 0 = all cores (os.cpu_count())

    # -- chunking
    passage_mode: str = "sentence"  # "sentence" (thesis) or "paragraph"
    min_sentence_chars: int = 20  # shorter fragments are merged into their neighbour

    # -- retrieval (hnswlib, cosine space)
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 64
    baseline_k: int = 5  # the fixed-k baseline (thesis, LangChain-style)

    # -- router tiers
    tiers: dict[Tier, TierSpec] = field(default_factory=lambda: dict(DEFAULT_TIERS))
    fallback_tier: Tier = Tier.MEDIUM  # used (and recorded) when no router.onnx is available
    tier_override: Tier | None = None  # force one tier (oracle labelling, or "always HARD" kiosks)

    # -- correction (thesis): low top-1 cosine on a non-HARD tier fetches more passages
    correction_threshold: float = 0.52
    correction_extra_k: int = 5

    # -- rerank h(q, p) weights (ours; thesis names the three signals)
    rerank_dense_weight: float = 0.6
    rerank_lexical_weight: float = 0.3
    rerank_title_weight: float = 0.1

    # -- dedupe (EverydayGPT): passages whose first N normalised characters repeat are dropped
    dedupe_prefix_chars: int = 120

    # -- evidence gate (cautious-rag), a HEURISTIC of the seed path (certified=False): it bounds the top-k
    # cosines of one query read in rank order, which are not i.i.d. draws, so its delta certifies nothing (gate.py).
    gate: str = "betting"  # none | distance | hoeffding | azuma | bernstein | betting
    gate_delta: float = 0.05
    gate_threshold: float = 0.25  # tau_rel on r = clip(cosine, 0, 1): a threshold on how high the top cosines are
    gate_max_n: int = 20  # cosines the gate may look at (one knn query; sequential gates stop earlier)
    azuma_c: float = 1.0  # bound on martingale differences: 1 is the only value [0, 1] scores guarantee

    # -- certified selective answering: among answered questions error <= max_error_rate w.p. >= 1 - delta
    # alpha: the smallest the calibration split certifies for the shipped reader at delta 0.05 (CP upper 0.69 at
    # 33% coverage; nothing below). Lower it after a better reader is calibrated (README "Decision layer").
    max_error_rate: float = 0.7
    delta: float = 0.05
    reader_passages: int = 2  # top hits, widened to their paragraph, the neural reader reads (latency: ~1 window each)

    # -- confidence-gated routing (EverydayGPT Def. 2). Distances are squared L2, d = 2 - 2 s, as the seeds'
    # FAISS IndexFlatL2; the certified path uses the out-of-domain floor of the calibration file instead.
    refuse_distance: float = 1.5  # delta_d: d_min above this is out of domain (cosine < 0.25)
    gpt_distance: float = 1.0  # GPT path only when d_min <= this (cosine >= 0.5)
    rag_confidence: float = 0.5  # tau: extractive answer accepted when c >= tau

    # -- generation (EverydayGPT §4.3)
    top_k: int = 50
    temperature: float = 0.4  # 0 for benchmarks / deterministic runs
    repeat_ngram: int = 3  # sliding-window n-gram repetition detector
    repeat_window: int = 48  # tokens the detector looks back over
    n_ctx: int = 1024
    seed: int = 0

    # -- cache
    cache_size: int = 256  # answers kept (LRU); 0 turns the cache off
    persistent_cache: bool = False  # also keep answers in <db>/answers.sqlite across restarts

    def with_(self, **changes: object) -> Config:
        """A copy with some fields changed (the config itself is frozen)."""
        return replace(self, **changes)

    def tier(self, tier: Tier) -> TierSpec:
        return self.tiers[tier]
