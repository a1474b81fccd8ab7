"""Train the tier router on oracle labels (thesis §4.3.2, §5.1.4) and ship it as ``edge_rag/assets/router.onnx``.

``python -m convert train-router [--squad PATH] [--hotpot PATH] [--out DIR] [--labels FILE] [--limit N]
[--epochs 60] [--seed 0] [--bundle DIR]``

1. Split. The benchmark part is never trained on: all questions of 2 of the SQuAD articles (the two
   whose titles hash lowest) and the HotpotQA questions whose hashed id is 0 mod 5 (~20%). Both rules
   ignore the seed, so every run and every benchmark sees the same part. The rest (answerable
   questions only) is put in a seeded hash order, cut to ``--limit``, and split 85/15 into train/val
   per dataset. Val shares SQuAD articles with train; the benchmark part does not. Ids: ``split.json``.
2. Corpus. All contexts of both files (deduplicated by doc_id) are indexed once, with the default
   Config (sentence passages), into ``$EDGE_RAG_HOME/router/db-<corpus hash>``: one open corpus.
3. Oracle labels. Each training question runs through the real pipeline at EASY, MEDIUM, HARD
   (``Config(temperature=0, tier_override=tier)``) in cost order until one is correct (EM = 1 or token
   F1 >= 0.6 against any gold answer; a refusal is wrong); label = cheapest correct tier, else HotpotQA
   → HARD, single-hop → MEDIUM. Labels are appended to a JSONL keyed by question id and a hash of the
   bundle's encoder/generator sha256, the Config repr and the corpus, so re-training never re-generates.
4. Train RouterMLP on the questions' embeddings: class-weighted cross-entropy w_c = N / (C·N_c),
   AdamW (lr 1e-3, wd 1e-4), batch 64; keep the epoch with the best val accuracy.
5. Export with ``convert.router.export_router`` (parity report beside it) and write
   ``router_report.{md,json}`` + PNGs: labels, val accuracy vs the majority class, per-class recall,
   confusion matrix, and the router's tier mix on each dataset's benchmark part.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from convert.router import RouterMLP, export_router
from edge_rag import bundle as B
from edge_rag.config import TIERS, Config, Tier
from edge_rag.models import ROUTER_ASSET, default_bundle, home
from edge_rag.pipeline import EdgeRAG, check_question
from edge_rag.route import Router
from edge_rag.types import Answer, Document, Route
from evaluation.datasets import QAItem, load_hotpot, load_squad
from evaluation.metrics import best_em, best_f1

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"

# -- split
BENCH_SQUAD_ARTICLES = 2
BENCH_HOTPOT_EVERY = 5  # hashed id ≡ 0 (mod 5) → benchmark
VAL_FRACTION = 0.15
SPLIT_RULE = (f"benchmark = every question of the {BENCH_SQUAD_ARTICLES} SQuAD articles whose titles have the lowest"
              f" sha256, and HotpotQA ids with int(sha256(id), 16) % {BENCH_HOTPOT_EVERY} == 0; the rest (answerable"
              f" only) is ordered by sha256(f'{{seed}}:{{id}}'), cut to the limit, and {VAL_FRACTION:.0%} of each dataset goes to val")

# -- oracle
F1_CORRECT = 0.6
FALLBACK = {"hotpotqa": Tier.HARD}  # none correct: multi-hop → HARD, single-hop (default) → MEDIUM
LABEL_CONFIG = Config(temperature=0.0)

# -- training (thesis §2.5.3)
LR = 1e-3
WEIGHT_DECAY = 1e-4
BATCH = 64

AskAt = Callable[[Tier, str], Answer]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- split ---------------------------------------------------------------------------------------
def benchmark_articles(items: list[QAItem]) -> set[str]:
    """The SQuAD articles held out whole: the ones whose titles hash lowest (seed-independent)."""
    titles = sorted({q.group for q in items if q.dataset == "squad"}, key=_digest)
    return set(titles[:BENCH_SQUAD_ARTICLES])


def rank(item: QAItem, seed: int) -> str:
    """Seeded order of the train/val pool. Labelling follows it too, so the labels of an interrupted run
    are exactly the ones a later ``--limit`` run needs."""
    return _digest(f"{seed}:{item.id}")


def split(items: list[QAItem], seed: int = 0, limit: int | None = None) -> dict[str, list[QAItem]]:
    """benchmark / train / val parts; see the module docstring for the rule."""
    articles = benchmark_articles(items)

    def held_out(q: QAItem) -> bool:
        if q.dataset == "squad":
            return q.group in articles
        return int(_digest(q.id), 16) % BENCH_HOTPOT_EVERY == 0

    pool = sorted((q for q in items if not held_out(q) and q.answers and not q.is_impossible),
                  key=lambda q: rank(q, seed))[:limit]
    parts: dict[str, list[QAItem]] = {"benchmark": [q for q in items if held_out(q)], "train": [], "val": []}
    for dataset in sorted({q.dataset for q in pool}):
        subset = [q for q in pool if q.dataset == dataset]
        n_val = round(VAL_FRACTION * len(subset))
        parts["val"] += subset[:n_val]
        parts["train"] += subset[n_val:]
    return parts


# -- oracle labels -------------------------------------------------------------------------------
def is_correct(answer: Answer, golds: list[str]) -> bool:
    """Thesis rule: EM or token F1 >= 0.6 against any gold answer. A refusal is never correct."""
    if answer.route is Route.REFUSE or not answer.answer:
        return False
    return best_em(answer.answer, golds) == 1.0 or best_f1(answer.answer, golds) >= F1_CORRECT


def oracle_label(item: QAItem, ask_at: AskAt) -> dict:
    """Run the tiers in cost order and stop at the first correct one (the cheapest correct tier)."""
    tries = []
    for tier in TIERS:
        answer = ask_at(tier, item.question)
        ok = is_correct(answer, item.answers)
        tries.append({"tier": tier.value, "route": answer.route.value, "answer": answer.answer,
                      "f1": round(best_f1(answer.answer, item.answers), 3), "correct": ok})
        if ok:
            return {"label": tier.value, "oracle": True, "tries": tries}
    return {"label": FALLBACK.get(item.dataset, Tier.MEDIUM).value, "oracle": False, "tries": tries}


def read_labels(path: Path, key: str) -> dict[str, dict]:
    """Cached labels computed with the same pipeline settings, by question id."""
    if not path.is_file():
        return {}
    rows = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {r["id"]: r for r in rows if r["key"] == key}


def label_items(items: list[QAItem], ask_at: AskAt, path: Path, key: str) -> list[dict]:
    """Labels for ``items``; only the ones missing from the cache run the pipeline (appended as they finish,
    so an interrupted run resumes where it stopped)."""
    done = read_labels(path, key)
    todo = [q for q in items if q.id not in done]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for q in tqdm(todo, desc="oracle labels", unit="q", disable=not todo):
            start = time.perf_counter()
            row = {"id": q.id, "key": key, "dataset": q.dataset, **oracle_label(q, ask_at)}
            row["seconds"] = round(time.perf_counter() - start, 3)
            f.write(json.dumps(row) + "\n")
            f.flush()
            done[q.id] = row
    return [done[q.id] for q in items]


def corpus_key(docs: list[Document], config: Config, encoder_sha: str) -> str:
    """What the passage store depends on: the documents, how they are chunked and indexed, the encoder."""
    c = config
    spec = f"{encoder_sha}|{c.passage_mode}|{c.min_sentence_chars}|{c.hnsw_m}|{c.hnsw_ef_construction}|"
    return _digest(spec + ",".join(sorted(d.doc_id for d in docs)))[:12]


def settings_key(shas: dict[str, str], config: Config, corpus: str) -> str:
    """What an oracle label depends on: encoder and generator weights, the Config, the corpus."""
    return _digest(f"{shas[B.ROLE_ENCODER]}|{shas[B.ROLE_GENERATOR]}|{config!r}|{corpus}")[:16]


def open_tiers(db: Path, bundle_dir: Path, docs: list[Document], config: Config) -> dict[Tier, EdgeRAG]:
    """One EdgeRAG per tier over one store folder; the first indexes the corpus (a no-op when done)."""
    rags: dict[Tier, EdgeRAG] = {}
    for tier in TIERS:
        rags[tier] = EdgeRAG(db, bundle=bundle_dir, config=config.with_(tier_override=tier))
        if tier is TIERS[0]:
            rags[tier].add_documents(docs, progress=True)
    return rags


# -- training ------------------------------------------------------------------------------------
def class_weights(y: torch.Tensor, n_classes: int = len(TIERS)) -> torch.Tensor:
    """w_c = N / (C·N_c): rare tiers weigh more, so the router does not ignore HARD (absent class → N/C)."""
    counts = torch.bincount(y, minlength=n_classes).float().clamp(min=1)
    return len(y) / (n_classes * counts)


def train(x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
          epochs: int = 60, seed: int = 0) -> tuple[RouterMLP, dict]:
    """Class-weighted AdamW training; returns the best-val-accuracy epoch's model and the curves."""
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)
    model = RouterMLP()
    loss_fn = nn.CrossEntropyLoss(weight=class_weights(y))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    history: dict[str, list[float]] = {"train_loss": [], "val_loss": [], "val_acc": []}
    best_acc, best_state, best_epoch = -1.0, None, 0
    for epoch in range(epochs):
        model.train()
        total = 0.0
        for idx in torch.randperm(len(y), generator=order).split(BATCH):
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
        acc = (logits.argmax(1) == y_val).float().mean().item()
        history["train_loss"].append(total / len(y))
        history["val_loss"].append(loss_fn(logits, y_val).item())
        history["val_acc"].append(acc)
        if acc > best_acc:
            best_acc, best_state, best_epoch = acc, copy.deepcopy(model.state_dict()), epoch + 1
    model.load_state_dict(best_state)
    history["best_epoch"] = best_epoch
    return model.eval(), history


def evaluate(model: RouterMLP, x_val: torch.Tensor, y_val: torch.Tensor, y_train: torch.Tensor) -> dict:
    """Val accuracy beside the majority-class baseline, per-class recall, confusion matrix (rows = oracle)."""
    with torch.no_grad():
        pred = model(x_val).argmax(1)
    n = len(TIERS)
    confusion = torch.zeros(n, n, dtype=torch.long)
    for t, p in zip(y_val.tolist(), pred.tolist()):
        confusion[t, p] += 1
    majority = int(torch.bincount(y_train, minlength=n).argmax())
    recall = {tier.value: (confusion[i, i] / confusion[i].sum()).item() if confusion[i].sum() else None
              for i, tier in enumerate(TIERS)}
    return {
        "val_accuracy": (pred == y_val).float().mean().item(),
        "majority_class": TIERS[majority].value,
        "majority_accuracy": (y_val == majority).float().mean().item(),
        "balanced_accuracy": float(np.mean([r for r in recall.values() if r is not None])),
        "recall": recall,
        "confusion": confusion.tolist(),
    }


# -- report --------------------------------------------------------------------------------------
def _counts(labels: list[str]) -> dict[str, int]:
    c = Counter(labels)
    return {t.value: c.get(t.value, 0) for t in TIERS}


def tier_mix(tiers: list[str], datasets: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Share of each tier per dataset, and the number of questions per dataset."""
    mix, n = {}, {}
    for dataset in sorted(set(datasets)):
        picked = [t for t, d in zip(tiers, datasets) if d == dataset]
        n[dataset] = len(picked)
        mix[dataset] = {t: c / len(picked) for t, c in _counts(picked).items()}
    return mix, n


def label_stats(rows: list[dict]) -> dict[str, dict]:
    """Per dataset: label counts, how many fell back (no tier correct), pipeline seconds spent."""
    stats = {}
    for dataset in sorted({r["dataset"] for r in rows}):
        subset = [r for r in rows if r["dataset"] == dataset]
        stats[dataset] = {**_counts([r["label"] for r in subset]),
                          "none correct (fallback)": sum(not r["oracle"] for r in subset),
                          "pipeline seconds": round(sum(r["seconds"] for r in subset), 1)}
    return stats


def _plots(out: Path, history: dict, metrics: dict, by_dataset: dict[str, dict[str, int]]) -> list[str]:
    """Training curves, val confusion matrix and per-dataset label bars; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [t.value for t in TIERS]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    epochs = range(1, len(history["train_loss"]) + 1)
    a.plot(epochs, history["train_loss"], label="train")
    a.plot(epochs, history["val_loss"], label="val")
    a.set(xlabel="epoch", ylabel="weighted cross-entropy", title="loss")
    a.legend()
    b.plot(epochs, history["val_acc"], label="router")
    b.axhline(metrics["majority_accuracy"], color="grey", ls="--", label=f"majority ({metrics['majority_class']})")
    b.axvline(history["best_epoch"], color="k", lw=0.5)
    b.set(xlabel="epoch", ylabel="accuracy", title="val accuracy", ylim=(0, 1))
    b.legend()
    fig.tight_layout()
    fig.savefig(out / "router_training.png", dpi=110)

    fig, ax = plt.subplots(figsize=(4.2, 3.8))
    ax.imshow(metrics["confusion"], cmap="Blues")
    for i, row in enumerate(metrics["confusion"]):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center")
    ax.set(xticks=range(3), yticks=range(3), xticklabels=names, yticklabels=names,
           xlabel="router", ylabel="oracle", title="val confusion")
    fig.tight_layout()
    fig.savefig(out / "router_confusion.png", dpi=110)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    width = 0.8 / max(1, len(by_dataset))
    for i, (dataset, counts) in enumerate(by_dataset.items()):
        ax.bar(np.arange(3) + i * width, [counts[n] for n in names], width, label=dataset)
    ax.set(xticks=np.arange(3) + width * (len(by_dataset) - 1) / 2, xticklabels=names, ylabel="questions",
           title="oracle labels")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "router_labels.png", dpi=110)
    plt.close("all")
    return ["router_training.png", "router_confusion.png", "router_labels.png"]


def _table(rows: dict[str, dict], columns: list[str]) -> str:
    head = "| | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    return head + "".join(f"| {name} | " + " | ".join(str(r.get(c, "")) for c in columns) + " |\n"
                          for name, r in rows.items())


def write_report(out: Path, report: dict, plots: list[str]) -> None:
    """router_report.json (every figure) and router_report.md (the same, readable)."""
    (out / "router_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    m, lab = report["metrics"], report["labels"]
    tiers = [t.value for t in TIERS]
    lines = [
        "# Router training report\n",
        f"Oracle labels from the real pipeline (bundle `{report['bundle']}`, settings key `{report['settings_key']}`),"
        f" {lab['total']} questions, {lab['overall']['pipeline seconds']:.0f} s of pipeline time"
        f" (EASY → MEDIUM → HARD, stopping at the first correct tier; cached in `{lab['file']}`).\n",
        "## Split\n",
        _table({k: {"questions": v} for k, v in report["split"].items() if isinstance(v, int)}, ["questions"]),
        f"\nBenchmark part (never trained on): SQuAD articles {', '.join(report['split']['benchmark_articles'])}"
        f" (all their questions) and HotpotQA ids with sha256 ≡ 0 (mod {BENCH_HOTPOT_EVERY}). Ids in `split.json`.\n",
        "## Oracle labels\n",
        _table({**lab["by_dataset"], "all": lab["overall"]}, tiers + ["none correct (fallback)", "pipeline seconds"]),
        "\nThesis reference: Easy 363 / Medium 637 / Hard 200 of 1,200.\n",
        "## Router (validation part)\n",
        f"- val accuracy **{m['val_accuracy']:.3f}** vs majority class ({m['majority_class']}) {m['majority_accuracy']:.3f};"
        f" balanced accuracy {m['balanced_accuracy']:.3f}; thesis ≈ 0.72",
        f"- best epoch {report['history']['best_epoch']} of {len(report['history']['val_acc'])} (its weights are kept,"
        f" so this accuracy is selected on val and slightly optimistic; last epoch {report['history']['val_acc'][-1]:.3f})",
        "- recall per class: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a"
                                           for k, v in m["recall"].items()),
        "\nConfusion (rows = oracle, columns = router):\n",
        _table({t: dict(zip(tiers, row)) for t, row in zip(tiers, m["confusion"])}, tiers),
        "\n## Router decisions on the benchmark part (all its questions; SQuAD includes unanswerable ones)\n",
        _table({d: {**{t: f"{v:.1%}" for t, v in mix.items()}, "questions": report["benchmark_n"][d]}
                for d, mix in report["benchmark_mix"].items()}, tiers + ["questions"]),
        f"\n## Export\n\n`{report['onnx']}`: {report['parity']['file_bytes']} bytes, ONNX vs torch max |Δ|"
        f" {report['parity']['max_abs_diff']:.2e} ({'PASS' if report['parity']['passed'] else 'FAIL'}).\n",
        *[f"![{p}]({p})" for p in plots],
    ]
    (out / "router_report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


# -- the whole run -------------------------------------------------------------------------------
def train_router(squad: Path, hotpot: Path, out: Path, labels: Path | None = None, bundle_dir: Path | None = None,
                 limit: int | None = None, epochs: int = 60, seed: int = 0, config: Config = LABEL_CONFIG) -> dict:
    """Split, index, label, train, export, report; returns the report dict. ``config`` is the labelling
    pipeline's (tests pass smaller generation budgets)."""
    bundle_dir = Path(bundle_dir or default_bundle())
    work = home() / "router"
    labels = Path(labels or work / "labels.jsonl")
    out.mkdir(parents=True, exist_ok=True)
    squad_docs, squad_items = load_squad(squad)
    hotpot_docs, hotpot_items = load_hotpot(hotpot)
    docs = list({d.doc_id: d for d in squad_docs + hotpot_docs}.values())
    parts = split(squad_items + hotpot_items, seed, limit)
    if not parts["train"] or not parts["val"]:
        raise SystemExit(f"too few questions to train: {len(parts['train'])} train, {len(parts['val'])} val")
    articles = sorted(benchmark_articles(squad_items))
    (out / "split.json").write_text(json.dumps({
        "rule": SPLIT_RULE, "seed": seed, "limit": limit, "benchmark_articles": articles,
        **{name: [q.id for q in part] for name, part in parts.items()},
    }, indent=1) + "\n", encoding="utf-8")

    shas = {f["role"]: f["sha256"] for f in B.Bundle.load(bundle_dir).files()}
    corpus = corpus_key(docs, config, shas[B.ROLE_ENCODER])
    key = settings_key(shas, config, corpus)
    labelled = sorted(parts["train"] + parts["val"], key=lambda q: rank(q, seed))
    rags = open_tiers(work / f"db-{corpus}", bundle_dir, docs, config)
    try:
        rows = label_items(labelled, lambda tier, q: rags[tier].ask(q), labels, key)
        encoder = rags[TIERS[0]].encoder
        x, x_val, x_bench = (torch.from_numpy(encoder.encode([check_question(q.question) for q in parts[name]]))
                             for name in ("train", "val", "benchmark"))
    finally:
        for rag in rags.values():
            rag.close()

    index = {r["id"]: TIERS.index(Tier(r["label"])) for r in rows}
    y, y_val = (torch.tensor([index[q.id] for q in parts[name]], dtype=torch.long) for name in ("train", "val"))
    model, history = train(x, y, x_val, y_val, epochs, seed)
    metrics = evaluate(model, x_val, y_val, y)
    onnx_path = out / ROUTER_ASSET.name
    parity = export_router(model, onnx_path, seed=seed)

    # the shipped artefact through the runtime's own Router, on questions it never saw
    picks = Router(onnx_path).logits(x_bench.numpy()).argmax(1) if parts["benchmark"] else []
    mix, bench_n = tier_mix([TIERS[int(i)].value for i in picks], [q.dataset for q in parts["benchmark"]])
    by_dataset = label_stats(rows)
    overall = {k: round(sum(d[k] for d in by_dataset.values()), 1) for k in next(iter(by_dataset.values()))}
    report = {
        "bundle": str(bundle_dir), "settings_key": key, "config": repr(config), "seed": seed, "epochs": epochs,
        "split": {**{name: len(part) for name, part in parts.items()}, "benchmark_articles": articles},
        "labels": {"total": len(rows), "overall": overall, "by_dataset": by_dataset, "file": str(labels)},
        "metrics": metrics, "history": history, "benchmark_mix": mix, "benchmark_n": bench_n,
        "onnx": str(onnx_path), "parity": parity,
    }
    write_report(out, report, _plots(out, history, metrics, by_dataset))
    print(f"val accuracy {metrics['val_accuracy']:.3f} (majority {metrics['majority_accuracy']:.3f});"
          f" report: {out / 'router_report.md'}")
    return report


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-router",
        help="oracle-label questions with the real pipeline, train the router MLP, export router.onnx",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--squad", type=Path, default=DATA / "squad2_dev_subset.json")
    p.add_argument("--hotpot", type=Path, default=DATA / "hotpotqa_dev_subset.jsonl")
    p.add_argument("--out", type=Path, default=ROUTER_ASSET.parent, help="router.onnx, report, split.json")
    p.add_argument("--labels", type=Path, help="label cache (default $EDGE_RAG_HOME/router/labels.jsonl)")
    p.add_argument("--limit", type=int, help="label at most N train/val questions (seeded sample)")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bundle", type=Path, help="model bundle (default: the gemma profile's)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    report = train_router(args.squad, args.hotpot, args.out, args.labels, args.bundle,
                          args.limit, args.epochs, args.seed)
    return 0 if report["parity"]["passed"] else 1
