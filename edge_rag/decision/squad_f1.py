"""SQuAD token F1, the rule a certificate counts right and wrong answers by: the shipped calibration (``convert
calibrate``) and a device's own (``edge-rag calibrate``) judge alike. (EM and the benchmarks' other metrics live in
``evaluation.metrics``, host side.)"""
from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, strip punctuation and articles, collapse white space."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def f1_score(prediction: str | None, gold: str) -> float:
    pred = normalize_answer(prediction or "").split()
    ref = normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def best_f1(prediction: str | None, golds: list[str]) -> float:
    """Token F1 against the best-matching gold answer (0 when there are none)."""
    return max((f1_score(prediction, g) for g in golds), default=0.0)
