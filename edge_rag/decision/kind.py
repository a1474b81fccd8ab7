"""Which kind of question the certificate is counted on: a single-hop question (its answer is in one passage, as
SQuAD's are) or a multi-hop one (it names one thing to ask about another, as HotpotQA's do: "the county seat of
the county where East Lempster is located"). The reader reads the top hit's paragraph, so on a multi-hop question it
answers the first hop ("Sullivan County") with a score as high as a right answer's: a threshold counted on single-hop
questions does not hold there. Each kind gets its own certificate, counted on calibration questions of that kind
(docs/decisions/question-kinds.md).

The kind is read from the question's form alone (its length, names, clauses), by a logistic model fitted on training
questions of both kinds and shipped, with its cut, in the calibration file, so the runtime and the calibration assign
kinds alike.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum


class Kind(str, Enum):
    """A question's kind: each has its own certificate."""

    SINGLE_HOP = "single-hop"
    MULTI_HOP = "multi-hop"


# The question-form inputs of the kind model, in order.
FORM = ("words", "capitalised", "commas", "both_either", "clause", "prepositions", "or_than", "numbers")
_BOTH = re.compile(r"\b(?:both|either)\b", re.IGNORECASE)
_CLAUSE = re.compile(r"\b(?:that|who|which|where|whose)\b", re.IGNORECASE)
_PREPOSITION = re.compile(r"\b(?:of|in|by|for)\b", re.IGNORECASE)
_OR_THAN = re.compile(r"\b(?:or|than)\b")


def form(question: str) -> dict[str, float]:
    """The kind model's inputs: a multi-hop question is longer, names more things and nests a clause
    ("... the woman who portrayed ...") past its first two words."""
    words = question.split()
    return {
        "words": float(len(words)),
        "capitalised": float(sum(1 for w in words[1:] if w[:1].isupper())),
        "commas": float(question.count(",")),
        "both_either": float(bool(_BOTH.search(question))),
        "clause": float(bool(_CLAUSE.search(" ".join(words[2:])))),
        "prepositions": float(len(_PREPOSITION.findall(question))),
        "or_than": float(bool(_OR_THAN.search(question))),
        "numbers": float(sum(1 for w in words if any(ch.isdigit() for ch in w))),
    }


def kind_of(model: Callable[[dict[str, float]], float] | None, cut: float, question: str) -> Kind:
    """The question's kind: multi-hop when ``model``'s P(multi-hop) of its form is at least ``cut``; single-hop
    without a model (a calibration that counts every question in one table)."""
    return Kind.MULTI_HOP if model is not None and model(form(question)) >= cut else Kind.SINGLE_HOP
