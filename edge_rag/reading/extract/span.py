"""Span choice for the extractive answerer: the short answer cut from the best sentence.

A date/number/name of the right type if the sentence has one; "because ..." / "is a ..." clauses for
causal/definitional; else the phrase the question leaves open — the n-gram (<= 6 words, no question
word, no clause break) nearest the question's words, on the side the wh-word points to ("... known as
what?" -> after them; "who founded X?" -> before them or after "by"), with clean ends. Choice questions
("who is older, A or B?") pick an option by year/number/evidence; yes/no questions answer "yes"/"no".
On SQuAD gold paragraphs spans double whole-sentence F1 (0.44 vs 0.21).
"""
from __future__ import annotations

import re

from ...documents.text import STOPWORDS
from .cues import CAUSAL_CUE, DATE, DEFINITION_CUE, ENTITY, NUMBER, PROPER, STEM_CHARS, stems
from .question import Expect, Question, QuestionType
from .rank import Sentence

# Span score: closeness to the question's words in the sentence, on the side the question points to
# (tuned with the ranking weights of ``rank``).
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
# "yes" when every named entity has a sentence with this share of the question's other words
# (HotpotQA: 11/21 right, as many as always saying "yes"; 0.67 gets 13/21: too few questions to tune on).
YES_COVER = 0.5

_CLAUSE_BREAK = re.compile(
    r"[;:()]|,\s(?=(?:which|who|whose|where|when|and|but|although|while|as|so|such as|including|for example"
    r"|especially|like)\b)|\bwhich\b|\bwho\b"
)
_NEGATION = re.compile(r"\b(?:not|never|no|neither|nor|n't)\b", re.IGNORECASE)
_VERBISH = ("ed", "ing", "ly")
WORD = re.compile(r"\w+")
_YEAR = re.compile(r"\b(1\d{3}|20\d{2})\b")
_DIGITS = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_TOKEN = re.compile(r"\w+(?:[-'’.,]\w+)*|[^\w\s]")
_NAMING = re.compile(r"\b(?:called|named|termed|known as|referred to as|nicknamed)\s+(?:the |an? )?[\"“']?$")
_LOCATIVE = frozenset("in at from near to into across throughout within outside inside".split())
_BREAK = frozenset(",;:()[]\"“”—–")
_EARLIER = re.compile(r"\b(?:older|oldest|first|earlier|earliest|before|sooner)\b")
_LATER = re.compile(r"\b(?:younger|youngest|later|latest|last|recent|recently|newer|after)\b")
_MORE = re.compile(r"\b(?:more|most|larger|largest|bigger|higher|longer|taller|greater)\b")
_FEWER = re.compile(r"\b(?:fewer|less|least|smaller|smallest|lower|shorter)\b")


def _running(flags: list[bool]) -> list[int]:
    """Prefix counts: out[k] = number of true flags before position k."""
    out = [0]
    for f in flags:
        out.append(out[-1] + f)
    return out


class _Tokens:
    """A sentence's tokens with character offsets, and per-token features so any span scores in O(1)."""

    def __init__(self, text: str, q: Question) -> None:
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
    for m in PROPER.finditer(t.text):
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


def _about(stems: set[str], sentences: list[Sentence]) -> list[Sentence]:
    """Sentences that mention at least half of a name's words, in the sentence or its passage title."""
    return [s for s in sentences if stems and 2 * len(stems & (s.stems | s.title_stems)) >= len(stems)]


def choose(q: Question, options: tuple[str, str], sentences: list[Sentence]) -> str:
    """Pick an option by the first year (older, earlier) or number (more, larger) about it, else evidence."""
    low = q.text.lower()
    names = [stems(o) for o in options]
    rest = set(q.stems | q.head) - names[0] - names[1]
    years: list[int | None] = []
    numbers: list[float | None] = []
    evidence: list[int] = []
    for name in names:
        about = _about(name, sentences)
        years.append(next((int(y) for s in about for y in _YEAR.findall(s.text)), None))
        counts = (n.replace(",", "") for s in about if rest & s.stems for n in _DIGITS.findall(s.text))
        numbers.append(next((float(n) for n in counts), None))
        evidence.append(max((len(rest & s.stems) for s in about), default=-1))
    earlier, later = _EARLIER.search(low), _LATER.search(low)
    (y0, y1), (n0, n1) = years, numbers
    if y0 is not None and y1 is not None and y0 != y1 and (earlier or later):
        return options[(y0 < y1) != bool(earlier)]
    more, fewer = _MORE.search(low), _FEWER.search(low)
    if n0 is not None and n1 is not None and n0 != n1 and (more or fewer):
        return options[(n0 > n1) != bool(more)]
    return options[evidence[1] > evidence[0]]


def yes_no(q: Question, best: Sentence, sentences: list[Sentence]) -> str:
    """'yes' when every entity the question names has a sentence carrying the rest of the question."""
    entities = [stems(e) for e in ENTITY.findall(q.text.split(" ", 1)[-1])]
    entities = [e for e in entities if e and _about(e, sentences)]
    if len(entities) < 2:
        return "no" if _NEGATION.search(best.text) else "yes"
    rest = set(q.stems | q.head) - set().union(*entities)
    if not rest:
        return "yes"
    cover = [max(len(rest & s.stems) for s in _about(e, sentences)) / len(rest) for e in entities]
    return "yes" if min(cover) >= YES_COVER else "no"


def span(best: Sentence, q: Question) -> tuple[str | None, bool]:
    """The answer cut from the best sentence, and whether it has the shape the question type asks for.

    Typed candidates (a date for "when", a number for "how many", a name for who/where) come first,
    else every open phrase of the sentence competes; "why" and "what is X" take the clause after
    their cue ("because ...", "is a ...") when there is one.
    """
    if q.qtype in (QuestionType.CAUSAL, QuestionType.DEFINITIONAL):
        cued = _after_cue(best.text, CAUSAL_CUE if q.qtype is QuestionType.CAUSAL else DEFINITION_CUE)
        if cued:
            return cued, True
    t = _Tokens(best.text, q)
    typed: list[tuple[int, int]] = []
    if q.qtype is QuestionType.TEMPORAL:
        typed = _pattern_cands(t, DATE)
    elif q.expect is Expect.NUMBER:
        typed = _pattern_cands(t, NUMBER)
    elif q.expect in (Expect.PERSON, Expect.PLACE):
        typed = _proper_cands(t)
    if typed:  # already the right shape: only where it sits matters
        i, j = max(typed, key=lambda c: t.place(*c))  # ties: the first (max keeps it)
        if q.unit and j + 1 < len(t.words) and not (t.stop[j + 1] or t.key[j + 1]):
            j += 1  # "how long ...?" -> "380 years" ("how many men" names its unit: "30,000")
        return t.cut(i, j), True
    cands = _open_cands(t)
    return (t.cut(*max(cands, key=lambda c: t.score(*c))) if cands else None), False

