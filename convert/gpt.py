"""GPT → GGUF: nanoGPT / Hugging Face GPT-2 checkpoints to llama.cpp, checked against the torch model.

``python -m convert gpt CHECKPOINT --out model.gguf --type f16|q8_0 --verify-text heldout.txt``

The export is only marked good (``passed`` in ``model.gguf.parity.json``, exit status 0) when llama.cpp, fed
the same tokens of held-back text, agrees with the torch model within the thresholds below.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gguf import MODEL_TENSOR
from tokenizers import Tokenizer

from convert.gguf_writer import (
    OUT_TYPES,
    GPT2Hparams,
    VocabError,
    read_bpe_vocab,
    tensor_name,
    write_gpt2_gguf,
)
from convert.report import write_report
from edge_rag.errors import EdgeRAGError

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

NANOGPT_CKPT_KEYS = ("model", "model_args")  # what nanoGPT's train.py saves in ckpt.pt
HF_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers some checkpoints carry: not weights
# HF activation_function → nn.GELU(approximate=...). llama.cpp's gpt2 always runs the tanh form, so an
# exact-GELU checkpoint (nanoGPT's) differs by that approximation; the parity check measures it.
HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


class CheckpointError(EdgeRAGError, ValueError):
    """The checkpoint cannot become a llama.cpp ``gpt2`` model; the message names the file and tensor."""


@dataclass(frozen=True)
class GPTConfig:
    """nanoGPT's GPTConfig plus what the HF GPT-2 config can vary that changes the numbers."""

    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True
    layer_norm_eps: float = 1e-5
    gelu: str = "none"  # nn.GELU(approximate=...): nanoGPT trains with exact GELU, HF "gelu_new" is "tanh"
    tie_embeddings: bool = True

    @classmethod
    def from_dict(cls, d: dict, source: str | Path = "config") -> GPTConfig:
        """Read nanoGPT ``model_args`` or a HF GPT-2 ``config.json``."""
        if "n_positions" in d or "n_ctx" in d or d.get("model_type") == "gpt2":
            return cls._from_hf(d, source)
        known = {f.name for f in fields(cls)}
        missing = [k for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd") if k not in d]
        if missing:
            raise CheckpointError(f"{source}: config lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def _from_hf(cls, d: dict, source: str | Path) -> GPTConfig:
        act = d.get("activation_function", "gelu_new")
        if act not in HF_GELU:
            raise CheckpointError(f"{source}: activation_function {act!r}: llama.cpp's gpt2 graph uses GELU")
        if d.get("n_inner") not in (None, 4 * d["n_embd"]):
            raise CheckpointError(f"{source}: n_inner={d['n_inner']}: only the 4×n_embd MLP is supported")
        if d.get("scale_attn_by_inverse_layer_idx"):
            raise CheckpointError(
                f"{source}: scale_attn_by_inverse_layer_idx is not in llama.cpp's gpt2 graph"
            )
        return cls(
            block_size=d.get("n_positions", d.get("n_ctx")),
            vocab_size=d["vocab_size"],
            n_layer=d["n_layer"],
            n_head=d["n_head"],
            n_embd=d["n_embd"],
            layer_norm_eps=d.get("layer_norm_epsilon", 1e-5),
            gelu=HF_GELU[act],
            tie_embeddings=d.get("tie_word_embeddings", True),
        )


# -- model: nanoGPT with the HF GPT-2 parameter names (c_attn, c_proj, c_fc) in nn.Linear (out, in) layout


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise CheckpointError(f"n_embd={cfg.n_embd} is not a multiple of n_head={cfg.n_head}")
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate=cfg.gelu)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Pre-LN GPT-2: learned positions, GELU, 4× MLP; the reference forward the GGUF is checked against."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) and, given targets, the mean next-token cross-entropy."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    @torch.no_grad()
    def greedy(self, prompt: list[int], n_new: int) -> list[int]:
        """Argmax continuation (no KV cache: the reference is about numbers, not speed)."""
        ids = list(prompt)
        for _ in range(n_new):
            logits, _ = self(torch.tensor([ids[-self.config.block_size :]]))
            ids.append(int(logits[0, -1].argmax()))
        return ids[len(prompt) :]


# -- checkpoints


@dataclass
class GPTCheckpoint:
    """Weights in the canonical layout (nanoGPT names, nn.Linear (out, in), float32) with their config."""

    config: GPTConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Path
    name: str
    source_format: str  # "nanogpt" | "hf"

    def model(self) -> GPT:
        model = GPT(self.config)
        tied = (
            {"lm_head.weight": self.state_dict["transformer.wte.weight"]}
            if self.config.tie_embeddings
            else {}
        )
        model.load_state_dict({**self.state_dict, **tied})
        return model.eval()


def expected_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Canonical tensor names and shapes the config calls for (lm_head only when untied)."""
    C, V = cfg.n_embd, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (cfg.block_size, C),
    }
    linears = {
        "attn.c_attn": (3 * C, C),
        "attn.c_proj": (C, C),
        "mlp.c_fc": (4 * C, C),
        "mlp.c_proj": (C, 4 * C),
    }
    for i in range(cfg.n_layer):
        for ln in ("ln_1", "ln_2"):
            shapes[f"transformer.h.{i}.{ln}.weight"] = (C,)
            if cfg.bias:
                shapes[f"transformer.h.{i}.{ln}.bias"] = (C,)
        for part, shape in linears.items():
            shapes[f"transformer.h.{i}.{part}.weight"] = shape
            if cfg.bias:
                shapes[f"transformer.h.{i}.{part}.bias"] = shape[:1]
    shapes["transformer.ln_f.weight"] = (C,)
    if cfg.bias:
        shapes["transformer.ln_f.bias"] = (C,)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def _canonical(
    raw: dict[str, torch.Tensor], cfg: GPTConfig, source: Path, conv1d: bool
) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """Check names and shapes against the config and bring HF Conv1D (in, out) weights to (out, in).

    An lm_head equal to wte (or absent) is tied: llama.cpp's gpt2 then reads token_embd as the output matrix.
    """
    sd: dict[str, torch.Tensor] = {}
    stored_as: dict[str, str] = {}  # canonical name → name in the file, for error messages
    for key, tensor in raw.items():
        name = key.removeprefix("_orig_mod.")  # torch.compile'd nanoGPT
        if not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # HF GPT2Model saves without the LM-head wrapper's prefix
        if not name.endswith(MASK_BUFFERS):
            sd[name], stored_as[name] = tensor, key
    wte, head = sd.get("transformer.wte.weight"), sd.get("lm_head.weight")
    if head is not None and wte is not None and head.shape == wte.shape and torch.equal(head, wte):
        del sd["lm_head.weight"]
    cfg = replace(cfg, tie_embeddings="lm_head.weight" not in sd)
    want = expected_shapes(cfg)
    unexpected = sorted(stored_as[name] for name in set(sd) - set(want))
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensors for a GPT-2 checkpoint: {', '.join(unexpected)}")
    for name, shape in want.items():
        if name not in sd:
            hint = " (llama.cpp's gpt2 needs every bias; a bias-free model must say bias=False in its config)"
            raise CheckpointError(
                f"{source}: missing tensor {name!r}{hint if name.endswith('.bias') else ''}"
            )
        flip = conv1d and name.endswith(HF_CONV1D_WEIGHTS)
        stored = shape[::-1] if flip else shape
        if tuple(sd[name].shape) != stored:
            raise CheckpointError(
                f"{source}: tensor {stored_as[name]!r} has shape {tuple(sd[name].shape)}, expected {stored}"
                f" for n_embd={cfg.n_embd}, block_size={cfg.block_size}, vocab_size={cfg.vocab_size}"
            )
        sd[name] = (sd[name].T if flip else sd[name]).to(torch.float32).contiguous()
    return cfg, sd


def _find_tokenizer(tokenizer: Path | None, folder: Path, source: Path) -> Path:
    path = tokenizer or folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{source}: no tokenizer at {path}; pass --tokenizer tokenizer.json")
    return path


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"no config at {path}; pass --config config.json")
    return json.loads(path.read_text(encoding="utf-8"))


def load_checkpoint(
    path: str | Path, *, config: str | Path | None = None, tokenizer: str | Path | None = None
) -> GPTCheckpoint:
    """A HF GPT-2 folder (config.json, model.safetensors, tokenizer.json) or a nanoGPT ``.pt``.

    The ``.pt`` is either nanoGPT's ``ckpt.pt`` (``model`` + ``model_args``) or a bare state_dict with
    ``--config``; its config.json and tokenizer.json default to files next to it.
    """
    path = Path(path)
    config_path = Path(config) if config else None
    tokenizer_path = Path(tokenizer) if tokenizer else None
    if path.is_dir():
        from safetensors.torch import load_file

        weights = path / "model.safetensors"
        if not weights.is_file():
            raise CheckpointError(
                f"{path}: no model.safetensors (pytorch_model.bin is not read: save as safetensors)"
            )
        cfg_path = config_path or path / "config.json"
        cfg = GPTConfig.from_dict(_read_config(cfg_path), cfg_path)
        cfg, sd = _canonical(load_file(weights), cfg, weights, conv1d=True)
        fmt, folder = "hf", path
    elif path.is_file():
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickles of custom classes, truncated files
            raise CheckpointError(f"{path}: not a loadable torch checkpoint ({exc})") from exc
        if isinstance(obj, dict) and all(k in obj for k in NANOGPT_CKPT_KEYS):
            raw, args = obj["model"], obj["model_args"]
            cfg = GPTConfig.from_dict(_read_config(config_path) if config_path else args, config_path or path)
        elif isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
            cfg_path = config_path or path.with_name("config.json")
            raw, cfg = obj, GPTConfig.from_dict(_read_config(cfg_path), cfg_path)
        else:
            raise CheckpointError(f"{path}: neither a state_dict nor a nanoGPT ckpt with {NANOGPT_CKPT_KEYS}")
        cfg, sd = _canonical(raw, cfg, path, conv1d=False)
        fmt, folder = "nanogpt", path.parent
    else:
        raise CheckpointError(f"{path}: no such checkpoint file or folder")
    return GPTCheckpoint(cfg, sd, _find_tokenizer(tokenizer_path, folder, path), path.stem or path.name, fmt)


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
    tensor_types = write_gguf(ckpt, out, out_type)
    report: dict = {
        "artifact": "gguf",
        "type": out_type,
        "source": str(checkpoint),
        "source_format": ckpt.source_format,
        "tied_embeddings": ckpt.config.tie_embeddings,
        "file_bytes": Path(out).stat().st_size,
        "tensor_types": tensor_types,
        "config": {f.name: getattr(ckpt.config, f.name) for f in fields(ckpt.config)},
    }
    if verify_text is None:
        report.update(verified=False, passed=False, failures=["not verified: no held-back text given"])
    else:
        report.update(
            verified=True,
            **verify_gguf(out, ckpt, verify_text, out_type, max_tokens=verify_tokens, n_threads=n_threads),
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
        "--verify-tokens", type=int, default=VERIFY_MAX_TOKENS, help="tokens compared (default %(default)s)"
    )
    p.add_argument("--threads", type=int, help="torch and llama.cpp threads (default: their own)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        report = convert_gpt(
            args.checkpoint,
            args.out,
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
