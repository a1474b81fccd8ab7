"""Calibrate the certified decision layer and ship it as ``edge_rag/assets/calibration.json``.

``python -m convert calibrate [--readers rules,neural] [--ood-sample 600] [--gpt-sample 40] [--backend pgvector]``
(``make calibrate`` runs both backends)

Splits from edge_rag/assets/splits.json; the corpus is every context of squad2_dev_subset.json (one index: the
embedded store, or with ``--backend pgvector`` a throw-away PostgreSQL + pgvector store, whose full-text half ranks
by ts_rank_cd instead of BM25, written to edge_rag/assets/calibration-pgvector.json).
1. Every reader-val, calibration and OOD-calibration question runs through the real pipeline
   (``EdgeRAG.decide`` with ``Config(temperature=0, cache_size=0, reader=...)``) without a calibration, which
   records the reader's candidate answer, its features and d_min = 2 - 2 s_max (squared L2).
   The model-selection set's questions (splits.json ``reader_select``: 30 train articles no reader trained on) run
   the same way over a store of their own articles.
2. Combiner, fitted on the validation questions (reader-val and the model-selection set, ~4,900; reader-val alone,
   364, moved alpha 0.4's coverage by about ±4 points): L2-regularised logistic regression of "the candidate is
   right" (answerable and F1 >= 0.5) on certify.FEATURES; the score grid is their score quantiles
   (strict → permissive, from 10% validation coverage), fixed before the calibration split is looked at.
3. Out-of-domain floor, from OOD-calibration and validation questions only (so the calibration split stays
   untouched for step 4): the most permissive squared distance at which the whole decision (floor, then the
   validation threshold for DESIGN_ALPHA) refuses OOD_REFUSE of the OOD-calibration questions. Its in-domain
   cost is reported on the calibration split.
4. Calibration split: per threshold, questions answered (within the floor, a candidate, score >= t) and
   errors among them (F1 < 0.5, or any answer to an unanswerable question).
5. GPT route: up to --gpt-sample why/how/describe calibration questions within the floor are generated
   (temperature 0); their counts decide at runtime whether generation is certified at the asked alpha.
6. Kinds of question (edge_rag.decision.kind): a model of P(multi-hop) from the question's form, fitted on training
   questions of both kinds (convert.question_kind); the calibration split's questions and HotpotQA's calibration
   bucket (over a store of every HotpotQA context) are each counted under their kind's table, so a multi-hop
   question is decided by a threshold certified on multi-hop questions.
Writes the JSON, a risk-coverage plot and a short report beside it; prints the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import filecmp
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks import data, splits
from benchmarks.pgserver import admin_url
from benchmarks.scale_backends import fresh_database
from convert import reader_data
from convert.args import at_least, existing_file
from convert.calibrate_report import report
from convert.logistic import fit_combiner
from convert.question_kind import choose_cut, fit_kind_model, training_questions
from edge_rag import Config, EdgeRAG
from edge_rag.config import READERS, Tier
from edge_rag.decision.calibrate import wrong as answer_wrong
from edge_rag.decision.calibrated_config import encoder_identity
from edge_rag.decision.certified import reader_sha256
from edge_rag.decision.certify import (
    CALIBRATION_ASSET,
    FEATURES,
    Combiner,
    RiskTable,
    answer_score,
    shipped_calibration,
)
from edge_rag.decision.kind import Kind, kind_of
from edge_rag.decision.policy import generative
from edge_rag.models.bundle import Bundle
from edge_rag.models.registry import default_bundle, home
from edge_rag.reading.read import reader_path
from edge_rag.reading.reader import READER_ASSET
from edge_rag.storage.fileio import atomic_write_text
from evaluation.datasets import QAItem

OOD_REFUSE = 0.98  # share of OOD-calibration questions the decision (floor + score threshold) must refuse
DESIGN_ALPHA = Config().max_error_rate  # the alpha the floor is chosen for: the default one
GRID_POINTS = 200  # thresholds in the fixed sequence
# The sequence starts at the score that answers 10% of validation, not at the very top: a threshold that
# answers a handful of calibration questions cannot certify any useful alpha, and fixed-sequence testing
# stops at its first failure. The start is fixed on validation, before calibration is looked at.
GRID_START_COVERAGE = 0.1
ALPHAS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7)  # reported in the summary
# Config().max_error_rate is the smallest alpha of ALPHAS certified (delta 0.05) while answering at least this share
# of the calibration questions: about half of its answerable ones (half of SQuAD-2's questions have no answer).
USEFUL_COVERAGE = 0.25
SEED = 0


def wrong(candidate: str | None, item: QAItem) -> bool:
    """An answer is an error if the question has none, or if it matches no gold answer at F1 >= 0.5 (the rule
    ``edge-rag calibrate`` counts by on the device)."""
    return answer_wrong(candidate, () if item.is_impossible else item.answers)


def collect(rag: EdgeRAG, items: list[QAItem], label: str) -> list[dict]:
    rows = []
    for q in tqdm(items, desc=label, unit="q"):
        a = rag.decide(q.question)
        rows.append({"id": q.id, "features": a.features, "candidate": a.candidate, "d_min": a.d_min,
                     "wrong": wrong(a.candidate, q), "answerable": not q.is_impossible,
                     "generative": generative(q.question), "context": a.context, "tier": a.tier.value})
    return rows


def collect_all(parts: dict[str, tuple[EdgeRAG, list[QAItem]]], reader: str) -> dict[str, list[dict]]:
    """Each part's rows, asked of its own store."""
    return {name: collect(rag, qs, f"{reader}/{name}") for name, (rag, qs) in parts.items()}


def cached_rows(cache: Path | None, reader: str, bundle: Bundle, make: Callable[[], dict],
                backend: str = "embedded") -> dict:
    """The per-question rows, kept in ``cache`` so re-fitting is cheap. Keyed by reader model, bundle, splits, the
    combiner's features, the parts and the store's kind only: use a fresh cache folder after changing the Config or --ood-sample."""
    if cache is None:
        return make()
    model = reader_sha256(bundle) if reader == "neural" else ""
    key = hashlib.sha1(json.dumps([reader, *([model] if model else []), sorted(f["sha256"] for f in bundle.files()),
                                   "hotpotqa_calibration",  # the rows' parts since HotpotQA was counted
                                   Path(CALIBRATION_ASSET).with_name("splits.json").read_text(), FEATURES,
                                   *([backend] if backend != "embedded" else [])]).encode())
    path = cache / f"rows-{reader}-{key.hexdigest()[:12]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    rows = make()
    atomic_write_text(path, json.dumps(rows))  # a write cut short (disk full, a kill) is not read back next run
    return rows


def _matrix(rows: list[dict]) -> np.ndarray:
    return np.array([[r["features"][f] for f in FEATURES] for r in rows], dtype=float)


def scores(rows: list[dict], combiner: Combiner, floor: float) -> np.ndarray:
    """Each question's score; NaN when it is never answered (no candidate, or beyond the floor)."""
    return np.array([answer_score(combiner, floor, r["candidate"], r["features"], r["d_min"]) for r in rows])


def grid(val_scores: np.ndarray) -> np.ndarray:
    """Thresholds strict → permissive: validation score quantiles from GRID_START_COVERAGE of the questions
    answered down to all of them, then 0 (answer every candidate)."""
    finite = val_scores[np.isfinite(val_scores)]
    top = 1 - GRID_START_COVERAGE * val_scores.size / max(finite.size, 1)
    q = np.quantile(finite, np.linspace(max(top, 0.0), 0, GRID_POINTS)) if finite.size else np.array([])
    return np.append(np.unique(q)[::-1], 0.0)


def choose_floor(ood: list[dict], val: list[dict], combiner: Combiner) -> float:
    """The most permissive OOD-quantile floor at which floor + validation threshold refuse OOD_REFUSE of OOD."""
    for share in np.arange(0.50, 1.0, 0.01):  # floors from permissive to strict
        floor = float(np.quantile([r["d_min"] for r in ood], 1 - share))
        val_scores = scores(val, combiner, floor)
        wrong = np.array([r["wrong"] for r in val])
        t = next((t for t in grid(scores(val, combiner, math.inf))[::-1]  # permissive → strict
                  if (val_scores >= t).sum() and (wrong & (val_scores >= t)).sum() / (val_scores >= t).sum()
                  <= DESIGN_ALPHA), math.inf)
        if np.mean(~(scores(ood, combiner, floor) >= t)) >= OOD_REFUSE:
            return floor
    return float(np.quantile([r["d_min"] for r in ood], 1 - OOD_REFUSE))


def measure_gpt(rag: EdgeRAG, rows: list[dict], items: dict[str, QAItem], ood: list[dict], val: list[dict],
                n: int) -> tuple[int, int]:
    """Generate for up to n generative calibration questions within a loose floor (the OOD median); (answered,
    errors). An empty generation is a refusal on the device (decision.outcome), so it is not counted as answered:
    counted, it lowered the error rate the certificate reads (3 of 40 samples were empty, 40 / 33 for 37 / 33)."""
    floor = float(np.median([r["d_min"] for r in ood]))
    picked = [r for r in rows if r["generative"] and r["d_min"] <= floor]
    picked = [picked[i] for i in sorted(np.random.default_rng(SEED).permutation(len(picked))[:n])]
    c, answered, errors = rag.config, 0, 0
    for r in tqdm(picked, desc="gpt", unit="q"):
        spec = c.tier(Tier(r["tier"]))
        gen = rag.generator.generate(items[r["id"]].question, r["context"], spec.max_new_tokens, 0.0, c.top_k,
                                     c.seed, c.repeat_ngram, c.repeat_window)
        answered += bool(gen.text)
        errors += wrong(gen.text or None, items[r["id"]])
    return answered, errors


def selection_file(cache: Path) -> Path:
    """The model-selection set as a SQuAD-2 file (written once into ``cache``): every SQuAD 1.1 paragraph of its 30
    articles as the corpus, its answerable questions (SQuAD 1.1's) and real unanswerables on their paragraphs."""
    questions = reader_data.reader_select(None)
    held = {q.context for q in questions}
    squad11 = reader_data.squad_questions(reader_data.SQUAD11_TRAIN, None)
    article_of = {q.context: q.article for q in squad11}
    articles = {article_of[c] for c in held}
    paragraphs: dict[str, dict[str, list[dict]]] = {}  # article -> paragraph -> its questions, in file order
    for q in squad11:
        if q.article in articles:
            paragraphs.setdefault(q.article, {}).setdefault(q.context, [])
    for q in questions:
        paragraphs[article_of[q.context]][q.context].append(
            {"id": q.id, "question": q.question, "is_impossible": q.answer_start < 0,
             "answers": [{"text": a, "answer_start": q.answer_start} for a in q.answers[:1]]})
    text = json.dumps({"version": "reader_select", "data": [
        {"title": a, "paragraphs": [{"context": c, "qas": qas} for c, qas in ps.items()]} for a, ps in paragraphs.items()]})
    path = cache / f"reader-select-{hashlib.sha256(text.encode()).hexdigest()[:10]}.json"
    if not path.is_file():  # named by its content: written whole or not at all
        atomic_write_text(path, text)
    return path


def run(args: argparse.Namespace) -> int:
    bundle = Bundle.load(args.bundle or default_bundle(args.profile))
    used = reader_path(bundle) if "neural" in args.readers else READER_ASSET
    if READER_ASSET.is_file() and used != READER_ASSET and not filecmp.cmp(used, READER_ASSET, shallow=False):
        print(f"warning: calibrating {used}, which differs from the shipped {READER_ASSET} "
              "(after `make reader`, run `make models` or `make calibrate` so the bundle holds the new reader)")
    base = Config(temperature=0.0, cache_size=0, certified=True)
    with (calibration_store(args, bundle, base, "squad", args.squad, "edge_rag_calibrate") as (db, items),
          calibration_store(args, bundle, base, "squad", selection_file(args.index_cache), "edge_rag_select") as select,
          calibration_store(args, bundle, base, "hotpotqa", args.hotpotqa, "edge_rag_hotpot") as hotpot):
        return calibrate(args, bundle, base, db, items, select, hotpot)


@contextlib.contextmanager
def calibration_store(args: argparse.Namespace, bundle: Bundle, base: Config, dataset: str, path: Path,
                      name: str) -> Iterator[tuple[str, list[QAItem]]]:
    """Every context of the ``dataset`` file ``path`` in one store of ``args.backend``, and the file's questions: the
    embedded pooled index (built once, then reused), or a fresh PostgreSQL database ``name`` (``$EDGE_RAG_PG_URL``'s
    server, else a throw-away one) indexed with the same documents."""
    if args.backend == "embedded":
        db, items = data.pooled_index(dataset, path, bundle, base, args.index_cache)
        yield str(db), items
        return
    ds = data.load(dataset, path, None, 0, "all")  # what pooled_index indexes, and its questions
    with admin_url() as admin:
        url = fresh_database(admin, name)
        with EdgeRAG(url, bundle=bundle.root, config=base) as rag:
            rag.add_documents(ds.documents, progress=True)
        yield url, ds.items


def calibrate(args: argparse.Namespace, bundle: Bundle, base: Config, db: str, items: list[QAItem],
              select: tuple[str, list[QAItem]], hotpot: tuple[str, list[QAItem]]) -> int:
    """Steps 1-6 of the module docstring over the store ``db`` (and the model-selection set's and HotpotQA's
    stores and questions, ``select`` and ``hotpot``); writes ``args.out`` and its report."""
    val, cal = splits.select(items, "reader_val"), splits.select(items, "calibration")
    hotpot_cal = splits.select(hotpot[1], "calibration")
    kind_model = fit_kind_model(*training_questions(select[1]))
    cut = choose_cut(kind_model, [q.question for q in val])
    questions = {q.id: q.question for q in cal + hotpot_cal}
    hotpot_ids = {q.id for q in hotpot_cal}
    ood = splits.ood_questions("calibration", data.OOD_FILE)
    ood = [ood[i] for i in sorted(np.random.default_rng(SEED).permutation(len(ood))[: args.ood_sample])]
    by_id = {q.id: q for q in cal}
    out: dict = {"readers": {}, "source": {
        "command": "python -m convert calibrate" + (f" --backend {args.backend}" if args.backend != "embedded" else ""),
        "backend": args.backend, "splits": "edge_rag/assets/splits.json", "corpus": str(args.squad),
        "n_reader_val": len(val), "n_select": len(select[1]), "n_calibration": len(cal),
        "n_hotpotqa_calibration": len(hotpot_cal), "n_ood_calibration": len(ood),
        "ood_refuse_target": OOD_REFUSE, "config": repr(base), "encoder": encoder_identity(bundle)}}
    gpt: tuple[int, int] | None = None
    for reader in args.readers:
        config = base.with_(reader=reader)
        with EdgeRAG(db, bundle=bundle.root, config=config) as rag, \
                EdgeRAG(select[0], bundle=bundle.root, config=config) as select_rag, \
                EdgeRAG(hotpot[0], bundle=bundle.root, config=config) as hotpot_rag:
            for each in (rag, select_rag, hotpot_rag):
                each.certified.record_only()
            parts = {"reader_val": (rag, val), "select": (select_rag, select[1]), "calibration": (rag, cal),
                     "ood": (rag, ood), "hotpotqa_calibration": (hotpot_rag, hotpot_cal)}
            rows = cached_rows(args.rows_cache, reader, bundle, partial(collect_all, parts, reader), args.backend)
            if gpt is None and args.gpt_sample:
                # generations are cached with the rows: re-fitting after a default change does not generate again.
                # The certified config never generates, so its plan holds no llama.cpp: the seeds' decision does.
                with EdgeRAG(db, bundle=bundle.root, config=config.with_(certified=False)) as generating:
                    measure = partial(measure_gpt, generating, rows["calibration"], by_id, rows["ood"],
                                      rows["reader_val"], args.gpt_sample)
                    gpt = tuple(cached_rows(args.rows_cache, f"gpt{args.gpt_sample}-answered", bundle, measure, args.backend))
        validation = rows["reader_val"] + rows["select"]
        fit = [r for r in validation if r["candidate"]]
        combiner = fit_combiner(_matrix(fit), np.array([not r["wrong"] for r in fit], dtype=float))
        floor = choose_floor(rows["ood"], validation, combiner)
        thresholds = grid(scores(validation, combiner, math.inf))
        by_kind = {kind: [r for r in rows["calibration"] + rows["hotpotqa_calibration"]
                          if kind_of(kind_model, cut, questions[r["id"]]) is kind] for kind in Kind}
        cal_in = by_kind[Kind.SINGLE_HOP]
        cal_scores, cal_wrong = scores(cal_in, combiner, floor), np.array([r["wrong"] for r in cal_in])
        table = RiskTable.count(cal_scores, cal_wrong, thresholds)
        unanswerable = np.array([not r["answerable"] for r in cal_in])
        kind_tables = {kind.value: RiskTable.count(scores(kind_rows, combiner, floor),
                                                   np.array([r["wrong"] for r in kind_rows]), thresholds)
                       for kind, kind_rows in by_kind.items() if kind is not Kind.SINGLE_HOP}
        out["readers"][reader] = {
            "combiner": combiner.to_json(),
            "table": {**table.to_json(),
                      # of n_errors, answers to unanswerable questions (the rest: wrong answers to answerable ones)
                      "n_errors_unanswerable": list(RiskTable.count(cal_scores, cal_wrong & unanswerable,
                                                                    thresholds).n_errors)},
            # step 6: each kind of question its own counts (the single-hop ones are "table")
            "kinds": {"model": kind_model.to_json(), "cut": cut,
                      "tables": {kind: t.to_json() for kind, t in kind_tables.items()},
                      "hotpotqa_by_kind": {kind.value: sum(r["id"] in hotpot_ids for r in kind_rows)
                                           for kind, kind_rows in by_kind.items()}},
            "ood_distance": floor,
            "model_sha256": reader_sha256(bundle) if reader == "neural" else None,  # the bundle manifest's hash
            "gpt": {"n": gpt[0] if gpt else 0, "errors": gpt[1] if gpt else 0,
                    "generator": bundle.generator.get("name") if gpt else None},
            "floor_refuses": {
                "ood_calibration": float(np.mean([r["d_min"] > floor for r in rows["ood"]])),
                "calibration_answerable": float(np.mean([r["d_min"] > floor for r in cal_in if r["answerable"]])),
                "calibration_unanswerable": float(np.mean([r["d_min"] > floor for r in cal_in if not r["answerable"]])),
            },
        }
    args.out = args.out or shipped_calibration(args.backend == "pgvector")
    atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    summary = report(out, args.out, ALPHAS, USEFUL_COVERAGE, DESIGN_ALPHA)
    print(summary)
    return 0


def readers(text: str) -> list[str]:
    """--readers, checked when parsed: an unknown name was a ConfigError only after the stores were built."""
    names = [r for r in text.split(",") if r]
    if not names or set(names) - set(READERS):
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(READERS)} (comma-separated)")
    return names


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="fit the answer score and certify its threshold (calibration.json)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--readers", default="rules,neural", type=readers, help=f"comma-separated: {', '.join(READERS)}")
    p.add_argument("--squad", type=existing_file, default=data.FILES["squad"], help="SQuAD-2 dev file (corpus, questions)")
    p.add_argument("--hotpotqa", type=existing_file, default=data.FILES["hotpotqa"], help="HotpotQA dev file (multi-hop)")
    p.add_argument("--backend", choices=("embedded", "pgvector"), default="embedded",
                   help="the store the calibration counts decisions on (pgvector: its full-text half ranks otherwise)")
    p.add_argument("--out", type=Path, default=None,
                   help="default: the shipped calibration of --backend (edge_rag/assets/calibration[-pgvector].json)")
    p.add_argument("--ood-sample", type=at_least(1), default=600, help="OOD-calibration questions used (seeded sample)")
    p.add_argument("--gpt-sample", type=at_least(0), default=40, help="generative calibration questions generated")
    p.add_argument("--profile", default="gemma", help="generator profile whose bundle runs the pipeline")
    p.add_argument("--bundle", type=Path, default=None, help="bundle folder (default: --profile's)")
    p.add_argument("--index-cache", type=Path, default=home() / "bench", help="cached indexes (the benchmarks' too)")
    p.add_argument("--rows-cache", type=Path, default=None, help="keep per-question rows here (re-fit without re-running)")
    p.set_defaults(func=run)
