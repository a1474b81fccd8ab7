"""router_report.{md,json} and its plots, from the dict ``convert.train_router.train_router`` builds."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge_rag.config import TIERS
from edge_rag.storage.fileio import atomic_write_text

NAMES = [t.value for t in TIERS]


def _table(rows: dict[str, dict], columns: list[str]) -> str:
    head = "| | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    return head + "".join(f"| {name} | " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |\n"
                          for name, r in rows.items())


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _plots(out: Path, report: dict) -> list[str]:
    """Training curves, test confusion matrix, labels per part; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history, test = report["history"], report["metrics"]["test"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    epochs = range(1, len(history["train_loss"]) + 1)
    a.plot(epochs, history["train_loss"], label="train")
    a.plot(epochs, history["val_loss"], label="val")
    a.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    a.legend()
    b.plot(epochs, history["val_acc"], label="router (val)")
    b.axhline(report["metrics"]["val"]["majority_accuracy"], color="grey", ls="--", label="majority (val)")
    b.axvline(history["best_epoch"], color="k", lw=0.5)
    b.set(xlabel="epoch", ylabel="accuracy", title="val accuracy (selection)", ylim=(0, 1))
    b.legend()
    fig.tight_layout()
    fig.savefig(out / "router_training.png", dpi=110)

    fig, ax = plt.subplots(figsize=(4.2, 3.8))
    ax.imshow(test["confusion"], cmap="Blues")
    for i, row in enumerate(test["confusion"]):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center")
    ax.set(xticks=range(3), yticks=range(3), xticklabels=NAMES, yticklabels=NAMES, xlabel="router",
           ylabel="label", title="test confusion")
    fig.tight_layout()
    fig.savefig(out / "router_confusion.png", dpi=110)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    groups = report["labels"]
    width = 0.8 / max(1, len(groups))
    cols = NAMES + ["none"]
    for i, (name, counts) in enumerate(groups.items()):
        total = sum(counts.values()) or 1
        ax.bar(np.arange(len(cols)) + i * width, [counts[c] / total for c in cols], width, label=name)
    ax.set(xticks=np.arange(len(cols)) + width * (len(groups) - 1) / 2, xticklabels=cols, ylabel="share",
           title="labels (cheapest tier whose context serves)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "router_labels.png", dpi=110)
    plt.close("all")
    return ["router_training.png", "router_confusion.png", "router_labels.png"]


def _cv_lines(cv: dict) -> list[str]:
    """The cross-validation table (``--cv``): why the router reads what it reads."""
    if not cv:
        return []
    first = next(iter(cv.values()))
    return [f"\n## What the router reads: article-grouped {first['folds']}-fold cross-validation on train + val\n",
            f"{first['n']} labelled questions in {first['groups']} groups (SQuAD articles, HotpotQA buckets); every"
            " fold's accuracy is on articles its router never saw. best = the best epoch (optimistic), last = the"
            " last; best <dataset> = that dataset's questions at the best epoch.\n",
            _table(cv, ["majority_accuracy", "best", "best_epoch", "last", *(k for k in first if k.startswith("best "))]),
            ""]


def write_report(out: Path, report: dict) -> None:
    """router_report.json (every figure) and router_report.md (the same, readable)."""
    atomic_write_text(out / "router_report.json", json.dumps(report, indent=2) + "\n")
    plots = _plots(out, report)
    m, h = report["metrics"], report["history"]
    metric_cols = ["n", "accuracy", "majority_class", "majority_accuracy", "balanced_accuracy"]
    lines = [
        "# Router training report\n",
        "Written by `python -m convert train-router` (`make router`). Labels: each answerable question of the"
        " router's parts of `edge_rag/assets/splits.json` runs through `decide()` of the benchmark's `full`"
        " system at EASY, MEDIUM and HARD (no generation); the label is the cheapest tier whose compressed"
        " context serves it (SQuAD: holds a gold answer; HotpotQA: holds both supporting paragraphs and the"
        " answer unless yes/no; `evaluation/tiers.py`). Questions no tier serves are not trained on and not"
        f" scored. Settings key `{report['settings_key']}`, cached in `{Path(report['labels_file']).name}`.\n",
        "Parts: train = reader_train (SQuAD-2 train file, Normans, Computational complexity theory, Harvard"
        " University, Yuan dynasty; HotpotQA buckets 2-3), val = reader_val (Imperialism; bucket 4: model"
        " selection), test = test (Steam engine, European Union law; bucket 0: the benchmark's questions,"
        " figures only). Calibration articles are left to the certified threshold.\n",
        "## Labels\n",
        _table(report["labels"], NAMES + ["none"]),
        f"\n## Router accuracy on genuine labels (the shipped ONNX through `edge_rag.retrieval.route.Router`; inputs:"
        f" {report['inputs']})\n",
        _table({k: m[k] for k in m}, metric_cols),
        f"\nSelection on val: {', '.join(f'{k} {v:.3f}' for k, v in report['selection'].items())} → kept"
        f" {'weighted' if h['weighted'] else 'unweighted'}, epoch {h['best_epoch']} of {len(h['val_acc'])}"
        " (val accuracy averaged over its datasets, every dataset weighing alike in training as well; val is"
        " optimistic for that reason; test is not used for any choice).\n",
        *_cv_lines(report["cv"]),
        "Test recall per class: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a"
                                              for k, v in m["test"]["recall"].items()),
        "\nTest confusion (rows = label, columns = router):\n",
        _table({t: dict(zip(NAMES, row)) for t, row in zip(NAMES, m["test"]["confusion"])}, NAMES),
        "\n## Router decisions on every test question (unanswerable ones too, as the benchmark asks them)\n",
        _table(report["test_mix"], ["n"] + NAMES),
    ]
    if report["floors"]:
        cols = [k for k in report["floors"][0] if k != "floor"]
        lines += ["\n## Compression floor on val (share of questions each tier's context serves, mean chars)\n",
                  _table({f"floor {r['floor']}": r for r in report["floors"]}, cols)]
    if report["agreement"]:
        a = report["agreement"]
        lines += [f"\n## Context label vs generated correctness ({a['n']} val questions, temperature 0)\n",
                  _table(a["per_tier"], list(next(iter(a["per_tier"].values())))),
                  f"\nSame label (cheapest served tier vs cheapest tier whose generated answer is right, none ="
                  f" none): {a['same_label']:.3f}. Labelled by context {a['context_labelled']}, by generation"
                  f" {a['generation_labelled']}; both labelled and equal: {a['both_labelled_same']} of {a['both']}.\n"]
    lines += [f"\n## Export\n\n`{Path(report['onnx']).name}`: {report['parity']['file_bytes']} bytes, ONNX vs torch"
              f" max |Δ| {report['parity']['max_abs_diff']:.2e} ({'PASS' if report['parity']['passed'] else 'FAIL'}).\n",
              *[f"![{p}]({p})" for p in plots]]
    atomic_write_text(out / "router_report.md", "\n".join(lines) + "\n")
