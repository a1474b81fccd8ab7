"""GPT checkpoints (nanoGPT ``ckpt.pt`` or a Hugging Face GPT-2 folder) read into one canonical layout,
with names and shapes checked against the config."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from convert.gpt_model import GPT, CheckpointError, GPTConfig

NANOGPT_CKPT_KEYS = ("model", "model_args")  # what nanoGPT's train.py saves in ckpt.pt
HF_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers some checkpoints carry: not weights


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
        try:
            tensors = load_file(weights)
        except Exception as exc:  # a file cut short: "incomplete metadata, file not fully covered"
            raise CheckpointError(f"{weights}: not a readable safetensors file ({exc})") from exc
        cfg, sd = _canonical(tensors, cfg, weights, conv1d=True)
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
