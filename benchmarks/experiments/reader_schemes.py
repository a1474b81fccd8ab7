"""The reader's int8 schemes side by side (issue #44): read latency of the same inputs, interleaved in one process.

    python -m benchmarks.experiments.reader_schemes --fp32 RUN/reader.fp32.onnx [--schemes quint8,qint8]
        [--repeats 40] [--threads 2] [--layers 12]
    python -m benchmarks.experiments.reader_schemes --int8 edge_rag/assets/reader.onnx --schemes qint8,quint8,fp32

Each scheme of ``convert.quantize`` is made from the reader's fp32 export (``make reader`` leaves it in its run
folder; ``--int8`` makes one from a shipped int8 reader, whose weights are then int8-rounded; ``fp32`` is that
export itself), then every scheme reads the same reader-val question over the same 1, 3 and 5 paragraphs in turn,
the order alternating per repeat, so a busy box slows every scheme alike: read the ratios. Their agreement with torch is the
export's parity check (``python -m convert.reader``). Prints JSON: p50 ms per scheme and paragraph count, the ratio
of each to the first scheme, and the load average. ``--layers N`` adds a reader N layers deep of the same width,
in the last scheme, with random weights: what a deeper base (issue #44 item 3: multilingual-e5-small, 12 layers of
MiniLM's 384 × 1536 shape) would cost to read, before training one (int8 kernels take as long whatever the values).
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
from convert.reader import export_fp32
from convert.reader_model import SpanReader, load_model, model_dir
from edge_rag.models.registry import default_bundle
from edge_rag.reading.reader import Reader
from edge_rag.types import Passage

PARAGRAPHS = (1, 3, 5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.reader_schemes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--fp32", type=Path, help="the reader's fp32 ONNX export")
    source.add_argument("--int8", type=Path, help="a shipped int8 reader.onnx, dequantized into an fp32 export first")
    p.add_argument("--schemes", default="quint8,qint8",
                   help="comma-separated convert.quantize schemes; `fp32` reads the --fp32 export itself")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=0, help="also a reader this many layers deep (random weights)")
    args = p.parse_args(argv)
    names = args.schemes.split(",")
    tokenizer = default_bundle() / "tokenizer.json"
    val = D.reader_val()
    paragraphs = list(dict.fromkeys((q.title, q.context) for q in val))
    with tempfile.TemporaryDirectory() as tmp:
        if args.int8:
            args.fp32 = export_fp32(load_model(args.int8), Path(tmp) / "reader.fp32.onnx")
        models = {s: args.fp32 if s == "fp32" else quantize_int8(args.fp32, Path(tmp) / f"reader.{s}.onnx", s)
                  for s in names}
        if args.layers:
            deep = export_fp32(deeper_reader(args.layers), Path(tmp) / "deep.fp32.onnx")
            models[f"{names[-1]}, {args.layers} layers"] = quantize_int8(deep, Path(tmp) / "deep.onnx", names[-1])
        schemes = list(models)
        times: dict[str, dict[int, list[float]]] = {s: {n: [] for n in PARAGRAPHS} for s in schemes}
        readers = {s: Reader(path, tokenizer, threads=args.threads) for s, path in models.items()}
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


def deeper_reader(layers: int):
    """A torch SpanReader ``layers`` deep, of the bundle encoder's width, with random weights."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model_dir(), local_files_only=True, num_hidden_layers=layers)
    return SpanReader(AutoModel.from_config(config, attn_implementation="eager"))


if __name__ == "__main__":
    raise SystemExit(main())
