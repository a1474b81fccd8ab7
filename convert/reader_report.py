"""After training: pick the checkpoint, export reader.onnx (int8 shipped), check parity, write the report.

An export that fails its parity gates stays in the run's folder with its report and the command exits non-zero: the
shipped reader is replaced (atomically) only by one that passed.

Selection is on reader-val HasAns F1 (the checkpoints' in-process scores); every figure in the report
is then re-measured on the shipped int8 ONNX through ``edge_rag.reading.reader.Reader``, the device path.
The Haswell (AVX2-only) parity run uses ``qemu-x86_64 -cpu Haswell`` when it is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.splits import SPLITS_FILE
from convert import reader as X
from convert import reader_data as D
from convert import reader_model as M
from convert.quantize import quantize_int8
from convert.report import write_report
from edge_rag.reading.reader import MAX_SEQ_LEN, READER_ASSET, STRIDE, Reader, passage_context
from edge_rag.retrieval.encode import load_session, pad_batch
from edge_rag.storage.fileio import atomic_path, atomic_write_text
from edge_rag.types import Passage

ASSETS = READER_ASSET.parent
PARITY_QUESTIONS = 120  # reader-val questions (+ their no-answer pairs, up to 60) compared with torch
QEMU_SAMPLE = 10  # emulated int8 runs ~100x slower; 0 skips the run
LATENCY_REPEATS = 30
# 8-bit signed weights, not the encoder's 7-bit qint8-reduce: the reader trained on real unanswerables keeps its
# no-answer margins near 0, and 7-bit weights flipped 19% of its answer/abstain decisions against torch (gate 0.9).
# Full 8-bit s8 weights read ~1.8x faster than u8 weights on VNNI CPUs (u8 x u8 has no VNNI instruction); on AVX2-only
# CPUs u8 x s8 pair sums (vpmaddubsw) can saturate, so the Haswell run below checks it on QEMU_SAMPLE inputs
# (docs/decisions/reader.md has the wider run that chose it)
SCHEME = "qint8"


def finish(args: argparse.Namespace) -> None:
    history = json.loads((args.run / "history.json").read_text())
    chosen = M.choose(history["checkpoints"])
    model = M.load_model(args.run / chosen["checkpoint"])
    tok_path = M.model_dir() / "tokenizer.json"
    fp32 = X.export_fp32(model, args.run / "reader.fp32.onnx")
    int8 = quantize_int8(fp32, args.run / "reader.int8.onnx", SCHEME)
    parity = check_parity(model, fp32, int8, tok_path, args)
    write_report(int8, {**parity, "checkpoint": chosen["checkpoint"]})
    if not parity["passed"]:  # docs/guides/models.md: an export that fails its gates is not shipped, and says so
        raise SystemExit(f"error: {int8} failed its parity check against torch ({int8}.parity.json); "
                         f"{READER_ASSET} is kept")
    with atomic_path(READER_ASSET) as tmp:  # a kill mid-copy leaves the old reader, not half a new one
        shutil.copyfile(int8, tmp)
    write_report(READER_ASSET, {**parity, "checkpoint": chosen["checkpoint"], "file_bytes": READER_ASSET.stat().st_size})
    val = evaluate_onnx(READER_ASSET, tok_path, args.seed)
    atomic_write_text(args.run / "val_onnx.json", json.dumps(val, indent=1))
    latency = measure_latency(READER_ASSET, tok_path)
    write_markdown(history, chosen, parity, val, latency, args)


def check_parity(model, fp32: Path, int8: Path, tok_path: Path, args: argparse.Namespace) -> dict:
    """fp32: logit max-abs diff vs torch; fp32 and int8: span / F1 / decision agreement with torch reads."""
    import torch

    val = D.reader_val()[:PARITY_QUESTIONS]
    inputs = X.sample_inputs(val, D.negative_pairs(val, args.seed)[: PARITY_QUESTIONS // 2])
    tok = M.windowing()
    session = load_session(fp32, threads=2)
    diff = 0.0
    for row in inputs[:40]:
        ws = tok(row["question"], passage_context(row["title"], row["text"])[0])
        feeds = pad_batch(ws)
        with torch.no_grad():
            ref = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        got = session.run(list(X.OUTPUTS), feeds)
        diff = max(diff, *(float(np.abs(r.numpy() - g).max()) for r, g in zip(ref, got)))
    reference = [M.read_one(model, tok, r["question"], r["title"], r["text"]) for r in inputs]
    ref_file = args.run / "parity_reference.json"
    atomic_write_text(ref_file, json.dumps({"inputs": inputs, "torch": [
        {k: r[k] for k in ("text", "start", "end", "margin")} for r in reference]}))
    out = {"artifact": "reader", "precision": "int8", "scheme": SCHEME, "opset": X.OPSET,
           "fp32_max_abs_diff": diff, "fp32_max_abs_diff_limit": X.MAX_ABS_DIFF_FP32,
           "fp32": X.agreement(reference, X.onnx_reads(fp32, tok_path, inputs)),
           "int8": X.agreement(reference, X.onnx_reads(int8, tok_path, inputs)),
           "int8_min_agreement": X.MIN_AGREEMENT_INT8, "haswell": qemu_parity(ref_file, int8, tok_path)}
    out["passed"] = bool(diff <= X.MAX_ABS_DIFF_FP32 and X.passes(out["int8"]) and out["haswell"].get("pass", True))
    return out


def qemu_parity(ref_file: Path, onnx: Path, tok_path: Path) -> dict:
    """The int8 check re-run on an emulated AVX2-only CPU (the portability issue's robustness bar)."""
    qemu = shutil.which("qemu-x86_64")
    if not QEMU_SAMPLE:
        return {"skipped": "QEMU_SAMPLE = 0"}
    if qemu is None:
        return {"skipped": "qemu-x86_64 not installed (apt-get install qemu-user)"}
    cmd = [qemu, "-cpu", "Haswell", sys.executable, "-m", "convert.reader", "--reference", str(ref_file),
           "--onnx", str(onnx), "--tokenizer", str(tok_path), "--limit", str(QEMU_SAMPLE), "--threads", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    lines = run.stdout.strip().splitlines()
    if not lines:
        return {"error": run.stderr[-500:], "pass": False}
    return {"cpu": "qemu-x86_64 -cpu Haswell", **json.loads(lines[-1])}


def onnx_read(onnx: Path, tok_path: Path) -> M.Read:
    """Reads through the device path (``edge_rag.reading.reader.Reader``), one gold paragraph at a time."""
    reader = Reader(onnx, tok_path)

    def read(question: str, title: str, context: str) -> tuple[str | None, float]:
        span = reader.read(question, [Passage(0, "", title, context)])
        return span.text, span.margin
    return read


def evaluate_onnx(onnx: Path, tok_path: Path, seed: int) -> dict:
    """reader-val and the whole model-selection set through the device path."""
    return M.score_reads(onnx_read(onnx, tok_path), seed, None)


def measure_latency(onnx: Path, tok_path: Path) -> dict:
    """p50 ms of Reader.read over 1, 3 and 5 reader-val paragraphs (2 threads, int8)."""
    reader = Reader(onnx, tok_path, threads=2)
    val = D.reader_val()
    paragraphs = list(dict.fromkeys((q.title, q.context) for q in val))
    out = {}
    for n in (1, 3, 5):
        times = []
        for r in range(LATENCY_REPEATS):
            q = val[(r * 7) % len(val)]
            passages = [Passage(i, "", *paragraphs[(r + i) % len(paragraphs)]) for i in range(n)]
            t = time.perf_counter()
            reader.read(q.question, passages)
            times.append((time.perf_counter() - t) * 1000)
        out[str(n)] = {"p50_ms": statistics.median(times), "max_ms": max(times), "load_avg_1min": os.getloadavg()[0]}
    return out


def write_markdown(history: dict, chosen: dict, parity: dict, val: dict, latency: dict,
                   args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([p["step"] for p in history["loss"]], [p["loss"] for p in history["loss"]])
    ax.set(xlabel="step (batch of 16 windows)", ylabel="train loss (mean start/end CE)", title="reader training")
    fig.tight_layout()
    fig.savefig(ASSETS / "reader_training.png", dpi=90)
    fig, ax = plt.subplots(figsize=(5, 3))
    bins = np.linspace(-15, 15, 41)
    for kind in ("answerable", "impossible", "other_paragraph"):
        ax.hist([np.clip(r["margin"], -15, 15) for r in val["rows"] if r["kind"] == kind], bins=bins, alpha=0.5,
                label=kind, density=True)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(xlabel="margin = best span score - null score", ylabel="density", title="reader-val margins (int8 ONNX)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ASSETS / "reader_margins.png", dpi=90)
    plt.close("all")
    seconds, hp = history["checkpoints"][-1]["seconds"], history["settings"]
    mix = ",".join(f"{k}={v}" for k, v in args.mix.items()) if args.mix else None
    init = f"~/{args.init.relative_to(Path.home())}" if args.init and args.init.is_relative_to(Path.home()) else args.init
    stage_two = "".join(f" --{k} {v}" for k, v in (("init", init), ("skip-subset", args.skip_subset), ("mix", mix)) if v)
    lines = [
        "# Reader training report", "",
        f"Produced by `python -m convert train-reader --lr {args.lr} --epochs {args.epochs} --checkpoints "
        f"{args.checkpoints} --examples {args.examples} --swaps {args.swaps} --seed {args.seed}{stage_two}`"
        f"{'' if stage_two else ' (`make reader`)'}.", "",
        "## Data (reader-train part only)", "",
        "| source | windows |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in history["counts"].items()], "",
        "Sources are described in `convert/reader_data.py`" + (
            f"; the windows are a seeded sample of those outside the first stage's {args.skip_subset}." if args.skip_subset
            else "; the subset is a seeded sample of all windows." if args.examples
            else "; every window of the reader-train part."), "",
        "## Training", "",
        f"MiniLM-L6 ({f'continued from `{init}` as it was before this run' if args.init else 'all-MiniLM-L6-v2 weights'}"
        f"{', int8 dequantized' if args.init and args.init.suffix == '.onnx' else ''}) + "
        f"Linear(384→2); max {MAX_SEQ_LEN} tokens, stride {STRIDE}, "
        f"batch {hp['batch']}, AdamW lr {args.lr}, warm-up {hp['warmup']:.0%} then linear decay, weight decay "
        f"{hp['weight_decay']}, {history['steps']} steps, bf16 autocast {history['bf16']}, {hp['threads']} torch "
        f"threads, {seconds / 60:.1f} min on the "
        "shared 2-core box.", "", "![loss](reader_training.png)", "",
        "reader-val (1 article + HotpotQA bucket 4) and the model-selection sample (30 held-out train articles, "
        f"{D.SELECT_SAMPLE} answerable + {D.SELECT_SAMPLE} real unanswerable questions), gold paragraphs, torch fp32:", "",
        "| checkpoint | windows seen | real unanswerables seen | reader-val HasAns F1 | reader-val NoAns acc (impossible / other paragraph) "
        "| selection HasAns F1 | selection NoAns acc | selection margin AUROC |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {c['checkpoint']} | {c['examples_seen']} | {c.get('impossible_seen', '')} | {c['hasans_f1']:.3f} | "
          f"{c['noans_acc_impossible']:.3f} / {c['noans_acc_other_paragraph']:.3f} | "
          + (f"{c['select']['hasans_f1']:.3f} | {c['select']['noans_acc_impossible']:.3f} | "
             f"{c['select']['auroc_answerable_vs_impossible']:.3f} |" if "select" in c else "| | |")
          for c in history["checkpoints"]], "",
        f"Shipped: {chosen['checkpoint']} (`convert.reader_model.choose`: best selection-set margin AUROC among the "
        "checkpoints within 0.01 of the best selection HasAns F1).", "",
        "## reader-val, shipped int8 ONNX (`edge_rag.reading.reader.Reader`)", "",
        f"Questions: {val['n']}. HasAns = the best non-null span on the gold paragraph (the answer/abstain "
        "decision is left to the calibrated policy); NoAns accuracy = share with margin ≤ 0.", "",
        f"- HasAns F1 **{val['hasans_f1']:.3f}**, EM {val['hasans_em']:.3f}; answerable with margin > 0: "
        f"{val['hasans_answered_at_0']:.3f}",
        f"- NoAns accuracy: real unanswerables {val['noans_acc_impossible']:.3f}, question + another paragraph "
        f"of its article {val['noans_acc_other_paragraph']:.3f}",
        f"- AUROC of the margin, answerable vs real unanswerable {val['auroc_answerable_vs_impossible']:.3f}, "
        f"vs another paragraph {val['auroc_answerable_vs_other_paragraph']:.3f}", "",
        "![margins](reader_margins.png)", "",
        "## Model-selection set, shipped int8 ONNX", "",
        f"All of it: {val['select']['n']['answerable']} answerable and {val['select']['n']['impossible']} real unanswerable "
        "questions of the 30 held-out articles, gold paragraph. HasAns F1 "
        f"**{val['select']['hasans_f1']:.3f}**; NoAns accuracy {val['select']['noans_acc_impossible']:.3f}; margin AUROC "
        f"answerable vs real unanswerable **{val['select']['auroc_answerable_vs_impossible']:.3f}**.", "",
        "## Export parity (`reader.onnx.parity.json`)", "",
        f"- fp32 logits max |Δ| vs torch {parity['fp32_max_abs_diff']:.2e} (limit {X.MAX_ABS_DIFF_FP32})",
        *[f"- {k}: span {parity[k]['span']:.3f}, F1 {parity[k]['f1']:.3f}, decision {parity[k]['decision']:.3f} "
          f"(n = {parity[k]['n']}) vs torch" for k in ("fp32", "int8")],
        f"- int8 on `qemu-x86_64 -cpu Haswell` (AVX2 only): {json.dumps(parity['haswell'])}",
        f"- gates (int8): {X.MIN_AGREEMENT_INT8} (span agreement is reported, not gated: see `convert/reader.py`);"
        f" size {READER_ASSET.stat().st_size / 1e6:.1f} MB", "",
        "## Latency (int8, 2 threads, `Reader.read`, reader-val paragraphs)", "",
        "The box is shared: the 1-minute load average at each measurement is given; on an idle box expect less.", "",
        "| paragraphs | p50 ms | max ms | load average |", "|---|---|---|---|",
        *[f"| {n} | {v['p50_ms']:.1f} | {v['max_ms']:.1f} | {v['load_avg_1min']:.1f} |" for n, v in latency.items()], "",
    ]
    atomic_write_text(ASSETS / "reader_report.md", "\n".join(lines))
    summary = {"history": history, "chosen": chosen["checkpoint"],
               "val": {k: v for k, v in val.items() if k not in ("rows", "select_rows")},
               "latency": latency}
    atomic_write_text(ASSETS / "reader_report.json", json.dumps(summary, indent=1) + "\n")
    print((ASSETS / "reader_report.md").read_text())


def _score(args: argparse.Namespace) -> int:
    tok_path = M.model_dir() / "tokenizer.json"
    result = {k: v for k, v in evaluate_onnx(args.onnx, tok_path, args.seed).items() if k not in ("rows", "select_rows")}
    if args.test:  # reported only: nothing is chosen on it
        read = onnx_read(args.onnx, tok_path)
        test = D.squad_questions(D.SQUAD_DEV, tuple(json.loads(SPLITS_FILE.read_text())["squad"]["test"]))
        result["test"] = M.summarise([M.read_row(read, q, q.title, q.context) for q in test])
    print(json.dumps(result, indent=1))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score-reader", help="score a reader.onnx on reader-val and the model-selection set",
                              description="HasAns F1, NoAns accuracy and margin AUROC of a reader (device path, gold "
                              "paragraphs) on reader-val and on all of the model-selection set (splits.json reader_select).")
    p.add_argument("--onnx", type=Path, default=READER_ASSET, help="reader ONNX to score (default: the shipped one)")
    p.add_argument("--seed", type=int, default=0, help="seed of the no-answer pairs (a question with another paragraph)")
    p.add_argument("--test", action="store_true", help="also the SQuAD test split's questions on their gold paragraph")
    p.set_defaults(func=_score)
