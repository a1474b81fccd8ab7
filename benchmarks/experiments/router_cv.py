"""Which router inputs to ship, chosen without the test split (issue #42): grouped cross-validation on train + val.

    python -m benchmarks.experiments.router_cv [--widths 10,16] [--epochs 40] [--seeds 0,1,2] [--out FILE]

Three folds: fold k holds out HotpotQA bucket (2, 3, 4)[k] (reader_train's two buckets, reader_val's one) and every
third SQuAD article of the router's train and val parts (sorted by digest). Per fold the router is trained as
``convert.train_router.train`` trains it (rows weighted so each dataset weighs alike, no tier weights) for a fixed
number of epochs — no epoch is picked on held-out rows — on the first ``width`` profile columns, and scored on the
held-out SQuAD articles, the held-out bucket's questions on the pooled dev file, and the same questions over a corpus
of their own bucket's part alone (the issue's condition: ``router_tiers.pooled_alone``). Accuracies are averaged over
the seeds. The test split (bucket 0, its SQuAD articles) is never loaded. Labels: the training label cache
(``router_labels.csv``); the pooled-alone stores are labelled here. Prints JSON (and writes it to ``--out``).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import torch

from benchmarks import data, splits
from benchmarks.experiments.router_tiers import emit, pooled_alone
from benchmarks.systems import bench_config
from convert import train_router as T
from edge_rag.config import TIERS
from edge_rag.models import bundle as B
from edge_rag.models.registry import ROUTER_ASSET, default_bundle, home
from edge_rag.retrieval.route import PROFILE
from evaluation.tiers import label, open_tiers, tier_contexts

HOTPOT_FOLDS = (2, 3, 4)  # the HotpotQA buckets of reader_train (2, 3) and reader_val (4); fold k holds out [k]
ALONE = "hotpotqa-alone"


def fit_rows(bundle_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels, condition and fold of every labelled train/val question on the training corpora."""
    config, encoder_sha = T.label_config(), _encoder_sha(bundle_dir)
    corpora = T.load_corpora(data.FILES["squad"], data.DATA_DIR / "squad2_train_subset.json", data.FILES["hotpotqa"])
    cached = T.read_labels(ROUTER_ASSET.parent / T.LABELS_FILE, T.settings_key(encoder_sha, config, corpora))
    rows, xs = [], []
    for c in corpora:
        items = [q for q in c.dataset.items if c.parts[q.id] in ("train", "val")]
        corpus = dataclasses.replace(c, dataset=dataclasses.replace(c.dataset, items=items))
        db = data.open_index(corpus.dataset, bundle_dir, encoder_sha, bench_config(), home() / "bench")[0]
        r, x = T.label_corpus(corpus, db, bundle_dir, config, cached)
        rows += r
        xs.append(x)
    group = {q.id: q.group for c in corpora for q in c.dataset.items}
    articles = sorted({group[r["id"]] for r in rows if r["dataset"] == "squad"}, key=_digest)
    fold = {a: i % len(HOTPOT_FOLDS) for i, a in enumerate(articles)}
    folds = [HOTPOT_FOLDS.index(splits.hotpot_bucket(r["id"])) if r["dataset"] == "hotpotqa" else fold[group[r["id"]]]
             for r in rows]
    y = [TIERS.index(t) if (t := label(r["served"])) else -1 for r in rows]
    return _labelled(np.vstack(xs), y, [r["dataset"] for r in rows], folds)


def alone_rows(bundle_dir: Path, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same, for the answerable HotpotQA questions of ``part`` over a corpus of their own paragraphs alone."""
    config, encoder_sha = T.label_config(), _encoder_sha(bundle_dir)
    ds = pooled_alone(data.FILES["hotpotqa"], part, home() / "bench")
    db = data.open_index(ds, bundle_dir, encoder_sha, bench_config(), home() / "bench")[0]
    items = [q for q in ds.items if q.answers and not q.is_impossible]
    rags = open_tiers(db, bundle_dir, config)
    try:
        y = [TIERS.index(t) if (t := label(tier_contexts(rags, q)[0])) else -1 for q in items]
        x = np.array([T.route_features(rags[TIERS[0]], q.question) for q in items], np.float32)
    finally:
        for rag in rags.values():
            rag.close()
    return _labelled(x, y, [ALONE] * len(items), [HOTPOT_FOLDS.index(splits.hotpot_bucket(q.id)) for q in items])


def cross_validate(x: np.ndarray, y: np.ndarray, cond: np.ndarray, fold: np.ndarray, width: int, epochs: int,
                   seeds: list[int]) -> dict:
    """Held-out accuracy per condition at the last epoch, averaged over ``seeds``; pooled-alone rows never train."""
    x = x[:, x.shape[1] - len(PROFILE):][:, :width]
    acc = {c: [] for c in np.unique(cond)}
    for seed in seeds:
        right = dict.fromkeys(acc, 0.0)
        for k in range(len(HOTPOT_FOLDS)):
            fit, held = (fold != k) & (cond != ALONE), fold == k
            t = [torch.from_numpy(a) for a in (x[fit], y[fit], x[held], y[held])]
            _, history = T.train(*t, epochs=epochs, seed=seed, weighted=False, source=cond[fit], source_val=cond[held])
            for c, a in history["val_acc_by"][epochs - 1].items():
                right[c] += a * np.sum(cond[held] == c)
        for c in acc:
            acc[c].append(right[c] / np.sum(cond == c))
    return {"columns": list(PROFILE[:width]), **{c: round(float(np.mean(a)), 3) for c, a in acc.items()},
            "n": {str(c): int(np.sum(cond == c)) for c in acc}}


def _labelled(x: np.ndarray, y: list[int], cond: list[str], fold: list[int]) -> tuple[np.ndarray, ...]:
    keep = np.array(y) >= 0
    return x[keep], np.array(y)[keep], np.array(cond)[keep], np.array(fold)[keep]


def _encoder_sha(bundle_dir: Path) -> str:
    return B.Bundle.load(bundle_dir).sha256(B.ROLE_ENCODER)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.router_cv", description=__doc__.splitlines()[0])
    p.add_argument("--widths", default=f"10,{len(PROFILE)}", help="profile prefixes to compare (10: issue #42's first)")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    bundle_dir = Path(default_bundle())
    parts = [fit_rows(bundle_dir), alone_rows(bundle_dir, "reader_train"), alone_rows(bundle_dir, "reader_val")]
    x, y, cond, fold = (np.concatenate([part[i] for part in parts]) for i in range(4))
    seeds = [int(s) for s in args.seeds.split(",")]
    return emit({f"width {w}": cross_validate(x, y, cond, fold, int(w), args.epochs, seeds)
                 for w in args.widths.split(",")}, args.out)


if __name__ == "__main__":
    main()
