"""The GPT model in torch: nanoGPT with the Hugging Face GPT-2 parameter names, and its config.

The converter loads checkpoints into it (``gpt_checkpoint``) and compares llama.cpp against it (``gpt``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from edge_rag.errors import EdgeRAGError

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

