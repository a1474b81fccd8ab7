"""GPT → GGUF: nanoGPT / Hugging Face GPT-2 checkpoints to llama.cpp, checked against the torch model.

``python -m convert gpt CHECKPOINT --out model.gguf --type f16|q8_0 --verify-text heldout.txt``

The export is only marked good (``passed`` in ``model.gguf.parity.json``, exit status 0) when llama.cpp, fed
the same tokens of held-back text, agrees with the torch model within the thresholds below.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from gguf import MODEL_TENSOR
from tokenizers import Tokenizer

from convert.args import InputError, at_least, out_file
from convert.gguf_writer import (
    OUT_TYPES,
    GPT2Hparams,
    VocabError,
    read_bpe_vocab,
    tensor_name,
    write_gpt2_gguf,
)
from convert.gpt_checkpoint import HF_CONV1D_WEIGHTS, GPTCheckpoint, load_checkpoint
from convert.gpt_model import GPT, CheckpointError, GPTConfig
from convert.report import write_report
from edge_rag.storage.fileio import atomic_path

# The converter's public API (the model and checkpoint reader live in gpt_model / gpt_checkpoint).
__all__ = [
    "GPT", "HF_CONV1D_WEIGHTS", "MAX_PPL_REL_DIFF", "MIN_TOP1_AGREEMENT", "CheckpointError", "GPTCheckpoint",
    "GPTConfig", "convert_gpt", "load_checkpoint", "verify_gguf", "write_gguf",
]

# -- parity thresholds: an export below any of them is written but reported as failed (exit status 1)
MIN_TOP1_AGREEMENT = {"f16": 0.99, "q8_0": 0.97}  # share of positions whose argmax token is the same
MAX_PPL_REL_DIFF = {"f16": 0.01, "q8_0": 0.03}  # |ppl_gguf − ppl_torch| / ppl_torch on the held-back text
MIN_TOKENIZER_AGREEMENT = 0.99  # share of held-back lines llama.cpp tokenises exactly as tokenizer.json does

# -- verification budget
VERIFY_MAX_TOKENS = 4096  # held-back tokens compared position by position
VERIFY_MAX_WINDOW = 512  # evaluation window (further capped by the model's block_size)
GREEDY_PROMPTS = 5  # greedy generations compared token by token (reported, not gated: one early
GREEDY_PROMPT_TOKENS = 16  # near-tie flips a whole continuation, which says little about the export)
GREEDY_NEW_TOKENS = 32
TOKENIZER_CHECK_LINES = 64


# -- GGUF

GLOBAL_TENSORS = {
    "transformer.wte.weight": tensor_name(MODEL_TENSOR.TOKEN_EMBD, "weight"),
    "transformer.wpe.weight": tensor_name(MODEL_TENSOR.POS_EMBD, "weight"),
    "transformer.ln_f.weight": tensor_name(MODEL_TENSOR.OUTPUT_NORM, "weight"),
    "transformer.ln_f.bias": tensor_name(MODEL_TENSOR.OUTPUT_NORM, "bias"),
    "lm_head.weight": tensor_name(MODEL_TENSOR.OUTPUT, "weight"),
}
BLOCK_TENSORS = {
    "ln_1": MODEL_TENSOR.ATTN_NORM,
    "attn.c_attn": MODEL_TENSOR.ATTN_QKV,
    "attn.c_proj": MODEL_TENSOR.ATTN_OUT,
    "ln_2": MODEL_TENSOR.FFN_NORM,
    "mlp.c_fc": MODEL_TENSOR.FFN_UP,
    "mlp.c_proj": MODEL_TENSOR.FFN_DOWN,
}


def gguf_tensors(ckpt: GPTCheckpoint) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, array) in llama.cpp's order; a bias-free model gets zero biases, which gpt2 requires."""
    sd = ckpt.state_dict
    for key, name in GLOBAL_TENSORS.items():
        if key in sd:
            yield name, sd[key].numpy()
        elif key.endswith(".bias"):
            yield name, np.zeros(ckpt.config.n_embd, np.float32)
    for i in range(ckpt.config.n_layer):
        for part, tensor in BLOCK_TENSORS.items():
            weight = sd[f"transformer.h.{i}.{part}.weight"].numpy()
            bias = sd.get(f"transformer.h.{i}.{part}.bias")
            yield tensor_name(tensor, "weight", i), weight
            yield (
                tensor_name(tensor, "bias", i),
                bias.numpy() if bias is not None else np.zeros(weight.shape[0], np.float32),
            )


def write_gguf(ckpt: GPTCheckpoint, out: str | Path, out_type: str) -> dict[str, str]:
    """Write the GGUF; returns the GGML type of each tensor."""
    cfg = ckpt.config
    hparams = GPT2Hparams(
        cfg.block_size, cfg.n_embd, cfg.n_layer, cfg.n_head, 4 * cfg.n_embd, cfg.layer_norm_eps
    )
    vocab = read_bpe_vocab(ckpt.tokenizer, cfg.vocab_size)
    return write_gpt2_gguf(out, hparams, gguf_tensors(ckpt), vocab, out_type, ckpt.name)


# -- verification


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _llama_greedy(llm, prompt: list[int], n_new: int) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    for _ in range(n_new):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(out[-1:])
    return out


def verify_gguf(
    gguf_path: str | Path,
    ckpt: GPTCheckpoint,
    text: str,
    out_type: str,
    *,
    max_tokens: int = VERIFY_MAX_TOKENS,
    n_threads: int | None = None,
) -> dict:
    """llama.cpp on the GGUF against the torch model, on the same tokens of ``text``: the parity figures."""
    from llama_cpp import Llama  # device dependency: imported here so other sub-commands work without it

    tokenizer = Tokenizer.from_file(str(ckpt.tokenizer))
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:max_tokens]
    window = min(ckpt.config.block_size, VERIFY_MAX_WINDOW)
    if len(ids) < max(window, GREEDY_PROMPT_TOKENS + 1):
        raise CheckpointError(f"verification text has {len(ids)} tokens; at least {window} are needed")
    model = ckpt.model()
    llm = Llama(
        model_path=str(gguf_path),
        n_ctx=window,
        n_batch=window,
        logits_all=True,
        verbose=False,
        n_threads=n_threads,
    )
    try:
        agree = positions = n_targets = 0
        nll_torch = nll_gguf = max_diff = sum_diff = 0.0
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start : start + window]
            if len(chunk) < 2:
                break
            with torch.no_grad():
                ref = model(torch.tensor([chunk]))[0][0].numpy()
            llm.reset()
            llm.eval(chunk)
            got = np.asarray(llm.scores[: len(chunk)], dtype=np.float32)
            diff = np.abs(got - ref)
            max_diff, sum_diff = max(max_diff, float(diff.max())), sum_diff + float(diff.mean()) * len(chunk)
            agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
            positions += len(chunk)
            targets = np.asarray(chunk[1:])
            rows = np.arange(len(targets))
            nll_torch -= float(_log_softmax(ref[:-1])[rows, targets].sum())
            nll_gguf -= float(_log_softmax(got[:-1])[rows, targets].sum())
            n_targets += len(targets)

        starts = np.linspace(0, len(ids) - GREEDY_PROMPT_TOKENS, GREEDY_PROMPTS).astype(int)
        same = 0
        for s in starts:
            prompt = ids[s : s + GREEDY_PROMPT_TOKENS]
            n_new = min(GREEDY_NEW_TOKENS, window - len(prompt))
            a, b = model.greedy(prompt, n_new), _llama_greedy(llm, prompt, n_new)
            same += sum(x == y for x, y in zip(a, b, strict=True))
        greedy_total = len(starts) * min(GREEDY_NEW_TOKENS, window - GREEDY_PROMPT_TOKENS)

        lines = [ln for ln in text.splitlines() if ln.strip()][:TOKENIZER_CHECK_LINES]
        tok_same = sum(
            llm.tokenize(ln.encode("utf-8"), add_bos=False, special=False)
            == tokenizer.encode(ln, add_special_tokens=False).ids
            for ln in lines
        )
    finally:
        llm.close()

    ppl_torch, ppl_gguf = math.exp(nll_torch / n_targets), math.exp(nll_gguf / n_targets)
    figures = {
        "tokens_compared": positions,
        "window": window,
        "top1_agreement": agree / positions,
        "max_abs_logit_diff": max_diff,
        "mean_abs_logit_diff": sum_diff / positions,
        "ppl_torch": ppl_torch,
        "ppl_gguf": ppl_gguf,
        "ppl_rel_diff": abs(ppl_gguf - ppl_torch) / ppl_torch,
        "greedy_match": same / greedy_total,
        "tokenizer_agreement": tok_same / len(lines) if lines else 1.0,
    }
    limits = {  # figure → (limit, whether the figure must be at least the limit or at most)
        "top1_agreement": (MIN_TOP1_AGREEMENT[out_type], ">="),
        "ppl_rel_diff": (MAX_PPL_REL_DIFF[out_type], "<="),
        "tokenizer_agreement": (MIN_TOKENIZER_AGREEMENT, ">="),
    }
    failures = [
        f"{key} {figures[key]:.4f} is not {op} {limit}"
        for key, (limit, op) in limits.items()
        if not (figures[key] >= limit if op == ">=" else figures[key] <= limit)
    ]
    thresholds = {key: f"{op} {limit}" for key, (limit, op) in limits.items()}
    return {**figures, "thresholds": thresholds, "failures": failures, "passed": not failures}


def convert_gpt(
    checkpoint: str | Path,
    out: str | Path,
    out_type: str = "f16",
    *,
    config: str | Path | None = None,
    tokenizer: str | Path | None = None,
    verify_text: str | None = None,
    verify_tokens: int = VERIFY_MAX_TOKENS,
    n_threads: int | None = None,
) -> dict:
    """Load, write the GGUF, verify it against torch on ``verify_text`` and write ``<out>.parity.json``.

    Without ``verify_text`` the GGUF is written but the report says ``passed: false`` (not verified).
    """
    if out_type not in OUT_TYPES:
        raise CheckpointError(f"--type {out_type!r}: choose one of {', '.join(OUT_TYPES)}")
    ckpt = load_checkpoint(checkpoint, config=config, tokenizer=tokenizer)
    # Written and verified beside ``out``, then renamed over it: a write cut short left half a GGUF beside the
    # previous export's passing report, for the bundle to pack.
    with atomic_path(out) as tmp:
        tensor_types = write_gguf(ckpt, tmp, out_type)
        report: dict = {
            "artifact": "gguf",
            "type": out_type,
            "source": str(checkpoint),
            "source_format": ckpt.source_format,
            "tied_embeddings": ckpt.config.tie_embeddings,
            "file_bytes": tmp.stat().st_size,
            "tensor_types": tensor_types,
            "config": {f.name: getattr(ckpt.config, f.name) for f in fields(ckpt.config)},
        }
        if verify_text is None:
            report.update(verified=False, passed=False, failures=["not verified: no held-back text given"])
        else:
            report.update(
                verified=True,
                **verify_gguf(tmp, ckpt, verify_text, out_type, max_tokens=verify_tokens, n_threads=n_threads),
            )
    write_report(out, report)
    return report


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gpt",
        help="GPT-2 checkpoint (nanoGPT .pt or HF folder) → GGUF, verified with llama.cpp",
        description=__doc__,
        epilog=(
            f"thresholds: top-1 agreement >= {MIN_TOP1_AGREEMENT}, perplexity within {MAX_PPL_REL_DIFF}"
            f" (relative), tokenizer agreement >= {MIN_TOKENIZER_AGREEMENT}"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", type=Path, help="nanoGPT .pt (ckpt.pt or state_dict) or HF GPT-2 folder")
    p.add_argument("--out", type=Path, required=True, help="GGUF file to write")
    p.add_argument("--type", choices=sorted(OUT_TYPES), default="f16", help="type of the weight matrices")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: next to the checkpoint)")
    p.add_argument(
        "--config", type=Path, help="nanoGPT model_args or HF config.json (default: from the checkpoint)"
    )
    p.add_argument(
        "--verify-text", type=Path, help="held-back text; without it the export is not marked good"
    )
    p.add_argument(
        "--verify-tokens", type=at_least(1), default=VERIFY_MAX_TOKENS, help="tokens compared (default %(default)s)"
    )
    p.add_argument("--threads", type=int, help="torch and llama.cpp threads (default: their own)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.verify_text and not args.verify_text.is_file():  # not when parsed: the docs' commands parse anywhere
        raise InputError(f"--verify-text {args.verify_text}: no such file")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        report = convert_gpt(
            args.checkpoint,
            out_file(args.out),
            args.type,
            config=args.config,
            tokenizer=args.tokenizer,
            verify_text=args.verify_text.read_text(encoding="utf-8") if args.verify_text else None,
            verify_tokens=args.verify_tokens,
            n_threads=args.threads,
        )
    except (CheckpointError, VocabError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for failure in report["failures"]:
        print(f"    FAILED: {failure}", file=sys.stderr)
    return 0 if report["passed"] else 1
