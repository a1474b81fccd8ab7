"""Question typing for the extractive answerer: the seed's five types, the answer shape a factoid asks
for, and where the wh-word sits among the question's keywords (EverydayGPT §5)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from ...documents.text import STOPWORDS
from .cues import STEM_CHARS, WORD, stems


class QuestionType(str, Enum):
    """The seed's five question types; they choose the ranking signal and the span kind."""

    FACTOID = "FACTOID"
    DEFINITIONAL = "DEFINITIONAL"
    TEMPORAL = "TEMPORAL"
    CAUSAL = "CAUSAL"
    YES_NO = "YES_NO"


class Expect(str, Enum):
    """What a factoid answer should look like (from who/where/how many...); NONE = any phrase."""

    NONE = "NONE"
    PERSON = "PERSON"
    PLACE = "PLACE"
    NUMBER = "NUMBER"
    CHOICE = "CHOICE"  # "A or B?": the answer is one of the options



# -- question cues -------------------------------------------------------------------------------------
_WH = re.compile(r"\b(what|which|who|whom|whose|when|where|why|how)\b")
_AUX = frozenset(
    "is are was were do does did can could has have had will would should shall may might".split()
)
_TEMPORAL_Q = re.compile(
    r"\bwhen\b|\b(?:what|which) (?:year|years|century|decade|date|day|month|time|time ?frame|era|period)\b"
    r"|\bhow long ago\b|\bsince when\b"
)
_CAUSAL_Q = re.compile(r"\bwhy\b|\bhow come\b|\b(?:what|which) (?:\w+ )?(?:reason|cause)|\bfor what reason\b")
_DEFINITION_Q = re.compile(  # "what is X?" with X a short noun phrase (no verb or preposition at the end)
    r"^what (?:is|are|was|were) (?:an? |the )?(?:[\w-]+ ){0,3}(?!(?:to|of|for|by|in|on|with|from|at|as)\b)"
    r"[\w-]+(?<!ed)\s*\?*$"
    r"|\bwhat does .+ (?:mean|stand for)\b|^define\b|\bdefinition of\b|\bwhat is meant by\b|\bmeaning of\b"
)
_NUMBER_Q = re.compile(
    r"\bhow (?:many|much|long|far|large|big|old|tall|high|often|wide|deep|heavy|fast)\b"
    r"|\b(?:what|which) (?:\w+ )?(?:percentage|percent|number|amount|proportion|fraction|size|population)\b"
)
_UNIT_Q = re.compile(r"\bhow (?:long|far|old|tall|high|big|large|wide|deep|heavy|fast)\b")
_PERSON_Q = re.compile(r"\bwho(?:m|se)?\b|\b(?:what|which) (?:\w+ )?(?:person|man|woman|king|name)\b")
_PLACE_Q = re.compile(
    r"\bwhere\b|\b(?:what|which) (?:\w+ )?(?:city|country|state|place|region|continent|town|location|"
    r"island|river|county|province|area|nation|borough|district)\b"
)
_COMPARATIVE = (
    r"(?:older|younger|larger|smaller|bigger|taller|longer|shorter|higher|lower|earlier|later|first|last"
    r"|(?:more|less|fewer|most|least) \w+)"
)
# "Who is older, A or B?" / "Which is larger A or B?" / "Is it easier or harder ...?"
_CHOICE_Q = re.compile(
    r"^(?:which|who|what)\b[^,:]*[,:]\s*(?:the )?(?P<a>[^,:?]+?),? or (?:the )?(?P<b>[^,:?]+?)\s*\??$", re.I
)
_COMPARE_Q = re.compile(
    rf"^(?:which|who)\b.*?\b{_COMPARATIVE}\s+(?:the )?(?P<a>.+?) or (?:the )?(?P<b>.+?)\s*\??$", re.I
)
_ALTERNATIVE = re.compile(r"((?:[A-Z][\w'-]* )*[\w'-]+) or (?:the |an? )?([\w'-]+(?: [A-Z][\w'-]*)*)")
_NAMING_Q = re.compile(r"\b(?:called|named?|term(?:ed)?|known as|referred to as|nickname[d]?)\b")
_NEGATION = re.compile(
    r"\b(?:not|never|no|none|nothing|nobody|nowhere|neither|nor|without|cannot)\b|n['\u2019]t\b", re.I
)


@dataclass(frozen=True)
class Question:
    """What the span finder needs to know about a question, computed once."""

    text: str
    qtype: QuestionType
    expect: Expect
    stems: frozenset[str]  # keywords, minus the wh-word's noun
    head: frozenset[str]  # the wh-word's noun: "fort" in "what fort did ..."
    before: frozenset[str]  # keywords before the wh-word ("... known as what?" -> answer after them)
    subject: bool  # "who founded X?": the answer is the subject, before the verb (or after "by")
    naming: bool  # "what is X called?": the answer follows "called", "known as", "named"
    options: tuple[str, str] | None  # "who is older, A or B?" -> (A, B)
    unit: bool  # "how long/far/old ...?": the number's unit belongs to the answer


def parse_question(question: str) -> Question:
    """Type, keywords, and where the wh-word sits among them."""
    q = " ".join(question.lower().split())
    options = _options(question)
    qtype, expect = _kind(question, options)
    toks = WORD.findall(q)
    wh = next((i for i, w in enumerate(toks) if _WH.fullmatch(w)), len(toks))
    head: list[str] = []
    k = wh + 1
    while k < len(toks) and len(head) < 2 and toks[k] not in STOPWORDS and not toks[k].endswith("ed"):
        head.append(toks[k])
        k += 1
    subject = wh < len(toks) and k < len(toks) and toks[k] not in _AUX and toks[k] not in STOPWORDS
    keys = stems(q)
    heads = {w[:STEM_CHARS] for w in head}
    return Question(
        text=question,
        qtype=qtype,
        expect=expect,
        stems=frozenset(keys - heads) or frozenset(keys),
        head=frozenset(heads),
        before=frozenset(stems(" ".join(toks[:wh])) - heads),
        subject=subject,
        naming=bool(_NAMING_Q.search(q)),
        options=options,
        unit=bool(_UNIT_Q.search(q)),
    )


def _kind(question: str, options: tuple[str, str] | None) -> tuple[QuestionType, Expect]:
    """First match wins: "when did ... how many" is temporal, "why ... who" causal."""
    q = " ".join(question.lower().split())
    if options:
        return QuestionType.FACTOID, Expect.CHOICE
    if q.split(" ", 1)[0] in _AUX and not _WH.search(q):
        return QuestionType.YES_NO, Expect.NONE
    if _TEMPORAL_Q.search(q):
        return QuestionType.TEMPORAL, Expect.NONE
    if _CAUSAL_Q.search(q):
        return QuestionType.CAUSAL, Expect.NONE
    if _NUMBER_Q.search(q):
        return QuestionType.FACTOID, Expect.NUMBER
    if _DEFINITION_Q.search(q):
        return QuestionType.DEFINITIONAL, Expect.NONE
    if _PERSON_Q.search(q):
        return QuestionType.FACTOID, Expect.PERSON
    if _PLACE_Q.search(q):
        return QuestionType.FACTOID, Expect.PLACE
    return QuestionType.FACTOID, Expect.NONE


def negated(question: str) -> bool:
    """Whether the question holds a negation cue ("not", "never", "n't", "no", ...). The reader learnt from
    SQuAD 1.1, whose questions seldom negate (2.3%), and SQuAD-2 writes many of its unanswerable questions as an
    answerable one with a "not" or "never" put in, which the reader answers with the positive question's span:
    a cue is in 12% of the reader-train dev articles' unanswerable questions (0-34% by article) and 1.4% of their
    answerable ones (counted over the data files; docs/decisions/score-inputs.md). The certified score reads it
    (certify.FEATURES)."""
    return _NEGATION.search(question) is not None


def classify(question: str) -> QuestionType:
    """The seed's question type: temporal, causal, definitional, yes/no, else factoid."""
    return _kind(question, _options(question))[0]


def expectation(question: str) -> Expect:
    """The answer shape a factoid question asks for (person, place, number, one of two options)."""
    return _kind(question, _options(question))[1]



def _options(question: str) -> tuple[str, str] | None:
    """The two options of a choice question ("Who is older, A or B?", "Is it easier or harder ...?")."""
    q = " ".join(question.split())
    m = _CHOICE_Q.search(q) or _COMPARE_Q.search(q)
    if m:
        return m["a"].strip(" ,."), m["b"].strip(" ,.")
    first, _, rest = q.partition(" ")
    if first.lower() in _AUX and (m := _ALTERNATIVE.search(rest)):
        return m[1], m[2]
    return None

