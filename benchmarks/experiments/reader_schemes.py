"""The reader's int8 schemes side by side (issue #44): read latency of the same inputs, interleaved in one process.

    python -m benchmarks.experiments.reader_schemes --fp32 RUN/reader.fp32.onnx [--schemes quint8,qint8]
        [--repeats 40] [--threads 2]

Each scheme of ``convert.quantize`` is made from the reader's fp32 export (``make reader`` leaves it in its run
folder), then every scheme reads the same reader-val question over the same 1, 3 and 5 paragraphs in turn, the order
alternating per repeat, so a busy box slows every scheme alike: read the ratios. Their agreement with torch is the
export's parity check (``python -m convert.reader``). Prints JSON: p50 ms per scheme and paragraph count, the ratio
of each to the first scheme, and the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from convert import reader_data as D
from convert.quantize import quantize_int8
from edge_rag.models.registry import default_bundle
from edge_rag.reading.reader import Reader
from edge_rag.types import Passage

PARAGRAPHS = (1, 3, 5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.reader_schemes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fp32", type=Path, required=True, help="the reader's fp32 ONNX export")
    p.add_argument("--schemes", default="quint8,qint8", help="comma-separated convert.quantize schemes")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    schemes = args.schemes.split(",")
    tokenizer = default_bundle() / "tokenizer.json"
    val = D.reader_val()
    paragraphs = list(dict.fromkeys((q.title, q.context) for q in val))
    times: dict[str, dict[int, list[float]]] = {s: {n: [] for n in PARAGRAPHS} for s in schemes}
    with tempfile.TemporaryDirectory() as tmp:
        readers = {s: Reader(quantize_int8(args.fp32, Path(tmp) / f"reader.{s}.onnx", s), tokenizer,
                             threads=args.threads) for s in schemes}
        for r in range(args.repeats):
            question = val[(r * 7) % len(val)].question
            for n in PARAGRAPHS:
                passages = [Passage(i, "", *paragraphs[(r + i) % len(paragraphs)]) for i in range(n)]
                for s in schemes if r % 2 else schemes[::-1]:
                    start = time.perf_counter()
                    readers[s].read(question, passages)
                    times[s][n].append((time.perf_counter() - start) * 1000)
    p50 = {s: {n: statistics.median(t) for n, t in by_n.items()} for s, by_n in times.items()}
    print(json.dumps({"p50_ms": p50, "ratio_to_first": {s: {n: p50[schemes[0]][n] / p50[s][n] for n in PARAGRAPHS}
                                                        for s in schemes},
                      "threads": args.threads, "load_avg_1min": os.getloadavg()[0]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
