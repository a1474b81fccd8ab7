"""`python -m benchmarks.combiner_features ROWS`: what each input of the certified score adds, on reader-val only.

ROWS is a per-question rows file of ``python -m convert calibrate --rows-cache DIR`` (``rows-neural-*.json``); only
its reader-val part is read (the part the combiner is fitted on; calibration and test stay out of every choice).
For all of ``certify.FEATURES`` and for each one left out, over the reader-val questions with a candidate answer:
the AUROC of right vs wrong candidates and the right share among the best-scored 25% of all reader-val questions
(reader_sweep's column), each candidate scored by a combiner fitted on the other folds, averaged over 10 seeded
5-fold splits. A feature earns its place when leaving it out costs both.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from edge_rag.decision.certify import FEATURES

from .reader_sweep import auroc, cross_fitted_scores, top_precision

SEEDS = 10


def evaluate(rows: list[dict], names: tuple[str, ...]) -> tuple[float, float]:
    """Mean cross-fitted (AUROC right/wrong, right share among the best-scored 25%) over SEEDS splits."""
    picked = [r for r in rows if r["candidate"]]
    x = np.array([[r["features"][f] for f in names] for r in picked], dtype=float)
    y = np.array([not r["wrong"] for r in picked], dtype=float)
    aucs, tops = [], []
    for seed in range(SEEDS):
        score = cross_fitted_scores(x, y, names, seed)
        aucs.append(auroc(score[y == 1].tolist(), score[y == 0].tolist()))
        tops.append(top_precision(score, y, len(rows)))
    return float(np.mean(aucs)), float(np.mean(tops))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.combiner_features", description=__doc__.splitlines()[0])
    ap.add_argument("rows", type=Path, help="a rows-<reader>-*.json file of `convert calibrate --rows-cache`")
    args = ap.parse_args(argv)
    rows = json.loads(args.rows.read_text(encoding="utf-8"))["reader_val"]
    missing = [f for f in FEATURES if f not in rows[0]["features"]]
    if missing:
        raise SystemExit(f"{args.rows} was collected without {', '.join(missing)}: run `convert calibrate` again")
    print(f"{len(rows)} reader-val questions, {sum(bool(r['candidate']) for r in rows)} with a candidate")
    print("| inputs | AUROC right/wrong | right among best-scored 25% |\n|---|---|---|")
    sets = [("all", FEATURES)] + [(f"without {f}", tuple(g for g in FEATURES if g != f)) for f in FEATURES]
    for label, names in sets:
        auc, top = evaluate(rows, names)
        print(f"| {label} | {auc:.3f} | {top:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
