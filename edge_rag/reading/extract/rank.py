"""Sentence ranking for the extractive answerer: which sentence of the context answers the question.

Score = IDF-weighted keyword overlap (IDF over the context's own sentences, so a word found in every
sentence counts little) + W_SIGNAL if the sentence carries the type's evidence (a date for "when", a
number for "how many", a name for who/where, "because" for "why", "is a" for "what is") + a little of
the retrieval cosine. Multi-hop: if the best sentence names another passage's title, the answer is
sought in that passage.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...documents.text import split_sentences
from ...types import Passage
from .cues import CAUSAL_CUE, DATE, DEFINITION_CUE, NUMBER, PROPER, stems
from .question import Expect, Question, QuestionType

# Tuned on half the SQuAD subset's articles; the other half scores no worse (F1 0.415 tuned half, 0.473
# other half), as were the span weights of ``span``.
W_TITLE = 0.5  # a question keyword found only in the passage title counts half
W_SIGNAL = 0.3  # a date for "when", a number for "how many", "because" for "why"...
W_RETRIEVAL = 0.1  # the retriever's cosine breaks ties between equally overlapping sentences


@dataclass
class Sentence:
    """A sentence of the context, its keyword stems, and its ranking score."""

    text: str
    passage: Passage
    stems: set[str]
    title_stems: set[str]
    score: float = 0.0



def rank(q: Question, passages: Sequence[Passage]) -> list[Sentence]:
    """The context's sentences, in passage order, each scored against the question (``q`` has keywords)."""
    q_stems = set(q.stems | q.head)
    titles = {p.title: stems(p.title) for p in passages}
    sentences = [
        Sentence(s, p, stems(s), titles[p.title])
        for p in passages
        for s in split_sentences(p.text)
        if s.strip()
    ]
    if not sentences:
        return sentences
    # A question word found in few of the context's sentences is worth more (IDF over the context).
    n = len(sentences)
    weight = {w: math.log(1 + n / (1 + sum(w in s.stems for s in sentences))) for w in q_stems}
    total = math.fsum(weight.values())  # fsum: exact, so ties do not depend on set order
    for s in sentences:
        hits = math.fsum(weight[w] for w in q_stems & s.stems)
        hits += W_TITLE * math.fsum(weight[w] for w in (q_stems & s.title_stems) - s.stems)
        s.score = hits / total + W_RETRIEVAL * s.passage.score
    # The type signal is a regex search: only run it where it could still change the winner.
    top = max(s.score for s in sentences)
    for s in sentences:
        if s.score + W_SIGNAL > top:
            s.score += W_SIGNAL * signal(s.text, q)
    return sentences


def signal(sentence: str, q: Question) -> bool:
    """Does the sentence carry the evidence this type of question asks for?"""
    if q.qtype is QuestionType.TEMPORAL:
        return bool(DATE.search(sentence))
    if q.qtype is QuestionType.CAUSAL:
        return bool(CAUSAL_CUE.search(sentence))
    if q.qtype is QuestionType.DEFINITIONAL:
        return bool(DEFINITION_CUE.search(sentence))
    if q.expect is Expect.NUMBER:
        return bool(NUMBER.search(sentence))
    if q.expect in (Expect.PERSON, Expect.PLACE):
        return bool(PROPER.search(sentence, 1))  # from 1: every sentence starts with a capital
    return False



def bridge(best: Sentence, q: Question, sentences: list[Sentence]) -> Sentence:
    """Multi-hop: when the best sentence names another passage's title that the question does not,
    the answer usually sits in that passage ("the county where X is" -> X's county -> its seat)."""
    q_stems = q.stems | q.head
    hops = [
        s for s in sentences
        if s.passage.title != best.passage.title and s.title_stems and s.title_stems <= best.stems
        and not s.title_stems <= q_stems
    ]
    rest = q_stems - best.stems - best.title_stems
    hops = [s for s in hops if rest & s.stems]
    if not hops:
        return best
    return max(hops, key=lambda s: len(rest & s.stems) + W_SIGNAL * signal(s.text, q))

