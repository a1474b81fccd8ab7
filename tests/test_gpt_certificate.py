"""The GPT-route certificate experiment (benchmarks/experiments/gpt_certificate.py) certifies with the reader's own
bound: a score that ranks right answers first gets a threshold whose error among answered is bounded by alpha,
one that ranks them last gets none, and an empty answer is never counted."""
from __future__ import annotations

import numpy as np

from benchmarks.experiments.gpt_certificate import ALPHAS, DELTA, evaluate, hindsight
from edge_rag.decision.certify import clopper_pearson_upper


def answers(n: int, seed: int, sign: float = 1.0) -> list[dict]:
    """Judged generated answers whose three scores rise (``sign`` 1) or fall (-1) with the chance of being right;
    one in ten is empty."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        quality = rng.uniform()
        answered = rng.uniform() > 0.1
        right = answered and rng.uniform() < quality ** 2
        s = quality if sign > 0 else 1 - quality
        rows.append({"answered": answered, "right": right, "error": answered and not right,
                     "support": float(np.clip(s + rng.normal(0, 0.1), 0, 1)), "agreement": float(s),
                     "logprob": float(np.log(0.05 + 0.9 * s))})
    return rows


def test_a_score_that_ranks_right_answers_first_is_certified_within_alpha() -> None:
    result = evaluate(answers(300, 0), answers(400, 1))
    chosen = result["scores"][result["chosen"]]
    default = chosen["calibration"][ALPHAS.index(0.4)]
    assert default["threshold"] is not None and default["answered"] > 0
    assert default["errors"] / default["answered"] <= default["upper"] <= 0.4
    for c in chosen["calibration"]:  # stricter alphas answer no more
        assert c["answered"] <= default["answered"]
    empty = sum(not r["answered"] for r in answers(400, 1))
    assert result["answer_all"]["answered"] == 400 - empty
    assert all(c["answered"] <= 400 - empty for s in result["scores"].values() for c in s["calibration"])


def test_a_score_that_ranks_right_answers_last_is_refused() -> None:
    result = evaluate(answers(300, 0), answers(400, 1, sign=-1.0))
    for name in ("support", "agreement", "logprob"):  # fitted on validation, where the scores rank well
        assert all(c["threshold"] is None and c["answered"] == 0 for c in result["scores"][name]["calibration"])


def test_hindsight_is_the_lowest_bound_over_every_top_k() -> None:
    rng = np.random.default_rng(3)
    scores = np.where(rng.uniform(size=60) < 0.2, np.nan, rng.normal(size=60))
    wrong = rng.uniform(size=60) < 0.5
    best = hindsight(scores, wrong)
    order = [i for i in np.argsort(-np.nan_to_num(scores, nan=-np.inf)) if np.isfinite(scores[i])]
    uppers = [clopper_pearson_upper(int(wrong[order[:k]].sum()), k, DELTA) for k in range(1, len(order) + 1)]
    assert best["upper"] == min(uppers) and best["answered"] == int(np.argmin(uppers)) + 1
