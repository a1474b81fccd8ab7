"""What the neural reader should read: quality, abstention signal and latency per (reader_passages, reader_window).

``python -m benchmarks.reader_sweep [--passages 1,2] [--windows 1,2,3] [--part reader_val|select] [--n N]``

Every question of one split (default reader-val, never calibration or test) goes through ``EdgeRAG.decide`` on
the certified path with the calibration switched off, so every candidate is recorded, over the pooled corpus of
the SQuAD dev file (as `convert calibrate` and `make bench` build it); ``--part select``: the model-selection set's
questions over a store of its own 30 articles (as `convert calibrate` asks them). Per setting: answerable candidate F1 (the
best span, answered or not), the share of candidates that are right (F1 >= 0.5 on an answerable question),
the AUROC of the reader margin for right vs wrong candidates (unanswerable ones are all wrong), the share of
right answers among the best-scored 25% of questions and the share answered at error <= --alpha (the certified
score's combiner, 5-fold cross-fitted on the same questions: what decides how much a given alpha can answer), and
the read stage's p50 / p95 ms.
The Config defaults `reader_passages` / `reader_window` are chosen by that share.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from tqdm import tqdm

from convert.calibrate import selection_file
from convert.logistic import fit_combiner
from edge_rag import Config, EdgeRAG
from edge_rag.decision.certify import F1_CORRECT, FEATURES
from edge_rag.models.bundle import Bundle
from edge_rag.models.registry import default_bundle, home
from evaluation.metrics import best_f1

from . import data, splits


def auroc(positive: list[float], negative: list[float]) -> float | None:
    """P(a random positive scores above a random negative), ties half; None without both kinds."""
    if not positive or not negative:
        return None
    p, n = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(np.mean((p > n) + 0.5 * (p == n)))


COVERAGE = 0.25  # about what the shipped calibration answers at alpha 0.5
FOLDS = 5


def cross_fitted_scores(x: np.ndarray, y: np.ndarray, names: tuple[str, ...] = FEATURES, seed: int = 0) -> np.ndarray:
    """Each candidate's score by a combiner fitted on the other folds (seeded folds): not its own training fit."""
    fold = np.random.default_rng(seed).permutation(len(y)) % FOLDS
    score = np.empty(len(y))
    for k in range(FOLDS):
        combiner = fit_combiner(x[fold != k], y[fold != k], features=names)
        score[fold == k] = [combiner(dict(zip(names, row))) for row in x[fold == k]]
    return score


def top_precision(score: np.ndarray, y: np.ndarray, n_questions: int) -> float:
    """Right share among the best-scored COVERAGE of all questions (those without a candidate never answer)."""
    top = np.argsort(-score)[:int(COVERAGE * n_questions)]
    return float(y[top].mean()) if len(top) else 0.0


def coverage_at(score: np.ndarray, wrong: np.ndarray, n_questions: int, alpha: float) -> float:
    """Share of ``n_questions`` answered at the most permissive score threshold whose error among answered is
    <= alpha (candidates sorted by score; questions without a candidate never answer)."""
    order = np.argsort(-score, kind="stable")
    errors = np.cumsum(wrong[order])
    ok = np.flatnonzero(errors <= alpha * np.arange(1, len(order) + 1))
    return float(ok[-1] + 1) / n_questions if ok.size else 0.0


def measure(rag: EdgeRAG, items: list, label: str, alpha: float) -> dict:
    f1s, right, margins, read_ms, features = [], [], {True: [], False: []}, [], []
    for q in tqdm(items, desc=label, unit="q"):
        a = rag.decide(q.question)
        read_ms.append(a.timings_ms.get("read", 0.0))
        f1 = best_f1(a.candidate, q.answers) if a.candidate and not q.is_impossible else 0.0
        if not q.is_impossible:
            f1s.append(f1)
        if a.candidate:
            ok = not q.is_impossible and f1 >= F1_CORRECT
            right.append(ok)
            margins[ok].append(a.features["margin"])
            features.append([a.features[f] for f in FEATURES])
    enough = len(right) >= 2 * FOLDS
    x, y = np.asarray(features, dtype=float), np.asarray(right, dtype=float)
    score = cross_fitted_scores(x, y) if enough else None
    return {"answerable_f1": float(np.mean(f1s)), "candidates_right": float(np.mean(right)) if right else 0.0,
            "margin_auroc": auroc(margins[True], margins[False]),
            "precision": top_precision(score, y, len(items)) if score is not None else None,
            "coverage": coverage_at(score, y == 0, len(items), alpha) if score is not None else None,
            "read_p50_ms": float(np.percentile(read_ms, 50)), "read_p95_ms": float(np.percentile(read_ms, 95))}


def main(argv: list[str] | None = None) -> None:
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(prog="python -m benchmarks.reader_sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=ints, default=[1, 2])
    ap.add_argument("--windows", type=ints, default=[1, 2, 3])
    ap.add_argument("--part", default="reader_val", choices=[*splits.TUNING_PARTS, "select"])
    ap.add_argument("--alpha", type=float, default=0.3, help="error among answered the coverage column is read at")
    ap.add_argument("--n", type=int, default=None, help="a seeded sample of the split's SQuAD questions")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--index-cache", type=Path, default=home() / "bench")
    args = ap.parse_args(argv)
    bundle = Bundle.load(args.bundle or default_bundle("gemma"))
    base = Config(temperature=0.0, cache_size=0, certified=True, threads=args.threads)
    if args.part == "select":
        db, part = data.pooled_index("squad", selection_file(args.index_cache), bundle, base, args.index_cache)
    else:
        db, items = data.pooled_index("squad", data.FILES["squad"], bundle, base, args.index_cache)
        part = splits.select(items, args.part)
    part = data.sample(part, args.n, 0)
    print(f"{len(part)} {args.part} questions ({sum(not q.is_impossible for q in part)} answerable)")
    lines = ["| reader_passages | reader_window | answerable F1 | candidates right | margin AUROC right/wrong "
             f"| right among best-scored {COVERAGE:.0%} | answered at error <= {args.alpha:g} | read p50 ms | read p95 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k in args.passages:
        for w in args.windows:
            with EdgeRAG(db, bundle=bundle.root, config=base.with_(reader_passages=k, reader_window=w)) as rag:
                rag.certified.record_only()  # every candidate, none decided
                rag.decide(part[0].question)  # load the reader outside the timings
                r = measure(rag, part, f"passages {k} window {w}", args.alpha)
            auc, top, cover = (f"{r[f]:.3f}" if r[f] is not None else "–" for f in ("margin_auroc", "precision", "coverage"))
            lines.append(f"| {k} | {w} | {r['answerable_f1']:.3f} | {r['candidates_right']:.3f} | {auc} | {top} | {cover} "
                         f"| {r['read_p50_ms']:.1f} | {r['read_p95_ms']:.1f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
