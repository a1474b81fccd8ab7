"""Can the GPT route be certified like the reader (issue #42 item 2)? A score per generated answer, fitted on
validation, and a threshold certified on calibration with the reader's own bound and fixed-sequence test.

    python -m benchmarks.experiments.gpt_certificate [--profiles gemma,qwen-0.5b] [--n-val 80] [--n-cal 0]
        [--threads 0] [--from GENERATORS_JSON ...] [--out bench-results/gpt-certificate]

Questions: the GPT-eligible ones (why/how/describe, nearest passage within the shipped out-of-domain floor), decided
by the default Config's pipeline (context, tier budget, the reader's candidate and its score). Validation: SQuAD
reader_val plus the model-selection set (the questions ``convert calibrate`` fits the reader's combiner on), a seeded
sample of ``--n-val``. Calibration: the SQuAD calibration split, all of them (``--n-cal`` caps it). Never the test
split. Each profile's GGUF answers through ``edge_rag.reading.generate.Generator`` at temperature 0 (generators.py's
worker, in a process of its own); the answers are cached per profile in ``--out`` (gen-<profile>.json, by question
id), so scoring again generates only what is missing. ``--from`` scores the answers of generators.py runs instead
(its generators.json): their SQuAD calibration-split rows as calibration, their HotpotQA reader_val rows as validation.

Scores of a non-empty answer (generators.judge): ``support``, ``agreement``, ``logprob`` and ``combined``, a logistic
combination of the three fitted on validation (convert.logistic.fit_combiner). An empty answer is not an answer: it
is never counted, as ``convert calibrate`` counts. For each score a grid of thresholds (validation quantiles, strict
to permissive) is fixed on validation; on calibration RiskTable.count / choose (Clopper-Pearson, fixed sequence) give
the certified threshold at each alpha and delta 0.05, on two populations: every eligible question ("eligible"), and
the ones the GPT route would actually take at that alpha ("routed": the reader's certified threshold does not answer
them). One score per profile is chosen on validation alone (the most validation questions answered at the default
alpha's threshold, then AUROC); the others' calibration figures are shown for reading, not as certificates (testing
four scores on one calibration set and keeping the best would not hold delta). "best top-k in hindsight": the
calibration's top-k by score with the lowest bound, picked after looking: what bounds any certificate on this set.

Measured (``--from`` the generators.py runs of issue #42, 48 calibration questions): nothing is certified at
alpha <= 0.4 for gemma or qwen-0.5b, by any score; even in hindsight the lowest bound is 0.61 (qwen-0.5b, combined:
8 errors among its top 20) and 0.66 (gemma: 1 among 5).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from convert.calibrate import selection_file
from convert.logistic import fit_combiner
from edge_rag import Config, EdgeRAG
from edge_rag.decision.certify import Combiner, RiskTable, bounded_by, clopper_pearson_upper
from edge_rag.models import registry as M
from edge_rag.models.bundle import Bundle

from .. import data, splits
from ..reader_sweep import auroc
from ..report import _table
from . import generators

SCORES = (*generators.SCORES, "combined")
ALPHAS = (0.25, 0.3, 0.4)
DELTA = 0.05
# The strictest threshold answers this share of validation's questions: at alpha 0.4 a certificate needs at least 6
# answers without an error (Clopper-Pearson), 10% of ~45 calibration questions is fewer, and the fixed sequence
# stops at its first failure.
GRID_START = 0.2
GRID_POINTS = 50
SEED = 0
CHUNK = 16  # questions per generator process


def question_sets(n_val: int, n_cal: int, config: Config, cache: Path) -> dict[str, list[dict]]:
    """The validation and calibration GPT-eligible questions as the pipeline decides them."""
    bundle = Bundle.load(M.default_bundle())
    db, items = data.pooled_index("squad", data.FILES["squad"], bundle, config, cache)
    select_db, select_items = data.pooled_index("squad", selection_file(cache), bundle, config, cache)
    with EdgeRAG(db, bundle=bundle.root, config=config) as rag, \
            EdgeRAG(select_db, bundle=bundle.root, config=config) as select:
        val = (generators.decided(rag, splits.select(items, "reader_val"), True)
               + generators.decided(select, select_items, True))
        cal = generators.decided(rag, splits.select(items, "calibration"), True, n_cal or None)
    val = [val[i] for i in sorted(np.random.default_rng(SEED).permutation(len(val))[:n_val])]
    return {"validation": val, "calibration": cal}


def generations(profile: str, qs: list[dict], out: Path, threads: int) -> dict[str, dict]:
    """The profile's answer to every question of ``qs``, by id: only the ones missing from the cache are generated,
    CHUNK at a time (each chunk's answers are kept as soon as it ends)."""
    path = out / f"gen-{profile}.json"
    cached: dict[str, dict] = json.loads(path.read_text()) if path.is_file() else {}
    missing = [q for q in qs if q["id"] not in cached]
    for start in range(0, len(missing), CHUNK):
        qpath, rpath = out / f"q-{profile}.json", out / f"run-{profile}.json"
        qpath.write_text(json.dumps(missing[start:start + CHUNK]))
        subprocess.run([sys.executable, "-m", generators.__name__, "--worker", profile, str(qpath), str(rpath),
                        "--threads", str(threads), "--budget-s", "1e9"], check=True)
        cached |= {r["id"]: r for r in json.loads(rpath.read_text())["rows"]}
        path.write_text(json.dumps(cached))
        print(f"{profile}: {len(cached)} answers cached, {len(missing) - start - CHUNK} to go", flush=True)
    return cached


def combiner_of(rows: list[dict]) -> Combiner:
    """The logistic combination of the three scores, fitted on validation's non-empty answers (right = 1)."""
    fit = [r for r in rows if r["answered"] and r["logprob"] is not None]
    x = np.array([[r[s] for s in generators.SCORES] for r in fit], dtype=float)
    return fit_combiner(x, np.array([r["right"] for r in fit], dtype=float), features=generators.SCORES)


def values(rows: list[dict], score: str, combiner: Combiner) -> np.ndarray:
    """Each answer's score; NaN for an empty answer (never counted) or a score that could not be read."""
    def one(r: dict) -> float:
        if not r["answered"] or any(r[s] is None for s in generators.SCORES):
            return math.nan
        return combiner(r) if score == "combined" else float(r[score])
    return np.array([one(r) for r in rows])


def grid(val_scores: np.ndarray) -> np.ndarray:
    """Thresholds strict → permissive: validation quantiles from GRID_START of its questions answered to all."""
    finite = val_scores[np.isfinite(val_scores)]
    top = 1 - GRID_START * val_scores.size / max(finite.size, 1)
    return np.unique(np.quantile(finite, np.linspace(max(top, 0.0), 0, GRID_POINTS)))[::-1]


def certify(scores: np.ndarray, wrong: np.ndarray, thresholds: np.ndarray, alpha: float) -> dict:
    """What the reader's bound certifies on these answers at ``alpha``: threshold, share answered, error among them."""
    c = RiskTable.count(scores, wrong, thresholds).choose(alpha, DELTA)
    return {"alpha": alpha, "n": c.n_cal, "threshold": None if math.isinf(c.threshold) else c.threshold,
            "answered": c.n_answered, "errors": c.n_errors, "coverage": c.coverage, "error": c.error,
            "upper": c.upper if c.n_answered else None}


def evaluate(val: list[dict], cal: list[dict]) -> dict:
    """Per score: validation AUROC and answers at the default alpha, calibration AUROC and certificate per alpha."""
    combiner = combiner_of(val)
    val_wrong, cal_wrong = (np.array([r["error"] for r in rows], dtype=bool) for rows in (val, cal))
    out: dict = {"combiner": {"features": list(combiner.features), "weights": list(combiner.weights),
                              "bias": combiner.bias, "mean": list(combiner.mean), "scale": list(combiner.scale)},
                 "scores": {}}
    for score in SCORES:
        v, c = values(val, score, combiner), values(cal, score, combiner)
        thresholds = grid(v)
        out["scores"][score] = {"val_auroc": _auroc(v, val), "cal_auroc": _auroc(c, cal), "grid": list(thresholds),
                                "val_default": certify(v, val_wrong, thresholds, Config().max_error_rate),
                                "calibration": [certify(c, cal_wrong, thresholds, a) for a in ALPHAS],
                                "hindsight": hindsight(c, cal_wrong)}
    out["chosen"] = max(SCORES, key=lambda s: (out["scores"][s]["val_default"]["answered"],
                                               out["scores"][s]["val_auroc"] or 0.0))
    out["answer_all"] = {"n": len(cal), "answered": sum(r["answered"] for r in cal), "errors": int(cal_wrong.sum()),
                         "right": sum(r["right"] for r in cal)}
    return out


def hindsight(scores: np.ndarray, wrong: np.ndarray) -> dict:
    """The calibration's top-k (by score) with the lowest Clopper-Pearson upper bound: the best any threshold could
    have certified, chosen after looking (so not a certificate; what bounds one)."""
    order = np.argsort(-np.where(np.isfinite(scores), scores, -np.inf), kind="stable")[: int(np.isfinite(scores).sum())]
    errors = np.cumsum(wrong[order])
    k, best = 0, math.inf  # the first top-k of the lowest bound, as an argmin over every k's bound
    for n, e in enumerate(errors.tolist(), 1):
        # a bound is above its errors' share, and above any p whose CDF is still > DELTA (one CDF, not a bisection's
        # 60): such a top-k cannot beat the best so far (the margin keeps rounding from hiding one that would)
        if k and (e / n >= best or not bounded_by(e, n, min(best * (1 + 1e-9), 1.0), DELTA)):
            continue
        upper = clopper_pearson_upper(e, n, DELTA)
        if upper < best:
            k, best = n, upper
    return {"answered": k, "errors": int(errors[k - 1]) if k else 0, "upper": best if k else None}


def _auroc(scores: np.ndarray, rows: list[dict]) -> float | None:
    """Right vs wrong among the answers a score was read for."""
    kept = [(float(x), r["right"]) for x, r in zip(scores, rows) if np.isfinite(x)]
    return auroc([x for x, ok in kept if ok], [x for x, ok in kept if not ok])


def markdown(result: dict) -> str:
    def cell(c: dict) -> str:
        upper = "–" if c["upper"] is None else f"{c['upper']:.2f}"
        return f"{c['answered']}/{c['n']} ({100 * c['coverage']:.0f}%), {c['errors']}, {upper}"

    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:.2f}"

    head = ["profile", "score", "val AUROC", "cal AUROC", f"val answered at α {Config().max_error_rate:g}",
            *(f"cal α={a:g}: answered (share), errors, upper" for a in ALPHAS), "best top-k in hindsight"]
    body = [[profile, score + (" (chosen on val)" if score == ev["chosen"] else ""), num(s["val_auroc"]),
             num(s["cal_auroc"]), f"{s['val_default']['answered']}/{s['val_default']['n']}",
             *(cell(c) for c in s["calibration"]),
             f"{s['hindsight']['answered']}, {s['hindsight']['errors']}, {num(s['hindsight']['upper'])}"]
            for profile, ev in result["profiles"].items() for score, s in ev["scores"].items()]
    base = "; ".join(f"{p} {ev['answer_all']['answered']} answered of {ev['answer_all']['n']}, "
                     f"{ev['answer_all']['errors']} wrong" for p, ev in result["profiles"].items())
    sizes = "; ".join(f"{p} validation n = {len(r['validation'])}, calibration n = {len(r['calibration'])}"
                      for p, r in result["rows"].items())
    return (f"# GPT-route certificate\n\n`{result['command']}`, {result['started']} UTC; {result['source']}; "
            f"{sizes}; delta {DELTA}. Answering every calibration question: {base}.\n\n" + _table(head, body))


def generated(profiles: list[str], args: argparse.Namespace) -> dict[str, dict[str, list[dict]]]:
    """Each profile's judged answers to the validation and calibration GPT-eligible SQuAD questions, generated
    here (cached)."""
    qpath = args.out / f"questions-{args.n_val}-{args.n_cal}.json"
    if not qpath.is_file():
        config = Config(temperature=0.0, cache_size=0)
        qpath.write_text(json.dumps(question_sets(args.n_val, args.n_cal, config, args.index_cache)))
    qsets = json.loads(qpath.read_text())
    rows = {}
    for profile in profiles:
        # calibration first: a run stopped early still says what the calibration split's answers look like
        answers = generations(profile, qsets["calibration"] + qsets["validation"], args.out, args.threads)
        rows[profile] = {part: [generators.judge(q, answers[q["id"]]) for q in qsets[part]]
                         for part in ("validation", "calibration")}
    return rows


def from_generators(profiles: list[str], paths: list[Path]) -> dict[str, dict[str, list[dict]]]:
    """Each profile's judged answers from generators.py's results (generators.json): its HotpotQA reader_val rows
    as validation, its SQuAD calibration-split GPT-eligible rows as calibration (the first file holding both)."""
    rows = {}
    for path in paths:
        for profile, sets in json.loads(path.read_text())["rows"].items():
            if profile in profiles and profile not in rows and {"hotpotqa", "squad"} <= set(sets):
                rows[profile] = {"validation": sets["hotpotqa"], "calibration": sets["squad"]}
    if missing := [p for p in profiles if p not in rows]:
        raise SystemExit(f"no generators.json of {', '.join(map(str, paths))} holds both sets for {', '.join(missing)}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.gpt_certificate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--profiles", default="gemma,qwen-0.5b")
    p.add_argument("--n-val", type=int, default=80, help="validation questions (seeded sample)")
    p.add_argument("--n-cal", type=int, default=0, help="calibration questions at most (0: all)")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores)")
    p.add_argument("--from", dest="sources", type=Path, nargs="+", default=None, metavar="GENERATORS_JSON",
                   help="score generators.py's answers instead of generating (validation: its HotpotQA reader_val)")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "gpt-certificate")
    p.add_argument("--index-cache", type=Path, default=M.home() / "bench", help="where dataset indexes are kept")
    args = p.parse_args(argv)
    profiles = [x for x in args.profiles.split(",") if x]
    if unknown := [x for x in profiles if x not in M.PROFILES]:
        p.error(f"unknown profile(s) {', '.join(unknown)}; choose from {', '.join(M.PROFILES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = from_generators(profiles, args.sources) if args.sources else generated(profiles, args)
    source = (f"answers of {', '.join(map(str, args.sources))} (validation: HotpotQA reader_val)" if args.sources
              else "answers generated here (validation: SQuAD reader_val + model-selection set)")
    result: dict = {"command": " ".join(["python -m benchmarks.experiments.gpt_certificate", *(argv or sys.argv[1:])]),
                    "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "source": source, "rows": rows,
                    "profiles": {p: evaluate(r["validation"], r["calibration"]) for p, r in rows.items()}}
    (args.out / "gpt-certificate.json").write_text(json.dumps(result, indent=1))
    (args.out / "gpt-certificate.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
