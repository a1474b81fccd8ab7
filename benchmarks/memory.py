"""Measure the memory plan against the real pipeline: ``python -m benchmarks.memory``.

Plans, builds EdgeRAG within the plan in this process and compares peak RSS with the plan. Run it in a
fresh process: RSS high-water marks never go down. The calibration constants of
``edge_rag.memory.estimate`` were fitted with it.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from edge_rag.cli.commands import SAMPLE_DIR
from edge_rag.config import Config, Tier
from edge_rag.decision.certified import CertifiedPath
from edge_rag.documents.chunk import chunk, read_documents
from edge_rag.documents.files import iter_files
from edge_rag.memory import peak_rss_mb, plan, rss_mb
from edge_rag.models import bundle as B
from edge_rag.models.registry import default_bundle
from edge_rag.models.verify import select_encoder
from edge_rag.pipeline import EdgeRAG
from edge_rag.retrieval.compress import build_context
from evaluation.datasets import load_squad


def measure(db: str | Path, bundle_dir: str | Path | None = None, config: Config | None = None, corpus: str = "sample",
            questions: int = 20, hard: int = 3, generator_first: bool = False) -> dict:
    """Plan, build EdgeRAG within the plan, index ``corpus`` ("sample" or a SQuAD JSON path), load
    the generator (before indexing if ``generator_first``: the worst order), ``ask`` the questions,
    then generate for the first ``hard`` of them from a HARD-tier context (the config's HARD budget)
    so llama.cpp's largest prompt runs whatever route ``ask`` took. A config that never generates (the certified
    default) plans no generator and loads none: its steps are skipped. Returns the plan, RSS after each
    stage and the peak (MB)."""
    config = config or Config(temperature=0.0)
    if corpus == "sample":
        docs = [d for p in iter_files([SAMPLE_DIR / "docs"]) for d in read_documents(p)]
        items = json.loads((SAMPLE_DIR / "questions.json").read_text(encoding="utf-8"))
        qs = [q["question"] for q in items if q.get("answer")]
    else:
        docs, qa = load_squad(corpus)
        qs = [q.question for q in qa if q.answers]
    n = sum(len(chunk(d, config.passage_mode, config.min_sentence_chars)) for d in docs)
    bundle = B.Bundle.load(bundle_dir or default_bundle())
    generates = CertifiedPath(bundle, config).may_generate  # as EdgeRAG decides whether llama.cpp is planned
    p = plan(bundle, config, passages=n, generator=generates, encoder=select_encoder(bundle, config.threads))
    stages = {"start": rss_mb()}
    rag = EdgeRAG(db, bundle=bundle.root, config=p.apply(config))
    stages["encoder + store"] = rss_mb()
    steps = ([("generator", lambda: rag.generator)] if generates else []) + [("index", lambda: rag.add_documents(docs))]
    for name, step in steps if generator_first else steps[::-1]:
        step()
        stages[name] = rss_mb()
    for q in qs[:questions]:
        rag.ask(q)
    stages["ask"] = rss_mb()
    spec = config.tier(Tier.HARD)
    for q in qs[:hard] if generates else []:
        passages = rag.store.search(rag.encoder.encode_one(q), spec.k)
        context = build_context(passages)[: spec.context_chars]
        rag.generator.generate(q, context, spec.max_new_tokens, temperature=0.0)
        stages["HARD generations"] = rss_mb()
    rag.close()
    return {"plan": {"budget_mb": p.budget_mb, "n_ctx": p.n_ctx, "encode_batch_tokens": p.encode_batch_tokens,
                     "passages": p.passages, "total_mb": round(p.total_mb, 1),
                     **{c.name: round(c.mb, 1) for c in p.components}},
            "generator_first": generator_first, "questions": min(questions, len(qs)),
            "hard": min(hard, len(qs)) if generates else 0,
            "rss_mb": {k: round(v, 1) for k, v in stages.items()}, "peak_rss_mb": round(peak_rss_mb(), 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory",
                                 description="Plan the memory budget, then measure the real pipeline against it.")
    ap.add_argument("--bundle", help="bundle folder (default: the gemma bundle)")
    ap.add_argument("--corpus", default="sample", help='"sample" or a SQuAD JSON path')
    ap.add_argument("--mode", default="sentence", choices=["sentence", "paragraph"])
    ap.add_argument("--budget", type=int, default=Config.memory_budget_mb, help="memory_budget_mb")
    ap.add_argument("--n-ctx", type=int, default=Config.n_ctx)
    ap.add_argument("--batch-tokens", type=int, default=Config.encode_batch_tokens)
    ap.add_argument("--questions", type=int, default=20, help="questions to ask()")
    ap.add_argument("--hard", type=int, default=3, help="of those, how many also generate from a HARD context")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--generator-first", action="store_true", help="load llama.cpp before indexing (worst order)")
    ap.add_argument("--seed-decision", action="store_true",
                    help="the seeds' decision (certified=False), which loads llama.cpp; default: the certified default")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    config = Config(temperature=0.0, memory_budget_mb=args.budget, n_ctx=args.n_ctx,
                    encode_batch_tokens=args.batch_tokens, passage_mode=args.mode, threads=args.threads,
                    certified=not args.seed_decision)
    with tempfile.TemporaryDirectory() as db:
        result = measure(db, args.bundle, config, args.corpus, args.questions, args.hard,
                         args.generator_first)
    if args.json:
        print(json.dumps(result))
        return
    p = result["plan"]
    print(f"plan: n_ctx {p['n_ctx']}, encode_batch_tokens {p['encode_batch_tokens']}, {p['passages']} passages; "
          + ", ".join(f"{k} {p[k]:.0f}" for k in ("runtime base", "generator", "encoder", "reader", "answer cache", "index") if k in p)
          + " MB")
    print("RSS after: " + ", ".join(f"{k} {v:.0f}" for k, v in result["rss_mb"].items()) + " MB")
    print(f"peak RSS {result['peak_rss_mb']:.0f} MB vs plan {p['total_mb']:.0f} MB "
          f"({p['total_mb'] / result['peak_rss_mb'] - 1:+.0%}); budget {p['budget_mb']} MB")


if __name__ == "__main__":
    main()
