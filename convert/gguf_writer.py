"""GGUF for llama.cpp's ``gpt2`` architecture: metadata, GPT-2 byte-level BPE vocabulary, typed tensors.

Mirrors what llama.cpp's ``convert_hf_to_gguf.py`` writes for ``GPT2LMHeadModel`` so that the file loads in
the llama.cpp bundled with llama-cpp-python, without depending on llama.cpp's converter or ``transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import MODEL_ARCH, MODEL_TENSOR, GGMLQuantizationType, LlamaFileType, TokenType
from tqdm import tqdm

ARCH = gguf.MODEL_ARCH_NAMES[MODEL_ARCH.GPT2]  # "gpt2"
TOKENIZER_MODEL = "gpt2"  # tokenizer.ggml.model: byte-level BPE with merges
TOKENIZER_PRE = "gpt-2"  # tokenizer.ggml.pre: GPT-2's pre-tokenizer regex
EOS_TOKEN = "<|endoftext|>"  # GPT-2 uses it as BOS and EOS; llama.cpp would otherwise default both to id 11
PAD_TOKEN = "[PAD{}]"  # filler for model rows beyond the tokenizer (nanoGPT pads 50257 → 50304)

# --type → (general.file_type, type of the 2-D weights)
OUT_TYPES: dict[str, tuple[LlamaFileType, GGMLQuantizationType]] = {
    "f16": (LlamaFileType.MOSTLY_F16, GGMLQuantizationType.F16),
    "q8_0": (LlamaFileType.MOSTLY_Q8_0, GGMLQuantizationType.Q8_0),
}

# Kept in f32 whatever --type says, as llama.cpp's converter does: learned positions are read by get_rows
# and added to the residual stream, so quantising them costs accuracy for no size worth having.
F32_TENSORS = (MODEL_TENSOR.POS_EMBD,)


class VocabError(ValueError):
    """tokenizer.json is not a GPT-2 style byte-level BPE that llama.cpp's ``gpt-2`` tokenizer reproduces."""


@dataclass(frozen=True)
class GPT2Hparams:
    """The hyper-parameters llama.cpp reads for ``gpt2``."""

    n_ctx: int
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    norm_eps: float


@dataclass(frozen=True)
class BPEVocab:
    """Token strings by id (byte-level unicode, as in GPT-2's vocab.json), their types and the merge ranks."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    eos_id: int


def tensor_name(tensor: MODEL_TENSOR, suffix: str, bid: int | None = None) -> str:
    """GGUF name of a tensor, e.g. ``blk.3.attn_qkv.weight``."""
    base = gguf.TENSOR_NAMES[tensor]
    return (base.format(bid=bid) if bid is not None else base) + "." + suffix


def read_bpe_vocab(path: str | Path, n_vocab: int) -> BPEVocab:
    """Read a ``tokenizers`` tokenizer.json; pad to the model's ``n_vocab`` rows with unused tokens."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise VocabError(f"{path}: tokenizer model is {model.get('type')!r}, expected a byte-level 'BPE'")
    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        raise VocabError(
            f"{path}: pre-tokenizer {pre!r} is not GPT-2's (ByteLevel, add_prefix_space=false,"
            f" use_regex=true); llama.cpp's {TOKENIZER_PRE!r} pre-tokenizer would split text differently"
        )
    by_id: dict[int, str] = {int(i): tok for tok, i in model["vocab"].items()}
    types: dict[int, int] = {}
    for added in data.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        types[int(added["id"])] = TokenType.CONTROL if added.get("special") else TokenType.USER_DEFINED
    size = max(by_id) + 1
    if size > n_vocab:
        raise VocabError(f"{path}: tokenizer has {size} tokens but the model's vocab_size is {n_vocab}")
    tokens = [by_id.get(i, PAD_TOKEN.format(i)) for i in range(n_vocab)]
    token_types = [types.get(i, TokenType.NORMAL if i in by_id else TokenType.UNUSED) for i in range(n_vocab)]
    # tokenizers >= 0.20 stores merges as [left, right] pairs, older versions as "left right" strings
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if EOS_TOKEN not in tokens:
        raise VocabError(f"{path}: no {EOS_TOKEN!r} token; llama.cpp would take token 11 as end of text")
    return BPEVocab(tokens, token_types, merges, tokens.index(EOS_TOKEN))


def tensor_qtype(name: str, data: np.ndarray, weight_type: GGMLQuantizationType) -> GGMLQuantizationType:
    """Norms, biases (1-D) and positions stay f32; other matrices take the requested type."""
    if data.ndim <= 1 or any(name.startswith(gguf.TENSOR_NAMES[t] + ".") for t in F32_TENSORS):
        return GGMLQuantizationType.F32
    return weight_type


def write_gpt2_gguf(
    path: str | Path,
    hparams: GPT2Hparams,
    tensors: Iterable[tuple[str, np.ndarray]],
    vocab: BPEVocab,
    out_type: str,
    model_name: str,
) -> dict[str, str]:
    """Write the GGUF; ``tensors`` are (GGUF name, float32 array in torch (out, in) order).

    Returns the GGML type written for each tensor (Q8_0 falls back to F16 where rows are not whole blocks).
    """
    file_type, weight_type = OUT_TYPES[out_type]
    writer = gguf.GGUFWriter(str(path), arch=ARCH)
    writer.add_name(model_name)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    writer.add_context_length(hparams.n_ctx)
    writer.add_embedding_length(hparams.n_embd)
    writer.add_feed_forward_length(hparams.n_ff)
    writer.add_block_count(hparams.n_layer)
    writer.add_head_count(hparams.n_head)
    writer.add_layer_norm_eps(hparams.norm_eps)

    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_tokenizer_pre(TOKENIZER_PRE)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.eos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(False)  # GPT-2 / nanoGPT never train with a leading BOS

    written: dict[str, str] = {}
    for name, data in tqdm(list(tensors), desc=f"{Path(path).name} ({out_type})", unit="tensor"):
        qtype = tensor_qtype(name, data, weight_type)
        try:
            packed = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
        except gguf.QuantError:  # a row length that is not a multiple of the 32-value block
            qtype = GGMLQuantizationType.F16
            packed = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
        writer.add_tensor(name, packed, raw_dtype=qtype)
        written[name] = qtype.name

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=True)
    writer.close()
    return written
