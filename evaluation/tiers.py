"""Which budget tiers can serve a question: the router's labels, judged on the context, not on generation.

A tier serves a question when the compressed context it hands the generator holds what the answer
needs: a gold answer (SQuAD; word-bounded match after SQuAD normalisation), or for HotpotQA both
supporting paragraphs and, unless the answer is yes/no, the answer itself. The label is the cheapest
tier that serves; a question no tier serves has no label (spending more cannot help it). Why not
generated correctness: the 270M generator's right/wrong flips with wording, so a label from it measures
noise as much as difficulty; convert/train_router.py measures how the two agree (router_report.md).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edge_rag.config import TIERS, Config, Tier
from edge_rag.models.bundle import Bundle
from edge_rag.pipeline import EdgeRAG

from .datasets import QAItem
from .metrics import normalize_answer

YES_NO = ("yes", "no")


def contains_answer(context: str, golds: Sequence[str]) -> bool:
    """A gold answer occurs in ``context`` as whole words, after SQuAD normalisation."""
    text = f" {normalize_answer(context)} "
    return any(g and f" {g} " in text for g in (normalize_answer(a) for a in golds))


def serves(item: QAItem, context: str, context_docs: set[str]) -> bool:
    """Does this context hold what ``item`` needs? See the module docstring."""
    if item.dataset == "hotpotqa":
        golds = [a for a in item.answers if normalize_answer(a) not in YES_NO]
        has_answer = not golds or contains_answer(context, golds)
        return bool(item.gold_doc_ids) and item.gold_doc_ids <= context_docs and has_answer
    return contains_answer(context, item.answers)


def label(served: Sequence[bool]) -> Tier | None:
    """The cheapest tier that serves (``served`` in ``TIERS`` order), None when none does."""
    return next((t for t, ok in zip(TIERS, served) if ok), None)


def open_tiers(db: Path, bundle_dir: Path | Bundle, config: Config, tiers: Sequence[Tier] = TIERS) -> dict[Tier, EdgeRAG]:
    """One EdgeRAG per tier of ``tiers`` (``tier_override``) over the store ``db``; close them when done."""
    return {t: EdgeRAG(db, bundle=bundle_dir, config=config.with_(tier_override=t)) for t in tiers}


def tier_contexts(rags: dict[Tier, EdgeRAG], item: QAItem) -> tuple[list[bool], list[int]]:
    """Whether each tier's context serves ``item``, and its length in characters (``decide``: no generation)."""
    served, chars = [], []
    for tier in TIERS:
        answer = rags[tier].decide(item.question)
        docs = {p.doc_id for p in rags[tier].store.passages([r.id for r in answer.passages])}
        served.append(serves(item, answer.context, docs))
        chars.append(len(answer.context))
    return served, chars
