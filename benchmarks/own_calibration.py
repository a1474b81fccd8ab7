"""What ``edge-rag calibrate`` buys a device whose visitors ask what its documents hold, or something off-topic.

The shipped calibration is certified on SQuAD-2 dev questions, half of them unanswerables written against the very
paragraph the search finds. A kiosk's questions are another distribution: mostly answerable, some off-topic. Here
that distribution is made of the questions of the SQuAD dev file's splits (one pooled index, as ``make calibrate``):

- calibrate on the calibration split's answerable questions plus the seeded OOD-calibration questions that
  ``make calibrate`` samples (other Wikipedia articles: every answer to them is wrong);
- report on the test split's answerable questions plus OOD-test questions, sampled to the same off-topic share.

Per alpha: the threshold each calibration certifies (delta 0.05), and on test the share of answerable questions
answered and the error among answered. Then two Monte-Carlo checks of the certificate, on the calibration and test
questions pooled (2,093):

- coverage: the pool as the population (its error among answered at every threshold is known exactly), ``--draws``
  calibration sets of ``--draw-size`` questions drawn from it with replacement (i.i.d., as the certificate
  assumes); the share of draws whose certified threshold keeps the population's error <= alpha (promised:
  >= 1 - delta);
- shift: the pool split in halves by article (an article's questions stay together; 5 SQuAD articles and 20
  off-topic ones) ``--draws`` times, certified on one half; the share of splits whose other half's error among
  answered stays <= alpha — questions about other documents than the certified ones, which the certificate does
  not cover.

``python -m benchmarks.own_calibration [--out DIR]``
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edge_rag import Config, EdgeRAG
from edge_rag.decision.calibrate import REPORT_ALPHAS, LabelledQuestion, Measured, measure, risk_table
from edge_rag.decision.certify import Calibration
from edge_rag.models.bundle import Bundle
from edge_rag.models.registry import default_bundle, home
from evaluation.datasets import QAItem

from . import data, splits

DELTA = 0.05
OOD_SAMPLE = 600  # the OOD-calibration questions `make calibrate` samples (convert/calibrate.py --ood-sample)
SEED = 0


def labelled(items: list[QAItem]) -> list[LabelledQuestion]:
    return [LabelledQuestion(q.question, () if q.is_impossible else tuple(q.answers)) for q in items]


def threshold_text(t: float) -> str:
    return f"{t:.3f}" if math.isfinite(t) else "none"


def realised(rows: list[Measured], answerable: np.ndarray, threshold: float) -> tuple[float, float, int]:
    """(share of answerable questions answered, error among answered, n answered) at ``threshold``."""
    answered = np.array([m.score >= threshold for m in rows])  # NaN >= t is False
    wrong = np.array([m.wrong for m in rows])
    n = int(answered.sum())
    return float(answered[answerable].mean()), float(wrong[answered].mean()) if n else 0.0, n


def coverage(rows: list[Measured], thresholds: tuple[float, ...], alpha: float, draws: int, size: int
             ) -> tuple[float, float]:
    """(share of i.i.d. draws from ``rows`` whose certified threshold keeps the error among answered of all
    ``rows`` <= alpha, median share of ``rows`` answered at it)."""
    rng, population = np.random.default_rng(SEED), risk_table(rows, thresholds)
    error = {t: e / n if n else 0.0 for t, n, e in zip(thresholds, population.n_answered, population.n_errors)}
    answered = dict(zip(thresholds, population.n_answered))
    held, covered = [], []
    for _ in range(draws):
        cert = risk_table([rows[i] for i in rng.integers(0, len(rows), size)], thresholds).choose(alpha, DELTA)
        held.append(error.get(cert.threshold, 0.0) <= alpha)
        covered.append(answered.get(cert.threshold, 0) / len(rows))
    return float(np.mean(held)), float(np.median(covered))


def article_splits(rows: list[Measured], groups: list[str], thresholds: tuple[float, ...], alpha: float,
                   draws: int) -> tuple[float, float]:
    """(share of article halvings whose held-out half's error among answered is <= alpha, median held-out share
    answered)."""
    rng, names = np.random.default_rng(SEED), sorted(set(groups))
    held, covered = [], []
    for _ in range(draws):
        first = set(rng.permutation(names)[: len(names) // 2])
        cert = risk_table([m for m, g in zip(rows, groups) if g in first], thresholds).choose(alpha, DELTA)
        rest = [m for m, g in zip(rows, groups) if g not in first]
        answered = [m for m in rest if m.score >= cert.threshold]
        held.append(np.mean([m.wrong for m in answered]) <= alpha if answered else True)
        covered.append(len(answered) / len(rest))
    return float(np.mean(held)), float(np.median(covered))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="gemma")
    ap.add_argument("--index-cache", type=Path, default=home() / "bench")
    ap.add_argument("--draws", type=int, default=500, help="Monte-Carlo draws (and article splits)")
    ap.add_argument("--draw-size", type=int, default=1000, help="calibration questions per draw")
    ap.add_argument("--out", type=Path, default=Path("bench-results") / "own_calibration")
    args = ap.parse_args(argv)

    bundle = Bundle.load(default_bundle(args.profile))
    config = Config(temperature=0.0, cache_size=0)
    db, items = data.pooled_index("squad", data.FILES["squad"], bundle, config, args.index_cache)
    rng = np.random.default_rng(SEED)
    ood_cal = splits.ood_questions("calibration", data.OOD_FILE)
    ood_cal = [ood_cal[i] for i in sorted(rng.permutation(len(ood_cal))[:OOD_SAMPLE])]
    cal = [q for q in splits.select(items, "calibration") if not q.is_impossible] + ood_cal
    test_ans = [q for q in splits.select(items, "test") if not q.is_impossible]
    ood_test = splits.ood_questions("test", data.OOD_FILE)
    n_ood = round(len(test_ans) * len(ood_cal) / (len(cal) - len(ood_cal)))  # the calibration's off-topic share
    test = test_ans + [ood_test[i] for i in sorted(rng.permutation(len(ood_test))[:n_ood])]

    shipped = Calibration.load().reader(config.reader)
    with EdgeRAG(db, bundle=bundle.root, config=config) as rag:
        cal_rows = measure(rag, labelled(cal), lambda qs: tqdm(qs, desc="calibration", unit="q"))
        test_rows = measure(rag, labelled(test), lambda qs: tqdm(qs, desc="test", unit="q"))
    thresholds = shipped.table.thresholds
    own = risk_table(cal_rows, thresholds)
    answerable = np.array([not q.is_impossible for q in test])

    lines = ["# Calibrating on the device's own kind of question", "",
             f"`python -m benchmarks.own_calibration`: calibration {len(cal)} questions ({len(ood_cal)} off-topic), "
             f"test {len(test)} ({n_ood} off-topic, {int(answerable.sum())} answerable); delta {DELTA:g}; "
             f"Monte-Carlo on the {len(cal) + len(test)} pooled: {args.draws} draws of {args.draw_size}, "
             f"{args.draws} article splits.", "",
             "| alpha | own threshold | test: answerable answered | test: error among answered | shipped threshold "
             "| test: answerable answered | test: error among answered | MC coverage: pool error <= alpha (pool answered) "
             "| MC shift: held-out article half's error <= alpha (answered) |",
             "|---|---|---|---|---|---|---|---|---|"]
    figures = []
    for alpha in REPORT_ALPHAS:
        mine, theirs = own.choose(alpha, DELTA), shipped.table.choose(alpha, DELTA)
        a_own, e_own, _ = realised(test_rows, answerable, mine.threshold)
        a_sh, e_sh, _ = realised(test_rows, answerable, theirs.threshold)
        pooled = cal_rows + test_rows
        held_q, cov_q = coverage(pooled, thresholds, alpha, args.draws, args.draw_size)
        held, cov = article_splits(pooled, [q.group for q in cal + test], thresholds, alpha, args.draws)
        figures.append({"alpha": alpha, "own_threshold": mine.threshold, "own_answered": a_own, "own_error": e_own,
                        "shipped_threshold": theirs.threshold, "shipped_answered": a_sh, "shipped_error": e_sh,
                        "mc_coverage_held": held_q, "mc_coverage_answered": cov_q,
                        "mc_shift_held": held, "mc_shift_answered": cov})
        lines.append(f"| {alpha:g} | {threshold_text(mine.threshold)} | {a_own:.1%} | {e_own:.1%} | {threshold_text(theirs.threshold)} | "
                     f"{a_sh:.1%} | {e_sh:.1%} | {held_q:.1%} ({cov_q:.1%}) | {held:.1%} ({cov:.1%}) |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "own_calibration.json").write_text(json.dumps(figures, indent=1) + "\n")
    text = "\n".join(lines) + "\n"
    (args.out / "own_calibration.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
