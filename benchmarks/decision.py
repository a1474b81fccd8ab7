"""The decision layer's figures: error among answered vs alpha (with a Clopper-Pearson interval), coverage,
out-of-domain refusal on the OOD-test articles, and the risk-coverage curve.

An answer is an error when its question is unanswerable (or out of domain), or when its F1 against every
gold answer is < 0.5: the same definition the calibration certifies (edge_rag/decision/certify.py).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from tqdm import tqdm

from edge_rag import EdgeRAG, Route
from edge_rag.decision.certify import F1_CORRECT, clopper_pearson_upper
from evaluation.metrics import best_f1

from . import data, splits

CI_DELTA = 0.025  # each side of a 95% two-sided Clopper-Pearson interval


def wrong(answer: str, row: dict) -> bool:
    """Whether ``answer`` to ``row``'s question is an error, judged against the row's gold answers (not against the
    row's own F1, which is that of what the system said: None or 0 when it refused)."""
    return not row["answerable"] or best_f1(answer, row["gold"]) < F1_CORRECT


def is_error(row: dict) -> bool:
    return bool(row["answer"]) and wrong(row["answer"], row)


def error_among_answered(rows: list[dict]) -> dict:
    """Realised error among answered questions, with a 95% Clopper-Pearson interval, and coverage."""
    answered = [r for r in rows if r["answer"]]
    n, k = len(answered), sum(is_error(r) for r in answered)
    return {"n_answered": n, "n_errors": k, "coverage": n / len(rows) if rows else None,
            "error": k / n if n else None,
            "lo": 1 - clopper_pearson_upper(n - k, n, CI_DELTA) if n else None,
            "hi": clopper_pearson_upper(k, n, CI_DELTA) if n else None}


def ood_refused(rag: EdgeRAG, n: int | None, seed: int) -> dict:
    """Share of OOD-test questions refused and the p50 of deciding one (decide only: a GPT route counts as
    answered, nothing generated; one beyond the out-of-domain floor is refused before the reader reads)."""
    items = splits.ood_questions("test", data.OOD_FILE)
    if n is not None and n < len(items):
        items = [items[i] for i in sorted(np.random.default_rng(seed).permutation(len(items))[:n])]
    refused, ms = [], []
    for q in tqdm(items, desc="ood-test", unit="q"):
        start = time.perf_counter()
        refused.append(rag.decide(q.question).route is Route.REFUSE)
        ms.append((time.perf_counter() - start) * 1e3)
    return {"n": len(items), "refused": float(np.mean(refused)) if items else None,
            "p50_ms": float(np.median(ms)) if items else None}


def risk_coverage(rows: list[dict]) -> list[tuple[float, float]]:
    """(coverage, error among answered) when every kind's certified threshold moves by the same margin m, for every
    margin seen: a candidate is answered when its score >= its kind's threshold + m (m = 0: what the system did),
    each judged by its own F1, also the refused ones the curve would answer. A question the decision refuses
    whatever its score (its kind certifies nothing, beyond the out-of-domain floor: no candidate) is never answered
    here either: the curve once counted a multi-hop one as answered at a single-hop threshold, so the system's
    operating point (392 answered of 865) sat off its curve (435 at its threshold)."""
    scored = sorted(((r["score"] - r["score_threshold"], wrong(r["candidate"], r)) for r in rows
                     if r.get("candidate") and r.get("score") is not None and r.get("score_threshold") is not None),
                    reverse=True)
    errors = np.cumsum([e for _, e in scored])
    return [((i + 1) / len(rows), float(errors[i]) / (i + 1)) for i in range(len(scored))]


def plot(curves: dict[str, list[tuple[float, float]]], points: dict[str, dict], alpha: dict[str, float],
         path: Path) -> Path | None:
    """Risk-coverage on the test questions per certified system, its operating point and its alpha."""
    if not curves:
        return None
    fig = Figure(figsize=(6.5, 4.5))
    draw(fig.subplots(), curves, points, alpha)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def draw(ax: Axes, curves: dict[str, list[tuple[float, float]]], points: dict[str, dict],
         alpha: dict[str, float]) -> None:
    """``plot``'s axes: each system's curve, its operating point and alpha, or its name alone if it answers nothing."""
    for name, curve in curves.items():
        if curve:
            cov, err = zip(*curve)
            line = ax.plot(cov, err, label=f"{name} (all thresholds)")[0]
            p = points[name]
            if p["n_answered"]:
                ax.plot([p["coverage"]], [p["error"]], "o", color=line.get_color(), label=f"{name} at alpha")
            ax.axhline(alpha[name], ls=":", color=line.get_color())
        else:  # no threshold certified at its alpha (the rule reader's at 0.4): no point to draw, but named
            ax.plot([], [], " ", label=f"{name}: answers no question at any threshold")
    ax.set_xlabel("coverage (share of test questions answered)")
    ax.set_ylabel("error among answered")
    ax.set_title("Risk-coverage on the test split (dotted: alpha)")
    ax.legend(fontsize=8)
