"""Deep health checks under load (issue #43): what clients looping on ``/api/health?deep=1`` cost the questions.

    python -m benchmarks.experiments.deep_health [--passages 26000] [--clients 6] [--seconds 60] [--db DIR]

Builds (once, into ``--db``) a store of the packaged sample corpus plus distinct templated passages, starts the real
server (``python -m edge_rag serve``, with a token) in its own process, asks one extractive question after another
for ``--seconds`` alone, then again while ``--clients`` threads loop on the deep health check with the token.
Prints JSON: question p50/p95 in both phases, the deep checks' HTTP statuses, and the server's RSS (sampled from
outside every 100 ms) before and at its peak. The code measured is the one on PYTHONPATH (run it against an older
checkout to compare).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from edge_rag.models.registry import home

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "deep-health-benchmark"
QUESTION = "How much does an adult ticket cost?"


def build(db: Path, passages: int) -> None:
    """The sample corpus plus ``passages`` distinct one-sentence passages (10 per document)."""
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.types import Document

    rnd = random.Random(0)
    words = ("north", "south", "east", "west", "upper", "lower", "old", "new", "main", "side")
    docs = [Document(f"crates-{d}", f"Store room log {d}", " ".join(
        f"Crate {d * 10 + i} on shelf {rnd.randint(1, 99)} of the {rnd.choice(words)} store holds item "
        f"{rnd.randint(1000, 99999)}." for i in range(10))) for d in range(passages // 10)]
    with EdgeRAG(db) as rag:
        rag.add_files([ROOT / "edge_rag" / "sample" / "docs"])
        rag.add_documents(docs)
        print(f"store {db}: {rag.store.count} passages", file=sys.stderr)


def run(db: Path, clients: int, seconds: float) -> dict:
    env = {**os.environ, "EDGE_RAG_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "edge_rag", "serve", "--db", str(db), "--port", "0"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split(" on ")[1].strip().rstrip("/")
        server = psutil.Process(proc.pid)
        rss: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                rss.append(server.memory_info().rss / 2**20)
                time.sleep(0.1)

        def ask(until: float) -> list[float]:
            times = []
            with httpx.Client(timeout=120) as c:
                while time.monotonic() < until:
                    t = time.perf_counter()
                    c.post(f"{url}/api/ask", json={"question": QUESTION}).raise_for_status()
                    times.append((time.perf_counter() - t) * 1000)
            return times

        statuses: collections.Counter[int] = collections.Counter()

        def deep(until: float) -> None:
            with httpx.Client(timeout=600, headers={"authorization": f"Bearer {TOKEN}"}) as c:
                while time.monotonic() < until:
                    statuses[c.get(f"{url}/api/health", params={"deep": "1"}).status_code] += 1

        ask(time.monotonic() + 5)  # warm up
        threading.Thread(target=sample, daemon=True).start()
        time.sleep(0.5)
        before = rss[-1]
        alone = ask(time.monotonic() + seconds)
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=deep, args=(until,)) for _ in range(clients)]
        for t in threads:
            t.start()
        loaded = ask(until)
        for t in threads:
            t.join()
        done.set()

        def pct(xs: list[float]) -> dict:
            return {"n": len(xs), "p50_ms": round(float(np.percentile(xs, 50)), 1),
                    "p95_ms": round(float(np.percentile(xs, 95)), 1), "max_ms": round(max(xs), 1)}

        return {"questions_alone": pct(alone), "questions_with_deep_clients": pct(loaded), "deep_clients": clients,
                "deep_statuses": dict(statuses), "rss_before_mb": round(before, 1), "rss_peak_mb": round(max(rss), 1)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passages", type=int, default=26000)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--db", type=Path, default=home() / "deep-health-db", help="built here on first use")
    args = p.parse_args(argv)
    if not args.db.exists():
        build(args.db, args.passages)
    print(json.dumps(run(args.db, args.clients, args.seconds), indent=2))


if __name__ == "__main__":
    main()
