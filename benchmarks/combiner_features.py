"""`python -m benchmarks.combiner_features ROWS`: what each input of the certified score adds, on the validation
questions only.

ROWS is a per-question rows file of ``python -m convert calibrate --rows-cache DIR`` (``rows-neural-*.json``); only
its validation parts are read (reader-val and the model-selection set: what the combiner is fitted on; calibration
and test stay out of every choice). Each candidate is scored by a combiner fitted on the other folds (seeded 5-fold
splits, averaged over SEEDS), and a set of inputs is judged by two figures over all validation questions:
the AUROC of right vs wrong candidates, and the share of questions answered at the most permissive threshold whose
error among answered stays <= --alpha (what the certificate trades on). For all of ``certify.FEATURES`` and for
each one left out: a feature earns its place when leaving it out costs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from edge_rag.decision.certify import FEATURES

from .reader_sweep import auroc, coverage_at, cross_fitted_scores

SEEDS = 3
VALIDATION = ("reader_val", "select")  # the parts convert.calibrate fits the combiner on


def evaluate(rows: list[dict], names: tuple[str, ...], alpha: float) -> tuple[float, float]:
    """Mean cross-fitted (AUROC right/wrong, coverage at alpha) over SEEDS splits."""
    picked = [r for r in rows if r["candidate"]]
    x = np.array([[r["features"][f] for f in names] for r in picked], dtype=float)
    y = np.array([not r["wrong"] for r in picked], dtype=float)
    aucs, covers = [], []
    for seed in range(SEEDS):
        score = cross_fitted_scores(x, y, names, seed)
        aucs.append(auroc(score[y == 1].tolist(), score[y == 0].tolist()))
        covers.append(coverage_at(score, y == 0, len(rows), alpha))
    return float(np.mean(aucs)), float(np.mean(covers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.combiner_features", description=__doc__.splitlines()[0])
    ap.add_argument("rows", type=Path, help="a rows-<reader>-*.json file of `convert calibrate --rows-cache`")
    ap.add_argument("--alpha", type=float, default=0.3, help="error among answered the coverage is read at")
    args = ap.parse_args(argv)
    parts = json.loads(args.rows.read_text(encoding="utf-8"))
    rows = [r for part in VALIDATION for r in parts.get(part, [])]
    missing = [f for f in FEATURES if f not in rows[0]["features"]]
    if missing:
        raise SystemExit(f"{args.rows} was collected without {', '.join(missing)}: run `convert calibrate` again")
    print(f"{len(rows)} validation questions, {sum(bool(r['candidate']) for r in rows)} with a candidate")
    print(f"| inputs | AUROC right/wrong | answered at error <= {args.alpha:g} |\n|---|---|---|")
    sets = [("all", FEATURES)] + [(f"without {f}", tuple(g for g in FEATURES if g != f)) for f in FEATURES]
    for label, names in sets:
        auc, cover = evaluate(rows, names, args.alpha)
        print(f"| {label} | {auc:.3f} | {cover:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
