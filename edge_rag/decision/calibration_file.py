"""What a calibration file must hold before anything is certified from it (``Calibration.load``).

The file is data from disk, the shipped asset or an operator's own (``edge-rag calibrate``, the /admin page), and
every number in it decides what is answered. Read as it came, a risk table whose counts cannot be counts (half an
error, ``false``, more questions answered than asked) certified answering every candidate at alpha 0.05; a negative
count or a list for a dict crashed opening the path with a bare ValueError or AttributeError; a combiner whose
lengths or feature names do not match, or a list among the measured kinds of passages, failed every question; and a kind model without its kind's table decided
multi-hop questions by the single-hop threshold, which their counts never measured. So each entry is checked here,
and a file that fails is a ValueError naming the entry (a BundleError naming the file, from ``load``), never a
certificate.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .kind import FORM, Kind


def check(raw: object, features: Sequence[str]) -> None:
    """ValueError naming the first entry of a parsed calibration file that cannot be what it says; ``features``:
    the names an answer combiner may read (a file fitted on fewer of them is fine)."""
    top = _dict(raw, "the file")
    readers = _dict(top.get("readers"), "readers")
    if not readers:
        raise ValueError("readers: no reader's calibration")
    source = _dict(top.get("source", {}), "source")
    if not isinstance(source.get("config", ""), str):
        raise ValueError("source.config: not a Config's repr (a string)")
    if not isinstance(source.get("backend", ""), str):
        raise ValueError("source.backend: not a kind of store (a string)")
    passages = source.get("passages", [])  # each question's store check compares these kinds
    if not isinstance(passages, list) or not all(isinstance(k, str) for k in passages):
        raise ValueError("source.passages: not a list of kinds of passages (strings)")
    for name, entry in readers.items():
        at = f"readers.{name}"
        r = _dict(entry, at)
        _combiner(r.get("combiner"), f"{at}.combiner", features)
        _table(r.get("table"), f"{at}.table")
        _real(r.get("ood_distance"), f"{at}.ood_distance")
        gpt = _dict(r.get("gpt"), f"{at}.gpt")
        if _count(gpt.get("errors"), f"{at}.gpt.errors") > _count(gpt.get("n"), f"{at}.gpt.n"):
            raise ValueError(f"{at}.gpt: more errors than generated answers")
        for key, value in (("model_sha256", r.get("model_sha256")), ("gpt.generator", gpt.get("generator"))):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{at}.{key}: not a string")
        if r.get("kinds") is not None:
            _kinds(r["kinds"], f"{at}.kinds")


def _kinds(raw: object, at: str) -> None:
    """A kind model and a table for every kind it can call a question other than single-hop ("table" holds those)."""
    kinds = _dict(raw, at)
    _combiner(kinds.get("model"), f"{at}.model", FORM)
    _real(kinds.get("cut"), f"{at}.cut")
    tables = _dict(kinds.get("tables"), f"{at}.tables")
    values = {k.value for k in Kind}
    for kind, table in tables.items():
        if kind not in values:
            raise ValueError(f"{at}.tables: no kind {kind!r}")
        _table(table, f"{at}.tables.{kind}")
    missing = [k.value for k in Kind if k is not Kind.SINGLE_HOP and k.value not in tables]
    if missing:
        raise ValueError(f"{at}.tables: no counts for {', '.join(missing)} questions, which the kind model names")


def _table(raw: object, at: str) -> None:
    """Counts a calibration set can give: per threshold, strict to permissive, 0 <= errors <= answered <= n_cal,
    and the answered (and their right and wrong answers) nest: a lower threshold answers all a higher one did."""
    t = _dict(raw, at)
    n_cal = _count(t.get("n_cal"), f"{at}.n_cal")
    thresholds, answered, errors = (_list(t.get(k), f"{at}.{k}") for k in ("thresholds", "n_answered", "n_errors"))
    if not len(thresholds) == len(answered) == len(errors):
        raise ValueError(f"{at}: {len(thresholds)} thresholds, {len(answered)} n_answered, {len(errors)} n_errors")
    before = (math.inf, 0, 0)
    for i, (th, a, e) in enumerate(zip(thresholds, answered, errors)):
        now = (_real(th, f"{at}.thresholds[{i}]"), _count(a, f"{at}.n_answered[{i}]"), _count(e, f"{at}.n_errors[{i}]"))
        if not e <= a <= n_cal:
            raise ValueError(f"{at}[{i}]: need 0 <= n_errors <= n_answered <= n_cal, got {e}, {a}, {n_cal}")
        if now[0] > before[0] or a < before[1] or e < before[2] or a - e < before[1] - before[2]:
            raise ValueError(f"{at}[{i}]: thresholds must fall and the questions they answer nest")
        before = now


def _combiner(raw: object, at: str, known: Sequence[str]) -> None:
    """One finite weight, mean and non-zero scale per feature, each a feature the decision computes."""
    c = _dict(raw, at)
    features = _list(c.get("features"), f"{at}.features")
    unknown = [f for f in features if f not in known]
    if unknown or len(set(features)) != len(features):
        raise ValueError(f"{at}.features: {features!r} are not distinct names of {', '.join(known)}")
    for key in ("weights", "mean", "scale"):
        values = [_real(v, f"{at}.{key}") for v in _list(c.get(key), f"{at}.{key}")]
        if len(values) != len(features):
            raise ValueError(f"{at}.{key}: {len(values)} values for {len(features)} features")
        if key == "scale" and 0.0 in values:
            raise ValueError(f"{at}.scale: a zero scale")
    _real(c.get("bias"), f"{at}.bias")


def _dict(value: object, at: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{at}: not an object")
    return value


def _list(value: object, at: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{at}: not a list")
    return value


def _count(value: object, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{at}: {value!r:.40} is not a count (an integer >= 0)")
    return value


def _real(value: object, at: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{at}: {value!r:.40} is not a finite number")
    return float(value)
