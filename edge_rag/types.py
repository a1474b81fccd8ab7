"""Domain objects passed between stages: Passage in, Answer out."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from .config import Tier


class Route(str, Enum):
    """Where Confidence-Gated Routing sent a question (EverydayGPT Def. 2)."""

    RAG = "RAG"  # extractive answer from the context, no LLM call
    GPT = "GPT"  # llama.cpp generation from the compressed context
    REFUSE = "REFUSE"  # out of domain or insufficient evidence


@dataclass(frozen=True)
class Document:
    """A source document before chunking."""

    doc_id: str
    title: str
    text: str
    source: str = ""  # the file it was read from; re-indexing that file replaces its documents


@dataclass(frozen=True)
class Passage:
    """A retrieval unit: one sentence (or paragraph) of a document, with its cosine score to the query."""

    id: int
    doc_id: str
    title: str
    text: str
    position: int = 0  # index of the unit inside its document
    score: float = 0.0  # cosine similarity to the query (0 until retrieved): the dense score every stage reads
    lexical: float = 0.0  # BM25 score of the full-text index (higher is better; 0: no query term matched)
    fused: float = 0.0  # what ordered the hybrid list: cosine + the BM25 rank bonus (retrieve.py)

    @property
    def distance(self) -> float:
        """Squared L2 distance between unit vectors, 2 - 2 s in [0, 4]: what the seeds' FAISS IndexFlatL2
        returns, so the seeds' distance thresholds (delta_d = 1.5 <=> cosine 0.25) mean the same here."""
        return max(0.0, 2.0 - 2.0 * self.score)


@dataclass(frozen=True)
class PassageRef:
    """What an Answer keeps of a passage it used."""

    id: int
    title: str
    score: float


@dataclass
class Answer:
    """Everything one ``ask`` did: the answer, why it was routed so, and what it cost."""

    question: str  # as answered: white space and control characters normalised
    answer: str | None  # None when refused
    route: Route  # RAG (a span of the documents), GPT (generated) or REFUSE
    tier: Tier  # the budget tier the router chose
    confidence: float = 0.0  # extraction confidence c (Eq. 1)
    lower_bound: float = float("nan")  # evidence gate's lower confidence bound L
    threshold: float = float("nan")  # evidence gate's tau_rel
    d_min: float = float("nan")  # squared distance 2 - 2 cosine to the nearest passage of the dense search
    passages: list[PassageRef] = field(default_factory=list)  # the passages used: id, title, cosine
    context_chars: int = 0  # characters of the compressed context
    prompt_tokens: int = 0  # tokens the generator read (0: no LLM call)
    completion_tokens: int = 0  # tokens it generated
    timings_ms: dict[str, float] = field(default_factory=dict)  # milliseconds per stage (total_ms: their sum)
    rss_mb: dict[str, float] = field(default_factory=dict)  # {"end": MB}, or per stage with Config.rss_per_stage
    corrected: bool = False  # a weak best match fetched more passages
    cache_hit: bool = False  # answered from the answer cache
    peak_rss_mb: float = 0.0  # the process's peak resident memory so far
    refusal_reason: str | None = None  # why it was refused, in words a person can read
    n_evidence: int = 0  # passages the evidence gate looked at
    tier_fallback: bool = False  # True when no router was available and the config's tier was used
    context: str = ""  # the compressed context the answer was drawn from
    # -- the certificate (certify.py): error among answered <= alpha w.p. 1 - delta; NaN / 0 when not certified
    score: float = float("nan")  # the candidate's score (a logistic combiner): answered when >= score_threshold
    candidate: str | None = None  # the reader's answer before the decision (kept when refused)
    features: dict[str, float] = field(default_factory=dict)  # what the score was computed from
    alpha: float = float("nan")  # the error bound asked for (Config.max_error_rate)
    delta: float = float("nan")  # the certificate holds with probability >= 1 - delta
    score_threshold: float = float("nan")  # the threshold certified at (alpha, delta): answered when score >= it
    n_cal: int = 0  # calibration questions the certificate was counted on
    cal_coverage: float = float("nan")  # share of them answered at the threshold
    cal_error: float = float("nan")  # error among those answered
    kind: str = ""  # the question's kind (single-hop / multi-hop) whose certificate decided it; "" when none did

    @property
    def confident(self) -> bool:
        """cautious-rag API: True when the system answered rather than refused."""
        return self.route is not Route.REFUSE

    @property
    def total_ms(self) -> float:
        return sum(self.timings_ms.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["route"] = self.route.value
        d["tier"] = self.tier.value
        d["confident"] = self.confident
        for key, value in d.items():
            if isinstance(value, float) and not math.isfinite(value):
                d[key] = None
        return d


def in_order(found: Iterable[Passage], ids: Sequence[int]) -> list[Passage]:
    """The passages ``found`` (in any order) in the order of ``ids``; an id not found is left out."""
    by_id = {p.id: p for p in found}
    return [by_id[i] for i in ids if i in by_id]
