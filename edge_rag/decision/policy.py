"""The routing decision: RAG | GPT | REFUSE, with a reason a person can read for every refusal.

Certified path (Config(certified=True), the default), on top of certify.py:

    d_min > ood floor (squared L2, calibrated)          → REFUSE (out of domain)
    a candidate answer with score >= certified threshold → RAG    (error among answered <= alpha w.p. 1 - delta)
    a why/how/describe question and GPT certified        → GPT    (generated answers' own calibration <= alpha)
    otherwise                                            → REFUSE

Seed path (Config(certified=False)), EverydayGPT Def. 2 / Alg. 1 with the evidence-gate heuristic:

    d_min > delta_d                   → REFUSE (out of domain)
    evidence gate fails               → REFUSE (insufficient evidence, heuristic)
    extracted a ≠ ∅ and c ≥ tau       → RAG    (extractive answer, no LLM call)
    d_min ≤ gpt_distance              → GPT    (generate from the compressed context)
    otherwise                         → REFUSE
"""
from __future__ import annotations

import math
import re

from ..config import Config
from ..reading.extract import Extraction
from ..reading.extract.question import negated
from ..types import Route
from .certify import Certificate, beyond_floor
from .gate import GateResult
from .kind import Kind

# Questions whose answer is an explanation, not a span: the extractive reader cannot answer them.
_GENERATIVE = re.compile(
    r"^\s*(?:why\b|how (?:do|does|did|is|are|was|were|can|could|should|would|to)\b|describe\b|explain\b"
    r"|what (?:is|was) the (?:reason|purpose|process)\b)",
    re.IGNORECASE,
)
# An empty store's refusal (d_min is NaN: no nearest passage); it read "nearest passage at squared distance nan".
NOTHING_STORED = "nothing to answer from: no documents are indexed"


def generative(question: str) -> bool:
    """True for why / how-does / describe / explain questions (answered by generation, if at all)."""
    return bool(_GENERATIVE.search(question))


def decide_certified(question: str, d_min: float, ood_distance: float, answer: str | None, score: float,
                     cert: Certificate, gpt_refused: str | None,
                     kind: Kind = Kind.SINGLE_HOP) -> tuple[Route, str | None]:
    """The certified route and, for REFUSE, why; ``cert`` is the certificate of the question's ``kind``,
    ``gpt_refused`` why generated answers are not certified (None: they are)."""
    counted = f"{cert.n_cal} calibration questions" + ("" if kind is Kind.SINGLE_HOP else " of its kind")
    if math.isnan(d_min):
        return Route.REFUSE, NOTHING_STORED
    if beyond_floor(d_min, ood_distance):
        return Route.REFUSE, (f"out of domain: nearest passage at squared distance {d_min:.3f} > "
                              f"{ood_distance:.3f} (floor calibrated on out-of-domain questions)")
    if answer and score >= cert.threshold:
        return Route.RAG, None
    if generative(question) and gpt_refused is None:
        return Route.GPT, None
    if cert.threshold == float("inf"):
        why = (f"no score threshold keeps the error among answered <= {cert.alpha:g} at confidence "
               f"{1 - cert.delta:g} on {counted}")
    elif not answer:
        why = "the reader found no answer in the retrieved passages"
    else:
        why = (f"not sure enough: score {score:.2f} < {cert.threshold:.2f}, the threshold that keeps the error "
               f"among answered <= {cert.alpha:g} (confidence {1 - cert.delta:g}, {counted})")
        if negated(question):
            why += "; a question with a negation (not, never, ...) scores lower: the reader often answers it as if " \
                   "the negation were not there"
    if generative(question):
        why += f"; {gpt_refused}"
    if kind is Kind.MULTI_HOP:
        why = ("a multi-hop question (it asks about something it names through something else, so its answer needs "
               f"facts from two passages, and the reader reads one): {why}")
    return Route.REFUSE, why


def decide(d_min: float, gate: GateResult, extraction: Extraction, config: Config) -> tuple[Route, str | None]:
    """The seed path's route and, for REFUSE, a reason a person can read."""
    if math.isnan(d_min):
        return Route.REFUSE, NOTHING_STORED
    if not d_min <= config.refuse_distance:
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
