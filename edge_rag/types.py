"""Domain objects passed between stages: Passage in, Answer out."""
from __future__ import annotations

import math
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


@dataclass(frozen=True)
class Passage:
    """A retrieval unit: one sentence (or paragraph) of a document, with its cosine score to the query."""

    id: int
    doc_id: str
    title: str
    text: str
    position: int = 0  # index of the unit inside its document
    score: float = 0.0  # cosine similarity to the query (0 until retrieved)

    @property
    def distance(self) -> float:
        """L2 distance between unit vectors, sqrt(2 - 2 s) in [0, 2] (the seeds' FAISS L2)."""
        return math.sqrt(max(0.0, 2.0 - 2.0 * self.score))


@dataclass(frozen=True)
class PassageRef:
    """What an Answer keeps of a passage it used."""

    id: int
    title: str
    score: float


@dataclass
class Answer:
    """Everything one ``ask`` did: the answer, why it was routed so, and what it cost."""

    question: str
    answer: str | None
    route: Route
    tier: Tier
    confidence: float = 0.0  # extraction confidence c (Eq. 1)
    lower_bound: float = float("nan")  # evidence gate's lower confidence bound L
    threshold: float = float("nan")  # evidence gate's tau_rel
    d_min: float = float("nan")
    passages: list[PassageRef] = field(default_factory=list)
    context_chars: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)  # {"end": MB}, or per stage with Config.rss_per_stage
    corrected: bool = False
    cache_hit: bool = False
    peak_rss_mb: float = 0.0
    refusal_reason: str | None = None
    n_evidence: int = 0  # passages the evidence gate looked at
    tier_fallback: bool = False  # True when no router was available and the config's tier was used
    context: str = ""  # the compressed context the answer was drawn from

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
        for key in ("lower_bound", "threshold", "d_min"):
            if isinstance(d[key], float) and math.isnan(d[key]):
                d[key] = None
        return d
