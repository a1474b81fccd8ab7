"""Sentence encoder → ONNX (fp32, dynamic batch and sequence axes) + int8, checked against torch.

Works for any BERT-style sentence-transformers folder (config.json + safetensors + tokenizer.json)
with mean pooling. The ONNX graph outputs ``last_hidden_state``; pooling and normalisation happen in
the runtime (``edge_rag.retrieval.encode``) exactly as sentence-transformers does, and the parity check runs
the runtime's own Encoder on the export so tokenisation and batching are covered too.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import AutoModel

from edge_rag.models.registry import REFERENCE_ROLE
from edge_rag.models.verify import THRESHOLDS, query_latency_ms, save_reference
from edge_rag.retrieval.encode import Encoder, length_batches, mean_pool, pad_batch
from edge_rag.storage.fileio import fsync_dir

from .args import InputError, at_least, model_folder
from .quantize import quantize_int8
from .report import write_report

OPSET = 17
# Parity thresholds on cosine(torch, export) per sentence are the on-device verify thresholds
# (edge_rag.models.verify.THRESHOLDS): fp32 exact up to float noise, int8 mean >= 0.99 and no sentence < 0.98.
MIN_SENTENCES = 20  # fewer parity sentences check nothing: an export compared on fewer never passes
REFERENCE_SENTENCES = 64  # sentences (+ torch vectors) the bundle carries for `edge-rag models verify`
MAX_RECALL_DROP = 0.01  # SQuAD paragraph Recall@5 of an export may trail torch's by at most 1 point
DEFAULT_SAMPLE = Path(__file__).resolve().parent.parent / "edge_rag" / "sample" / "docs"


class _LastHidden(torch.nn.Module):
    """Wraps a Hugging Face encoder so the ONNX graph has plain tensor inputs and one output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: D102
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def load_torch(model_dir: Path) -> torch.nn.Module:
    # Eager attention traces the padding mask into the graph; SDPA paths may drop an all-ones mask.
    try:
        model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager")
    except (OSError, ValueError, SafetensorError) as exc:  # a safetensors file cut short, a config of no model
        raise InputError(f"{model_dir}: cannot load the model ({exc})") from exc
    return model.eval()


def export_fp32(model: torch.nn.Module, out: Path) -> None:
    dummy = torch.ones((2, 8), dtype=torch.long)
    mask = dummy.clone()
    mask[1, 5:] = 0  # a padded row, so the exported graph keeps the attention mask
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        _LastHidden(model),
        (dummy, mask, torch.zeros_like(dummy)),
        str(out),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                      "last_hidden_state": axes},
        opset_version=OPSET,
        dynamo=False,
    )


@torch.no_grad()
def torch_embed(model: torch.nn.Module, encoder: Encoder, texts: list[str], batch_tokens: int = 512) -> np.ndarray:
    """Reference embeddings: the torch model on the same tokenizer output, sentence-transformers pooling. Texts run
    in batches of similar length, right-padded and masked as the runtime's encoder feeds them (``length_batches``,
    ``pad_batch``), at most ``batch_tokens`` padded tokens each: the same vectors as one text at a time up to float
    noise (cosine >= 0.9999997 over the 200 SQuAD parity sentences), at two thirds of the CPU."""
    model.eval()  # torch.onnx.export leaves the module in training mode (dropout on)
    encodings = encoder.tokenizer.encode_batch(texts)
    out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    for rows in length_batches([len(e.ids) for e in encodings], batch_tokens):
        feeds = pad_batch([encodings[i] for i in rows])
        hidden = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state
        out[rows] = mean_pool(hidden.numpy(), feeds["attention_mask"])
    return out


def squad_recall_at_5(embed: Callable[[list[str]], np.ndarray], squad: Path, articles: int = 0) -> float:
    """Paragraph-level Recall@5 of answerable SQuAD questions over all paragraphs (exact cosine search).

    ``articles`` > 0 keeps only the first N articles (a quicker check for tests).
    """
    from evaluation.datasets import load_squad

    docs, items = load_squad(squad)
    if articles:
        keep = list(dict.fromkeys(d.title for d in docs))[:articles]
        docs = [d for d in docs if d.title in keep]
        items = [q for q in items if q.group in keep]
    questions = [q for q in items if not q.is_impossible]
    doc_vecs = embed([d.text for d in docs])
    q_vecs = embed([q.question for q in questions])
    top5 = np.argsort(-(q_vecs @ doc_vecs.T), axis=1)[:, :5]
    ids = np.array([d.doc_id for d in docs])
    return float(np.mean([bool(set(ids[row]) & q.gold_doc_ids) for row, q in zip(top5, questions)]))


def parity_texts(sample_dir: Path, squad: Path | None, n: int) -> list[str]:
    """Sentences for the parity check: SQuAD contexts when given, else the packaged sample corpus."""
    from edge_rag.documents.text import split_sentences
    from evaluation.datasets import load_squad

    if squad is not None and squad.is_file():
        docs, _ = load_squad(squad)
        texts = [docs[i].text for i in range(len(docs))]
    else:
        texts = [p.read_text(encoding="utf-8") for p in sorted(sample_dir.glob("*.md"))]
    sentences = [s for t in texts for s in split_sentences(t) if len(s) > 20]
    return sentences[:n]


def convert(model_dir: Path, out_dir: Path, precision: str, texts: list[str], threads: int = 0,
            squad: Path | None = None, recall_articles: int = 0) -> dict:
    """Export ``encoder.onnx`` (+ ``encoder.int8.onnx``) and ``tokenizer.json`` into ``out_dir``; with
    ``squad``, also compare SQuAD Recall@5 of torch and each export. Every file is made in a folder beside them and
    renamed in when all are checked: a run cut short leaves the previous export whole (it left half an encoder.onnx
    beside the old report's passed: true, which the bundle packed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir))
    try:
        summary = _convert(model_dir, work, precision, texts, threads, squad, recall_articles)
        for name in sorted((p.name for p in work.iterdir()), key=lambda n: not n.endswith(".parity.json")):
            os.replace(work / name, out_dir / name)  # the verdicts first: no new file beside an old verdict
        fsync_dir(out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _convert(model_dir: Path, out_dir: Path, precision: str, texts: list[str], threads: int,
             squad: Path | None, recall_articles: int) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    st_cfg = model_dir / "sentence_bert_config.json"
    max_len = json.loads(st_cfg.read_text()).get("max_seq_length", 256) if st_cfg.exists() else 256
    shutil.copyfile(model_dir / "tokenizer.json", out_dir / "tokenizer.json")
    model = load_torch(model_dir)
    fp32 = out_dir / "encoder.onnx"
    export_fp32(model, fp32)
    artifacts = {"fp32": fp32}
    if precision == "int8":
        artifacts["int8"] = out_dir / "encoder.int8.onnx"
        quantize_int8(fp32, artifacts["int8"])
    summary = {"dim": config["hidden_size"], "max_seq_len": max_len, "pooling": "mean", "files": {}}
    reference = torch_recall = None
    for kind, path in artifacts.items():
        encoder = Encoder(path, out_dir / "tokenizer.json", max_seq_len=max_len, threads=threads)
        if reference is None:
            reference = torch_embed(model, encoder, texts)
            save_reference(out_dir / REFERENCE_ROLE.file, texts[:REFERENCE_SENTENCES], reference[:REFERENCE_SENTENCES])
            if squad is not None:
                torch_recall = squad_recall_at_5(partial(torch_embed, model, encoder), squad, recall_articles)
        cos = (encoder.encode(texts) * reference).sum(axis=1)
        recall = squad_recall_at_5(encoder.encode, squad, recall_articles) if squad is not None else None
        report = {
            "kind": kind,
            "dim": summary["dim"],
            "max_seq_len": max_len,
            "sentences": len(texts),
            "cosine_min": float(cos.min()),
            "cosine_mean": float(cos.mean()),
            "threshold_min": THRESHOLDS[kind].cosine_min,
            "threshold_mean": THRESHOLDS[kind].cosine_mean,
            "query_ms_median": query_latency_ms(encoder, texts, repeats=50),
            "size_bytes": path.stat().st_size,
            "passed": bool(len(texts) >= MIN_SENTENCES and cos.min() >= THRESHOLDS[kind].cosine_min
                           and cos.mean() >= THRESHOLDS[kind].cosine_mean
                           and (recall is None or recall >= torch_recall - MAX_RECALL_DROP)),
        }
        if recall is not None:
            report.update(squad_recall_at_5=recall, squad_recall_at_5_torch=torch_recall)
        write_report(path, report)
        summary["files"][kind] = {"name": path.name, **report}
    return summary


def run(args: argparse.Namespace) -> int:
    if Path(args.out).is_file():  # else a FileExistsError traceback once the model is loaded
        raise InputError(f"--out {args.out} is a file: name the folder to write into")
    if args.recall and not args.squad:  # else the export passed with no Recall@5 compared, the gate asked for skipped
        raise InputError("--recall needs --squad: the SQuAD JSON whose Recall@5 torch and each export are compared on")
    texts = parity_texts(Path(args.sample_dir), Path(args.squad) if args.squad else None, args.sentences)
    if len(texts) < MIN_SENTENCES:  # said before the export, not as a FAIL of cosines that all pass
        raise SystemExit(f"convert encoder: {len(texts)} parity sentences (of {args.squad or args.sample_dir}); "
                         f"the check needs at least {MIN_SENTENCES}")
    squad = Path(args.squad) if args.squad and args.recall else None
    summary = convert(model_folder(args.model_dir), Path(args.out), args.precision, texts, args.threads, squad)
    failed = [k for k, r in summary["files"].items() if not r["passed"]]
    if failed:
        print(f"parity FAILED for {', '.join(failed)}; do not ship these files")
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("encoder", help="sentence-transformers folder → ONNX (+int8) with parity check")
    p.add_argument("model_dir", help="folder with config.json, model.safetensors, tokenizer.json")
    p.add_argument("--out", required=True, help="output folder (encoder.onnx, tokenizer.json, reports)")
    p.add_argument("--precision", choices=["fp32", "int8"], default="int8",
                   help="int8 also writes encoder.int8.onnx (convert.quantize.quantize_int8)")
    p.add_argument("--squad", help="SQuAD JSON whose contexts give the parity sentences")
    p.add_argument("--recall", action="store_true", help="also compare --squad's Recall@5: torch vs each export")
    p.add_argument("--sample-dir", default=str(DEFAULT_SAMPLE), help="fallback parity text (*.md)")
    p.add_argument("--sentences", type=at_least(MIN_SENTENCES), default=200, help="number of parity sentences")
    p.add_argument("--threads", type=at_least(0), default=0, help="onnxruntime threads of the parity check (0: its own)")
    p.set_defaults(func=run)
