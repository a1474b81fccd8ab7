"""Plain-text helpers shared by chunking, rerank, compression and extraction."""
from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator

STOPWORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from as into onto over under about
    is are was were be been being am do does did doing have has had having can could will would shall
    should may might must it its this that these those there here their they them he him his she her
    we us our you your i me my what which who whom whose when where why how than also not no nor so
    such very just only own same too s t any all both each few more most other some up down out off
    again further once during before after above below between through while until because""".split()
)

_WORD = re.compile(r"\w+", re.UNICODE)
# Invisible marks inside words (Unicode word segmentation ignores them): soft hyphen, zero-width space, word joiner,
# zero-width no-break space. Files and pages carry them; the full-text indexes cut words at them (PostgreSQL glues
# the word to the mark), so no question found "infor\u00admation" by "information". ZWJ/ZWNJ spell Persian and Indic
# words: kept.
INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u2060\ufeff"))
# A sentence ends at . ! ? (optionally followed by a closing quote/bracket) before whitespace and an
# upper-case letter, digit or opening quote. Common abbreviations do not end a sentence.
_SENT_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
# The end of text cut off: . ! ? and an optional closing quote or bracket; not a '.' after a digit, nor an ellipsis
# (Gemma's "wait for it... the engine starts at noon", cut by the budget, was shown as the answer "wait for it...").
_FINAL_END = re.compile(r"(?:[!?]|(?<![\d.])\.)[\"')\]]?$")
_ABBREV = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|vs|etc|e\.g|i\.e|U\.S|No|Fig|approx|ca|c)\.$")
# Besides those, what never ends a generated answer shown to a visitor (whole_sentences): an initial ("J. R. R.
# Tolkien") or a title before a name ("Mt. Everest"). Gemma's answers cut by the budget were shown as "J." and "Mt.".
# The splitter keeps its own rule: the shipped calibration's passages were cut by it.
_NAME_PART = re.compile(r"(?:\b[A-Z]|\b(?:Mt|Ft|Gen|Col|Capt|Lt|Sgt|Rev|Gov|Sen|Hon))\.$")
# A CJK full stop, exclamation or question mark ends a sentence without a space after it (with its closing quote).
_CJK_END = re.compile(r"[。！？][」』”）]?")


def path_text(path: str | os.PathLike[str]) -> str:
    """A path as text a store and the encoder take: the bytes of a file name that is not UTF-8 (held in str as
    lone surrogates, which cannot be encoded) become U+FFFD."""
    return os.fsencode(path).decode("utf-8", "replace")


def plain(text: str) -> str:
    """A file's text as a question spells it, for the full-text indexes: in NFC (a file exported by macOS writes
    "Cafe" and a combining accent, which PostgreSQL's index never matched with a typed "Café") and without invisible
    marks (a zero-width space cut "cloakroom" in two). Documents given as strings are indexed as given: the
    calibration's SQuAD passages hold zero-width spaces."""
    return unicodedata.normalize("NFC", text.translate(INVISIBLE))


def normalize(text: str) -> str:
    """Lower-case and collapse white space (cache keys, dedupe prefixes)."""
    return " ".join(text.lower().split())


def words(text: str) -> list[str]:
    """Lower-case word tokens of the text in NFC, the form the full-text indexes match: a combining accent is no
    word character, so "Pe\u0301rez" (NFD, as macOS and some PDFs and web pages write it) was the words "pe" and
    "rez", which no index holds. Cut before lower-casing: "İ" lower-cases to "i" and a combining dot."""
    return [w.lower() for w in _WORD.findall(unicodedata.normalize("NFC", text))]


def keywords(text: str) -> set[str]:
    """Content words: lower-case tokens that are not stop words."""
    return {w for w in words(text) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())}


def overlap(query: str | set[str], text: str | set[str]) -> float:
    """Share of the query's keywords found in the text, in [0, 1]."""
    q = query if isinstance(query, set) else keywords(query)
    t = text if isinstance(text, set) else keywords(text)
    return len(q & t) / len(q) if q else 0.0


def _sentence_ends(text: str) -> Iterator[re.Match[str]]:
    """Where sentences end in ``text`` (the one rule: a match of _SENT_END not after an abbreviation)."""
    for m in _SENT_END.finditer(text):
        if not _ABBREV.search(text[max(0, m.start() - 12) : m.start()]):  # 12 > the longest abbreviation
            yield m


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences without a model; keeps abbreviations like 'Dr.' inside."""
    out: list[str] = []
    start = 0
    for m in _sentence_ends(text):
        candidate = text[start : m.start()].strip()
        if candidate:
            out.append(candidate)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def whole_sentences(text: str, finished: bool = False) -> str:
    """The longest prefix of ``text`` that ends a sentence ('' if none does): what may be shown of text
    still being written (a sentence has ended once the next one starts) or, ``finished``, of text cut off
    mid-way by a token budget: then a closing . ! ? ends it too, unless that '.' may be a decimal point
    ("3.") or an abbreviation's ("Dr.", an initial's "J."). A CJK 。！？ ends one wherever it stands."""
    end = 0
    for m in _sentence_ends(text):
        if not _NAME_PART.search(text[max(0, m.start() - 12) : m.start()]):
            end = m.start() + len(m.group().rstrip())  # with its closing quote or bracket, without the space
    for m in _CJK_END.finditer(text):
        if m.end() < len(text) or finished:  # a closing quote may follow: at the very end only once finished
            end = max(end, m.end())
    tail = text.rstrip()
    last = tail[-12:].rstrip("\"')]")
    if finished and _FINAL_END.search(tail) and not _ABBREV.search(last) and not _NAME_PART.search(last):
        end = len(tail)
    return text[:end]
