"""What the extractive answerer recognises in text: keyword stems, and the shapes answers take
(dates, numbers, names, "because ..." and "is a ..." cues)."""
from __future__ import annotations

import re

from ...documents.text import STOPWORDS

STEM_CHARS = 4  # keywords match on this prefix: +0.005 F1 over 5 letters, +0.02 over whole words
WORD = re.compile(r"\w+")
ENTITY = re.compile(r"\b[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|de|von|van)\s+)*[A-Z0-9][\w'’.-]*)*")

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
DATE = re.compile(
    rf"\b(?=\d|[JFMASOND]|early|mid|late|[a-z]+(?:th|st|nd|rd) century)"
    rf"{_ONE_DATE}(?:\s?(?:–|-|to|until|through)\s?{_ONE_DATE})?\b"
)
_NUMBER_WORD = (
    r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen"
    r"|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand"
    r"|dozen|half)"
)
NUMBER = re.compile(  # "30,000", "$37.6 billion", "Four thousand", "5,000 to 30,000", "30%"
    rf"(?:[$£€¥]\s?|\b(?=[\dotfsenhd]))(?:\d[\d,]*(?:\.\d+)?|{_NUMBER_WORD}(?:[- ]{_NUMBER_WORD})*)\b"
    r"(?:\s?(?:%|percent|per cent))?(?: (?:million|billion|trillion|thousand|hundred))?"
    rf"(?:\s?(?:–|-|to)\s?(?:[$£€¥]\s?)?\d[\d,]*(?:\.\d+)?(?: (?:million|billion|trillion|thousand))?)?",
    re.IGNORECASE,
)
PROPER = re.compile(
    r"\b[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|de|da|di|von|van|del|la|le|al|bin|du|y|and)\s+)*[A-Z][\w'’.-]*)*"
)
CAUSAL_CUE = re.compile(
    r"\b(?=[bdaotcsif])(?:because(?: of)?|due to|as a result of|owing to|thanks to|caused by|since|so that"
    r"|in order to|in protest|for fear of|out of)\b",
    re.IGNORECASE,
)
DEFINITION_CUE = re.compile(
    r"\b(?=[iawrmkdc])(?:(?:is|are|was|were) (?:an?|the|one of the)|refers? to|means|known as|defined as"
    r"|is called|consists? of)\b",
    re.IGNORECASE,
)
# Where a cued clause ends. A bare comma does not end it: "is a long, free-swinging pendulum that ...".


def stems(text: str) -> set[str]:
    """Stemmed content words of a text (digits count, stop words do not): the hot loop, kept inline."""
    words = WORD.findall(text.lower())
    return {w[:STEM_CHARS] for w in words if w not in STOPWORDS and (len(w) > 1 or w.isdigit())}

