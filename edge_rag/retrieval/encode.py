"""Sentence encoder: ONNX transformer + tokenizers, mean pooling over the mask, L2-normalised.

Texts are sorted by length and cut into batches bounded in padded tokens (rows × longest row), so
onnxruntime's activations stay flat however many texts come in; the CPU arena is off so memory freed
after a batch goes back to the OS instead of staying reserved at the largest batch ever seen.
"""
from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from ..config import default_threads
from ..errors import BundleError


def session_options(threads: int) -> ort.SessionOptions:
    """CPU session options shared by every ONNX model we run: arena off, bounded threads, no spinning.

    Each session has its own pool of ``threads`` workers, and by default a worker spins on its core for a while after
    its work instead of sleeping. A question runs three sessions in a row (encoder, router, reader): on 2 cores the
    reader's workers then competed with the encoder's still-spinning ones, and the read stage took twice its
    compute (docs/decisions/ort-spinning.md). Outputs do not change, only when the workers sleep.

    ``x64quantprecision``: on x86 without VNNI, onnxruntime sums u8×s8 products in pairs that saturate at 16 bits
    (``vpmaddubsw``), so the 8-bit reader scored otherwise there than on VNNI and ARM, where the calibration's counts
    hold. The option makes it sum those weights as u8×u8, exactly, on such CPUs only (docs/decisions/reader-kernels.md)."""
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    opts.intra_op_num_threads = threads or default_threads()
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.x64quantprecision", "1")
    opts.log_severity_level = 3
    return opts


def load_session(path: Path, threads: int) -> ort.InferenceSession:
    try:
        session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for corrupt models
        raise BundleError(f"cannot load ONNX model {path}: {exc}") from exc
    _MADE.add(session)
    return session


_MADE: weakref.WeakSet[ort.InferenceSession] = weakref.WeakSet()  # the sessions alive in this process


def _kept_in_child() -> None:
    """A forked child never frees the sessions it inherited: freeing one joins its thread pool's workers, which are
    its parent's threads, so a child that dropped its inherited EdgeRAG, or only exited, hung for good. Kept, they cost
    it only the pages it shares with its parent."""
    for session in _MADE:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(session))
    _MADE.clear()


os.register_at_fork(after_in_child=_kept_in_child)


TOKENIZE_CHARS = 1 << 19  # characters the tokenizer encodes at once (a long text's overflow is dropped after each)
HEAD_CHARS_PER_TOKEN = 16  # a long text is tokenized from a head of this many characters per kept token (_head)


class Tokens(NamedTuple):
    """One text's tokens as the encoder feeds them (pad_batch reads these fields of a tokenizers Encoding too)."""

    ids: np.ndarray
    attention_mask: np.ndarray
    type_ids: np.ndarray


class Encoder:
    """Embeds texts into unit vectors of ``dim`` floats."""

    def __init__(
        self,
        onnx_path: str | Path,
        tokenizer_path: str | Path,
        max_seq_len: int = 256,
        batch_tokens: int = 2048,
        threads: int = 0,
    ) -> None:
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:
            raise BundleError(f"cannot load tokenizer {tokenizer_path}: {exc}") from exc
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_seq_len)
        self.session = load_session(Path(onnx_path), threads)
        self.run_options = ort.RunOptions()  # stop() sets its terminate flag from another thread
        self.input_names = {i.name for i in self.session.get_inputs()}
        hidden = self.session.get_outputs()[0].shape  # (batch, sequence, dim): a manifest naming another model fails here
        if not {"input_ids", "attention_mask"} <= self.input_names or len(hidden) != 3 or not isinstance(hidden[2], int):
            raise BundleError(f"{onnx_path} is not a sentence encoder: inputs {sorted(self.input_names)}, output {hidden}")
        self.dim = hidden[2]
        self.max_seq_len = max_seq_len
        self.batch_tokens = max(batch_tokens, max_seq_len)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of shape (len(texts), dim), float32, each row of unit length."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenize(texts)
        for rows in length_batches([len(e.ids) for e in encodings], self.batch_tokens):
            out[rows] = self._run([encodings[i] for i in rows])
        return out

    def _tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """The texts' tokens, cut to max_seq_len, tokenized about TOKENIZE_CHARS characters at a time and kept as arrays:
        the tokenizer's encodings hold the whole of a long text as overflow, ~1.7 MB for a 60k-character passage, so a
        batch of 1,024 such passages held 1.8 GB (the memory plan prices the activations, not the tokenizer). A long
        text is tokenized from its head (``_head``): a 60k-character passage took ~25 ms to tokenize whole, for the
        256 tokens kept of it."""
        heads = [self._head(text) for text in texts]
        out: list[Tokens] = []
        start, chars = 0, 0
        for end, head in enumerate(heads, 1):
            chars += len(head)
            if chars >= TOKENIZE_CHARS or end == len(heads):
                for i, e in enumerate(self.tokenizer.encode_batch(heads[start:end]), start):
                    if len(heads[i]) < len(texts[i]) and not e.overflowing:  # the head held fewer than are kept
                        e = self.tokenizer.encode(texts[i])
                    out.append(Tokens(*(np.asarray(x, dtype=np.int64) for x in (e.ids, e.attention_mask, e.type_ids))))
                start, chars = end, 0
        return out

    def _head(self, text: str) -> str:
        """The start of ``text`` up to its last space within HEAD_CHARS_PER_TOKEN × max_seq_len characters. A space
        ends a word for every pre-tokenizer (BERT's, Metaspace, byte-level BPE), so the head's tokens are the
        text's own up to the cut; when the head holds more than max_seq_len of them, the kept ones are the text's
        (``_tokenize`` checks that, else tokenizes the whole text)."""
        limit = HEAD_CHARS_PER_TOKEN * self.max_seq_len
        cut = text.rfind(" ", 0, limit) if len(text) > limit else -1
        return text if cut <= 0 else text[:cut]

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    def encode_alone(self, texts: Sequence[str]) -> np.ndarray:
        """``encode``, each text in a batch of its own, as the pipeline encodes a question: an int8 model scales its
        activations by the largest value in the whole batch, so a vector shifts with the texts batched with it
        (docs/decisions/int8-scheme.md)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self.encode_one(text)
        return out

    def stop(self) -> None:
        """Abort the batch this encoder is running (from another thread): its ``encode`` raises, now and ever after.
        For an indexing session when the server stops: a batch of 1,024 passages takes seconds on a small CPU."""
        self.run_options.terminate = True

    def _run(self, encodings: list) -> np.ndarray:
        feeds = pad_batch(encodings)
        hidden = self.session.run(None, {k: v for k, v in feeds.items() if k in self.input_names}, self.run_options)[0]
        return mean_pool(hidden, feeds["attention_mask"])


def length_batches(lengths: Sequence[int], batch_tokens: int) -> Iterator[list[int]]:
    """Row indices grouped by length so that rows × longest ≤ batch_tokens (bounds activation memory)."""
    order = np.argsort(lengths, kind="stable")
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[i] > batch_tokens:
            yield batch
            batch = []
        batch.append(int(i))
    if batch:
        yield batch


def pad_batch(encodings: Sequence) -> dict[str, np.ndarray]:
    """BERT feeds (input_ids, attention_mask, token_type_ids) right-padded to the longest encoding."""
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for r, e in enumerate(encodings):
        n = len(e.ids)
        ids[r, :n], mask[r, :n], types[r, :n] = e.ids, e.attention_mask, e.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers mean pooling over real tokens, then L2 normalisation."""
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
