"""Train the extractive reader (MiniLM + span head + [CLS] no-answer) and ship ``edge_rag/assets/reader.onnx``.

``python -m convert train-reader [--epochs 1] [--checkpoints 5] [--examples N] [--swaps 0.25] [--lr 1.5e-4] [--seed 0]
[--work DIR] [--skip-train]`` (``make reader``). Steps: build examples from the reader-train part
(``convert.reader_data``: SQuAD 1.1 train and the 17,648 real SQuAD-2 train unanswerables, plus constructed negatives),
fine-tune the all-MiniLM-L6-v2 weights the bundle's encoder comes from plus a fresh Linear(384 → 2) head with
cross-entropy on start and end positions (SQuAD-2 style: an unanswerable window points at [CLS]) and a hinge that
makes [CLS] beat an unanswerable's plausible span (a hard negative), AdamW with linear warm-up and
linear decay, seeded, 2 torch threads, bfloat16 autocast where the CPU has native bf16 (2.3-3x faster here);
score equally spaced checkpoints on reader-val and the model-selection set (``reader_select``: 30 held-out train
articles); export the one ``reader_model.choose`` picks to ONNX fp32 + int8 with a parity check
(``convert.reader``), then write ``reader_report.md`` (``convert.reader_report``).

A second stage starts from a checkpoint (``--init``: a ``.pt`` of a run, or a shipped int8 ``reader.onnx``,
dequantized), on the windows a first stage did not see (``--skip-subset N``), or on a chosen mix of sources (``--mix
impossible=0.2,answerable=0.45,...`` of ``--examples`` windows; a source with fewer windows than its share is
repeated): SQuAD 1.1 teaches spans, the real unanswerables teach SQuAD-2's look-alike questions apart from answerable
ones, and a mix sets how much of each a stage sees.

Resumable: the training state (weights, optimiser, schedule, step, torch's random state) is saved outside git in
``--work`` every few minutes and at each checkpoint, in a folder named by the run's settings; running the same command
again continues where it stopped (the batch order is seeded, so the resumed run sees exactly the batches it had left,
with the dropout it would have drawn: the same weights as a run never stopped). The run records a fingerprint of
what else it depends on (``fingerprint``: the training constants, the windows, the start weights); a resume where one
of them changed is refused, naming it (a run folder from before fingerprints resumes unchecked, and says so).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from convert import reader_data as D
from convert import reader_model as M
from convert.args import at_least
from convert.reader_report import finish
from edge_rag.models.registry import home
from edge_rag.storage.fileio import atomic_path, atomic_write_text

NEGATIVES_PER_ANSWERABLE = 0.3  # sampled no-answer pairs per answerable question (half same article, half other)
SWAPS_PER_ANSWERABLE = 0.25  # share of answerable SQuAD questions also asked with a swapped name/number (no answer)
BATCH = 16
LR = 1.5e-4  # lr 5e-5 barely moved a fresh head in one epoch on 4k examples
WARMUP = 0.06  # fraction of all steps
WEIGHT_DECAY = 0.01
THREADS = 2
PAD_MULTIPLE = 32  # batch widths rounded up to this: 8 shapes, not 240 (memory grew 1 GB per 5 min, and speed fell)
LOG_EVERY = 50  # steps
SAVE_EVERY_S = 300  # resumable state written at least this often
EPOCHS = 1  # SQuAD 1.1 is big enough that one pass over more data beats repeated passes over less
CHECKPOINTS = 5
EXAMPLES = 70_000  # a seeded subset of all windows, sized to ~75 min on 2 busy cores (0 = all)
# An unanswerable question's plausible span (the one a careless reader picks) is a hard negative: beside the
# cross-entropy towards [CLS], the null score must beat that span's score by HARD_MARGIN (hinge, weight HARD_WEIGHT).
HARD_MARGIN = 1.0
HARD_WEIGHT = 0.5


def bf16() -> bool:
    """bfloat16 autocast only where the CPU computes it natively (elsewhere it is emulated, and slower)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def run_dir(args: argparse.Namespace) -> Path:
    """The folder of this run's state and checkpoints, named by every setting that changes what it trains."""
    settings = {k: getattr(args, k) for k in ("epochs", "checkpoints", "examples", "swaps", "lr", "seed")}
    settings |= {k: str(v) if k == "init" else v for k in ("mix", "init", "skip_subset") if (v := getattr(args, k))}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return args.work / f"run-{digest}"


def train(args: argparse.Namespace) -> None:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(THREADS)
    tok = M.windowing()
    examples = D.build_examples(tok, D.reader_train(), NEGATIVES_PER_ANSWERABLE, args.seed, args.swaps)
    if args.skip_subset:  # the windows a first stage of --examples N (same seed) trained on: the rest are new to it
        examples = D.seeded_subset(examples, args.skip_subset, args.seed)[1]
    if args.mix:
        try:
            examples = D.mixed(examples, args.mix, args.examples, random.Random(args.seed))
        except ValueError as exc:  # a source the data does not hold: a usage error, not a crash
            raise SystemExit(f"error: {exc}") from None
    elif args.examples and args.examples < len(examples):  # a seeded subset, same mix of sources in expectation
        examples = D.seeded_subset(examples, args.examples, args.seed)[0]
    counts = {s: sum(e.source == s for e in examples) for s in sorted({e.source for e in examples})}
    print(f"examples {len(examples)} {counts}; bf16 autocast {bf16()}", flush=True)
    model = M.load_model(args.init).train()
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr)
    batches = [b for epoch in range(args.epochs) for b in bucketed_batches(examples, random.Random(args.seed + epoch))]
    steps = len(batches)
    warm = max(1, int(WARMUP * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    history = {"counts": counts, "steps": steps, "bf16": bf16(), "loss": [], "checkpoints": [], "seconds": 0.0,
               "settings": {"batch": BATCH, "warmup": WARMUP, "weight_decay": WEIGHT_DECAY, "threads": THREADS,
                            "negatives": NEGATIVES_PER_ANSWERABLE}}
    history["fingerprint"] = fp = fingerprint(examples, model)
    state_file = args.run / "state.pt"
    step = 0
    if state_file.is_file():  # resume: same settings (the folder name), same seeded batches
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        refuse_another_run(args.run, state["history"].get("fingerprint"), fp)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if "rng" in state:  # dropout's stream where the run left it (older states: from the seed)
            torch.set_rng_state(state["rng"])
        step, history = state["step"], {**state["history"], "counts": counts, "steps": steps, "fingerprint": fp}
        print(f"resuming {args.run} at step {step}/{steps}", flush=True)
    saves = {round(steps * k / args.checkpoints) for k in range(1, args.checkpoints + 1)}
    loss_fn = nn.CrossEntropyLoss()
    t0, last_save, base_seconds, running = time.time(), time.time(), history["seconds"], []
    for batch in batches[step:]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=history["bf16"]):
            start, end = model(**M.pad([(e.ids, e.types) for e in batch], PAD_MULTIPLE))
        loss = span_loss(start.float(), end.float(), batch, loss_fn)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        running.append(loss.item())
        history["seconds"] = base_seconds + time.time() - t0
        if step % LOG_EVERY == 0:
            rate = len(running) * BATCH / (time.time() - t0)
            history["loss"].append({"step": step, "loss": float(np.mean(running[-LOG_EVERY:])),
                                    "seconds": history["seconds"]})
            print(f"step {step}/{steps} loss {history['loss'][-1]['loss']:.3f} {rate:.1f} ex/s "
                  f"lr {sched.get_last_lr()[0]:.2e} eta {(steps - step) * BATCH / rate / 60:.0f} min", flush=True)
        if step in saves:
            checkpoint(model, tok, args, history, step)
        if step in saves or time.time() - last_save > SAVE_EVERY_S or step == steps:
            save_state(state_file, model, opt, sched, step, history)
            last_save = time.time()


def fingerprint(examples: list, model: nn.Module) -> dict:
    """What a run's state depends on beyond its folder's name (the command's settings): the training constants, the
    windows (the data files, the tokenizer, the code that builds them) and the start weights (the base model,
    --init, the model's shape). A resume where one of them changed went on silently from another run's state."""
    windows, weights = hashlib.sha256(), hashlib.sha256()
    for e in examples:
        windows.update(repr((e.ids, e.types, e.start, e.end, e.source, e.plausible_start, e.plausible_end)).encode())
    for name, tensor in sorted(model.state_dict().items()):
        weights.update(f"{name} {tuple(tensor.shape)}".encode())
        weights.update(tensor.detach().float().contiguous().numpy().tobytes())
    return {"BATCH": BATCH, "WARMUP": WARMUP, "WEIGHT_DECAY": WEIGHT_DECAY, "PAD_MULTIPLE": PAD_MULTIPLE,
            "NEGATIVES_PER_ANSWERABLE": NEGATIVES_PER_ANSWERABLE, "HARD_MARGIN": HARD_MARGIN,
            "HARD_WEIGHT": HARD_WEIGHT, "windows (data, tokenizer, example code)": windows.hexdigest()[:12],
            "start weights (base model, --init, shape)": weights.hexdigest()[:12]}


def refuse_another_run(run: Path, saved: dict | None, now: dict) -> None:
    """Stop before a resume whose fingerprint differs from the run's; a run from before fingerprints is resumed."""
    if saved is None:
        print(f"note: {run} is from before run fingerprints: resumed unchecked (from now on it is checked)", flush=True)
        return
    if changed := [f"{k} {saved.get(k)} → {v}" for k, v in now.items() if saved.get(k) != v]:
        raise SystemExit(f"error: {run} was trained with other {'; '.join(changed)}: resuming would go on from another "
                         "run's state; delete that folder or give another --work to train afresh")


def span_loss(start: torch.Tensor, end: torch.Tensor, batch: list, loss_fn: nn.Module) -> torch.Tensor:
    """Mean start/end cross-entropy, plus the hinge by which [CLS] must beat an unanswerable's plausible span."""
    loss = (loss_fn(start, torch.tensor([e.start for e in batch])) + loss_fn(end, torch.tensor([e.end for e in batch]))) / 2
    rows = torch.tensor([k for k, e in enumerate(batch) if e.plausible_start], dtype=torch.long)
    if len(rows):
        ps = torch.tensor([batch[k].plausible_start for k in rows.tolist()])
        pe = torch.tensor([batch[k].plausible_end for k in rows.tolist()])
        span, null = start[rows, ps] + end[rows, pe], start[rows, 0] + end[rows, 0]
        loss = loss + HARD_WEIGHT * torch.relu(HARD_MARGIN + span - null).sum() / len(batch)
    return loss


def save_state(path: Path, model, opt, sched, step: int, history: dict) -> None:
    """Everything a resumed run needs, written atomically (a kill mid-write keeps the previous state); torch's random
    state too: dropout draws from it every step, and a resumed run that redrew from the seed trained another reader."""
    with atomic_path(path) as tmp:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "step": step, "history": history, "rng": torch.get_rng_state()}, tmp)


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


def checkpoint(model: M.SpanReader, tok, args: argparse.Namespace, history: dict, step: int) -> None:
    """Save the weights and score them on reader-val (fp32, as exported)."""
    ckpt = args.run / f"step{step}.pt"
    torch.save(model.state_dict(), ckpt)
    model.eval()
    result = M.evaluate(model, tok, args.seed)
    model.train()
    atomic_write_text(args.run / f"val_step{step}.json", json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k not in ("rows", "select_rows")}
    total = sum(history["counts"].values()) * args.epochs
    seen = min(step * BATCH, total)
    impossible = round(history["counts"].get("impossible", 0) * args.epochs * seen / total)  # real unanswerables
    history["checkpoints"].append({"step": step, "examples_seen": seen, "impossible_seen": impossible,
                                   "seconds": history["seconds"], "checkpoint": ckpt.name, **summary})
    atomic_write_text(args.run / "history.json", json.dumps(history, indent=1))  # half a JSON failed --skip-train
    print(f"checkpoint {ckpt.name} ({seen} windows) after {history['seconds'] / 60:.1f} min: {summary}", flush=True)


def stopped_at(run: Path) -> tuple[int, int] | None:
    """(last checkpoint's step, all steps) of a run stopped before its last checkpoint, else None."""
    history = json.loads((run / "history.json").read_text())
    last = max(c["step"] for c in history["checkpoints"])
    return (last, history["steps"]) if last < history["steps"] else None


def _run(args: argparse.Namespace) -> int:
    if args.mix and not args.examples:
        raise SystemExit("error: --mix needs --examples N > 0 (the windows the shares are of)")
    if args.init and not args.init.is_file():  # checked here, not when parsed: a report's command parses anywhere
        raise SystemExit(f"error: --init {args.init}: no such file")
    args.run = run_dir(args)
    if args.skip_train and not (args.run / "history.json").is_file():
        raise SystemExit(f"error: --skip-train: {args.run} holds no scored checkpoint of a run with these settings")
    if args.skip_train and (done := stopped_at(args.run)):  # a choice among the checkpoints so far is no run's choice
        raise SystemExit(f"error: --skip-train: the run in {args.run} stopped at step {done[0]} of {done[1]}; "
                         "run the command without --skip-train to finish it")
    args.run.mkdir(parents=True, exist_ok=True)
    if not args.skip_train:
        train(args)
    if not args.no_export:
        finish(args)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train-reader", help="fine-tune the extractive reader, export reader.onnx, write its report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=at_least(1), default=EPOCHS, help="passes over the training windows")
    p.add_argument("--checkpoints", type=at_least(1), default=CHECKPOINTS, help="equally spaced checkpoints (each scored on reader-val)")
    p.add_argument("--lr", type=at_least(0.0, float), default=LR, help="AdamW's peak learning rate (linear warm-up, decay)")
    p.add_argument("--examples", type=at_least(0), default=EXAMPLES, help="train on a seeded subset of this many windows (0 = all)")
    p.add_argument("--swaps", type=at_least(0.0, float), default=SWAPS_PER_ANSWERABLE,
                   help="share of answerable SQuAD questions also trained with a swapped name/number as no-answer")
    p.add_argument("--init", type=Path, default=None, help="start from this checkpoint's weights (a second stage)")
    p.add_argument("--skip-subset", type=at_least(0), default=0,
                   help="leave out the seeded subset of this many windows (a first stage's --examples, same seed)")
    p.add_argument("--mix", type=D.source_mix, default=None,
                   help="train on --examples windows with these shares of sources, e.g. impossible=0.2,answerable=0.8")
    p.add_argument("--seed", type=int, default=0, help="seed of the examples, the subset, the batch order and dropout")
    p.add_argument("--work", type=Path, default=home() / "reader-train", help="runs: state, checkpoints, validation rows")
    p.add_argument("--skip-train", action="store_true", help="export from the checkpoints of this run's folder (a run trained to its end)")
    p.add_argument("--no-export", action="store_true",
                   help="train and score the checkpoints only (comparing mixes); the shipped reader stays")
    p.set_defaults(func=_run)
