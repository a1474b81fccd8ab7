"""llama.cpp with and without flash attention, as `Generator` loads the bundle's GGUF: prompt and decode speed and
the memory a long prompt adds, against `generator_estimate` (docs/decisions/flash-attention.md).

Usage: ``python -m benchmarks.experiments.flash_attention [--n-ctx 1024,4096,8192] [--threads 2]``. Each point runs
in a fresh process (RSS high-water marks never go down): load, evaluate a prompt of n_ctx - 70 tokens (the sample
documents, repeated) in one call, then decode 64 tokens greedily, one call each. One line per n_ctx and setting:
ms per prompt token, ms per decoded token, RSS after load and the peak's rise over it, and the estimate's compute part.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

NEW_TOKENS = 64


def point(n_ctx: int, flash_attn: bool, threads: int) -> dict:
    """One measurement in this process (call it in a fresh one)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as Generator
    import llama_cpp
    import numpy as np

    from edge_rag.cli.commands import SAMPLE_DIR
    from edge_rag.memory import peak_rss_mb, rss_mb
    from edge_rag.memory.estimate import generator_estimate
    from edge_rag.memory.gguf import read_gguf
    from edge_rag.models import bundle as B
    from edge_rag.models.registry import default_bundle

    gguf = B.Bundle.load(default_bundle()).require(B.ROLE_GENERATOR)
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_batch=min(512, n_ctx),
                          flash_attn=flash_attn, seed=0, verbose=False)
    loaded = rss_mb()
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((SAMPLE_DIR / "docs").glob("*.md")))
    tokens = llm.tokenize(text.encode())
    prompt = (tokens * (n_ctx // len(tokens) + 1))[: n_ctx - 70]
    start = time.perf_counter()
    llm.eval(prompt)
    prompt_ms = (time.perf_counter() - start) * 1e3 / len(prompt)
    start = time.perf_counter()
    for _ in range(NEW_TOKENS):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        llm.eval([int(logits.argmax())])
    decode_ms = (time.perf_counter() - start) * 1e3 / NEW_TOKENS
    estimate = generator_estimate(read_gguf(gguf), n_ctx).parts
    return {"n_ctx": n_ctx, "flash_attn": flash_attn, "prompt_ms_per_token": round(prompt_ms, 2),
            "decode_ms_per_token": round(decode_ms, 2), "rss_after_load_mb": round(loaded, 1),
            "compute_rise_mb": round(peak_rss_mb() - loaded, 1), "estimated_compute_mb": round(estimate["compute"], 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.flash_attention", description=__doc__)
    p.add_argument("--n-ctx", default="1024,4096,8192", help="comma-separated context sizes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--point", nargs=2, metavar=("N_CTX", "FLASH_ATTN"), help=argparse.SUPPRESS)  # the child's job
    args = p.parse_args(argv)
    if args.point:
        print(json.dumps(point(int(args.point[0]), args.point[1] == "on", args.threads)))
        return
    for n_ctx in (int(n) for n in args.n_ctx.split(",")):
        for setting in ("off", "on"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.experiments.flash_attention", "--point",
                                  str(n_ctx), setting, "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"n_ctx {n_ctx:>6}  flash attention {setting:>3}: prompt {row['prompt_ms_per_token']:.2f} ms/token, "
                  f"decode {row['decode_ms_per_token']:.2f} ms/token, RSS after load {row['rss_after_load_mb']:.0f} MB, "
                  f"+{row['compute_rise_mb']:.1f} MB over it (estimated compute {row['estimated_compute_mb']:.1f})",
                  flush=True)


if __name__ == "__main__":
    main()
