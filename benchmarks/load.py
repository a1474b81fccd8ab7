"""Load test of ``edge-rag serve``: N concurrent clients on loopback, a fixed number of questions.

    python -m benchmarks.load [--clients 4] [--questions 40] [--gpt 3] [--memory-mb 2048]

Indexes the packaged sample corpus into a temporary store, starts the real server in its own process
(``python -m edge_rag serve --port 0``), and has ``--clients`` threads ask over the streaming endpoint
(as the kiosk page does): ``--questions`` from the sample questions, other questions about the corpus and
off-topic ones (extractive RAG answers and refusals), plus ``--gpt`` open-ended ones that tend to be
routed to llama.cpp. Routes are reported as the server decided them. Prints p50 / p95 latency per route
(time to the route event, to the first token, to the answer), errors (must be 0), and the server's peak
RSS (sampled from outside every 100 ms, and its own VmHWM) against the memory budget and plan. Absolute
times move with the machine's load; compare routes within one run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "edge_rag" / "sample"
MORE_QUESTIONS = (  # about the sample corpus, not among its sample questions
    "Why is the pendulum swinging?", "What is special about the meteorite?", "How old is the building?",
    "What is the best time to visit?", "Who was Margaret Hollins?", "What is a Foucault pendulum?",
    "Tell me about the Foucault pendulum", "What shows are on in the planetarium?",
)
OFF_TOPIC = (
    "How do I bake sourdough bread?", "What is the capital of France?", "Who won the football cup final last season?",
    "How long should I boil dried spaghetti?", "How do I claim a tax refund for working from home?",
)
OPEN_ENDED = (  # open-ended questions on the sample corpus, usually answered by generation
    "What can children do at the museum?", "Tell me about Big Mary", "What happens in the Energy Works gallery?",
    "Tell me about the planetarium", "Tell me about Margaret Hollins", "What can I do in the Little Sparks area?",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4, help="concurrent clients")
    p.add_argument("--questions", type=int, default=40, help="extractive / off-topic questions in total")
    p.add_argument("--gpt", type=int, default=3, help="open-ended questions (llama.cpp) in total")
    p.add_argument("--memory-mb", type=int, default=2048, help="the server's memory budget")
    p.add_argument("--profile", default="gemma")
    p.add_argument("--bundle", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("bench-results") / "load.json")
    return p.parse_args(argv)


def workload(n_questions: int, n_gpt: int) -> list[str]:
    """A fixed, interleaved question list; repeats (cache hits) only when more are asked than exist."""
    samples = [q["question"] for q in json.loads((SAMPLE / "questions.json").read_text())]
    fast = list(itertools.islice(itertools.cycle(samples + list(MORE_QUESTIONS) + list(OFF_TOPIC)), n_questions))
    slow = list(itertools.islice(itertools.cycle(OPEN_ENDED), n_gpt))
    step = max(1, len(fast) // (len(slow) + 1))
    for i, q in enumerate(slow):  # spread the generations through the run
        fast.insert(min(len(fast), (i + 1) * step + i), q)
    return fast


def start_server(db: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "edge_rag", "serve", "--db", str(db), "--port", "0", "--profile", args.profile,
           "--memory-mb", str(args.memory_mb), "--timeout", "3600", "--max-queue", str(args.clients)]
    if args.bundle:
        cmd += ["--bundle", str(args.bundle)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if " on http" not in line:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, line.split(" on ")[1].strip().rstrip("/")


def ask(client: httpx.Client, url: str, question: str) -> dict:
    """One question over SSE: route, timings (ms) and any error."""
    start = time.perf_counter()
    out: dict = {"question": question, "route": None, "error": None, "cache_hit": False}
    try:
        with client.stream("GET", f"{url}/api/ask/stream", params={"q": question}) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}: {r.read().decode()[:200]}"
                return out
            event = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                    ms = (time.perf_counter() - start) * 1e3
                    if event == "route":
                        out["route_ms"] = ms
                    elif event == "token":
                        out.setdefault("first_token_ms", ms)
                elif line.startswith("data: ") and event == "route":
                    data = json.loads(line[6:])
                    out["route"], out["cache_hit"] = data["route"], data["cache_hit"]
                elif line.startswith("data: ") and event == "failed":
                    out["error"] = json.loads(line[6:])["error"]
                elif line.startswith("data: ") and event == "answer":
                    out["answer_ms"] = (time.perf_counter() - start) * 1e3
                    out["answer"] = json.loads(line[6:])["answer"]
    except httpx.HTTPError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    if "answer_ms" not in out and out["error"] is None:
        out["error"] = "the stream ended without an answer"
    return out


def run(args: argparse.Namespace) -> dict:
    questions = workload(args.questions, args.gpt)
    with tempfile.TemporaryDirectory(prefix="edge-rag-load-") as tmp:
        db = Path(tmp) / "db"
        index = [sys.executable, "-m", "edge_rag", "index", str(SAMPLE / "docs"), "--db", str(db), "--quiet",
                 "--profile", args.profile] + (["--bundle", str(args.bundle)] if args.bundle else [])
        subprocess.run(index, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
        proc, url = start_server(db, args)
        server = psutil.Process(proc.pid)
        peak = [0.0]
        done = threading.Event()

        def sample_rss() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], server.memory_info().rss / 2**20)
                done.wait(0.1)

        todo: queue.Queue[str] = queue.Queue()
        for q in questions:
            todo.put(q)
        results: list[dict] = []

        def client() -> None:
            with httpx.Client(timeout=httpx.Timeout(3600.0, connect=10.0)) as c:
                while True:
                    try:
                        q = todo.get_nowait()
                    except queue.Empty:
                        return
                    results.append(ask(c, url, q))

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        start = time.perf_counter()
        clients = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        wall = time.perf_counter() - start
        health = httpx.get(f"{url}/api/health", timeout=30).json()
        done.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return summarize(results, health, peak[0], wall, args)


def summarize(results: list[dict], health: dict, sampled_peak: float, wall: float, args) -> dict:
    def pct(values: list[float]) -> dict:
        return {"p50": round(float(np.percentile(values, 50)), 1), "p95": round(float(np.percentile(values, 95)), 1)} \
            if values else {}

    routes: dict[str, dict] = {}
    for key in sorted({("cached" if r["cache_hit"] else r["route"]) for r in results if r["route"]}):
        rows = [r for r in results if r["route"] and ("cached" if r["cache_hit"] else r["route"]) == key]
        routes[key] = {"n": len(rows), "answer_ms": pct([r["answer_ms"] for r in rows if "answer_ms" in r]),
                       "route_ms": pct([r["route_ms"] for r in rows if "route_ms" in r]),
                       "first_token_ms": pct([r["first_token_ms"] for r in rows if "first_token_ms" in r])}
    return {
        "clients": args.clients, "questions": len(results), "wall_s": round(wall, 1),
        "errors": [r for r in results if r["error"]], "routes": routes,
        "peak_rss_mb": {"sampled": round(sampled_peak, 1), "server_vmhwm": health["memory"]["peak_rss_mb"]},
        "budget_mb": health["memory"]["budget_mb"], "plan_mb": health["plan"]["total_mb"],
    }


def report(s: dict) -> str:
    lines = [f"load: {s['clients']} clients, {s['questions']} questions in {s['wall_s']} s, "
             f"errors {len(s['errors'])}",
             f"{'route':<8} {'n':>3}  {'answer p50':>10} {'p95':>8}  {'route p50':>9} {'p95':>7}  {'1st token p50':>13}"]
    for route, r in s["routes"].items():
        ft = r["first_token_ms"].get("p50")
        lines.append(f"{route:<8} {r['n']:>3}  {r['answer_ms'].get('p50', 0):>10.0f} {r['answer_ms'].get('p95', 0):>8.0f}"
                     f"  {r['route_ms'].get('p50', 0):>9.0f} {r['route_ms'].get('p95', 0):>7.0f}  "
                     f"{'' if ft is None else f'{ft:.0f}':>13}   (ms)")
    peak = max(s["peak_rss_mb"].values())
    lines.append(f"server peak RSS {peak:.0f} MB (sampled {s['peak_rss_mb']['sampled']:.0f}, VmHWM "
                 f"{s['peak_rss_mb']['server_vmhwm']:.0f}) of the {s['budget_mb']} MB budget (plan "
                 f"{s['plan_mb']:.0f} MB): {'inside' if peak <= s['budget_mb'] else 'OVER'}")
    for e in s["errors"]:
        lines.append(f"error: {e['question']!r}: {e['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(report(summary))
    print(f"wrote {args.out}")
    return 1 if summary["errors"] or max(summary["peak_rss_mb"].values()) > summary["budget_mb"] else 0


if __name__ == "__main__":
    sys.exit(main())
