"""CPU seconds of the bundle's encoder for the same work with 1 and with 2 onnxruntime threads: why `make test` gives
each of its two files at a time one thread (tests/isolated.py) rather than the whole machine each.

Usage: ``python -m benchmarks.experiments.thread_cost [--questions 300]``; one line per thread count: CPU seconds
(user + sys of this process) for that many single-question encodes, then for the same questions as one batch.
"""
from __future__ import annotations

import argparse
import resource

from edge_rag.models import bundle as B
from edge_rag.models.registry import default_bundle
from edge_rag.retrieval.encode import Encoder


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.thread_cost", description=__doc__)
    p.add_argument("--questions", type=int, default=300)
    args = p.parse_args(argv)
    bundle = B.Bundle.load(default_bundle("gemma"))
    questions = [f"What is the opening time of hall number {i} on a sunday afternoon?" for i in range(args.questions)]
    for threads in (1, 2):
        encoder = Encoder(bundle.require(B.ROLE_ENCODER), bundle.require(B.ROLE_TOKENIZER), threads=threads)
        encoder.encode_one(questions[0])  # warm-up
        start = cpu_s()
        for q in questions:
            encoder.encode_one(q)
        single = cpu_s() - start
        start = cpu_s()
        encoder.encode(questions)
        print(f"{threads} thread(s): {len(questions)} single encodes {single:.2f} s CPU, "
              f"one batch {cpu_s() - start:.2f} s CPU")


if __name__ == "__main__":
    main()
