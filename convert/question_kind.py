"""Fit the question-kind model (``edge_rag.decision.kind``): P(multi-hop) from a question's form.

Single-hop questions: the SQuAD dev file's reader-train articles and the model-selection set (its 30 train
articles); multi-hop ones: HotpotQA's reader-train buckets. Never the calibration or test split. A logistic
regression on ``kind.FORM`` with each kind weighing alike (there are ~50 single-hop questions per multi-hop one), so
P(multi-hop) = 0.5 is where both kinds are equally likely. The cut is then raised to the smallest at which at most
MAX_SINGLE_AS_MULTI of SQuAD's reader-val questions (single-hop, not fitted on) are called multi-hop: a question
called multi-hop leaves the single-hop certificate, so the kind model must take few single-hop questions away
(docs/decisions/question-kinds.md says why this rule came after the first test run).
"""
from __future__ import annotations

import numpy as np

from benchmarks import data, splits
from convert.logistic import fit_combiner
from edge_rag.decision.certify import Combiner
from edge_rag.decision.kind import FORM, form
from evaluation.datasets import QAItem

MAX_SINGLE_AS_MULTI = 0.05  # share of single-hop validation questions the cut may call multi-hop
CUTS = np.round(np.arange(0.5, 1.0, 0.01), 2)  # cuts tried, from the balanced point up


def training_questions(selection: list[QAItem]) -> tuple[list[str], list[str]]:
    """(single-hop, multi-hop) training questions; ``selection``: the model-selection set's questions."""
    squad = data.load("squad", data.FILES["squad"], None, 0, "all").items
    hotpot = data.load("hotpotqa", data.FILES["hotpotqa"], None, 0, "all").items
    single = [q.question for q in splits.select(squad, "reader_train") + selection]
    return single, [q.question for q in splits.select(hotpot, "reader_train")]


def fit_kind_model(single: list[str], multi: list[str]) -> Combiner:
    """The kind model, fitted with both kinds weighing alike."""
    x = np.array([[form(q)[f] for f in FORM] for q in single + multi], dtype=float)
    y = np.r_[np.zeros(len(single)), np.ones(len(multi))]
    weight = np.where(y == 1, len(single) / len(multi), 1.0)
    return fit_combiner(x, y, weights=weight / weight.mean(), features=FORM)


def choose_cut(model: Combiner, single_val: list[str]) -> float:
    """The smallest cut of CUTS calling at most MAX_SINGLE_AS_MULTI of ``single_val`` multi-hop."""
    p = np.array([model(form(q)) for q in single_val])
    return float(next((c for c in CUTS if np.mean(p >= c) <= MAX_SINGLE_AS_MULTI), CUTS[-1]))
