"""A tiny GPT-2 trained on SQuAD contexts, saved as nanoGPT ckpt.pt and as a HF GPT-2 folder.

Training takes about a minute, so the result is cached under ``tests/.cache/tiny_gpt/<hash>/``,
keyed by this file's text and the data's size: edit the settings (or how the model is saved) and it is trained
again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from convert.gpt import GPT, HF_CONV1D_WEIGHTS, GPTConfig
from evaluation.datasets import load_squad

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT.parent / "shared" / "data" / "squad2_dev_subset.json"
CACHE = ROOT / "tests" / ".cache" / "tiny_gpt"
EOS = "<|endoftext|>"

SETTINGS = {
    "vocab": 2000,  # BPE merges learnt; the model pads its rows to a multiple of 64 like nanoGPT
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 128,
    "batch": 8,
    "steps": 300,
    "lr": 3e-3,
    "seed": 0,
    "heldout_every": 10,  # every 10th SQuAD paragraph is kept out of training for the parity checks
    # One thread: barely slower on an idle 2-core machine, and 5× faster than two on a busy one, where
    # OpenMP's barriers make two threads wait on each other.
    "threads": 1,
}


@dataclass(frozen=True)
class TinyGPT:
    """Where the trained model lives in both input formats, with its tokenizer and held-back text."""

    root: Path

    @property
    def nanogpt_ckpt(self) -> Path:
        return self.root / "ckpt.pt"

    @property
    def hf_dir(self) -> Path:
        return self.root / "hf"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer.json"

    @property
    def heldout(self) -> Path:
        return self.root / "heldout.txt"

    def model(self) -> GPT:
        ckpt = torch.load(self.nanogpt_ckpt, weights_only=True)
        model = GPT(GPTConfig(**ckpt["model_args"]))
        model.load_state_dict(ckpt["model"])
        return model.eval()


def tiny_gpt() -> TinyGPT:
    """The cached tiny model, trained first if needed; skips when ../shared/data is absent."""
    if not SQUAD.is_file():
        pytest.skip(f"SQuAD data not found at {SQUAD}: the tiny GPT round trip trains on it")
    key = hashlib.sha256(Path(__file__).read_bytes() + str(SQUAD.stat().st_size).encode())
    done = CACHE / key.hexdigest()[:16]
    if not (done / "DONE").is_file():
        tmp = CACHE / f"{done.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _build(tmp)
        (tmp / "DONE").write_text(json.dumps(SETTINGS, indent=2))
        shutil.rmtree(done, ignore_errors=True)
        os.replace(tmp, done)
        for stale in CACHE.iterdir():  # models of earlier settings (other runs' builds in progress are kept)
            if stale != done and ".tmp-" not in stale.name:
                shutil.rmtree(stale, ignore_errors=True)
    return TinyGPT(done)


def _train_tokenizer(texts: list[str]) -> Tokenizer:
    """GPT-2 style byte-level BPE: no prefix space, GPT-2's regex, <|endoftext|> as the only special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SETTINGS["vocab"],
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def _build(out: Path) -> None:
    torch.manual_seed(SETTINGS["seed"])
    threads = torch.get_num_threads()
    torch.set_num_threads(SETTINGS["threads"])
    try:
        docs, _ = load_squad(SQUAD)
        texts = [d.text for d in docs]
        train = [t for i, t in enumerate(texts) if i % SETTINGS["heldout_every"]]
        heldout = [t for i, t in enumerate(texts) if not i % SETTINGS["heldout_every"]]
        tok = _train_tokenizer(train)
        tok.save(str(out / "tokenizer.json"))
        (out / "heldout.txt").write_text("\n".join(heldout) + "\n", encoding="utf-8")

        eos = tok.token_to_id(EOS)
        stream = torch.tensor([i for enc in tok.encode_batch(train) for i in (*enc.ids, eos)])
        cfg = GPTConfig(
            block_size=SETTINGS["block_size"],
            vocab_size=-(-tok.get_vocab_size() // 64) * 64,
            n_layer=SETTINGS["n_layer"],
            n_head=SETTINGS["n_head"],
            n_embd=SETTINGS["n_embd"],
        )
        model = _train(GPT(cfg), stream)
        _save_nanogpt(model, out / "ckpt.pt")
        _save_hf(model, out / "hf", out / "tokenizer.json")
    finally:
        torch.set_num_threads(threads)


def _train(model: GPT, stream: torch.Tensor) -> GPT:
    T, B, steps = SETTINGS["block_size"], SETTINGS["batch"], SETTINGS["steps"]
    opt = torch.optim.AdamW(model.parameters(), lr=SETTINGS["lr"], weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=SETTINGS["lr"], total_steps=steps, pct_start=0.05)
    model.train()
    for _ in range(steps):
        starts = torch.randint(len(stream) - T - 1, (B,))
        x = torch.stack([stream[s : s + T] for s in starts])
        y = torch.stack([stream[s + 1 : s + T + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval()


def _save_nanogpt(model: GPT, path: Path) -> None:
    """As nanoGPT's train.py does: tied lm_head included, config in ``model_args``."""
    cfg = model.config
    args = {
        k: v
        for k, v in asdict(cfg).items()
        if k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout")
    }
    torch.save({"model": model.state_dict(), "model_args": {**args, "vocab_size": cfg.vocab_size}}, path)


def _save_hf(model: GPT, folder: Path, tokenizer: Path) -> None:
    """Laid out as the hub's gpt2 model.safetensors: Conv1D (in, out) weights, no "transformer." prefix,
    tied head omitted."""
    folder.mkdir()
    cfg = model.config
    sd = {
        k.removeprefix("transformer."): (v.T if k.endswith(HF_CONV1D_WEIGHTS) else v).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(sd, folder / "model.safetensors")
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu",  # exact GELU, as nanoGPT trains (HF's default is gelu_new)
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "vocab_size": cfg.vocab_size,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "tie_word_embeddings": True,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(tokenizer, folder / "tokenizer.json")
