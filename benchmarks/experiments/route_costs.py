"""What the RAG route's cuts of issue #44 save, each as an A/B interleaved in one process (the order alternating per
question, so a busy box slows both sides alike: read the ratios), over the benchmark's SQuAD test questions on its
pooled store under the certified default:

    python -m benchmarks.experiments.route_costs [--questions 400]

- search: encode the question, then ``retrieve.search`` (before) | ``retrieve.begin``, encode, ``finish`` (now: the
  lexical search runs beside the encoder); both find the same passages (checked);
- profile: the router's profile computed twice, once by the route stage and once by the certified score (before:
  ``route.profile``'s memo cleared in between) | twice, the second remembered (now);
- memory sample: the Answer's RSS and peak through ``psutil.Process()`` and a read of /proc/self/status (before) |
  ``memory.usage_mb``, one read (now); sampled right after a question, as ``Stages.finish`` samples;
- encoder threads, not a cut (the question session also indexes, and a second session would cost its weights): the
  question's encoding by the session of ``Config.threads`` threads (before) | by one of 1 thread (now); the same
  vectors (checked).

Prints JSON: p50 ms of each side, the ratio now / before, and the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import psutil

from edge_rag import EdgeRAG
from edge_rag.memory import peak_rss_mb, usage_mb
from edge_rag.memory.rss import MB
from edge_rag.models.bundle import ROLE_ENCODER, Bundle
from edge_rag.models.registry import default_bundle, home
from edge_rag.retrieval import retrieve, route
from edge_rag.retrieval.route import search_width

from .. import data
from ..systems import bench_config, preset


def ab(questions: list[str], before: Callable[[str], object], now: Callable[[str], object],
       same: Callable[[object, object], bool] | None = None) -> dict:
    """p50 ms of ``before`` and ``now`` on every question, their order alternating; ``same`` checks their results."""
    ms: dict[str, list[float]] = {"before": [], "now": []}
    for i, q in enumerate(questions):
        out = {}
        for side, fn in (("before", before), ("now", now))[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            out[side] = fn(q)
            ms[side].append((time.perf_counter() - start) * 1e3)
        if same is not None and not same(out["before"], out["now"]):
            raise SystemExit(f"the two sides differ on {q!r}")
    p50 = {side: statistics.median(v) for side, v in ms.items()}
    return {**{f"{side}_p50_ms": round(v, 3) for side, v in p50.items()}, "ratio": round(p50["now"] / p50["before"], 3)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.route_costs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=400)
    args = p.parse_args(argv)
    bundle = Bundle.load(default_bundle("gemma"))
    base = bench_config()
    ds = data.load("squad", data.FILES["squad"], args.questions, 0)
    db, _ = data.open_index(ds, bundle.root, bundle.sha256(ROLE_ENCODER), base, home() / "bench")
    questions = [q.question for q in ds.items]
    out: dict = {"questions": len(questions), "load_before": os.getloadavg()}
    with EdgeRAG(db, bundle=bundle.root, config=preset(base, "certified").with_(index_threads=1)) as rag:
        c, k, store = rag.config, search_width(rag.config), rag.store
        rag.ask(questions[0])  # warm: the reader loaded

        def begun(q: str) -> retrieve.Retrieved:
            search = retrieve.begin(store, q, k, c)
            return search.finish(rag.encoder.encode_one(q))

        out["search"] = ab(questions, lambda q: retrieve.search(store, rag.encoder.encode_one(q), q, k, c), begun,
                           lambda a, b: a == b)
        hits = {q: retrieve.search(store, rag.encoder.encode_one(q), q, k, c).passages for q in questions}

        def twice(q: str, forget: bool) -> np.ndarray:
            route._profile.cache_clear()  # the other side just computed this one
            first = route.profile(q, hits[q])
            if forget:
                route._profile.cache_clear()
            assert np.array_equal(first, second := route.profile(q, hits[q]))
            return second

        out["profile"] = ab(questions, lambda q: twice(q, True), lambda q: twice(q, False))

        ms: dict[str, list[float]] = {"before": [], "now": []}
        for i, q in enumerate(questions):  # each probe right after a question's onnxruntime runs, as Stages.finish
            side = ("before", "now")[i % 2]
            rag.ask(q)
            start = time.perf_counter()
            _ = (psutil.Process().memory_info().rss / MB, peak_rss_mb()) if side == "before" else usage_mb()
            ms[side].append((time.perf_counter() - start) * 1e3)
        p50 = {side: statistics.median(v) for side, v in ms.items()}
        out["memory sample"] = {**{f"{s}_p50_ms": round(v, 3) for s, v in p50.items()},
                                "ratio": round(p50["now"] / p50["before"], 3)}
        one = rag.indexing_encoder()  # 1 thread (index_threads), planned
        out["encoder threads"] = ab(questions, rag.encoder.encode_one, one.encode_one, np.array_equal)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
