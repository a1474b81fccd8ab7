"""One measured process of the peer comparison: ``python -m benchmarks.peer_worker build|serve WORK [STACK T0]``.

Imports only what its stack needs, so start-up time and peak RSS are that stack's own. ``serve``
answers the first question (cold start = wall time from the parent's launch stamp T0), then the rest
one by one (warm latency, summarised by the parent as the benchmark's other latencies), and writes ``WORK/STACK.json``.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.rss import peak_rss_mb
from edge_rag.config import default_threads

# What a user gets from a LangChain "stuff" chain: the default RetrievalQA prompt over k passages.
PROMPT = (
    "Use the following pieces of context to answer the question at the end. If you don't know the answer, "
    "just say that you don't know, don't try to make up an answer.\n\n{context}\n\nQuestion: {question}\nHelpful Answer:"
)
SPLIT = ("prompt_eval_ms", "prompt_evaluated", "decode_ms", "decoded")


def _threads(job: dict) -> int:
    return job["threads"] or default_threads()


def build(work: Path, job: dict) -> dict:
    """sentence-transformers embeddings of the same passages into a FAISS flat inner-product index."""
    import faiss
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(_threads(job))
    passages = json.loads((work / "passages.json").read_text(encoding="utf-8"))
    start = time.perf_counter()
    encoder = SentenceTransformer(job["model_dir"], device="cpu")
    vectors = encoder.encode([p["text"] for p in passages], batch_size=32, normalize_embeddings=True)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(work / "index.faiss"))
    return {"passages": len(passages), "build_s": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb()}


def peer_answerer(work: Path, job: dict) -> Callable[[str], dict]:
    """sentence-transformers (torch) + FAISS + llama-cpp-python, unconditional top-k."""
    import faiss
    import torch
    from llama_cpp import Llama
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(_threads(job))
    encoder = SentenceTransformer(job["model_dir"], device="cpu")
    index = faiss.read_index(str(work / "index.faiss"))
    passages = json.loads((work / "passages.json").read_text(encoding="utf-8"))
    llm = Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_threads=_threads(job), seed=0, verbose=False)

    def answer(question: str) -> dict:
        _, ids = index.search(encoder.encode([question], normalize_embeddings=True), job["k"])
        context = "\n".join(f"{passages[i]['title']}: {passages[i]['text']}" for i in ids[0])
        prompt = PROMPT.format(context=context, question=question)
        kw = {"max_tokens": job["max_new_tokens"], "temperature": 0.0, "stop": ["\n"]}
        if job["prompt_style"] == "chat":
            out = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], **kw)
            text = out["choices"][0]["message"]["content"]
        else:
            out = llm.create_completion(prompt, **kw)
            text = out["choices"][0]["text"]
        return {"answer": text.strip(), "prompt_tokens": out["usage"]["prompt_tokens"],
                "completion_tokens": out["usage"]["completion_tokens"], "route": "GPT", **llm_split(llm)}

    return answer


def llm_split(llm) -> dict:
    """llama.cpp's own timings of the answer just made (then reset for the next): prompt evaluation and decoding,
    milliseconds and tokens. Prompt tokens found in the KV cache are not evaluated again, so they are not counted."""
    import llama_cpp

    perf = llama_cpp.llama_perf_context(llm._ctx.ctx)  # llama-cpp-python exposes no public call for this
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
    return {"prompt_eval_ms": perf.t_p_eval_ms, "prompt_evaluated": perf.n_p_eval, "decode_ms": perf.t_eval_ms,
            "decoded": perf.n_eval}


def edge_answerer(system: str, job: dict) -> Callable[[str], dict]:
    """edge-rag with one of the benchmark presets, on the benchmark's prebuilt store, its models loaded before the
    first question as ``edge-rag serve`` loads them (``warm_up``), as the peer loads llama.cpp: loaded at the first
    generated answer instead, a stack whose first question is not generated for (``full_cgr``) left llama.cpp out of
    its cold start and peak RSS, and a warm answer that generated paid its load."""
    from benchmarks.systems import preset, settings_config
    from edge_rag import EdgeRAG

    rag = EdgeRAG(job["db"], bundle=job["bundle"], config=preset(settings_config(job["config"]), system))
    rag.warm_up()

    def answer(question: str) -> dict:
        a = rag.ask(question)
        split = llm_split(rag.generator.llm) if a.prompt_tokens else {}  # no LLM call: nothing to read
        return {"answer": a.answer, "prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
                "route": a.route.value, **split}

    return answer


def serve(work: Path, job: dict, stack: str, t0: float) -> dict:
    answer = peer_answerer(work, job) if stack == "peer" else edge_answerer(stack.split(":", 1)[1], job)
    first = answer(job["questions"][0])
    cold_start_s = time.time() - t0
    warm, answers = [], [first]
    for question in job["questions"][1:]:
        start = time.perf_counter()
        answers.append(answer(question))
        warm.append((time.perf_counter() - start) * 1e3)
    routes = [a["route"] for a in answers]
    # where a warm answer's time went, by llama.cpp (answers that called it); tokens in and out of every answer
    split = {k: statistics.median(v) for k in SPLIT if (v := [a[k] for a in answers[1:] if k in a])}
    return {"cold_start_s": cold_start_s, "warm_ms": warm, "peak_rss_mb": peak_rss_mb(),
            "prompt_tokens": statistics.fmean(a["prompt_tokens"] for a in answers),
            "completion_tokens": statistics.fmean(a["completion_tokens"] for a in answers),
            "llm_p50": split, "routes": {r: routes.count(r) for r in sorted(set(routes))}}


if __name__ == "__main__":
    mode, folder, *rest = sys.argv[1:]
    work = Path(folder)
    job = json.loads((work / "job.json").read_text(encoding="utf-8"))
    if mode == "build":
        result, name = build(work, job), "build"
    else:
        result, name = serve(work, job, rest[0], float(rest[1])), rest[0].replace(":", "-")
    (work / f"{name}.json").write_text(json.dumps(result), encoding="utf-8")
