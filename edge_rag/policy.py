"""Confidence-Gated Routing (EverydayGPT Def. 2 / Alg. 1) composed with the evidence gate.

    d_min > delta_d                   → REFUSE (out of domain)
    evidence gate fails               → REFUSE (insufficient evidence, cautious-rag)
    extracted a ≠ ∅ and c ≥ tau       → RAG    (extractive answer, no LLM call)
    d_min ≤ 1.0                       → GPT    (generate from the compressed context)
    otherwise                         → REFUSE
"""
from __future__ import annotations

from .config import Config
from .extract import Extraction
from .gate import GateResult
from .types import Route


def decide(d_min: float, gate: GateResult, extraction: Extraction, config: Config) -> tuple[Route, str | None]:
    """The route and, for REFUSE, a reason a person can read."""
    if not d_min <= config.refuse_distance:  # also catches NaN: nothing retrieved
        return Route.REFUSE, f"out of domain: nearest passage at distance {d_min:.3f} > {config.refuse_distance}"
    if not gate.passed:
        return Route.REFUSE, f"insufficient evidence ({gate.method}): {gate.reason}"
    if extraction.answer and extraction.confidence >= config.rag_confidence:
        return Route.RAG, None
    if d_min <= config.gpt_distance:
        return Route.GPT, None
    return Route.REFUSE, (
        f"no confident extractive answer (c = {extraction.confidence:.2f} < {config.rag_confidence}) and the "
        f"nearest passage (distance {d_min:.3f}) is too far to generate from (> {config.gpt_distance})"
    )
