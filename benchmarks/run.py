"""`python -m benchmarks`: every system on the same pooled corpus and questions, then peer, scale, report.

One EdgeRAG per system, opened on the dataset's shared store and closed before the next. The systems share one
llama.cpp model, loaded by the first that may generate and handed to every later one (of every dataset) at the same
n_ctx; under ``--memory-mb`` each system loads its own after the last one's is freed, as its memory plan counts it.
Latency is the wall time of ``ask`` measured here; stage times come from the Answer. Per-question rows go to
questions.jsonl, summaries to results.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

import numpy as np
from tqdm import tqdm

from edge_rag import EdgeRAG, EdgeRAGError, Route, Tier
from edge_rag.config import DEFAULT_TIERS, PASSAGE_MODES, Config
from edge_rag.decision.certified import CertifiedPath
from edge_rag.models.bundle import ROLE_ENCODER, Bundle
from edge_rag.models.registry import PROFILES, default_bundle, home
from edge_rag.reading.generate import Generator
from edge_rag.reading.llama_log import interrupts_after

from . import data, decision, hardware, peer, plots, report, routing, rss, scale, scale_backends, summary
from . import metrics as M
from .systems import BASELINE, SYSTEMS, available, bench_config, preset, run_settings, settings_config

SCHEMA_VERSION = 1
STAGE = "outputs.partial"  # in the output folder: this run's results, figures and report until they are all drawn
WARMUP_QUESTION = "What is this collection about?"


def answer_tokens(text: str) -> int:
    """--max-new-tokens: what a tier's ``max_new_tokens`` allows, by TierSpec's own check and message."""
    try:
        return replace(DEFAULT_TIERS[Tier.EASY], max_new_tokens=int(text)).max_new_tokens
    except ValueError as exc:  # int()'s, or TierSpec's ConfigError
        raise argparse.ArgumentTypeError(str(exc)) from None


def question_count(text: str) -> int:
    """--n: at least one question (0 ran every system on nothing, then failed writing the report; < 0, sampling)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1 question per dataset")
    return n


def tier_chars(text: str) -> tuple[Tier, int]:
    """--context-chars TIER=N: one tier's context budget, by Tier's and TierSpec's own checks and messages."""
    name, _, value = text.partition("=")
    try:
        tier = Tier(name.strip().upper())
        return tier, replace(DEFAULT_TIERS[tier], context_chars=int(value)).context_chars
    except ValueError as exc:  # Tier's, int()'s, or TierSpec's ConfigError
        raise argparse.ArgumentTypeError(f"{text!r}: expected TIER=N, TIER one of EASY, MEDIUM, HARD ({exc})") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="all questions and the 1M-vector scale point")
    p.add_argument("--datasets", default="squad,hotpotqa", help="comma-separated: squad,hotpotqa")
    p.add_argument("--squad", type=Path, default=data.FILES["squad"], help="SQuAD 2.0 JSON file")
    p.add_argument("--hotpot", type=Path, default=data.FILES["hotpotqa"], help="HotpotQA JSONL file")
    p.add_argument("--n", type=question_count, default=100, help="questions per dataset in the quick run")
    p.add_argument("--part", default="benchmark", choices=data.PARTS,
                   help="questions from the test split (default), the router/reader val split (for choices"
                        " made before a test run), or the whole file")
    p.add_argument("--answerable", action="store_true",
                   help="answerable questions only: F1 comparisons of generating systems at half the generations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="0 = OMP_NUM_THREADS if set, else all cores")
    p.add_argument("--memory-mb", type=int, default=None, help="memory budget for the pipeline")
    p.add_argument("--passages", choices=PASSAGE_MODES, default="sentence",
                   help="passage unit of the pooled corpus: sentences (default, the router's training unit) or paragraphs")
    p.add_argument("--max-new-tokens", type=answer_tokens, default=None, metavar="N",
                   help="cap every tier's answer at N tokens (a quick check of the harness; default: the tiers' own)")
    p.add_argument("--context-chars", type=tier_chars, action="append", default=[], metavar="TIER=N",
                   help="a tier's context budget in characters, e.g. HARD=600 (repeatable; default: the tiers' own). "
                        "Generated answers then come from other contexts; the neural reader's decision is unchanged")
    p.add_argument("--profile", default="gemma", help=f"bundle profile: {' | '.join(PROFILES)}")
    p.add_argument("--bundle", type=Path, default=None, help="bundle folder (default: the profile's)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--index-cache", type=Path, default=home() / "bench", help="where dataset indexes are kept")
    p.add_argument("--systems", default=",".join(available()), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--scale-sizes", type=scale.corpus_sizes, default=None,
                   help="comma-separated corpus sizes, k/M suffixes allowed (default 1k,10k,100k[,1M])")
    args = p.parse_args(argv)
    args.datasets = [d for d in args.datasets.split(",") if d]
    args.systems = [s for s in args.systems.split(",") if s]
    for name, known in (("dataset", data.LOADERS), ("system", SYSTEMS)):
        unknown = [x for x in (args.datasets if name == "dataset" else args.systems) if x not in known]
        if unknown:
            p.error(f"unknown {name}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    args.sizes = args.scale_sizes or list(scale.FULL_SIZES if args.full else scale.QUICK_SIZES)
    return args


def ask_all(rag: EdgeRAG, ds: data.Dataset, qvecs: np.ndarray, label: str) -> list[dict]:
    """Ask every question once; one row per question with its answer, costs and quality."""
    rows = []
    for item in tqdm(ds.items, desc=label, unit="q"):
        start = time.perf_counter()
        a = rag.ask(item.question)
        wall_ms = (time.perf_counter() - start) * 1e3
        d = a.to_dict()
        used = [p.doc_id for p in rag.store.passages([p["id"] for p in d["passages"]])]
        pred = None if a.route is Route.REFUSE else a.answer
        answerable = not item.is_impossible
        rows.append({
            "id": item.id, "question": item.question, "answerable": answerable, "answer": pred, "gold": item.answers,
            "em": M.best_em(pred, item.answers) if answerable else None,
            "f1": M.best_f1(pred, item.answers) if answerable else None,
            "route": d["route"], "tier": d["tier"], "tier_fallback": d.get("tier_fallback"),
            "confidence": d.get("confidence"), "lower_bound": d.get("lower_bound"), "d_min": d.get("d_min"),
            "candidate": d.get("candidate"), "score": d.get("score"), "score_threshold": d.get("score_threshold"),
            "alpha": d.get("alpha"), "kind": d.get("kind"),
            "refusal_reason": d.get("refusal_reason"), "corrected": d.get("corrected"),
            "cache_hit": d.get("cache_hit"), "prompt_tokens": d["prompt_tokens"],
            "completion_tokens": d["completion_tokens"], "context_chars": d["context_chars"],
            "n_passages": len(used), "total_ms": wall_ms, "timings_ms": d["timings_ms"],
            "rss_mb": max(d.get("rss_mb", {}).values(), default=None), "peak_rss_mb": d.get("peak_rss_mb"),
            "context_precision": M.context_precision(used, item.gold_doc_ids),
            "context_recall": M.context_recall(used, item.gold_doc_ids),
            "faithfulness": M.faithfulness(pred, d.get("context", "")),
        })
    answered = [i for i, r in enumerate(rows) if r["answer"]]
    avecs = rag.encoder.encode([rows[i]["answer"] for i in answered])
    for i, v in zip(answered, avecs):
        rows[i]["relevance"] = M.cosine(qvecs[i], v)
    return rows


def run_system(system: str, ds: data.Dataset, args: argparse.Namespace, bundle: Bundle, db: Path, base: Config,
               qvecs: np.ndarray, shared: dict[str, Generator] | None) -> tuple[list[dict], dict | None]:
    """One system's rows and, on SQuAD, its OOD-test refusals. Its memory figures are its own: the run's llama.cpp
    model is dropped first when this system never generates, and the high-water mark starts again here (None where
    it cannot: it would be an earlier system's)."""
    config = preset(base, system)
    if shared and not CertifiedPath(bundle, config).may_generate:
        shared.clear()  # a later system that generates loads it again
    gc.collect()
    fresh_peak = rss.reset_peak()
    held = (shared or {}).get("generator")
    with EdgeRAG(db, bundle=bundle, config=config, generator=held) as rag:
        # load before timing (cold start is measured in the peer section), unless an earlier system did
        loaded = rag.certified.may_generate and rag.generator is not held
        if loaded and shared is not None:
            shared["generator"] = rag.generator
        rag.warm_up()  # the reader too: the warm-up question is refused out of domain, before it is read
        if loaded or not rag.certified.may_generate:
            rag.ask(WARMUP_QUESTION)
        else:  # llama.cpp is warm from an earlier system (an answer does not depend on what came before)
            rag.decide(WARMUP_QUESTION)  # the rest of what the first question would load
        rows = ask_all(rag, ds, qvecs, f"{ds.name}/{system}")
        for row in rows if not fresh_peak else []:
            row["peak_rss_mb"] = None
        # out-of-domain: OOD-test articles against this corpus, decided only. A system without a decision is not
        # measured there (it would have to generate every answer, and refuses those cut off: not 0% for sure)
        if ds.name != "squad":
            return rows, None
        return rows, (decision.ood_refused(rag, args.n if not args.full else None, args.seed)
                      if config.cgr else {"n": 0, "refused": None, "p50_ms": None})


def measure_corpus(ds: data.Dataset, bundle: Bundle, db: Path, base: Config
                   ) -> tuple[dict, np.ndarray, np.ndarray, list[list[str]]]:
    """The system-independent figures (retrieval), the questions' embeddings and the stored passages, from a pipeline
    of its own that is gone when this returns: held through the systems, its sessions counted in the first one's RSS
    (+35 MB on SQuAD's test split)."""
    with EdgeRAG(db, bundle=bundle, config=base) as rag:
        qvecs = rag.encoder.encode_alone([q.question for q in ds.items])  # as `ask` encodes them
        result = {"file": str(ds.path), "sha256": ds.sha256, "part": ds.part, "n_questions": len(ds.items),
                  "n_answerable": sum(not q.is_impossible for q in ds.items),
                  "retrieval": summary.retrieval(rag, ds, qvecs)}
        vectors, texts = scale_backends.stored_passages(rag.store)
    return result, qvecs, vectors, texts


def run_dataset(ds: data.Dataset, args: argparse.Namespace, bundle: Bundle, out_rows: TextIO,
                shared: dict[str, Generator] | None = None) -> tuple[dict, Path, dict]:
    """All systems on one dataset; returns its results, its index folder and, for the scale test, its passages
    (vectors and texts) and questions (embeddings and texts). ``shared``: the run's llama.cpp model under
    "generator", used by every system that may generate (loaded into it by the first); None: one per system."""
    base = settings_config(run_settings(args))
    encoder_sha = bundle.sha256(ROLE_ENCODER)
    db, corpus = data.open_index(ds, bundle, encoder_sha, base, args.index_cache)
    result, qvecs, vectors, texts = measure_corpus(ds, bundle, db, base)
    result["corpus"] = corpus
    rows_by_system: dict[str, list[dict]] = {}
    errors: dict[str, dict] = {}
    ood: dict[str, dict] = {}
    for system in args.systems:
        try:
            rows_by_system[system], ood_of = run_system(system, ds, args, bundle, db, base, qvecs, shared)
            if ood_of is not None:
                ood[system] = ood_of
        except EdgeRAGError as exc:  # e.g. a memory budget the system cannot fit: report, keep going
            print(f"{ds.name}/{system} failed: {exc}")
            errors[system] = {"error": str(exc)}
        gc.collect()  # free the generator (unless shared) before the next system loads its own
        for row in rows_by_system.get(system, []):
            out_rows.write(json.dumps({"dataset": ds.name, "system": system, **row}) + "\n")
    result["systems"] = {s: summary.summarise(rows_by_system[s], rows_by_system.get(BASELINE), args.seed)
                         if s in rows_by_system else errors[s] for s in args.systems}
    for s, o in ood.items():
        result["systems"][s]["ood"] = o
    result["router"] = routing.router_confusion(db, bundle, base, ds.items, rows_by_system)
    certified = {s: r for s, r in rows_by_system.items() if SYSTEMS[s].get("certified")}
    result["risk_coverage"] = {s: decision.risk_coverage(r) for s, r in certified.items()}
    return result, db, {"vectors": vectors, "queries": qvecs, "texts": texts,
                        "questions": [q.question for q in ds.items]}


def drop_stale(out: Path, figures: list[Path], ran_peer: bool, ran_stores: bool) -> None:
    """Remove the figures, peer and store-scale files an earlier run left in ``out`` that this run did not write: the
    report links only this run's, but whoever opens the folder takes every file in it for this run's."""
    for path in {*out.glob("risk_coverage_*.png"), *(out / name for name, _, _ in plots.FIGURES)} - set(figures):
        path.unlink(missing_ok=True)
    if not ran_peer:
        shutil.rmtree(out / "peer", ignore_errors=True)
    if not ran_stores:
        (out / scale_backends.ROWS_FILE).unlink(missing_ok=True)


def publish(results: dict, out: Path, rows: Path) -> None:
    """The run's outputs, in ``out`` together: drawn first in a folder of their own (the figures take seconds), then
    moved in under Ctrl-C held, the report last (until then ``out`` holds none). A Ctrl-C while the figures were
    drawn left this run's results.json and questions.jsonl beside the last run's report.md and figures."""
    stage = out / STAGE
    shutil.rmtree(stage, ignore_errors=True)  # an interrupted run's
    stage.mkdir()
    (stage / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    figures = plots.write(results, stage)
    for name, ds in results["datasets"].items():
        rc = ds.get("risk_coverage") or {}
        alphas = {s: ds["systems"][s]["alpha"] or 0.0 for s in rc}
        fig = decision.plot(rc, {s: ds["systems"][s]["answered"] for s in rc}, alphas,
                            stage / f"risk_coverage_{name}.png")
        figures += [fig] if fig else []
    report.write(results, stage / "report.md", figures)
    with interrupts_after():
        (out / "report.md").unlink(missing_ok=True)
        os.replace(rows, out / "questions.jsonl")
        if "skipped" not in results["peer"]:
            shutil.rmtree(out / "peer", ignore_errors=True)
            os.replace(out / peer.WORK, out / "peer")
        for path in [stage / "results.json", *figures]:
            os.replace(path, out / path.name)
        drop_stale(out, [out / f.name for f in figures], ran_peer="skipped" not in results["peer"],
                   ran_stores=bool(results["scale"].get("stores", {}).get("rows")))
        os.replace(stage / "report.md", out / "report.md")
        stage.rmdir()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    bundle = Bundle.load(args.bundle or default_bundle(args.profile))
    n = None if args.full else args.n
    results: dict = {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "hardware": hardware.profile(args.threads, bundle),
        "systems": {s: {"flags": SYSTEMS[s]} for s in args.systems},
        "baseline": BASELINE,
        "datasets": {},
    }
    paths = {"squad": args.squad, "hotpotqa": args.hotpot}
    dbs: dict[str, Path] = {}
    arrays: list[dict] = []
    items: dict[str, list] = {}
    shared: dict[str, Generator] = {}
    # this run's rows go beside the folder's last complete run until this one is complete too: an interrupted run
    # leaves questions.jsonl matching the results.json and report.md it came with
    partial = args.out / "questions.jsonl.partial"
    with open(partial, "w", encoding="utf-8") as out_rows:
        for name in args.datasets:
            if not paths[name].is_file():
                print(f"skipping {name}: {paths[name]} not found (see ../shared/data/README.md)")
                results["datasets"][name] = {"skipped": f"{paths[name]} not found"}
                continue
            ds = data.load(name, paths[name], n, args.seed, args.part, args.answerable)
            results["datasets"][name], dbs[name], arr = run_dataset(ds, args, bundle, out_rows,
                                                                    shared if args.memory_mb is None else None)
            arrays.append(arr)
            items[name] = ds.items
    shared.clear()
    gc.collect()  # the shared generator is freed before the peer and scale sections measure memory
    if args.skip_peer or not dbs:
        results["peer"] = {"skipped": "--skip-peer" if args.skip_peer else "no dataset"}
    else:
        name = "squad" if "squad" in dbs else next(iter(dbs))
        results["peer"] = peer.run(dbs[name], name, items[name], bundle, args)
    if args.skip_scale or not arrays:
        results["scale"] = {"skipped": "--skip-scale" if args.skip_scale else "no dataset"}
    else:
        real, queries = np.concatenate([a["vectors"] for a in arrays]), np.concatenate([a["queries"] for a in arrays])
        results["scale"] = scale.run(real, queries, args.sizes, bench_config(args.threads), args.out, args.seed)
        store_sizes = [n for n in args.sizes if n >= scale_backends.MIN_SIZE]  # embedded vs pgvector
        texts, questions = [t for a in arrays for t in a["texts"]], [q for a in arrays for q in a["questions"]]
        results["scale"]["stores"] = scale_backends.run(real, queries, texts, questions, store_sizes,
                                                        bench_config(args.threads), args.out, args.seed
                                                        ) if store_sizes else {"rows": []}
    results["runtime_s"] = time.perf_counter() - started
    publish(results, args.out, partial)
    print(f"benchmark done in {results['runtime_s'] / 60:.1f} min; results in {args.out.resolve()}/ "
          "(results.json, report.md, questions.jsonl, *.png)")
    return results
