"""Router tiers on a corpus it was not trained on (issue #42): tier accuracy, tier shares, and what the default costs.

    python -m benchmarks.experiments.router_tiers [--router FILE] [--hotpot-parts reader_val,test] [--n 200]
        [--generate 30] [--out FILE]

HotpotQA: the questions of each named split part (``edge_rag/assets/splits.json`` buckets), over a corpus of their
own contexts alone (pooled alone: 10 paragraphs a question, distractors included), built once into the benchmark's
index cache; the router never saw that corpus. SQuAD: the test split over the pooled dev file, as ``make bench``.
Per corpus: tier labels (``evaluation.tiers``: the cheapest tier whose ``full`` context serves the question) against
the tier ``decide()`` picks under the ``full`` system; the EASY / MEDIUM / HARD shares over every question asked;
the default Config's answers (F1 over answerable questions, answered share, routes, context chars and prompt
tokens); with ``--generate N`` also the ``full`` system's generated answers for N answerable questions (F1, prompt
and completion tokens: what the tiers cost the generator). ``--router`` measures another router.onnx (e.g. the one before a
retrain: ``git show <commit>:edge_rag/assets/router.onnx > old.onnx``) on the same stores and questions.
Prints JSON (and writes it to ``--out``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

from benchmarks import data, splits
from benchmarks import metrics as M
from benchmarks.systems import bench_config, preset
from edge_rag import EdgeRAG, Route
from edge_rag.config import TIERS, Config
from edge_rag.models.bundle import ROLE_ENCODER, Bundle
from edge_rag.models.registry import ROUTER_ASSET, default_bundle, home
from edge_rag.retrieval.route import Router
from evaluation.datasets import QAItem, load_hotpot
from evaluation.tiers import label, open_tiers, tier_contexts

LABEL_SYSTEM = "full"  # the system whose contexts are labelled and whose tier is the router's choice


def pooled_alone(path: Path, part: str, cache: Path, limit: int | None = None) -> data.Dataset:
    """The HotpotQA questions of split ``part`` (the first ``limit``) over a corpus of their own contexts only
    (their lines of ``path``, written once into ``cache`` so the corpus has a file and a digest like any other)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines()
             if line.strip() and splits.part_of(QAItem(json.loads(line)["question_id"], "", [], "hotpotqa")) == part]
    lines = lines[:limit]
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    subset = cache / f"hotpotqa-{part}-{digest[:10]}.jsonl"
    if not subset.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subset.write_text(text, encoding="utf-8")
    docs, items = load_hotpot(subset)
    return data.Dataset(f"hotpotqa-{part}-alone", subset, digest, docs, items, part)


def tiers(db: Path, bundle: Path, base: Config, items: list[QAItem], router: Router) -> dict:
    """Tier labels against the routed system's choices: accuracy on the labelled, shares on all."""
    full = preset(base, LABEL_SYSTEM)
    rags = open_tiers(db, bundle, full)
    try:
        labels = {q.id: label(tier_contexts(rags, q)[0]) for q in items if q.answers and not q.is_impossible}
    finally:
        for rag in rags.values():
            rag.close()
    with EdgeRAG(db, bundle=bundle, config=full) as rag:
        rag.router = router
        chosen = {q.id: rag.decide(q.question).tier for q in items}
    labelled = [qid for qid, t in labels.items() if t is not None]
    share = Counter(chosen.values())
    mix = Counter(labels[q] for q in labelled)
    return {"asked": len(items), "answerable": len(labels), "labelled": len(labelled),
            "accuracy": M.mean([float(chosen[q] is labels[q]) for q in labelled]),
            "router_share": {t.value: share[t] / len(items) for t in TIERS},
            "label_share": {t.value: mix[t] / len(labelled) if labelled else None for t in TIERS}}


def answers(db: Path, bundle: Path, config: Config, items: list[QAItem], router: Router) -> dict:
    """F1 over the answerable questions (a refusal scores 0), answered share, routes, context and tokens."""
    rows = []
    with EdgeRAG(db, bundle=bundle, config=config) as rag:
        rag.router = router
        for q in items:
            a = rag.ask(q.question)
            pred = None if a.route is Route.REFUSE else a.answer
            rows.append({"answerable": not q.is_impossible, "route": a.route.value, "answered": pred is not None,
                         "f1": M.best_f1(pred, q.answers) if not q.is_impossible else None,
                         "context_chars": a.context_chars, "prompt_tokens": a.prompt_tokens,
                         "completion_tokens": a.completion_tokens})
    ans = [r for r in rows if r["answerable"]]
    return {"n": len(rows), "n_answerable": len(ans), "f1": M.mean([r["f1"] for r in ans]),
            "answered": M.mean([float(r["answered"]) for r in rows]),
            "answered_answerable": M.mean([float(r["answered"]) for r in ans]),
            "routes": M.shares([r["route"] for r in rows]),
            **{k: M.mean([r[k] for r in rows]) for k in ("context_chars", "prompt_tokens", "completion_tokens")}}


def measure(ds: data.Dataset, bundle: Bundle, router: Router, args: argparse.Namespace) -> dict:
    base = bench_config()
    encoder_sha = bundle.sha256(ROLE_ENCODER)
    db, corpus = data.open_index(ds, bundle.root, encoder_sha, base, args.index_cache)
    out = {"questions": ds.part, "passages": corpus["passages"],
           "tiers": tiers(db, bundle.root, base, ds.items, router),
           "default": answers(db, bundle.root, base, ds.items, router)}
    if args.generate:
        asked = [q for q in ds.items if not q.is_impossible][: args.generate]
        out["full_generated"] = answers(db, bundle.root, preset(base, LABEL_SYSTEM), asked, router)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.router_tiers", description=__doc__.splitlines()[0])
    p.add_argument("--router", type=Path, default=ROUTER_ASSET,
                   help="router.onnx to measure (default: this checkout's edge_rag/assets/router.onnx, which an"
                        " installed bundle may not hold yet)")
    p.add_argument("--hotpot-parts", default="reader_val,test", help="comma-separated split parts, each pooled alone")
    p.add_argument("--n", type=int, default=200, help="SQuAD test questions (seeded sample, half unanswerable)")
    p.add_argument("--generate", type=int, default=0, metavar="N", help="also generate for N answerable questions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index-cache", type=Path, default=home() / "bench")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    bundle = Bundle.load(default_bundle())
    router = Router(args.router)
    sets = [pooled_alone(data.FILES["hotpotqa"], part, args.index_cache)
            for part in args.hotpot_parts.split(",") if part]
    sets.append(data.load("squad", data.FILES["squad"], args.n, args.seed, "benchmark"))
    return emit({"router": str(args.router), **{ds.name: measure(ds, bundle, router, args) for ds in sets}}, args.out)


def emit(result: dict, out: Path | None) -> dict:
    """Print ``result`` as JSON, and write it to ``out`` when given."""
    text = json.dumps(result, indent=1)
    if out:
        out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return result


if __name__ == "__main__":
    main()
