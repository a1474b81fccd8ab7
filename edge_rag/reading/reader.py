"""Extractive reader: MiniLM + a span head with a SQuAD-2 no-answer score, run by onnxruntime.

The model reads ``question [SEP] "title: text"`` windows and gives start/end logits per token. A span
(i, j) scores start[i] + end[j]; the no-answer ("null") score is start[CLS] + end[CLS], as in SQuAD 2.0
BERT readers. Long passages are cut into overlapping windows; the first MAX_WINDOWS of each passage go
through the model in a few length-bounded batches. The same windowing and span decoding are used by
the trainer (``convert/train_reader.py``), so what is measured there is what runs here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from ..errors import BundleError, InputError
from ..models import bundle as B
from ..models.registry import SHIPPED_ASSETS
from ..retrieval.encode import length_batches, load_session, pad_batch
from ..types import Passage

READER_ASSET = SHIPPED_ASSETS[B.ROLE_READER]  # trained by `make reader`
CONTEXT_SEQUENCE = 1  # tokenizers' sequence id of the passage in a (question, passage) pair
MAX_SEQ_LEN = 256  # window length the reader is trained and run with (tokens)
STRIDE = 128  # tokens shared by consecutive windows
MAX_ANSWER_TOKENS = 30
# The most windows of one passage the reader reads (its first): a passage of punctuation or CJK is a token a character,
# so even read.READ_MAX_CHARS is ~150 windows. SQuAD's most is 12 (its longest paragraph, a 64-token question).
MAX_WINDOWS = 16


@dataclass(frozen=True)
class Span:
    """The reader's best answer over all windows of all passages read.

    ``null_score`` comes from the window that holds the best span, so ``margin`` compares answering
    and abstaining on the same evidence (a passage with no answer elsewhere does not dilute it).
    """

    text: str | None  # best non-null span (None if no window had a valid span)
    passage_id: int  # Passage.id of the passage it came from (-1 if none)
    score: float  # start_logit + end_logit of the best span
    null_score: float  # start + end logit of [CLS] in that window
    margin: float  # score - null_score; > 0 means the reader prefers answering
    start: int  # character offsets of the span in the passage's text
    end: int


NO_SPAN = Span(text=None, passage_id=-1, score=float("-inf"), null_score=float("inf"),
               margin=float("-inf"), start=0, end=0)


def reader_file(bundle: B.Bundle) -> Path:
    """The bundle's reader ONNX, else the one shipped with the package (which may be absent)."""
    return bundle.path(B.ROLE_READER) or READER_ASSET


def passage_context(title: str, text: str) -> tuple[str, int]:
    """The text the reader sees for a passage ("title: text", as in training) and where ``text`` starts."""
    prefix = f"{title}: " if title else ""
    return prefix + text, len(prefix)


class Windows:
    """Cuts (question, passage) pairs into model windows that overlap by ``stride`` passage tokens.

    The question is cut to a quarter of the window first, so the passage part of a window always
    exceeds the stride (the tokenizer cannot window a passage otherwise; it aborts).
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_len: int, stride: int) -> None:
        if max_seq_len < 32 or not 0 < stride <= max_seq_len // 2:
            raise InputError(f"reader needs max_seq_len >= 32 and 0 < stride <= max_seq_len / 2, "
                             f"got {max_seq_len} and {stride}")
        self.question_tokens = max_seq_len // 4
        self.plain = Tokenizer.from_str(tokenizer.to_str())  # untruncated, to measure questions
        self.plain.no_truncation()
        self.plain.no_padding()
        self.pairs = tokenizer
        self.pairs.no_padding()
        self.pairs.enable_truncation(max_length=max_seq_len, stride=stride, strategy="only_second")

    def __call__(self, question: str, context: str) -> list[Encoding]:
        """All windows of one (question, context) pair, first window first."""
        q = self.plain.encode(question, add_special_tokens=False)
        if len(q.ids) > self.question_tokens:
            question = question[: q.offsets[self.question_tokens - 1][1]]
        enc = self.pairs.encode(question, context)
        return [enc, *enc.overflowing]


def best_span(start: np.ndarray, end: np.ndarray, window: Encoding, min_char: int,
              max_answer_tokens: int) -> tuple[float, int, int] | None:
    """Best (score, char_start, char_end) over passage tokens starting at ``min_char`` or later."""
    n = len(window.ids)
    seq = np.array([s == CONTEXT_SEQUENCE for s in window.sequence_ids], dtype=bool)
    offsets = np.array(window.offsets, dtype=np.int64)
    valid = np.flatnonzero(seq & (offsets[:, 0] >= min_char))
    if valid.size == 0:
        return None
    s, e = start[:n][valid], end[:n][valid]
    scores = s[:, None] + e[None, :]
    width = valid[None, :] - valid[:, None]  # token distance end - start
    scores = np.where((width >= 0) & (width < max_answer_tokens), scores, -np.inf)
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    if not np.isfinite(scores[i, j]):
        return None
    return float(scores[i, j]), int(offsets[valid[i], 0]), int(offsets[valid[j], 1])


class Reader:
    """Finds the answer span to a question in a few passages, with a no-answer score."""

    def __init__(self, onnx_path: str | Path, tokenizer_path: str | Path, max_seq_len: int = MAX_SEQ_LEN,
                 stride: int = STRIDE, max_answer_tokens: int = MAX_ANSWER_TOKENS, threads: int = 0,
                 batch_tokens: int = 2048) -> None:
        if max_answer_tokens < 1:
            raise InputError(f"reader max_answer_tokens must be >= 1, got {max_answer_tokens}")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:
            raise BundleError(f"cannot load tokenizer {tokenizer_path}: {exc}") from exc
        self.windows = Windows(tokenizer, max_seq_len, stride)
        self.session = load_session(Path(onnx_path), threads)
        outputs = [o.name for o in self.session.get_outputs()]
        if outputs[:2] != ["start_logits", "end_logits"]:
            raise BundleError(f"{onnx_path} is not a reader model: outputs {outputs}")
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.max_answer_tokens = max_answer_tokens
        self.batch_tokens = max(batch_tokens, max_seq_len)

    def read(self, question: str, passages: Sequence[Passage]) -> Span:
        """The best span over the first MAX_WINDOWS windows of every passage (``NO_SPAN`` if there is nothing to
        read)."""
        if not isinstance(question, str) or not question.strip():
            raise InputError("reader: the question is empty")
        owners: list[tuple[Passage, int]] = []  # (passage, offset of its text in the context) per window
        encodings: list[Encoding] = []
        for passage in passages:
            if not passage.text.strip():
                continue
            context, prefix = passage_context(passage.title, passage.text)
            for window in self.windows(question.strip(), context)[:MAX_WINDOWS]:
                owners.append((passage, prefix))
                encodings.append(window)
        best = NO_SPAN
        for rows in length_batches([len(e.ids) for e in encodings], self.batch_tokens):
            feeds = pad_batch([encodings[r] for r in rows])
            start, end = self.session.run(
                ["start_logits", "end_logits"], {k: v for k, v in feeds.items() if k in self.input_names}
            )
            for k, r in enumerate(rows):
                passage, prefix = owners[r]
                found = best_span(start[k], end[k], encodings[r], prefix, self.max_answer_tokens)
                if found is None or found[0] <= best.score:
                    continue
                score, a, b = found
                null = float(start[k, 0] + end[k, 0])
                best = Span(text=passage.text[a - prefix:b - prefix], passage_id=passage.id, score=score,
                            null_score=null, margin=score - null, start=a - prefix, end=b - prefix)
        return best
