"""The router on the benchmark's questions: its tier choices against the tier labels of those questions.

Labels as in router training (``evaluation.tiers``): the cheapest tier whose ``full``-system context serves
the question, made here with ``decide()`` (no generation) on the same store, so the confusion matrix is
computed on the very questions the table above reports. Unanswerable questions and questions no tier
serves have no label and are left out of the accuracy.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from edge_rag import Config, EdgeRAGError
from edge_rag.config import TIERS
from edge_rag.models.bundle import Bundle
from evaluation.datasets import QAItem
from evaluation.tiers import label, open_tiers, tier_contexts

from .systems import SYSTEMS, preset

LABEL_SYSTEM = "full"
# systems whose tier is the router's choice, the label system first: every one with the router on (the certified
# default too, which a run of it alone reported as "No routed system ran")
ROUTED = tuple(sorted((s for s, flags in SYSTEMS.items() if flags.get("router")), key=lambda s: s != LABEL_SYSTEM))


def router_confusion(db: Path, bundle: Path | Bundle, base: Config, items: list[QAItem],
                     rows_by_system: dict[str, list[dict]]) -> dict | None:
    """Accuracy, majority-label share and confusion (rows = label, columns = router) of the first routed
    system that ran; None when none ran; an error when the labels' pipelines cannot be opened (the run goes on)."""
    system = next((s for s in ROUTED if s in rows_by_system), None)
    if system is None:
        return None
    chosen = {r["id"]: r["tier"] for r in rows_by_system[system]}
    try:
        rags = open_tiers(db, bundle, preset(base, LABEL_SYSTEM))
    except EdgeRAGError as exc:  # three label pipelines at once may not fit a --memory-mb the systems fit one by one
        return {"system": system, "error": str(exc)}
    try:
        labels = {q.id: label(tier_contexts(rags, q)[0]) for q in items if q.answers and not q.is_impossible}
    finally:
        for rag in rags.values():
            rag.close()
    names = [t.value for t in TIERS]
    confusion = [[0] * len(TIERS) for _ in TIERS]
    for qid, tier in labels.items():
        if tier is not None:
            confusion[TIERS.index(tier)][names.index(chosen[qid])] += 1
    n = sum(map(sum, confusion))
    counts = Counter({t.value: sum(confusion[i]) for i, t in enumerate(TIERS)})
    return {"system": system, "answerable": len(labels), "labelled": n,
            "accuracy": sum(confusion[i][i] for i in range(len(TIERS))) / n if n else None,
            "label_mix": {t: c / n for t, c in counts.items()} if n else {},
            "confusion": confusion}


def report(r: dict | None) -> str:
    """Markdown: the labelled share, accuracy, and the confusion matrix."""
    if not r:
        return "No routed system ran.\n"
    if "error" in r:
        return f"No tier labels for `{r['system']}`: {r['error']}\n"
    names = [t.value for t in TIERS]
    acc = "–" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
    head = (f"Router tiers of `{r['system']}` against tier labels (cheapest tier whose `full` context serves the "
            f"question): {r['labelled']} of {r['answerable']} answerable questions have a label; accuracy {acc};"
            " label mix " + " / ".join(f"{t} {r['label_mix'].get(t, 0):.0%}" for t in names) + ".\n\n")
    rows = ["| label \\ router | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    rows += [f"| {t} | " + " | ".join(str(v) for v in row) + " |" for t, row in zip(names, r["confusion"])]
    return head + "\n".join(rows) + "\n"
