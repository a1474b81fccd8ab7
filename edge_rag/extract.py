"""Extractive answerer of the RAG route (EverydayGPT §5–6): rules and regexes, no model, < 1 ms a question.

classify the question -> rank the context's sentences -> cut a short span from the best one -> Eq. 1.

* Ranking: IDF-weighted keyword overlap (IDF over the context's own sentences, so a word found in every
  sentence counts little), + W_SIGNAL if the sentence carries the type's evidence (a date for "when", a
  number for "how many", a name for who/where, "because" for "why", "is a" for "what is"), + a little of
  the retrieval cosine. Keywords match on a 4-letter prefix ("invented" meets "invention").
* Span: a date/number/name of the right type if the sentence has one; "because ..." / "is a ..." clauses
  for causal/definitional; else the phrase the question leaves open — the n-gram (<= 6 words, no question
  word, no clause break) nearest the question's words, on the side the wh-word points to ("... known as
  what?" -> after them; "who founded X?" -> before them or after "by"), with clean ends. Choice questions
  ("who is older, A or B?") pick an option by year/number/evidence; yes/no questions answer "yes"/"no".
  Multi-hop: if the best sentence names another passage's title, the answer is sought in that passage.
  On SQuAD gold paragraphs spans double whole-sentence F1 (0.44 vs 0.21).
* Eq. 1, c = min(1, (|w|/25)·0.3 + ovlp(q, ·)·0.4 + η·0.3), is computed on the *supporting sentence*:
  a 2-word span has ovlp(q, span) ≈ 0 by construction and |w|/25 ≈ 0.1, so on the span c < τ = 0.5
  for ~94% of questions whatever their quality. |w|/25 is capped at 1 so a long sentence cannot buy
  confidence. η = 1.5 when the answer has the shape its type asks for (date, number, name, cue clause,
  option, yes/no); 1.0 when the sentence carries the type's evidence but the span fell back to an open
  phrase; 0.3 otherwise, including open "what ...?" factoids, which have no shape to check — that is
  what makes c rank answers (AUC 0.68 for F1 >= 0.5 on SQuAD; 0.65 if open factoids got 1.0).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .text import STOPWORDS, split_sentences
from .types import Passage


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


@dataclass(frozen=True)
class Extraction:
    """An extractive answer, the sentence it came from, and its Eq. 1 confidence."""

    answer: str | None
    confidence: float
    sentence: str
    qtype: QuestionType
    passage_id: int | None


# -- tunables (the integrator may move them into Config); tuned on half the SQuAD subset's articles,
# the other half scores no worse (F1 0.415 tuned half, 0.473 other half).
# Sentence score = IDF-weighted overlap + W_SIGNAL·[type evidence] + W_RETRIEVAL·cosine.
W_TITLE = 0.5  # a question keyword found only in the passage title counts half
W_SIGNAL = 0.3  # a date for "when", a number for "how many", "because" for "why"...
W_RETRIEVAL = 0.1  # the retriever's cosine breaks ties between equally overlapping sentences
STEM_CHARS = 4  # keywords match on this prefix: +0.005 F1 over 5 letters, +0.02 over whole words
# Span score: closeness to the question's words in the sentence, on the side the question points to.
MAX_SPAN_WORDS = 6  # SQuAD answers average ~3 words; 6 keeps most multi-word names whole
W_GAP = 0.05  # per word between the span and the nearest question keyword (capped at 6)
W_SIDE = 2.0  # span sits where the wh-word sits relative to the question's words (or after "by")
W_HEAD = 0.6  # span touches the wh-word's noun ("what fort" -> "Fort Beauséjour")
W_BOUNDARY = 0.3  # span ends at a stop word, punctuation, question word or the sentence end (each side)
W_LENGTH = -0.02  # per word: a slight pull to longer spans (partial credit beats a wrong word)
W_NAME = 0.3  # span holds a capitalised word or digit (not the sentence's first word): answers often do
W_LOCATIVE = 0.3  # "where" spans after in/at/from/near...
W_NAMING = 0.5  # "what is X called?" spans right after "called", "known as"...
W_VERB = 0.3  # span starts or ends with an -ed/-ing/-ly word: a verb or adverb, rarely an answer
# Eq. 1: c = min(1, min(|w|/25, 1)·0.3 + ovlp·0.4 + η·0.3) on the supporting sentence.
CONF_WORDS, CONF_W_LEN, CONF_W_OVLP, CONF_W_ETA = 25, 0.3, 0.4, 0.3
ETA_TYPED, ETA_PARTIAL, ETA_NONE = 1.5, 1.0, 0.3
# "yes" when every named entity has a sentence with this share of the question's other words
# (HotpotQA: 11/21 right, as many as always saying "yes"; 0.67 gets 13/21: too few questions to tune on).
YES_COVER = 0.5

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
_ENTITY = re.compile(r"\b[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|de|von|van)\s+)*[A-Z0-9][\w'’.-]*)*")

# -- sentence cues ---------------------------------------------------------------------------------------
# Each pattern opens with a lookahead on its possible first characters: Python's re would otherwise try
# every alternative at every position (3-4x slower on a typical sentence).
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
    r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_ONE_DATE = (
    rf"(?:\d{{1,2}}(?:st|nd|rd|th)? {_MONTH},? \d{{3,4}}|{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{3,4}}"
    rf"|{_MONTH},? \d{{3,4}}|{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?"
    r"|(?:(?:early|mid|late)[- ])?(?:\d{1,2}(?:st|nd|rd|th)|[a-z]+(?:th|st|nd|rd)) century"
    r"(?: (?:BC|AD|BCE|CE))?"
    r"|(?:(?:early|mid|late)[- ])?\d{3}0s|(?:AD )?\d{3,4}(?: (?:BC|AD|BCE|CE))?"
    r"|\d{1,2}:\d{2}(?:\s?[ap]\.?m\.?)?(?: and \d{1,2}:\d{2})?)"  # clock times: "13:00 and 16:00"
)
_DATE = re.compile(
    rf"\b(?=\d|[JFMASOND]|early|mid|late|[a-z]+(?:th|st|nd|rd) century)"
    rf"{_ONE_DATE}(?:\s?(?:–|-|to|until|through)\s?{_ONE_DATE})?\b"
)
_YEAR = re.compile(r"\b(1\d{3}|20\d{2})\b")
_NUMBER_WORD = (
    r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen"
    r"|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand"
    r"|dozen|half)"
)
_NUMBER = re.compile(  # "30,000", "$37.6 billion", "Four thousand", "5,000 to 30,000", "30%"
    rf"(?:[$£€¥]\s?|\b(?=[\dotfsenhd]))(?:\d[\d,]*(?:\.\d+)?|{_NUMBER_WORD}(?:[- ]{_NUMBER_WORD})*)\b"
    r"(?:\s?(?:%|percent|per cent))?(?: (?:million|billion|trillion|thousand|hundred))?"
    rf"(?:\s?(?:–|-|to)\s?(?:[$£€¥]\s?)?\d[\d,]*(?:\.\d+)?(?: (?:million|billion|trillion|thousand))?)?",
    re.IGNORECASE,
)
_PROPER = re.compile(
    r"\b[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|de|da|di|von|van|del|la|le|al|bin|du|y|and)\s+)*[A-Z][\w'’.-]*)*"
)
_CAUSAL_CUE = re.compile(
    r"\b(?=[bdaotcsif])(?:because(?: of)?|due to|as a result of|owing to|thanks to|caused by|since|so that"
    r"|in order to|in protest|for fear of|out of)\b",
    re.IGNORECASE,
)
_DEFINITION_CUE = re.compile(
    r"\b(?=[iawrmkdc])(?:(?:is|are|was|were) (?:an?|the|one of the)|refers? to|means|known as|defined as"
    r"|is called|consists? of)\b",
    re.IGNORECASE,
)
# Where a cued clause ends. A bare comma does not end it: "is a long, free-swinging pendulum that ...".
_CLAUSE_BREAK = re.compile(
    r"[;:()]|,\s(?=(?:which|who|whose|where|when|and|but|although|while|as|so|such as|including|for example"
    r"|especially|like)\b)|\bwhich\b|\bwho\b"
)
_NEGATION = re.compile(r"\b(?:not|never|no|neither|nor|n't)\b", re.IGNORECASE)
_VERBISH = ("ed", "ing", "ly")
_WORD = re.compile(r"\w+")
_DIGITS = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_TOKEN = re.compile(r"\w+(?:[-'’.,]\w+)*|[^\w\s]")
_NAMING_Q = re.compile(r"\b(?:called|named?|term(?:ed)?|known as|referred to as|nickname[d]?)\b")
_NAMING = re.compile(r"\b(?:called|named|termed|known as|referred to as|nicknamed)\s+(?:the |an? )?[\"“']?$")
_LOCATIVE = frozenset("in at from near to into across throughout within outside inside".split())
_BREAK = frozenset(",;:()[]\"“”—–")
_EARLIER = re.compile(r"\b(?:older|oldest|first|earlier|earliest|before|sooner)\b")
_LATER = re.compile(r"\b(?:younger|youngest|later|latest|last|recent|recently|newer|after)\b")
_MORE = re.compile(r"\b(?:more|most|larger|largest|bigger|higher|longer|taller|greater)\b")
_FEWER = re.compile(r"\b(?:fewer|less|least|smaller|smallest|lower|shorter)\b")


def _stems(text: str) -> set[str]:
    """Stemmed content words of a text (digits count, stop words do not): the hot loop, kept inline."""
    words = _WORD.findall(text.lower())
    return {w[:STEM_CHARS] for w in words if w not in STOPWORDS and (len(w) > 1 or w.isdigit())}


@dataclass(frozen=True)
class _Question:
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


def _question(question: str) -> _Question:
    """Type, keywords, and where the wh-word sits among them."""
    q = " ".join(question.lower().split())
    options = _options(question)
    qtype, expect = _kind(question, options)
    toks = _WORD.findall(q)
    wh = next((i for i, w in enumerate(toks) if _WH.fullmatch(w)), len(toks))
    head: list[str] = []
    k = wh + 1
    while k < len(toks) and len(head) < 2 and toks[k] not in STOPWORDS and not toks[k].endswith("ed"):
        head.append(toks[k])
        k += 1
    subject = wh < len(toks) and k < len(toks) and toks[k] not in _AUX and toks[k] not in STOPWORDS
    stems = _stems(q)
    heads = {w[:STEM_CHARS] for w in head}
    return _Question(
        text=question,
        qtype=qtype,
        expect=expect,
        stems=frozenset(stems - heads) or frozenset(stems),
        head=frozenset(heads),
        before=frozenset(_stems(" ".join(toks[:wh])) - heads),
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


def classify(question: str) -> QuestionType:
    """The seed's question type: temporal, causal, definitional, yes/no, else factoid."""
    return _kind(question, _options(question))[0]


def expectation(question: str) -> Expect:
    """The answer shape a factoid question asks for (person, place, number, one of two options)."""
    return _kind(question, _options(question))[1]


@dataclass
class _Sentence:
    """A sentence of the context, its keyword stems, and its ranking score."""

    text: str
    passage: Passage
    stems: set[str]
    title_stems: set[str]
    score: float = 0.0


def _running(flags: list[bool]) -> list[int]:
    """Prefix counts: out[k] = number of true flags before position k."""
    out = [0]
    for f in flags:
        out.append(out[-1] + f)
    return out


class _Tokens:
    """A sentence's tokens with character offsets, and per-token features so any span scores in O(1)."""

    def __init__(self, text: str, q: _Question) -> None:
        self.text, self.q = text, q
        self.spans = [m.span() for m in _TOKEN.finditer(text)]
        self.words = [text[a:b] for a, b in self.spans]
        low = [w.lower() for w in self.words]
        n = len(low)
        stems = [w[:STEM_CHARS] for w in low]
        self.stop = [w in STOPWORDS or not w[0].isalnum() for w in low]
        self.brk = [w in _BREAK for w in low]
        self.key = [not s and w in q.stems for w, s in zip(stems, self.stop, strict=True)]
        self.keys = [k for k in range(n) if self.key[k]]
        befores = [k for k in self.keys if stems[k] in q.before]
        self.n_before = len(befores)
        self.before_upto = _running([k in befores for k in range(n)])
        self.head_upto = _running([not s and w in q.head for w, s in zip(stems, self.stop, strict=True)])
        named = [k > 0 and (w[0].isupper() or w[0].isdigit()) for k, w in enumerate(self.words)]
        self.named_upto = _running(named)
        # Distance to the nearest question keyword on each side (capped at 6 words).
        self.left, self.right = [6] * n, [6] * n
        for k in self.keys:
            for m in range(k + 1, min(n, k + 7)):
                self.left[m] = min(self.left[m], m - k)
            for m in range(max(0, k - 6), k):
                self.right[m] = min(self.right[m], k - m)
        # What the word before a span says about it: "called X", "in X", "by X".
        self.start = [
            W_NAMING * (q.naming and _NAMING.search(text[max(0, a - 16) : a]) is not None)
            + W_LOCATIVE * (q.expect is Expect.PLACE and k > 0 and low[k - 1] in _LOCATIVE)
            for k, (a, _) in enumerate(self.spans)
        ]
        self.by = [k > 0 and low[k - 1] == "by" for k in range(n)]
        # Open-phrase shape: clean ends (stop word, question word, punctuation, edge), no verb-like ends.
        verb = [W_VERB * w.endswith(_VERBISH) for w in low]
        clean = [s or k for s, k in zip(self.stop, self.key, strict=True)]
        self.open_start = [W_BOUNDARY * (k == 0 or clean[k - 1]) - verb[k] for k in range(n)]
        self.open_end = [W_BOUNDARY * (k == n - 1 or clean[k + 1]) - verb[k] for k in range(n)]

    def index(self, start: int, end: int) -> tuple[int, int]:
        """Token range [i, j] covering a character span."""
        i = next(k for k, (a, b) in enumerate(self.spans) if b > start)
        j = max(k for k, (a, b) in enumerate(self.spans) if a < end)
        return i, j

    def cut(self, i: int, j: int) -> str:
        return self.text[self.spans[i][0] : self.spans[j][1]].strip(" ,.;:")

    def place(self, i: int, j: int) -> float:
        """How well tokens [i, j] sit where the question points: near its words, on the wh-word's side."""
        score = self.start[i] - W_GAP * min(self.left[i], self.right[j]) - W_LENGTH * (j - i)
        if self.n_before:
            score += W_SIDE * self.before_upto[i] / self.n_before
        elif self.q.subject and self.keys and (j < self.keys[0] or self.by[i]):
            score += W_SIDE
        head = self.head_upto[min(j + 2, len(self.words))] - self.head_upto[max(0, i - 1)]
        return score + W_HEAD * (head > 0)

    def score(self, i: int, j: int) -> float:
        """Place, plus what makes an open phrase look like an answer: clean ends, a name, no verb."""
        named = self.named_upto[j + 1] > self.named_upto[i]
        return self.place(i, j) + self.open_start[i] + self.open_end[j] + W_NAME * named


def _pattern_cands(t: _Tokens, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """Token ranges of pattern matches that hold something other than question words."""
    out = []
    for m in pattern.finditer(t.text):
        i, j = t.index(*m.span())
        if any(not t.stop[k] and not t.key[k] for k in range(i, j + 1)):
            out.append((i, j))
    return out


def _proper_cands(t: _Tokens) -> list[tuple[int, int]]:
    """Capitalised noun phrases (minus leading stop words) not made only of question words."""
    out = []
    for m in _PROPER.finditer(t.text):
        i, j = t.index(*m.span())
        while i <= j and t.stop[i]:
            i += 1
        new = any(not t.key[k] and not t.stop[k] for k in range(i, j + 1))
        if i <= j and new and (i, j) != (0, 0):  # a lone first word is capitalised anyway
            out.append((i, j))
    return out


def _open_cands(t: _Tokens) -> list[tuple[int, int]]:
    """Runs of <= MAX_SPAN_WORDS tokens free of question words and clause breaks, content at both ends."""
    out = []
    n = len(t.words)
    for i in range(n):
        if t.stop[i] or t.key[i]:
            continue
        for j in range(i, min(n, i + MAX_SPAN_WORDS)):
            if t.key[j] or t.brk[j]:
                break
            if not t.stop[j] and t.head_upto[j + 1] - t.head_upto[i] < j + 1 - i:
                out.append((i, j))
    return out


def _after_cue(text: str, cue: re.Pattern[str]) -> str | None:
    """The clause following a cue ("because ...", "is a ..."), up to the next clause break."""
    m = cue.search(text)
    if not m:
        return None
    rest = _CLAUSE_BREAK.split(text[m.end() :], maxsplit=1)[0].strip(" .")
    return rest or None


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


def _about(stems: set[str], sentences: list[_Sentence]) -> list[_Sentence]:
    """Sentences that mention at least half of a name's words, in the sentence or its passage title."""
    return [s for s in sentences if stems and 2 * len(stems & (s.stems | s.title_stems)) >= len(stems)]


def _choose(q: _Question, options: tuple[str, str], sentences: list[_Sentence]) -> str:
    """Pick an option by the first year (older, earlier) or number (more, larger) about it, else evidence."""
    low = q.text.lower()
    names = [_stems(o) for o in options]
    rest = set(q.stems | q.head) - names[0] - names[1]
    years, numbers, evidence = [], [], []
    for name in names:
        about = _about(name, sentences)
        years.append(next((int(y) for s in about for y in _YEAR.findall(s.text)), None))
        counts = (n.replace(",", "") for s in about if rest & s.stems for n in _DIGITS.findall(s.text))
        numbers.append(next((float(n) for n in counts), None))
        evidence.append(max((len(rest & s.stems) for s in about), default=-1))
    earlier, later = _EARLIER.search(low), _LATER.search(low)
    if None not in years and years[0] != years[1] and (earlier or later):
        return options[(years[0] < years[1]) != bool(earlier)]
    more, fewer = _MORE.search(low), _FEWER.search(low)
    if None not in numbers and numbers[0] != numbers[1] and (more or fewer):
        return options[(numbers[0] > numbers[1]) != bool(more)]
    return options[evidence[1] > evidence[0]]


def _yes_no(q: _Question, best: _Sentence, sentences: list[_Sentence]) -> str:
    """'yes' when every entity the question names has a sentence carrying the rest of the question."""
    entities = [_stems(e) for e in _ENTITY.findall(q.text.split(" ", 1)[-1])]
    entities = [e for e in entities if e and _about(e, sentences)]
    if len(entities) < 2:
        return "no" if _NEGATION.search(best.text) else "yes"
    rest = set(q.stems | q.head) - set().union(*entities)
    if not rest:
        return "yes"
    cover = [max(len(rest & s.stems) for s in _about(e, sentences)) / len(rest) for e in entities]
    return "yes" if min(cover) >= YES_COVER else "no"


def _span(best: _Sentence, q: _Question) -> tuple[str | None, bool]:
    """The answer cut from the best sentence, and whether it has the shape the question type asks for.

    Typed candidates (a date for "when", a number for "how many", a name for who/where) come first,
    else every open phrase of the sentence competes; "why" and "what is X" take the clause after
    their cue ("because ...", "is a ...") when there is one.
    """
    if q.qtype in (QuestionType.CAUSAL, QuestionType.DEFINITIONAL):
        cued = _after_cue(best.text, _CAUSAL_CUE if q.qtype is QuestionType.CAUSAL else _DEFINITION_CUE)
        if cued:
            return cued, True
    t = _Tokens(best.text, q)
    typed: list[tuple[int, int]] = []
    if q.qtype is QuestionType.TEMPORAL:
        typed = _pattern_cands(t, _DATE)
    elif q.expect is Expect.NUMBER:
        typed = _pattern_cands(t, _NUMBER)
    elif q.expect in (Expect.PERSON, Expect.PLACE):
        typed = _proper_cands(t)
    if typed:  # already the right shape: only where it sits matters
        i, j = max(typed, key=lambda c: t.place(*c))  # ties: the first (max keeps it)
        if q.unit and j + 1 < len(t.words) and not (t.stop[j + 1] or t.key[j + 1]):
            j += 1  # "how long ...?" -> "380 years" ("how many men" names its unit: "30,000")
        return t.cut(i, j), True
    cands = _open_cands(t)
    return (t.cut(*max(cands, key=lambda c: t.score(*c))) if cands else None), False


def _signal(sentence: str, q: _Question) -> bool:
    """Does the sentence carry the evidence this type of question asks for?"""
    if q.qtype is QuestionType.TEMPORAL:
        return bool(_DATE.search(sentence))
    if q.qtype is QuestionType.CAUSAL:
        return bool(_CAUSAL_CUE.search(sentence))
    if q.qtype is QuestionType.DEFINITIONAL:
        return bool(_DEFINITION_CUE.search(sentence))
    if q.expect is Expect.NUMBER:
        return bool(_NUMBER.search(sentence))
    if q.expect in (Expect.PERSON, Expect.PLACE):
        return bool(_PROPER.search(sentence, 1))  # from 1: every sentence starts with a capital
    return False


def _confidence(sentence: _Sentence, q_stems: set[str], eta: float) -> float:
    """Eq. 1 on the supporting sentence: a 2-word span would overlap the question by ~0 by design."""
    n_words = len(_WORD.findall(sentence.text))
    ovlp = len(q_stems & sentence.stems) / len(q_stems)
    return min(1.0, min(n_words / CONF_WORDS, 1.0) * CONF_W_LEN + ovlp * CONF_W_OVLP + eta * CONF_W_ETA)


def _bridge(best: _Sentence, q: _Question, sentences: list[_Sentence]) -> _Sentence:
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
    return max(hops, key=lambda s: len(rest & s.stems) + W_SIGNAL * _signal(s.text, q))


def extract(question: str, passages: Sequence[Passage]) -> Extraction:
    """Answer from the passages (in rank order) without a model; answer None when nothing matches."""
    q = _question(question)
    q_stems = set(q.stems | q.head)
    titles = {p.title: _stems(p.title) for p in passages}
    sentences = [
        _Sentence(s, p, _stems(s), titles[p.title])
        for p in passages
        for s in split_sentences(p.text)
        if s.strip()
    ]
    if not sentences or not q_stems:
        return Extraction(None, 0.0, "", q.qtype, None)
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
            s.score += W_SIGNAL * _signal(s.text, q)
    best = max(sentences, key=lambda s: s.score)
    if not q_stems & (best.stems | best.title_stems):
        return Extraction(None, 0.0, "", q.qtype, None)
    if q.qtype is QuestionType.YES_NO:
        answer, typed = _yes_no(q, best, sentences), True
    elif q.options:
        answer, typed = _choose(q, q.options, sentences), True
    else:
        best = _bridge(best, q, sentences)
        answer, typed = _span(best, q)
    if not answer:
        return Extraction(None, 0.0, best.text, q.qtype, best.passage.id)
    eta = ETA_TYPED if typed else ETA_PARTIAL if _signal(best.text, q) else ETA_NONE
    return Extraction(answer, _confidence(best, q_stems, eta), best.text, q.qtype, best.passage.id)
