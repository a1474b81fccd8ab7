"""Reader training and validation examples: the article split, gold spans, and sampled no-answer pairs.

One example = one (question, "title: paragraph") window with a start/end token label; label 0 ([CLS])
means "no answer in this window". Questions: SQuAD 1.1 train (87,599, all answerable; ``answer_start`` there is the
answer text's first occurrence, ambiguous for ~11% of answers), the 17,648 real SQuAD-2 train unanswerables of
``squad2_train_recovered.json`` (with the span a careless reader would pick, ``plausible``), the reader-train dev
articles and HotpotQA buckets. The 30 articles of the model-selection set (``reader_select``) are left out of every
source. Sources, all in the reader-train part only:
- ``answerable``: the window of the gold paragraph that holds the first gold answer;
- ``window``: the other windows of that paragraph (the answer is not in them);
- ``impossible``: real SQuAD-2 unanswerable questions on their paragraph (written to look answerable); the window
  holding the plausible answer carries its tokens as a hard negative (``plausible_start`` / ``plausible_end``);
- ``other_article``: an answerable question with a paragraph of another article;
- ``same_article``: an answerable question with another paragraph of its article that lacks every gold answer;
- ``swapped``: an answerable SQuAD question on its own paragraph with one name or number that occurs there
  replaced by one of the same kind from another paragraph of the article that does not occur there
  ("When did the Normans reach Italy?" → "When did the Lombards reach Italy?").
``other_article`` / ``same_article`` are what a retriever hands the reader when the answer is not in the corpus
or not in the passage. SQuAD-2's crowdworkers wrote most of their unanswerables by swaps of an entity or number, so
``swapped`` imitates them at scale.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from benchmarks.splits import SPLITS_FILE, hotpot_bucket
from edge_rag.reading.reader import CONTEXT_SEQUENCE, Windows, passage_context

# ../shared/data next to the checkout, unless $EDGE_RAG_DATA says otherwise (a git worktree sits elsewhere).
DATA = Path(os.environ.get("EDGE_RAG_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
SQUAD_TRAIN = DATA / "squad2_train_subset.json"
SQUAD11_TRAIN = DATA / "squad11_train.json"  # all 87,599 answerable SQuAD 1.1 train questions (442 articles)
# 17,648 real SQuAD-2 train unanswerables over 290 train articles (a superset of SQUAD_TRAIN's); its answerable
# questions are SQuAD 1.1's under other ids, so only its unanswerables are read
SQUAD2_RECOVERED = DATA / "squad2_train_recovered.json"
SQUAD_DEV = DATA / "squad2_dev_subset.json"
HOTPOT = DATA / "hotpotqa_dev_subset.jsonl"

# The reader's parts of the one split file (calibration / test / out-of-domain articles are never read here);
# "*squad2_train_recovered.json" / "*squad11_train.json" there mean the whole train files (less reader_select).
_SPLITS = json.loads(SPLITS_FILE.read_text(encoding="utf-8"))
READER_TRAIN_DEV_ARTICLES = tuple(a for a in _SPLITS["squad"]["reader_train"] if not a.startswith("*"))
READER_VAL_DEV_ARTICLES = tuple(_SPLITS["squad"]["reader_val"])
READER_TRAIN_HOTPOT = tuple(_SPLITS["hotpotqa"]["reader_train"])
READER_VAL_HOTPOT = tuple(_SPLITS["hotpotqa"]["reader_val"])
READER_SELECT_ARTICLES = frozenset(_SPLITS["reader_select"]["articles"])  # of SQUAD2_RECOVERED
SELECT_SAMPLE = 800  # per kind (answerable, real unanswerable): what a training checkpoint is scored on
SOURCES = ("answerable", "window", "impossible", "other_article", "same_article", "swapped")  # build_examples' kinds


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    article: str
    title: str
    context: str  # the gold paragraph (without title)
    answers: tuple[str, ...]
    answer_start: int  # char offset of answers[0] in context, -1 if unanswerable
    source: str  # "squad" | "hotpotqa"
    plausible: str = ""  # unanswerable: the span a careless reader would pick (SQuAD-2 ``plausible_answers``)
    plausible_start: int = -1


def squad_questions(path: Path, articles: tuple[str, ...] | None) -> list[Question]:
    """Questions of ``articles`` (all articles if None) with their gold paragraph and first answer offset."""
    out = []
    for art in json.loads(path.read_text(encoding="utf-8"))["data"]:
        if articles is not None and art["title"] not in articles:
            continue
        title = art["title"].replace("_", " ")
        for para in art["paragraphs"]:
            for qa in para["qas"]:
                answers = qa.get("answers", [])
                plausible = (qa.get("plausible_answers") or [{"text": "", "answer_start": -1}])[0]
                out.append(Question(qa["id"], qa["question"].strip(), art["title"], title, para["context"],
                                    tuple(dict.fromkeys(a["text"] for a in answers)),
                                    answers[0]["answer_start"] if answers else -1, "squad",
                                    *((plausible["text"], plausible["answer_start"]) if not answers else ())))
    return out


def hotpot_questions(path: Path, buckets: tuple[int, ...]) -> list[Question]:
    """HotpotQA questions of ``buckets`` whose answer occurs verbatim in a supporting paragraph (no yes/no)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else None
        if row is None or hotpot_bucket(row["question_id"]) not in buckets:
            continue
        answers = tuple(s for obj in row.get("answers_objects", [])[:1] for s in obj.get("spans", []))
        for ctx in row["contexts"]:
            at = ctx["paragraph_text"].find(answers[0]) if answers and ctx.get("is_supporting") else -1
            if at >= 0 and answers[0].lower() not in ("yes", "no"):
                out.append(Question(row["question_id"], row["question_text"].strip(), row["question_id"],
                                    ctx["title"], ctx["paragraph_text"], answers, at, "hotpotqa"))
                break
    return out


def _recovered() -> list[Question]:
    if not SQUAD2_RECOVERED.is_file():
        raise FileNotFoundError(f"{SQUAD2_RECOVERED} not found: the reader's real unanswerables (../shared/data)")
    return squad_questions(SQUAD2_RECOVERED, None)


@functools.lru_cache(maxsize=1)
def _select_paragraphs() -> frozenset[str]:
    """The paragraphs of the model-selection articles (no training source may hold them)."""
    return frozenset(q.context for q in _recovered() if q.article in READER_SELECT_ARTICLES)


def reader_train() -> list[Question]:
    """SQuAD 1.1 train (every question answerable), the recovered SQuAD-2 train unanswerables (their answerable
    ones are SQuAD 1.1's, not repeated), the reader-train dev articles and HotpotQA buckets; never an article of
    the model-selection set (a SQuAD 1.1 article with one of its paragraphs is left out whole)."""
    if not SQUAD11_TRAIN.is_file():
        raise FileNotFoundError(f"{SQUAD11_TRAIN} not found: the reader trains on SQuAD 1.1 train (../shared/data)")
    held = _select_paragraphs()
    squad11 = squad_questions(SQUAD11_TRAIN, None)
    held_articles = {q.article for q in squad11 if q.context in held}
    unanswerable = [q for q in _recovered() if q.answer_start < 0 and q.context not in held]
    return ([q for q in squad11 if q.article not in held_articles] + unanswerable
            + squad_questions(SQUAD_DEV, READER_TRAIN_DEV_ARTICLES) + hotpot_questions(HOTPOT, READER_TRAIN_HOTPOT))


def reader_val() -> list[Question]:
    return squad_questions(SQUAD_DEV, READER_VAL_DEV_ARTICLES) + hotpot_questions(HOTPOT, READER_VAL_HOTPOT)


def reader_select(sample: int | None = SELECT_SAMPLE, seed: int = 0) -> list[Question]:
    """The model-selection set: the held-out articles' real unanswerables and SQuAD 1.1's answerable questions on
    the same paragraphs; a seeded ``sample`` of each kind (None: all 3,149 + 1,421)."""
    held = _select_paragraphs()
    kinds = ([q for q in squad_questions(SQUAD11_TRAIN, None) if q.context in held],
             [q for q in _recovered() if q.answer_start < 0 and q.context in held])
    rng = random.Random(seed)
    return [q for qs in kinds for q in (qs if sample is None or sample >= len(qs) else rng.sample(qs, sample))]


@dataclass(frozen=True)
class Example:
    ids: list[int]
    types: list[int]
    start: int  # token index, 0 = no answer
    end: int
    source: str
    plausible_start: int = 0  # an unanswerable's plausible span in this window (token indices; 0 = none)
    plausible_end: int = 0


def label_windows(windows: Windows, question: str, title: str, context: str,
                  answer_start: int, answer: str) -> list[tuple[list[int], list[int], int, int]]:
    """(ids, type_ids, start, end) for every window; start = end = 0 where the answer is not fully inside."""
    text, prefix = passage_context(title, context)
    a, b = (prefix + answer_start, prefix + answer_start + len(answer)) if answer_start >= 0 else (-1, -1)
    out = []
    for w in windows(question, text):
        offsets = w.offsets  # a property that builds a new list on every access: read it once
        tok = [k for k, s in enumerate(w.sequence_ids) if s == CONTEXT_SEQUENCE]
        starts = [k for k in tok if offsets[k][0] <= a < offsets[k][1]] if a >= 0 else []
        ends = [k for k in tok if offsets[k][0] < b <= offsets[k][1]] if a >= 0 else []
        s, e = (starts[0], ends[-1]) if starts and ends and ends[-1] >= starts[0] else (0, 0)
        out.append((w.ids, w.type_ids, s, e))
    return out


# A name (capitalised words, inner "of"/"the"/"de" allowed) or a number; the first word of a question is skipped
# by the caller (it is capitalised as a sentence start, not as a name).
_SWAPPABLE = re.compile(r"\b(?:[A-Z][\w'-]+(?:\s+(?:of|the|de|von|van)?\s*[A-Z][\w'-]+)*|\d[\d,.]*\d|\d)\b")


def _kind(span: str) -> str:
    return "number" if span[0].isdigit() else "name"


@functools.lru_cache(maxsize=8)
def _article_spans(article_text: str) -> frozenset[str]:
    """Every name or number of an article (questions come article by article: a small cache suffices)."""
    return frozenset(_SWAPPABLE.findall(article_text))


def swap_question(question: str, context: str, article_text: str, rng: random.Random) -> str | None:
    """``question`` with one name or number that occurs in ``context`` replaced by one of the same kind and about
    the same number of words that occurs in ``article_text`` but not in ``context``; None when the question has no such span or no replacement exists."""
    spans = [m for m in _SWAPPABLE.finditer(question) if m.start() > 0 and m.group() in context]
    if not spans:
        return None
    m = rng.choice(spans)
    low = context.lower()
    words = len(m.group().split())  # a like-sized replacement keeps the question fluent
    pool = sorted({x for x in _article_spans(article_text) if _kind(x) == _kind(m.group())
                   and abs(len(x.split()) - words) <= 1 and x.lower() not in low and len(x) > 1})
    if not pool:
        return None
    return question[:m.start()] + rng.choice(pool) + question[m.end():]


def build_examples(windows: Windows, questions: list[Question], negatives_per_answerable: float,
                   seed: int, swaps_per_answerable: float = 0.0) -> list[Example]:
    """Every window of every question, plus sampled negative pairs (see the module docstring)."""
    rng, swap_rng = random.Random(seed), random.Random(seed + 1)  # swaps leave the other samples as they were
    paragraphs: dict[str, list[tuple[str, str]]] = {}
    for q in questions:
        if q.source == "squad" and (q.title, q.context) not in paragraphs.setdefault(q.article, []):
            paragraphs[q.article].append((q.title, q.context))
    articles = sorted(paragraphs)
    article_text = {a: " ".join(c for _, c in ps) for a, ps in paragraphs.items()}
    out: list[Example] = []
    for q in questions:
        answerable = q.answer_start >= 0
        span, at = (q.answers[0], q.answer_start) if answerable else (q.plausible, q.plausible_start)
        for ids, types, s, e in label_windows(windows, q.question, q.title, q.context, at, span):
            if answerable:
                out.append(Example(ids, types, s, e, "answerable" if s else "window"))
            else:  # the label is [CLS]; the plausible span (if in this window) is what [CLS] must beat
                out.append(Example(ids, types, 0, 0, "impossible", s, e))
        if answerable and q.source == "squad" and swap_rng.random() < swaps_per_answerable:
            swapped = swap_question(q.question, q.context, article_text[q.article], swap_rng)
            for ids, types, _, _ in label_windows(windows, swapped, q.title, q.context, -1, "") if swapped else []:
                out.append(Example(ids, types, 0, 0, "swapped"))
        if not answerable or rng.random() >= negatives_per_answerable:
            continue
        same = [p for p in paragraphs.get(q.article, []) if not any(x in p[1] for x in q.answers)]
        others = [a for a in articles if a != q.article]
        if same and (rng.random() < 0.5 or not others):
            title, context, source = *rng.choice(same), "same_article"
        elif others:
            title, context, source = *rng.choice(paragraphs[rng.choice(others)]), "other_article"
        else:
            continue
        for ids, types, _, _ in label_windows(windows, q.question, title, context, -1, ""):
            out.append(Example(ids, types, 0, 0, source))
    return out


def negative_pairs(questions: list[Question], seed: int) -> list[tuple[Question, str, str]]:
    """Validation no-answer pairs: each answerable question with another paragraph of its article lacking the answer."""
    rng = random.Random(seed)
    by_article: dict[str, list[tuple[str, str]]] = {}
    for q in questions:
        if (q.title, q.context) not in by_article.setdefault(q.article, []):
            by_article[q.article].append((q.title, q.context))
    out = []
    for q in questions:
        same = [p for p in by_article[q.article] if not any(x in p[1] for x in q.answers)]
        if q.answer_start >= 0 and same:
            out.append((q, *rng.choice(same)))
    return out


def seeded_subset(examples: list, n: int, seed: int) -> tuple[list, list]:
    """The seeded subset of ``n`` examples a run trains on, and the rest (what a second stage has not seen)."""
    chosen = random.Random(seed).sample(range(len(examples)), n)
    taken = set(chosen)
    return [examples[i] for i in chosen], [e for i, e in enumerate(examples) if i not in taken]


def mixed(examples: list, mix: dict[str, float], n: int, rng: random.Random) -> list:
    """``n`` examples, ``mix[source]`` of them from each source (all of a source's, repeated, when it has fewer)."""
    by_source: dict[str, list] = {}
    for e in examples:
        by_source.setdefault(e.source, []).append(e)
    out = []
    for source, share in mix.items():
        pool = by_source.get(source)
        if not pool:
            raise ValueError(f"--mix: no {source!r} examples (sources: {', '.join(sorted(by_source))})")
        repeats, rest = divmod(round(share * n), len(pool))
        out += pool * repeats + rng.sample(pool, rest)
    return out


def source_mix(text: str) -> dict[str, float]:
    """``"impossible=0.2,answerable=0.8"`` → {"impossible": 0.2, "answerable": 0.8}; the shares must sum to 1."""
    try:
        mix = {k.strip(): float(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mix {text!r}: expected source=share,source=share,...") from None
    if unknown := sorted(set(mix) - set(SOURCES)):  # a typo is named now, not after minutes of building examples
        raise argparse.ArgumentTypeError(f"--mix {text!r}: no source {', '.join(map(repr, unknown))} "
                                         f"(sources: {', '.join(SOURCES)})")
    if any(v < 0 for v in mix.values()) or abs(sum(mix.values()) - 1) > 1e-6:
        raise argparse.ArgumentTypeError(f"--mix {text!r}: shares must be >= 0 and sum to 1")
    return mix
