"""Where fixed_k's warm time goes against the peer (issue #42), both answering the same questions at the same time.

    python -m benchmarks.experiments.generation_latency WORK [--questions ROWS] [--n 40] [--rounds 1]

WORK is the ``peer`` folder a ``python -m benchmarks`` run leaves (job.json, passages.json, index.faiss); ROWS its
questions.jsonl (the run's questions; default: the job's). The peer (sentence-transformers + FAISS +
llama-cpp-python) and edge-rag's fixed_k each run in a process of their own, as ``benchmarks.peer_worker`` builds
them, but side by side: each question goes to one, then the other (the order alternating), so the load of a shared
box falls on both alike. Per answer: wall ms, tokens in and out, and llama.cpp's own split of its time (prompt
evaluation: ms and tokens actually evaluated, KV-cache hits excluded; decoding: ms). Writes WORK/latency.json and
prints medians and p95.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peer import ROOT

STACKS = ("peer", "edge_rag:fixed_k")
FIELDS = ("ms", "prompt_tokens", "completion_tokens", "prompt_eval_ms", "prompt_evaluated", "decode_ms", "decoded")


def worker(work: Path, stack: str) -> None:
    """Answer the questions read from stdin, one JSON line each on stdout."""
    from benchmarks.peer_worker import edge_answerer, peer_answerer

    job = json.loads((work / "job.json").read_text(encoding="utf-8"))
    answer = peer_answerer(work, job) if stack == "peer" else edge_answerer(stack.split(":", 1)[1], job)
    print("ready", flush=True)
    for line in sys.stdin:
        start = time.perf_counter()
        out = answer(json.loads(line))
        print(json.dumps({**out, "ms": (time.perf_counter() - start) * 1e3}), flush=True)


def summary(rows: list[dict]) -> dict:
    out = {}
    for k in FIELDS:
        values = [r[k] for r in rows if k in r]
        if len(values) > 1:
            out[k] = {"p50": statistics.median(values),
                      "p95": statistics.quantiles(values, n=20, method="inclusive")[18]}
    return out


def parser(doc: str) -> argparse.ArgumentParser:
    """WORK [--questions ROWS] [--n N]: a run's peer folder and which of its questions."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("work", type=Path)
    p.add_argument("--questions", type=Path, help="questions.jsonl of the run (default: the job's questions)")
    p.add_argument("--n", type=int, default=40)
    return p


def job_questions(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The run's job.json and the first ``args.n`` of its questions (from ROWS if given, each once)."""
    job = json.loads((args.work / "job.json").read_text(encoding="utf-8"))
    questions = job["questions"]
    if args.questions:
        with open(args.questions, encoding="utf-8") as f:
            questions = list(dict.fromkeys(json.loads(line)["question"] for line in f))
    return job, questions[: args.n]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    _, questions = job_questions(args)
    # as benchmarks.peer runs its workers, after the systems' run set llama.cpp's passive waiting in its environment
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    procs = {s: subprocess.Popen([sys.executable, "-m", "benchmarks.experiments.generation_latency", "--worker", s,
                                  str(args.work)], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True) for s in STACKS}
    for proc in procs.values():
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def ask(stack: str, question: str) -> dict:
        proc = procs[stack]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(question) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    for stack in STACKS:  # warm-up: the first answer of each process is its cold start, not measured
        ask(stack, questions[0])
    rows: dict[str, list[dict]] = {s: [] for s in STACKS}
    for r in range(args.rounds):
        for i, q in enumerate(questions[1:]):
            for stack in (STACKS if (i + r) % 2 == 0 else STACKS[::-1]):
                rows[stack].append({"question": q, **ask(stack, q)})
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    result = {"questions": len(questions) - 1, "rounds": args.rounds,
              "stacks": {s: {"summary": summary(v), "rows": v} for s, v in rows.items()}}
    (args.work / "latency.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    for s in STACKS:
        print(s, {k: {q: round(x, 1) for q, x in v.items()} for k, v in result["stacks"][s]["summary"].items()})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[3]), sys.argv[2])
    else:
        main()
