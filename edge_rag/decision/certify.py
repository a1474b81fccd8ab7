"""Certified selective answering: answer only when a question's score clears a threshold chosen so that the
error rate among answered questions is <= alpha with probability >= 1 - delta (Learn-then-Test).

One score per candidate answer: a logistic combiner of the reader's span score and no-answer margin, the
retrieval evidence (top cosine, and how much of the question the top hit covers) and whether the question holds
a negation cue, fitted on the validation questions only (reader-val and the model-selection set; ``python -m
convert calibrate``).
The calibration split (questions no training or tuning touched) gives, for every threshold of a grid fixed
before calibration (strict -> permissive), n answered and n errors; an error is an answer with F1 < 0.5 to
an answerable question, or any answer to an unanswerable one. ``choose`` runs fixed-sequence testing: walk
the grid from strict to permissive and keep going while the one-sided Clopper-Pearson upper bound on the
error proportion at level 1 - delta is <= alpha; the last threshold that passed is chosen. The decision's
certificates (each kind's, the GPT route's) share delta: ReaderCalibration.tests.

What the certificate covers: the calibration questions and a future question must be exchangeable, i.e.
drawn from the same distribution (questions a person asks about an article of the same kind, answered by
the same bundle and config). Then, with probability >= 1 - delta over the calibration draw, the long-run
error rate among answered future questions is <= alpha. It is NOT a per-question guarantee (one answer can
still be wrong), and it does not cover a different kind of corpus, questions or reader. Pure Python/numpy:
this runs on the device (the beta quantile is a bisection on the binomial CDF, no scipy).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import BundleError
from .calibration_file import check
from .kind import Kind, kind_of

CALIBRATION_ASSET = Path(__file__).resolve().parent.parent / "assets" / "calibration.json"
# A PostgreSQL store ranks its full-text half by ts_rank_cd, not BM25, so its fused lists, candidates and scores
# differ (245 of 865 SQuAD test decisions under one calibration: benchmarks.backend_parity): its certificate is
# counted on its own decisions.
PGVECTOR_CALIBRATION_ASSET = CALIBRATION_ASSET.with_name("calibration-pgvector.json")

# The shipped calibrations are ~50 KB: a file past this (a GGUF given by mistake) is refused, not read whole into a
# memory budget the plan has not priced it in (it runs before the plan).
MAX_FILE_BYTES = 4 << 20
FEATURES = ("span_score", "margin", "top_cosine", "overlap@1", "negated")  # what a newly fitted combiner sees, in order
F1_CORRECT = 0.5  # an answer with F1 >= this against a gold answer counts as right
_BISECT_STEPS = 60  # 2^-60: far below any proportion a calibration set can resolve


def shipped_calibration(remote: bool) -> Path:
    """The shipped calibration for a store: the embedded one's, or a PostgreSQL store's (``remote``)."""
    return PGVECTOR_CALIBRATION_ASSET if remote else CALIBRATION_ASSET


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(Bin(n, p) <= k), summed in log space (stable for n in the thousands). log C(n, i) is a running sum of
    log((n - j) / (j + 1)), one numpy pass: three log-gammas per term in Python made a bound's 60-step bisection
    cost ~25 ms at a few hundred errors (choosing a certificate, `edge-rag calibrate`)."""
    if k >= n:
        return 1.0
    if k < 0 or p >= 1.0:
        return 0.0
    if p <= 0.0:
        return 1.0
    i = np.arange(k + 1, dtype=np.float64)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - i[:-1]) - np.log1p(i[:-1]))))
    logs = log_choose + i * math.log(p) + (n - i) * math.log1p(-p)
    top = float(logs.max())
    return min(1.0, math.exp(top) * float(np.exp(logs - top).sum()))


def clopper_pearson_upper(errors: int, n: int, delta: float) -> float:
    """One-sided (1 - delta) upper confidence bound on a binomial proportion from ``errors`` of ``n``.

    The u with P(Bin(n, u) <= errors) = delta (the beta(errors + 1, n - errors) quantile 1 - delta), found
    by bisection: P(p_true > u) <= delta for any true p. n = 0 says nothing: 1.0.
    """
    if not 0 <= errors <= n or not 0.0 < delta < 1.0:
        raise ValueError(f"need 0 <= errors <= n and 0 < delta < 1, got errors={errors}, n={n}, delta={delta}")
    if n == 0 or errors == n:
        return 1.0
    lo, hi = errors / n, 1.0  # the CDF falls from >= delta-ish at the MLE to 0 at p = 1
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if binom_cdf(errors, n, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def bounded_by(errors: int, n: int, alpha: float, delta: float) -> bool:
    """Whether ``clopper_pearson_upper(errors, n, delta) <= alpha``, without the bisection (60 binomial CDFs):
    the bound is the p at which P(Bin(n, p) <= errors) falls to delta, and that probability falls as p grows,
    so the bound is <= alpha exactly when P(Bin(n, alpha) <= errors) <= delta. One CDF: choosing a certificate
    walks up to 200 thresholds, which took seconds at a permissive alpha (4.6 s at 0.7 on a 2-core x86)."""
    if n == 0 or errors == n:
        return alpha >= 1.0  # the bound is 1
    return binom_cdf(errors, n, alpha) <= delta


@dataclass(frozen=True)
class Combiner:
    """score = sigmoid(w . (x - mean) / scale + b): one number in [0, 1] per candidate answer. ``features``
    names its inputs in order: a calibration file fitted on fewer features keeps working."""

    weights: tuple[float, ...]
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    features: tuple[str, ...] = FEATURES

    @classmethod
    def from_json(cls, raw: dict) -> Combiner:
        return cls(tuple(raw["weights"]), raw["bias"], tuple(raw["mean"]), tuple(raw["scale"]), tuple(raw["features"]))

    def to_json(self) -> dict:
        return {"features": list(self.features), "weights": list(self.weights), "bias": self.bias,
                "mean": list(self.mean), "scale": list(self.scale)}

    def __call__(self, features: dict[str, float]) -> float:
        x = (np.array([features[f] for f in self.features]) - np.array(self.mean)) / np.array(self.scale)
        z = float(np.dot(self.weights, x) + self.bias)
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def beyond_floor(d_min: float, floor: float) -> bool:
    """Whether a question whose nearest passage lies at squared distance ``d_min`` is out of domain: beyond the
    calibrated ``floor``, or NaN (nothing retrieved). Refused first, whatever its candidate."""
    return not d_min <= floor


def answer_score(combiner: Combiner, floor: float, candidate: str | None, features: dict[str, float],
                 d_min: float) -> float:
    """A calibration question's score; NaN when no threshold answers it (no candidate, or its nearest passage
    beyond the out-of-domain floor ``floor``, which refuses first)."""
    return combiner(features) if candidate and not beyond_floor(d_min, floor) else math.nan


@dataclass(frozen=True)
class Certificate:
    """The threshold a config's (alpha, delta) gets and the calibration figures behind it.

    threshold is inf when no threshold of the grid could be certified: then nothing is answered."""

    alpha: float
    delta: float
    threshold: float
    n_cal: int  # calibration questions
    n_answered: int  # of them answered at this threshold
    n_errors: int  # of those, wrong
    upper: float  # Clopper-Pearson upper bound on the error among answered (<= alpha when certified)

    @property
    def coverage(self) -> float:
        return self.n_answered / self.n_cal if self.n_cal else 0.0

    @property
    def error(self) -> float:
        return self.n_errors / self.n_answered if self.n_answered else 0.0


@dataclass(frozen=True)
class RiskTable:
    """Per-threshold calibration counts, thresholds from strict (high) to permissive (low)."""

    thresholds: tuple[float, ...]
    n_answered: tuple[int, ...]
    n_errors: tuple[int, ...]
    n_cal: int

    @classmethod
    def from_json(cls, raw: dict) -> RiskTable:
        return cls(tuple(raw["thresholds"]), tuple(raw["n_answered"]), tuple(raw["n_errors"]), raw["n_cal"])

    def to_json(self) -> dict:
        return {"thresholds": list(self.thresholds), "n_answered": list(self.n_answered),
                "n_errors": list(self.n_errors), "n_cal": self.n_cal}

    @classmethod
    def count(cls, scores: np.ndarray, wrong: np.ndarray, grid: np.ndarray) -> RiskTable:
        """Counts on a calibration set: score NaN = no candidate answer (never answered)."""
        scores, wrong = np.asarray(scores, dtype=float), np.asarray(wrong, dtype=bool)
        answered = [(scores >= t) for t in grid]  # NaN >= t is False
        return cls(tuple(float(t) for t in grid), tuple(int(a.sum()) for a in answered),
                   tuple(int((a & wrong).sum()) for a in answered), int(scores.size))

    def choose(self, alpha: float, delta: float, tests: int = 1) -> Certificate:
        """Fixed-sequence Learn-then-Test: the most permissive threshold reached before the first whose
        Clopper-Pearson bound exceeds alpha. Valid at level delta because the order is fixed in advance
        (the grid comes from the reader-val split), so no correction is needed across thresholds; ``tests``:
        the certificates one decision answers by, which share delta (ReaderCalibration.tests), each at delta / tests."""
        level, last = delta / tests, None
        for t, n, e in zip(self.thresholds, self.n_answered, self.n_errors):
            if not bounded_by(e, n, alpha, level):
                break
            last = t, n, e
        if last is None:
            return Certificate(alpha, delta, math.inf, self.n_cal, 0, 0, 0.0)
        t, n, e = last
        return Certificate(alpha, delta, t, self.n_cal, n, e, clopper_pearson_upper(e, n, level))

    def curve(self) -> list[tuple[float, float]]:
        """(coverage, error among answered) per threshold: the risk-coverage curve."""
        return [(n / self.n_cal, e / n if n else 0.0) for n, e in zip(self.n_answered, self.n_errors)]


@dataclass(frozen=True)
class ReaderCalibration:
    """What the calibration command measured for one reader ("rules" or "neural")."""

    combiner: Combiner
    table: RiskTable
    ood_distance: float  # squared-L2 floor: d_min = 2 - 2 s_max above this is out of domain, refused first
    gpt_n: int  # generated answers measured on calibration why/how questions
    gpt_errors: int
    model_sha256: str | None = None  # the reader ONNX the table was measured with (None: rules, or an old file)
    gpt_generator: str | None = None  # the generator model those answers came from (None: an old file, unchecked)
    # P(multi-hop) of a question from its form (kind.py); None: one table for every question (an own calibration,
    # an older file). With it, ``table`` holds the single-hop calibration questions and ``kind_tables`` the others.
    kind_model: Combiner | None = None
    kind_cut: float = 0.5  # P(multi-hop) at or above which a question is multi-hop
    kind_tables: dict[Kind, RiskTable] = field(default_factory=dict)

    def kind(self, question: str) -> Kind:
        """The question's kind, whose certificate decides it (single-hop when the file has no kind model)."""
        return kind_of(self.kind_model, self.kind_cut, question)

    def table_of(self, kind: Kind) -> RiskTable:
        """The calibration counts of questions of ``kind``."""
        return self.kind_tables.get(kind, self.table)

    @property
    def tests(self) -> int:
        """The certificates a decision answers by: one per kind of question counted (one table without a kind model)
        and the GPT route's, if generated answers were counted. The error among all answered questions exceeds alpha
        only if one of theirs does, so each is chosen at delta / tests (Bonferroni) for the whole to hold at delta."""
        return (len(Kind) if self.kind_model is not None else 1) + (self.gpt_n > 0)

    def certificate(self, kind: Kind, alpha: float, delta: float) -> Certificate:
        """The certificate of questions of ``kind``, its share of delta taken."""
        return self.table_of(kind).choose(alpha, delta, self.tests)

    def gpt_refused(self, alpha: float, delta: float, generator: str | None) -> str | None:
        """Why the GPT route may not answer (None: it may): only with the generator model its answers were measured
        with (``generator``: the bundle's), as another one makes other mistakes, and only if their error is
        certified <= alpha too, at its share of delta."""
        if self.gpt_generator is not None and generator != self.gpt_generator:
            return (f"generated answers are not certified for this generator ({generator}; the calibration counted "
                    f"{self.gpt_generator}'s)")
        if clopper_pearson_upper(self.gpt_errors, self.gpt_n, delta / self.tests) > alpha:
            return f"generated answers are not certified at alpha {alpha:g}"
        return None


@dataclass(frozen=True)
class Calibration:
    """The shipped calibration artifact: per reader, its combiner, OOD floor and risk table."""

    readers: dict[str, ReaderCalibration]
    source: dict  # how it was made (splits, command, sizes)

    @classmethod
    def load(cls, path: str | Path = CALIBRATION_ASSET) -> Calibration:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"over {MAX_FILE_BYTES >> 20} MB, read no further")
            raw = json.loads(data.decode("utf-8"))
            check(raw, FEATURES)  # counts that cannot be counts certify nothing: an error naming the entry
            readers = {
                name: ReaderCalibration(
                    Combiner.from_json(r["combiner"]), RiskTable.from_json(r["table"]), float(r["ood_distance"]),
                    r["gpt"]["n"], r["gpt"]["errors"], r.get("model_sha256"), r["gpt"].get("generator"),
                    **_kinds(r.get("kinds")))
                for name, r in raw["readers"].items()
            }
            return cls(readers, raw.get("source", {}))
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: deep nesting
            shipped = path.resolve() in (CALIBRATION_ASSET, PGVECTOR_CALIBRATION_ASSET)  # convert needs torch and SQuAD
            fix = ("it ships with edge-rag: reinstall edge-rag (`pip install --force-reinstall edge-rag`)" if shipped
                   else "make it again (`edge-rag calibrate`)")
            raise BundleError(f"calibration file {path} is missing or malformed ({exc}); {fix}") from exc

    def reader(self, name: str) -> ReaderCalibration:
        if name not in self.readers:
            raise BundleError(f"no calibration for reader {name!r} (have {', '.join(self.readers)}); "
                              "run `python -m convert calibrate`")
        return self.readers[name]


def _kinds(raw: dict | None) -> dict:
    """ReaderCalibration's kind fields from a file's "kinds" entry (none: its defaults, one table for all)."""
    if raw is None:
        return {}
    return {"kind_model": Combiner.from_json(raw["model"]), "kind_cut": float(raw["cut"]),
            "kind_tables": {Kind(k): RiskTable.from_json(t) for k, t in raw["tables"].items()}}
