"""Steps 7-8 of the pipeline: drop repeated passages (EverydayGPT), then squeeze the rest into the
tier's character budget by keeping the most question-relevant sentences (thesis §4.3.6).

Compression is where the thesis gets most of its token reduction, so it must never exceed the budget
(``len(context.text) <= budget_chars`` always) and it must stay cheap: no model, only keyword overlap.
A relevance floor makes it filter as well as cap: sentences below it are dropped even when room is left
(without one, a budget above what the passages hold changes nothing).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..documents.text import keywords, normalize, split_sentences
from ..types import Passage

# How much the passage's retrieval cosine counts next to the sentence's term overlap (both ~[0, 1]).
# Overlap decides; the prior breaks its many ties (short questions give overlaps of 0, 1/3, 1/2...) in
# favour of the passages the dense retriever or reranker ranked high. Ours; the thesis leaves it open.
PRIOR_WEIGHT = 0.5
# Terms are keywords cut to this many characters, a stemmer-free match of "arriving" with "arrival".
# Answer survival at 600 chars, plain keyword overlap -> 5-char terms -> 5-char terms + local idf:
# SQuAD (gold + 4 same-article paragraphs) 0.896 -> 0.907 -> 0.930; HotpotQA (10 paragraphs)
# 0.473 -> 0.509 -> 0.599.
STEM_CHARS = 5


@dataclass(frozen=True)
class Context:
    """The compressed evidence handed to extraction or generation, and what it cost."""

    text: str
    passage_ids: list[int]  # passages with at least one sentence in ``text``, in the order they appear
    sentences_kept: int
    sentences_total: int
    truncated: bool  # True when no whole sentence fitted and the first passage was cut to the budget


class Scored(NamedTuple):
    """A sentence of the compressor's input and its relevance to the question."""

    rank: int  # index of its passage in the (reranked) input
    sentence: int  # position inside its passage
    text: str
    relevance: float


def dedupe(passages: Sequence[Passage], prefix_chars: int) -> list[Passage]:
    """Keep the first of passages whose first ``prefix_chars`` normalised characters are equal.

    Corpora repeat boilerplate (headers, copied paragraphs); repeats waste the context budget and
    inflate the evidence gate's sample size. ``prefix_chars <= 0`` turns dedupe off.
    """
    if prefix_chars <= 0:
        return list(passages)
    seen: set[str] = set()
    kept: list[Passage] = []
    for p in passages:
        key = normalize(p.text)[:prefix_chars]
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept


def compress(
    question: str, passages: Sequence[Passage], budget_chars: int, floor: float = 0.0,
    prior_weight: float = PRIOR_WEIGHT,
) -> Context:
    """Keep the most relevant sentences that fit ``budget_chars``, rendered in reading order.

    Relevance is ``score_sentences``. Only sentences with relevance >= ``floor`` are candidates, so the
    budget is a ceiling, not a target: room left over stays empty. When no sentence reaches the floor,
    the single most relevant one is the only candidate (the retriever's best guess beats an empty
    context: a small generator cannot tell "nothing relevant" from "no context"). Candidates are taken
    greedily by relevance; one that does not fit is skipped, so a shorter one further down can still use
    the room. The kept sentences are then put back in reading order and grouped by document, one line
    per document: "Title: s1 s2\nTitle2: s3". Documents appear in the rank order of their best kept
    passage, sentences in document order (passage position, then index), so sentence-level passages of
    one document share one title instead of repeating it.
    """
    sentences = score_sentences(question, passages, prior_weight)
    if not sentences:
        return Context("", [], 0, 0, False)

    groups: dict[tuple[str, str], list[Scored]] = {}
    used = 0
    ranked = sorted(sentences, key=lambda s: (-s.relevance, s.rank, s.sentence))
    for s in [s for s in ranked if s.relevance >= floor] or ranked[:1]:
        p = passages[s.rank]
        group = groups.get((p.doc_id, p.title))
        # a new group costs its header (and the newline before it); joining one costs a space
        cost = len(s.text) + (1 if group else len(_header(p)) + (1 if groups else 0))
        if used + cost <= budget_chars:
            used += cost
            if group is None:
                groups[(p.doc_id, p.title)] = group = []
            group.append(s)
    if not groups:
        return _truncate_first(passages[sentences[0].rank], budget_chars, len(sentences))

    lines: list[str] = []
    ids: list[int] = []
    for group in sorted(groups.values(), key=lambda g: min(s.rank for s in g)):
        group.sort(key=lambda s: (passages[s.rank].position, s.rank, s.sentence))
        lines.append(_header(passages[group[0].rank]) + " ".join(s.text for s in group))
        ids.extend(dict.fromkeys(passages[s.rank].id for s in group))
    text = "\n".join(lines)
    assert len(text) == used <= budget_chars
    return Context(text, ids, sum(len(g) for g in groups.values()), len(sentences), False)


class Terms(NamedTuple):
    """The question's terms, each weighted by its rarity among the candidate sentences, and those sentences."""

    question: set[str]
    weight: dict[str, float]
    units: list[tuple[int, int, str, set[str], float]]  # (passage rank, sentence index, text, terms, cosine prior)

    def share(self, terms: set[str]) -> float:
        """The weighted share of the question's terms among ``terms``, in [0, 1]."""
        return sum(self.weight[t] for t in self.question & terms) / (sum(self.weight.values()) or 1.0)


def weigh_terms(question: str, passages: Sequence[Passage]) -> Terms:
    """Every sentence of ``passages`` with its terms, and the question's terms weighted by
    idf = ln(1 + n / (1 + df)) over those n sentences: a question term found in every candidate (the
    article's topic) cannot tell them apart."""
    units = [
        (rank, index, " ".join(s.split()), terms_of(s), min(max(p.score, 0.0), 1.0))
        for rank, p in enumerate(passages)
        for index, s in enumerate(split_sentences(p.text))
    ]
    q = terms_of(question)
    df = Counter(t for *_, terms, _ in units for t in q & terms)
    return Terms(q, {t: math.log(1 + len(units) / (1 + df[t])) for t in q}, units)


def score_sentences(question: str, passages: Sequence[Passage], prior_weight: float = PRIOR_WEIGHT) -> list[Scored]:
    """Every sentence of ``passages`` with its relevance to ``question``, in input order:
    idf-weighted share of the question's terms found in the sentence (``weigh_terms``) + prior_weight * clip(cosine, 0, 1)."""
    terms = weigh_terms(question, passages)
    return [Scored(rank, index, s, terms.share(found) + prior_weight * prior)
            for rank, index, s, found, prior in terms.units]


def terms_of(text: str) -> set[str]:
    """The stemmed keywords a question is matched on (a sentence's, a title's)."""
    return {w[:STEM_CHARS] for w in keywords(text)}


def _header(p: Passage) -> str:
    return f"{p.title}: " if p.title else ""


def _truncate_first(p: Passage, budget_chars: int, sentences_total: int) -> Context:
    """Thesis fallback when no whole sentence fits: the top passage (with text) cut to the budget at a
    word boundary. The title is kept only when it leaves room for text; a budget < 1 yields ""."""
    header = _header(p)
    if len(header) >= budget_chars:
        header = ""
    text = header + _cut(" ".join(p.text.split()), budget_chars - len(header))
    return Context(text, [p.id] if text else [], 0, sentences_total, True)


def _cut(text: str, limit: int) -> str:
    """The longest prefix of whole words within ``limit`` (``text`` has single spaces only);
    mid-word only when the first word alone is longer than ``limit``."""
    if len(text) <= limit:
        return text
    head = text[: max(limit, 0)]
    if text[len(head)] == " ":
        return head
    space = head.rfind(" ")
    return head[:space] if space > 0 else head


def build_context(passages: list[Passage]) -> str:
    """One line per passage, prefixed by its title, in rank order."""
    return "\n".join(f"{p.title}: {p.text}" if p.title else p.text for p in passages)
