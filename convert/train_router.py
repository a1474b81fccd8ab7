"""Train the tier router on context labels and ship it as ``edge_rag/assets/router.onnx``.

``python -m convert train-router [--squad PATH] [--squad-train PATH] [--hotpot PATH] [--out DIR]
[--labels FILE] [--epochs 60] [--seed 0] [--bundle DIR] [--inputs profile] [--cv 5] [--agreement N]
[--floors 0,0.4,...]``

1. Split: the project's one split file, ``edge_rag/assets/splits.json``. Router train = its reader_train part
   (the 10 SQuAD-2 train-file articles, 4 dev articles, HotpotQA buckets 2-3), router val = reader_val
   (Imperialism, bucket 4: model selection), test = test (Steam engine, European Union law, bucket 0: the
   questions ``make bench`` reports on, used here only for the figures). The calibration part stays
   reserved for the certified threshold. Every part is article-disjoint (SQuAD) / bucket-disjoint (HotpotQA)
   from the others. Only answerable questions are labelled: an unanswerable one has no gold answer to find.
2. Corpora: as the benchmark, one pooled index per data file (every context, sentence passages), kept in
   the benchmark's index cache, so labels are made on the store the benchmark measures.
3. Labels (``evaluation.tiers``): each question goes through ``decide()`` of the benchmark's ``full`` system
   at EASY, MEDIUM and HARD — the same retrieval, rerank, correction and compression, no generation, a few
   ms each — and the label is the cheapest tier whose context serves it. A question no tier serves is left
   out of training and of the accuracy (more budget cannot help it). Labels are cached in
   ``router_labels.csv`` beside the report, keyed by the encoder, the Config and the data files.
4. Features (``edge_rag.retrieval.route.features``): ``encode_one`` and ``store.search(search_width)``, the calls the
   pipeline makes, so training and run time see the same numbers. The router reads the retrieval profile
   (``--inputs profile``); ``--cv K`` measures why: article-grouped K-fold cross-validation over train + val
   (SQuAD folds never split an article, HotpotQA folds keep buckets whole) for each input layout. The val
   part is one article and one bucket, too few questions to compare layouts on; the folds hold 18 groups.
5. Train RouterMLP (AdamW lr 1e-3, wd 1e-4, batch 64, inputs standardised on train), each row weighted so
   every dataset (SQuAD, HotpotQA) weighs alike, with and without class weights w_c = N / (C·N_c); the epoch
   and weighting with the best val accuracy averaged over the datasets are kept (issue #42: unweighted, 4,381
   SQuAD labels against 64 HotpotQA ones taught the router SQuAD's rule, and it sent multi-hop questions to k = 1).
6. Report: test accuracy on genuine labels beside the majority class, per-class recall, confusion matrix,
   the router's tier mix on every test question; ``--agreement N`` also generates answers for N val
   questions at every tier and reports how the context label agrees with generated correctness;
   ``--floors`` lists val serve rates and context sizes per compression floor (how the floor was chosen).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import sys
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from benchmarks import data, splits
from benchmarks.systems import bench_config, preset
from convert.args import at_least, existing_file
from convert.router import RouterError, RouterMLP, export_router
from edge_rag.config import TIERS, Config
from edge_rag.models import bundle as B
from edge_rag.models.registry import ROUTER_ASSET, default_bundle, home
from edge_rag.pipeline import EdgeRAG, check_question
from edge_rag.retrieval import retrieve
from edge_rag.retrieval.route import PROFILE, Router, columns, features, search_width
from edge_rag.storage.fileio import atomic_write_text
from evaluation.datasets import QAItem, load_hotpot, load_squad
from evaluation.metrics import best_em, best_f1
from evaluation.tiers import label, open_tiers, tier_contexts

ROUTER_PARTS = {"reader_train": "train", "reader_val": "val", "test": "test"}  # splits.json part → router part
LABEL_SYSTEM = "full"  # the benchmark system whose contexts are labelled (and whose cost the router sets)
LABELS_FILE = "router_labels.csv"
F1_CORRECT = 0.6  # generated answer "correct": EM or token F1 >= 0.6 (thesis rule; --agreement only)
INPUTS = ("profile", "embedding+profile")  # what the router reads of a features row; the shipped one first

# -- training (thesis §2.5.3)
LR = 1e-3
WEIGHT_DECAY = 1e-4
BATCH = 64


@dataclass(frozen=True)
class Corpus:
    """One data file: its pooled corpus and the answerable questions of the router's parts in it."""

    name: str
    dataset: data.Dataset
    parts: dict[str, str]  # question id → router part


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- split ---------------------------------------------------------------------------------------
def router_part(item: QAItem, train_file: bool) -> str | None:
    """train / val / test for an answerable question of a router part; None otherwise (unanswerable,
    calibration, or an article no split names). Every train-file question is reader_train."""
    if not item.answers or item.is_impossible:
        return None
    return "train" if train_file else ROUTER_PARTS.get(splits.part_of(item))


def load_corpora(squad: Path, squad_train: Path, hotpot: Path) -> list[Corpus]:
    corpora = []
    for name, path, loader, train_file in (("squad", squad, load_squad, False),
                                           ("squad_train", squad_train, load_squad, True),
                                           ("hotpotqa", hotpot, load_hotpot, False)):
        docs, items = loader(path)
        parts = {q.id: p for q in items if (p := router_part(q, train_file))}
        kept = [q for q in items if q.id in parts]
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        corpora.append(Corpus(name, data.Dataset(name, path, sha, docs, kept, "router"), parts))
    return corpora


# -- labels --------------------------------------------------------------------------------------
def label_config() -> Config:
    """The benchmark's ``full`` system: what the router's tiers cost is measured on."""
    return preset(bench_config(), LABEL_SYSTEM)


# Config fields that only shape the answer decision or the run (the labelled ``full`` system has cgr off and
# generates nothing): a change to them keeps the cached labels. Every other field, new ones too, is in the key.
ANSWER_ONLY_FIELDS = frozenset({
    "certified", "reader", "max_error_rate", "delta", "reader_passages", "reader_window", "refuse_distance",
    "gpt_distance", "rag_confidence", "gate", "gate_delta", "gate_threshold", "azuma_c", "top_k", "temperature",
    "repeat_ngram", "repeat_window", "n_ctx", "seed", "cache_size", "persistent_cache", "memory_budget_mb",
    "rss_per_stage", "threads", "index_threads"})


def settings_key(encoder_sha: str, config: Config, corpora: list[Corpus]) -> str:
    """What a label depends on: the encoder, the Config fields that shape contexts (tiers, floor, stages,
    retrieval), the data files."""
    files = ",".join(c.dataset.sha256 for c in corpora)
    shaping = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in ANSWER_ONLY_FIELDS}
    return _digest(f"{encoder_sha}|{shaping!r}|{files}")[:16]


def read_labels(path: Path, key: str) -> dict[str, dict]:
    """Cached rows by question id; empty when the file was made with other settings."""
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != f"# settings {key}":
        return {}
    rows = {}
    for line in lines[2:]:
        qid, part, dataset, served, *chars = line.split(",")
        rows[qid] = {"id": qid, "part": part, "dataset": dataset, "served": [c == "1" for c in served],
                     "chars": [int(c) for c in chars]}
    return rows


def write_labels(path: Path, key: str, rows: list[dict]) -> None:
    """One line per question: id, part, dataset, served per tier (e.g. 011), context chars per tier."""
    lines = [f"# settings {key}", "id,part,dataset,served," + ",".join(f"chars_{t.value.lower()}" for t in TIERS)]
    lines += [",".join([r["id"], r["part"], r["dataset"], "".join("01"[s] for s in r["served"]),
                        *map(str, r["chars"])]) for r in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")  # whole or absent: half a file read back as wrong labels


def route_features(rag: EdgeRAG, question: str) -> np.ndarray:
    """The router's input row for ``question``, computed with the pipeline's own calls."""
    question = check_question(question)
    vector = rag.encoder.encode_one(question)
    return features(vector, question, retrieve.search(rag.store, vector, question, search_width(rag.config),
                                                      rag.config).passages)


def label_corpus(corpus: Corpus, db: Path, bundle_dir: Path, config: Config,
                 cached: dict[str, dict]) -> tuple[list[dict], np.ndarray]:
    """Label rows (from the cache when there) and feature rows of the corpus's questions, in file order. Only the
    first tier is opened (the features' search) when every question is in the cache."""
    to_label = any(q.id not in cached for q in corpus.dataset.items)
    rags = open_tiers(db, bundle_dir, config, TIERS if to_label else TIERS[:1])
    rows, x = [], []
    try:
        for q in tqdm(corpus.dataset.items, desc=f"labels {corpus.name}", unit="q"):
            row = cached.get(q.id)
            if row is None:
                served, chars = tier_contexts(rags, q)
                row = {"id": q.id, "part": corpus.parts[q.id], "dataset": q.dataset, "served": served, "chars": chars}
            rows.append(row)
            x.append(route_features(rags[TIERS[0]], q.question))
    finally:
        for rag in rags.values():
            rag.close()
    return rows, np.array(x, dtype=np.float32).reshape(len(rows), -1)


def floor_table(corpora: list[Corpus], dbs: dict[str, Path], bundle_dir: Path, config: Config,
                floors: list[float]) -> list[dict]:
    """Per compression floor, on the val part: share of questions each tier serves, mean context chars."""
    table = []
    for floor in floors:
        served, chars = [], []
        for corpus in corpora:
            val = [q for q in corpus.dataset.items if corpus.parts[q.id] == "val"]
            if not val:
                continue
            rags = open_tiers(dbs[corpus.name], bundle_dir, config.with_(compression_floor=floor))
            try:
                for q in val:
                    s, c = tier_contexts(rags, q)
                    served.append(s)
                    chars.append(c)
            finally:
                for rag in rags.values():
                    rag.close()
        s, c = np.array(served, float), np.array(chars, float)
        table.append({"floor": floor, "n": len(served),
                      **{f"served {t.value}": round(float(s[:, i].mean()), 3) for i, t in enumerate(TIERS)},
                      **{f"chars {t.value}": round(float(c[:, i].mean())) for i, t in enumerate(TIERS)},
                      "served by any": round(float(s.max(1).mean()), 3)})
    return table


def is_correct(answer: str | None, golds: list[str]) -> bool:
    return bool(answer) and (best_em(answer, golds) == 1.0 or best_f1(answer, golds) >= F1_CORRECT)


def agreement(corpora: list[Corpus], dbs: dict[str, Path], bundle_dir: Path, config: Config,
              rows: dict[str, dict], n: int, seed: int) -> dict:
    """Generate at every tier for ``n`` val questions (seeded order) and compare generated correctness with
    the context label: per tier a 2x2 table, and how often the two labelling rules pick the same tier."""
    val = sorted(((c, q) for c in corpora for q in c.dataset.items if c.parts[q.id] == "val"),
                 key=lambda cq: _digest(f"{seed}:{cq[1].id}"))[:n]
    correct: dict[str, list[bool]] = {q.id: [] for _, q in val}
    for tier in TIERS:
        for corpus in corpora:
            mine = [q for c, q in val if c is corpus]
            if not mine:
                continue
            with EdgeRAG(dbs[corpus.name], bundle=bundle_dir, config=config.with_(tier_override=tier)) as rag:
                for q in tqdm(mine, desc=f"agreement {corpus.name}/{tier.value}", unit="q"):
                    correct[q.id].append(is_correct(rag.ask(q.question).answer, q.answers))
    per_tier = {}
    for i, tier in enumerate(TIERS):
        pairs = Counter((rows[qid]["served"][i], ok[i]) for qid, ok in correct.items())
        per_tier[tier.value] = {"served & correct": pairs[(True, True)], "served & wrong": pairs[(True, False)],
                                "not served & correct": pairs[(False, True)], "not served & wrong": pairs[(False, False)],
                                "agreement": round((pairs[(True, True)] + pairs[(False, False)]) / len(correct), 3)}
    same = [label(rows[qid]["served"]) == label(ok) for qid, ok in correct.items()]
    both = [qid for qid, ok in correct.items() if label(ok) and label(rows[qid]["served"])]
    return {"n": len(correct), "per_tier": per_tier, "same_label": round(float(np.mean(same)), 3),
            "generation_labelled": sum(label(ok) is not None for ok in correct.values()),
            "context_labelled": sum(label(rows[qid]["served"]) is not None for qid in correct),
            "both_labelled_same": sum(label(rows[q]["served"]) == label(correct[q]) for q in both), "both": len(both)}


# -- training ------------------------------------------------------------------------------------
def class_weights(y: torch.Tensor, n_classes: int = len(TIERS)) -> torch.Tensor:
    """w_c = N / (C·N_c): rare tiers weigh more (absent class → N/C)."""
    counts = torch.bincount(y, minlength=n_classes).float().clamp(min=1)
    return len(y) / (n_classes * counts)


def dataset_weights(source: np.ndarray) -> torch.Tensor:
    """Per row w_d = N / (D·N_d): every dataset weighs as much as the others in the loss. Unweighted, the 4,381
    SQuAD labels drowned the 64 HotpotQA ones and the router learnt SQuAD's rule (a strong first match is EASY),
    which sends multi-hop questions, whose first hop matches as strongly, to k = 1."""
    names, index, counts = np.unique(source, return_inverse=True, return_counts=True)
    return torch.from_numpy(len(source) / (len(names) * counts[index])).float()


def accuracies(pred: torch.Tensor, y: torch.Tensor, source: np.ndarray | None) -> dict[str, float]:
    """Accuracy per dataset of ``source`` (each row's), or of all rows under "" when None."""
    right = (pred == y).float().numpy()
    if source is None:
        return {"": float(right.mean())}
    return {str(d): float(right[source == d].mean()) for d in np.unique(source)}


def train(x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
          epochs: int = 60, seed: int = 0, weighted: bool = True, source: np.ndarray | None = None,
          source_val: np.ndarray | None = None) -> tuple[RouterMLP, dict]:
    """AdamW on cross-entropy weighted per row (tier: ``weighted``; dataset: ``source``, each row's dataset);
    returns the model of the epoch with the best val accuracy (averaged over ``source_val``'s datasets).
    One thread: for a 100k-parameter MLP more only contend (10 s vs 1.3 s an epoch beside a busy job)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)
    model = RouterMLP(in_dim=x.shape[1])
    model.standardise(x)
    w = dataset_weights(source) if source is not None else torch.ones(len(y))
    w_val = dataset_weights(source_val) if source_val is not None else torch.ones(len(y_val))
    if weighted:
        tiers = class_weights(y)
        w, w_val = w * tiers[y], w_val * tiers[y_val]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (nn.functional.cross_entropy(logits, target, reduction="none") * weight).sum() / weight.sum()

    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    history: dict = {"train_loss": [], "val_loss": [], "val_acc": [], "val_acc_by": [], "weighted": weighted}
    best_acc, best_state, best_epoch = -1.0, None, 0
    for epoch in range(epochs):
        model.train()
        total = 0.0
        for idx in torch.randperm(len(y), generator=order).split(BATCH):
            loss = loss_fn(model(x[idx]), y[idx], w[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
        by = accuracies(logits.argmax(1), y_val, source_val)
        acc = float(np.mean(list(by.values())))  # over datasets: val holds 168 SQuAD and 28 HotpotQA labels
        history["train_loss"].append(total / len(y))
        history["val_loss"].append(loss_fn(logits, y_val, w_val).item())
        history["val_acc"].append(acc)
        history["val_acc_by"].append(by)
        if acc > best_acc:
            best_acc, best_state, best_epoch = acc, copy.deepcopy(model.state_dict()), epoch + 1
    model.load_state_dict(best_state)
    history["best_epoch"] = best_epoch
    return model.eval(), history


def select(x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, epochs: int,
           seed: int, source: np.ndarray | None = None,
           source_val: np.ndarray | None = None) -> tuple[RouterMLP, dict, dict[str, float]]:
    """Train with and without class weights; keep the one with the better val accuracy."""
    runs = {w: train(x, y, x_val, y_val, epochs, seed, w, source, source_val) for w in (True, False)}
    scores = {("weighted" if w else "unweighted"): max(h["val_acc"]) for w, (_, h) in runs.items()}
    best = max(runs, key=lambda w: (max(runs[w][1]["val_acc"]), w))
    return *runs[best], scores


def evaluate(pred: np.ndarray, y: np.ndarray, y_train: np.ndarray) -> dict:
    """Accuracy beside the training set's majority class, per-class recall, confusion (rows = label)."""
    n = len(TIERS)
    confusion = np.zeros((n, n), dtype=int)
    for t, p in zip(y, pred):
        confusion[t, p] += 1
    majority = int(np.bincount(y_train, minlength=n).argmax())
    recall = {t.value: float(confusion[i, i] / confusion[i].sum()) if confusion[i].sum() else None
              for i, t in enumerate(TIERS)}
    return {
        "n": int(len(y)),
        "accuracy": float(np.mean(pred == y)) if len(y) else None,
        "majority_class": TIERS[majority].value,
        "majority_accuracy": float(np.mean(y == majority)) if len(y) else None,
        "balanced_accuracy": float(np.mean([r for r in recall.values() if r is not None])),
        "recall": recall,
        "confusion": confusion.tolist(),
    }


def input_columns(inputs: str, row_width: int) -> slice:
    """The columns of a features row the router reads: the profile alone, or the embedding too."""
    if inputs not in INPUTS:
        raise ValueError(f"unknown router inputs {inputs!r}; choose from {', '.join(INPUTS)}")
    return columns(len(PROFILE) if inputs == "profile" else row_width, row_width)


def cross_validate(x: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int, epochs: int,
                   seed: int, source: np.ndarray | None = None) -> dict:
    """Article-grouped K-fold accuracy per epoch (unweighted by tier, every fold's questions pooled; rows weighted
    by ``source``, their dataset, as in training): how the router does on articles it never saw, measured on many
    more of them than val holds; with ``source`` also per dataset (at the pooled best epoch)."""
    source = source if source is not None else np.full(len(y), "")
    correct, n = {d: np.zeros(epochs) for d in np.unique(source)}, 0
    names = np.unique(groups)
    fold_of = {g: i % folds for i, g in enumerate(sorted(names, key=lambda g: _digest(f"{seed}:{g}")))}
    fold = np.array([fold_of[g] for g in groups])
    for k in range(folds):
        held = fold == k
        t = [torch.from_numpy(a) for a in (x[~held], y[~held], x[held], y[held])]
        _, history = train(*t, epochs=epochs, seed=seed, weighted=False, source=source[~held], source_val=source[held])
        for d in np.unique(source[held]):
            correct[d] += np.array([by[str(d)] for by in history["val_acc_by"]]) * np.sum(source[held] == d)
        n += int(held.sum())
    acc = sum(correct.values()) / n
    best = int(acc.argmax())
    return {"n": n, "groups": len(names), "folds": folds, "majority_accuracy": float(np.mean(y == np.bincount(y).argmax())),
            "best": float(acc[best]), "best_epoch": best + 1, "last": float(acc[-1]),
            **({f"best {d}": float(c[best] / np.sum(source == d)) for d, c in correct.items()} if len(correct) > 1 else {})}


# -- the whole run -------------------------------------------------------------------------------
def train_router(squad: Path, squad_train: Path, hotpot: Path, out: Path, labels: Path | None = None,
                 bundle_dir: Path | None = None, epochs: int = 60, seed: int = 0, agreement_n: int = 0,
                 floors: tuple[float, ...] = (), config: Config | None = None, inputs: str = INPUTS[0],
                 cv_folds: int = 0) -> dict:
    """Split, index, label, train, select, export, report; returns the report dict."""
    from convert.router_report import write_report  # matplotlib: only when a report is written

    config = config or label_config()
    bundle_dir = Path(bundle_dir or default_bundle())
    labels = Path(labels or out / LABELS_FILE)
    out.mkdir(parents=True, exist_ok=True)
    corpora = load_corpora(squad, squad_train, hotpot)
    encoder_sha = B.Bundle.load(bundle_dir).sha256(B.ROLE_ENCODER)
    key = settings_key(encoder_sha, config, corpora)
    cached = read_labels(labels, key)
    dbs = {c.name: data.open_index(c.dataset, bundle_dir, encoder_sha, bench_config(), home() / "bench")[0]
           for c in corpora}
    rows, xs = [], []
    for corpus in corpora:
        r, x = label_corpus(corpus, dbs[corpus.name], bundle_dir, config, cached)
        rows += r
        xs.append(x)
    x_all = np.vstack(xs)
    write_labels(labels, key, rows)
    by_id = {r["id"]: r for r in rows}

    y_all = np.array([TIERS.index(t) if (t := label(r["served"])) else -1 for r in rows])
    part = np.array([r["part"] for r in rows])
    source = np.array([r["dataset"] for r in rows])  # training weighs each dataset alike (dataset_weights)
    pick = {p: (part == p) & (y_all >= 0) for p in ("train", "val", "test")}
    if not pick["train"].any() or not pick["val"].any():
        raise SystemExit(f"too few labelled questions: {pick['train'].sum()} train, {pick['val'].sum()} val")
    cols = input_columns(inputs, x_all.shape[1])
    t = {p: (torch.from_numpy(x_all[m][:, cols]), torch.from_numpy(y_all[m])) for p, m in pick.items()}
    model, history, selection = select(*t["train"], *t["val"], epochs, seed, source[pick["train"]],
                                       source[pick["val"]])
    onnx_path = out / ROUTER_ASSET.name
    parity = export_router(model, onnx_path, seed=seed, replace_failed=False)  # the shipped router: only a passing one

    # the shipped artefact through the runtime's Router: genuine-label accuracy on val and test
    router = Router(onnx_path)
    picks = router.logits(x_all).argmax(1)
    cv = {}
    if cv_folds:
        fit = pick["train"] | pick["val"]
        groups = cv_groups(rows, corpora)[fit]
        cv = {layout: cross_validate(x_all[fit][:, input_columns(layout, x_all.shape[1])], y_all[fit], groups,
                                     cv_folds, epochs, seed, source[fit]) for layout in INPUTS}
    metrics = {p: evaluate(picks[pick[p]], y_all[pick[p]], y_all[pick["train"]]) for p in ("val", "test")}
    for dataset in sorted(set(source)):
        m = pick["test"] & (source == dataset)
        metrics[f"test {dataset}"] = evaluate(picks[m], y_all[m], y_all[pick["train"]])
    report = {
        "bundle": str(bundle_dir), "settings_key": key, "config": repr(config), "seed": seed, "epochs": epochs,
        "inputs": inputs, "cv": cv,
        "labels": label_stats(rows), "labels_file": str(labels), "selection": selection, "history": history,
        "metrics": metrics, "test_mix": bench_mix(corpora, dbs, bundle_dir, config, router),
        "onnx": str(onnx_path), "parity": parity,
        "floors": floor_table(corpora, dbs, bundle_dir, config, list(floors)) if floors else [],
        "agreement": agreement(corpora, dbs, bundle_dir, config, by_id, agreement_n, seed) if agreement_n else None,
    }
    write_report(out, report)
    m = metrics["test"]
    print(f"test accuracy {m['accuracy']:.3f} (majority {m['majority_accuracy']:.3f}, n={m['n']});"
          f" report: {out / 'router_report.md'}")
    return report


def cv_groups(rows: list[dict], corpora: list[Corpus]) -> np.ndarray:
    """Each row's cross-validation group: its SQuAD article, or its HotpotQA bucket."""
    article = {q.id: q.group for c in corpora for q in c.dataset.items}
    return np.array([f"hotpotqa {splits.hotpot_bucket(r['id'])}" if r["dataset"] == "hotpotqa" else article[r["id"]]
                     for r in rows])


def label_stats(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per router part and dataset: questions per label, and how many no tier serves."""
    stats: dict[str, dict[str, int]] = {}
    for r in rows:
        t = label(r["served"])
        s = stats.setdefault(f"{r['part']} {r['dataset']}", {**{x.value: 0 for x in TIERS}, "none": 0})
        s[t.value if t else "none"] += 1
    return dict(sorted(stats.items()))


def bench_mix(corpora: list[Corpus], dbs: dict[str, Path], bundle_dir: Path, config: Config,
             router: Router) -> dict[str, dict]:
    """The router's tier shares on every test question of the dev files (unanswerable ones too: the
    benchmark asks them), with the mean context chars of the ``full`` system's tiers there."""
    mix = {}
    for corpus in corpora:
        if corpus.name not in data.LOADERS:  # the SQuAD-2 train file holds no test questions
            continue
        test = splits.select(data.LOADERS[corpus.name](corpus.dataset.path)[1], "test")
        if not test:
            continue
        with EdgeRAG(dbs[corpus.name], bundle=bundle_dir, config=config) as rag:
            x = np.array([route_features(rag, q.question) for q in test], dtype=np.float32)
        tiers = Counter(TIERS[i].value for i in router.logits(x).argmax(1))
        mix[corpus.name] = {"n": len(test), **{t.value: round(tiers[t.value] / len(test), 3) for t in TIERS}}
    return mix


def folds(text: str) -> int:
    """--cv K: 0 (none) or at least 2 folds, checked when parsed (--cv 1 held every question out and divided by
    zero; --epochs 0 kept no epoch: both only after the labelling, the slow part)."""
    k = at_least(0)(text)
    if k == 1:
        raise argparse.ArgumentTypeError("1 fold trains on nothing: 0 (no cross-validation) or at least 2")
    return int(k)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-router",
        help="label questions by the tier whose context serves them, train the router MLP, export router.onnx",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--squad", type=existing_file, default=data.FILES["squad"], help="SQuAD-2 dev file (every split part)")
    p.add_argument("--squad-train", type=existing_file, default=data.DATA_DIR / "squad2_train_subset.json",
                   help="SQuAD-2 train file (the router train part's train-file articles)")
    p.add_argument("--hotpot", type=existing_file, default=data.FILES["hotpotqa"], help="HotpotQA dev file")
    p.add_argument("--out", type=Path, default=ROUTER_ASSET.parent, help="router.onnx, report, label cache")
    p.add_argument("--labels", type=Path, help=f"label cache (default <out>/{LABELS_FILE})")
    p.add_argument("--epochs", type=at_least(1), default=60, help="training epochs (the best on val is kept)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch order")
    p.add_argument("--bundle", type=Path, help="model bundle (default: the gemma profile's)")
    p.add_argument("--agreement", type=at_least(0), default=0, metavar="N",
                   help="generate for N val questions at every tier and compare with the context labels")
    p.add_argument("--inputs", choices=INPUTS, default=INPUTS[0], help="what of a features row the router reads")
    p.add_argument("--cv", type=folds, default=0, metavar="K",
                   help="also report article-grouped K-fold accuracy on train + val for every input layout")
    p.add_argument("--floors", type=lambda s: tuple(float(f) for f in s.split(",") if f), default=(),
                   help="comma-separated compression floors to tabulate on val (how the default was chosen)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        train_router(args.squad, args.squad_train, args.hotpot, args.out, args.labels, args.bundle,
                     args.epochs, args.seed, args.agreement, args.floors, inputs=args.inputs, cv_folds=args.cv)
    except RouterError as exc:  # the export failed its check: nothing of this run was shipped, the report neither
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
