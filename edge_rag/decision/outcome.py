"""What one question's run decided (Decision) and what it cost (Stages), turned into one Answer.

The pipeline's stages return their results here instead of filling caller-owned dicts, and the Answer
is built once, after the last stage (``generate`` on the GPT route).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..config import Tier
from ..memory import rss_mb, usage_mb
from ..reading.extract import Extraction
from ..reading.generate import Generation
from ..types import Answer, Passage, PassageRef, Route
from .certified import Verdict
from .gate import GateResult


@dataclass(frozen=True)
class Decision:
    """What the stages up to the route decided for one question."""

    route: Route
    refusal_reason: str | None
    tier: Tier
    tier_fallback: bool
    used: list[Passage]
    context: str
    d_min: float
    corrected: bool
    gate: GateResult | None
    extraction: Extraction | None
    verdict: Verdict | None = None  # the certified path's candidate, route and certificate (Config.certified)
    hits: list[Passage] = field(default_factory=list)  # the search's top hits, which the reader/extractor read

    def cited(self) -> list[Passage]:
        """The passages an Answer names: the context's; on the RAG route the answer's own passage first when
        the context lacks it (reader and extractor read the search's top hits, not the tier's context)."""
        source = self.verdict.candidate.passage_id if self.verdict else (
            self.extraction.passage_id if self.extraction else None)
        if self.route is not Route.RAG or source in {p.id for p in self.used}:
            return self.used
        return [p for p in self.hits if p.id == source][:1] + self.used

    def answer(self, question: str, stages: Stages, gen: Generation | None = None) -> Answer:
        """The Answer, built once: the extractive answer on RAG, the generated text on GPT."""
        gate, extraction, verdict = self.gate, self.extraction, self.verdict
        candidate = verdict.candidate.text if verdict else extraction.answer if extraction else None
        text = candidate if self.route is Route.RAG else None
        route, reason = self.route, self.refusal_reason
        if gen is not None:
            text = gen.text or None
            if gen.cut and not gen.text:  # not one whole sentence: a fragment is no answer
                route, reason = Route.REFUSE, (f"the generated answer was cut off after {gen.completion_tokens} "
                                               "tokens, before its first sentence ended")
            elif not gen.text:  # a GPT route without an answer nor a reason was shown as "not in the documents"
                route, reason = Route.REFUSE, ("the generator gave no answer: the first line of its "
                                               f"{gen.completion_tokens} tokens was empty")
        return Answer(
            question=question,
            answer=text,
            route=route,
            tier=self.tier,
            confidence=verdict.candidate.span_score if verdict else extraction.confidence if extraction else 0.0,
            lower_bound=gate.lower_bound if gate else math.nan,
            threshold=gate.threshold if gate else math.nan,
            d_min=self.d_min,
            passages=[PassageRef(p.id, p.title, p.score) for p in self.cited()],
            context_chars=len(self.context),
            prompt_tokens=gen.prompt_tokens if gen else 0,
            completion_tokens=gen.completion_tokens if gen else 0,
            corrected=self.corrected,
            refusal_reason=reason,
            n_evidence=gate.n if gate else 0,
            tier_fallback=self.tier_fallback,
            context=self.context,
            candidate=candidate,
            **(verdict.fields if verdict else {}),
            **stages.finish(),
        )


@dataclass
class Stages:
    """Per-stage wall time (ms); resident memory (MB) sampled once at the end, or after every stage
    when ``per_stage`` (Config.rss_per_stage): each psutil sample reads /proc, and one per stage is a
    measurable share of a few-millisecond ``decide``."""

    per_stage: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + (time.perf_counter() - start) * 1e3
            if self.per_stage:
                self.rss[name] = rss_mb()

    def finish(self) -> dict:
        """The Answer fields that measure the run: timings, RSS and the process's peak RSS."""
        now, peak = usage_mb()  # one read of /proc/self/status
        rss = self.rss if self.per_stage else {"end": now}
        return {"timings_ms": dict(self.timings), "rss_mb": dict(rss), "peak_rss_mb": peak}
