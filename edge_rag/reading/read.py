"""The read stage: one candidate answer per question from the retrieved passages, with the numbers the
certified score is made of.

``Config(reader="neural")`` runs the trained extractive reader (edge_rag/reading/reader.py, ONNX) over the top
passages' paragraph text with title; ``reader="rules"`` runs the EverydayGPT rule extractor (the seed path)
over the compressed context. Both return a Candidate; the policy turns it into one score (certify.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from ..errors import BundleError
from ..models.bundle import ROLE_READER, Bundle
from ..retrieval.lexical import query_terms
from ..retrieval.route import PROFILE, profile
from ..types import Passage
from .extract import extract
from .extract.question import negated
from .reader import Reader, reader_file


@dataclass(frozen=True)
class Candidate:
    """A reader's best answer (text None = it found none) and its scores."""

    text: str | None
    passage_id: int | None
    span_score: float  # the reader's score for its span (rules: Eq. 1 confidence)
    null_score: float  # the reader's no-answer score (rules: none, 0)
    margin: float  # span_score - null_score: how much the span beats "no answer"

    def features(self, question: str, passages: Sequence[Passage]) -> dict[str, float]:
        """The combiner's inputs (certify.FEATURES). d_min = 2 - 2 s_max is the top cosine in another unit,
        so only the cosine is used. overlap@1 is the router's: how much of the question the top hit's best
        sentence covers (a hit on the article's topic vs one holding the asked-about names; chosen on reader-val:
        docs/decisions/score-inputs.md). negated: whether the question holds a negation cue
        (extract.question.negated: the reader answers "what is not X?" as "what is X?")."""
        top = max((p.score for p in passages), default=0.0)
        overlap = float(profile(question, passages)[PROFILE.index("overlap@1")])
        return {"span_score": self.span_score, "margin": self.margin, "top_cosine": top, "overlap@1": overlap,
                "negated": float(negated(question))}


NOTHING = Candidate(None, None, 0.0, 0.0, 0.0)  # no answer: nothing found, or nothing read


# The most characters of a hit and its neighbours the reader reads: twice SQuAD's longest paragraph (4,063), so every
# SQuAD context (a paragraph is a document there) is read whole, as calibrated.
READ_MAX_CHARS = 8192
FIRST_REACH = 8  # neighbours either side a hit's first fetch holds (Config.reader_window's default, 2, in one)


class _Store(Protocol):
    def passages(self, ids: Sequence[int]) -> list[Passage]: ...


def paragraphs(question: str, hits: Sequence[Passage], store: _Store, limit: int, window: int) -> list[Passage]:
    """The first ``limit`` distinct hits widened to their neighbourhood: for a sentence passage, the passages
    of the same document at positions within ``window`` of it (ids of one document are consecutive), joined
    in document order, as many as fit in READ_MAX_CHARS (``within``; a longer hit, its part most like ``question``).
    Keeps the hit's id and score."""
    out: list[Passage] = []
    covered: set[int] = set()  # passage ids already inside an earlier hit's window
    for hit in hits:
        if len(out) >= limit:
            break
        if hit.id in covered:
            continue
        around = neighbourhood(question, hit, store, window)
        covered.update(p.id for p in around)
        out.append(replace(hit, text=" ".join(p.text for p in around)))
    return out


def neighbourhood(question: str, hit: Passage, store: _Store, window: int) -> list[Passage]:
    """``within`` the passages of the hit's document at most ``window`` positions from it, fetched ``FIRST_REACH``
    either side, then twice as far while a side's read reaches the last one fetched: Config(reader_window=1000)
    fetched 2,001 ids around each hit (a store of 16 KB passages: 3 MB a question) for 8 KB read. What is read is the
    same: ``within`` widens each side until a passage does not fit, and never looks past it."""
    reach = min(window, FIRST_REACH)
    while True:
        ids = [hit.id + k for k in range(-reach, reach + 1) if hit.position + k >= 0]
        around = within([p for p in store.passages(ids) if p.doc_id == hit.doc_id], hit, question)
        if reach >= window or (around[0].id > hit.id - reach and around[-1].id < hit.id + reach):
            return around
        reach = min(window, 2 * reach)


def within(around: list[Passage], hit: Passage, question: str, budget: int = READ_MAX_CHARS) -> list[Passage]:
    """The hit (a longer one cut to its ``budget`` characters most like the question, ``best_part``), then its
    neighbours nearest first, each side until one does not fit whole: a document without sentence ends was cut into
    64 KB passages (now chunk.MAX_UNIT_CHARS), and the reader read every window of a hit and its neighbours (a 121 KB
    context: 222 windows, 11-20 s a question on 2 cores)."""
    i = next((k for k, p in enumerate(around) if p.id == hit.id), None)
    middle = around[i] if i is not None else hit
    if len(middle.text) > budget:
        middle = replace(middle, text=best_part(middle.text, question, budget))
    if i is None:
        return [middle]
    lo, hi, size, grew = i, i + 1, len(middle.text), True
    while grew:
        grew = False
        if lo > 0 and size + 1 + len(around[lo - 1].text) <= budget:
            lo, size, grew = lo - 1, size + 1 + len(around[lo - 1].text), True
        if hi < len(around) and size + 1 + len(around[hi].text) <= budget:
            hi, size, grew = hi + 1, size + 1 + len(around[hi].text), True
    return [*around[lo:i], middle, *around[i + 1 : hi]]


def best_part(text: str, question: str, budget: int) -> str:
    """The first of ``text``'s parts of at most ``budget`` characters, from a word's start to a word's end, that holds
    the most of the question's terms (as the lexical search reads them, ``query_terms``): the search indexes a whole
    passage, so a question found a 16 KB passage by the words of its second half, and the reader read its first
    half. Parts start at word starts about every budget / 8 characters, and are scored by the words they hold
    whole; no term anywhere: the text's beginning."""
    wanted = set(query_terms(question))
    starts = [0]
    while (space := text.find(" ", starts[-1] + budget // 8)) >= 0:
        starts.append(space + 1)
    ends = [*starts[1:], len(text)]
    blocks = [wanted.intersection(query_terms(text[a:b])) for a, b in zip(starts, ends)]
    best, held = 0, -1
    for k, a in enumerate(starts):
        terms = set().union(*(blocks[j] for j in range(k, len(starts)) if ends[j] - a <= budget))
        if len(terms) > held:
            best, held = a, len(terms)
    cut = text.rfind(" ", best, best + budget + 1) if best + budget < len(text) else len(text)
    return text[best : cut if cut > best else best + budget]


def read_rules(question: str, passages: Sequence[Passage]) -> Candidate:
    """The rule extractor's answer; its Eq. 1 confidence is the span score."""
    e = extract(question, passages)
    return Candidate(e.answer or None, e.passage_id, e.confidence, 0.0, e.confidence)


def reader_path(bundle: Bundle) -> Path:
    """The bundle's reader ONNX, else the one shipped with the package."""
    path = reader_file(bundle)
    if not path.is_file():
        raise BundleError(f"no reader model: {path} is missing; use Config(reader='rules') or run `make reader`")
    return bundle.current(ROLE_READER) if bundle.path(ROLE_READER) else path  # loaded on first use: checked again


class NeuralReader:
    """edge_rag.reading.reader.Reader behind the Candidate interface."""

    def __init__(self, onnx_path: str | Path, tokenizer_path: str | Path, threads: int = 0,
                 batch_tokens: int = 2048) -> None:
        self.reader = Reader(onnx_path, tokenizer_path, threads=threads, batch_tokens=batch_tokens)

    def __call__(self, question: str, passages: Sequence[Passage]) -> Candidate:
        span = self.reader.read(question, list(passages))
        if not span.text:  # the reader's NO_SPAN has infinite scores: no candidate, nothing to score
            return NOTHING
        return Candidate(span.text, span.passage_id, float(span.score), float(span.null_score), float(span.margin))
