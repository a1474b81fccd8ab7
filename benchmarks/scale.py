"""Retrieval at scale: HNSW (hnswlib, the Config's M / ef) against exact search (numpy matmul).

Each corpus size runs in a fresh process (``python -m benchmarks.scale``), so its peak RSS is its own
and a 1M-vector index never inflates the benchmark process. Index memory is the size hnswlib serialises
(its vectors and graph links): RSS deltas inside one process are hidden by the allocator reusing freed
heap. Real passage embeddings are used up to the number we have; beyond that, synthetic vectors are
real embeddings plus Gaussian noise of norm ``NOISE_NORM``, renormalised: they keep the cluster
structure of text embeddings, whereas uniform random unit vectors are a worst case for HNSW that no
text corpus looks like.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import hnswlib
import numpy as np
from tqdm import tqdm

from benchmarks.rss import peak_rss_mb

if TYPE_CHECKING:
    from edge_rag import Config

QUICK_SIZES = (1_000, 10_000, 100_000)
FULL_SIZES = QUICK_SIZES + (1_000_000,)
NOISE_NORM = 0.5
MAX_QUERIES = 200
K = 10
CHUNK = 100_000  # synthetic rows generated at a time (bounds the float temporaries)
MB = 2**20
PASSAGES_PER_DOCUMENT = 5  # corpus rows per document in the store benchmarks: each passage gets neighbours

SIZE_SUFFIXES = {"k": 1_000, "m": 1_000_000}


def corpus_sizes(text: str) -> list[int]:
    """``"1k,10k,100k,1M"`` (or plain integers) → [1000, 10000, 100000, 1000000]."""
    sizes = []
    for raw in filter(None, (s.strip() for s in text.split(","))):
        scale_by = SIZE_SUFFIXES.get(raw[-1].lower(), 1)
        digits = raw[:-1] if scale_by > 1 else raw
        if not digits.isdigit() or int(digits) == 0:
            raise argparse.ArgumentTypeError(f"corpus size {raw!r} is not a positive integer with optional k/M")
        sizes.append(int(digits) * scale_by)
    return sizes


def documents(rows: list[tuple[str, str]], prefix: str = "v", per_document: int = PASSAGES_PER_DOCUMENT) -> list:
    """The corpus rows (title, text), in order, as parts of whole documents of ``per_document`` consecutive
    passages: the full-text index then holds each passage's context (its neighbours' text) as a real corpus's
    sentences have, so its size and search cost are measured, not skipped."""
    from edge_rag.storage.store_db import Part
    from edge_rag.types import Document

    parts = []
    for k, at in enumerate(range(0, len(rows), per_document)):
        group = rows[at:at + per_document]
        doc = Document(f"{prefix}{k}", group[0][0], " ".join(text for _, text in group))
        parts.append(Part(doc, 0, [text for _, text in group], last=True, sha=doc.doc_id))
    return parts


def corpus(real: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` unit vectors: a seeded sample of the real ones, topped up with noisy copies; and the real row each
    one comes from (so a copy can carry its source passage's text)."""
    rng = np.random.default_rng(seed)
    n_real = min(n, len(real))
    x = np.empty((n, real.shape[1]), dtype=np.float32)
    source = np.empty(n, dtype=np.int64)
    source[:n_real] = rng.permutation(len(real))[:n_real]
    x[:n_real] = real[source[:n_real]]
    sigma = NOISE_NORM / np.sqrt(real.shape[1])
    for start in range(n_real, n, CHUNK):
        rows = slice(start, min(start + CHUNK, n))
        size = rows.stop - rows.start
        source[rows] = rng.integers(0, len(real), size)
        block = real[source[rows]] + sigma * rng.standard_normal((size, real.shape[1]), np.float32)
        x[rows] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return x, source


def point(work: str, n: int, m: int, ef_construction: int, ef_search: int, threads: int, seed: int) -> dict:
    """Build and query one corpus size (runs in its own process)."""
    real = np.load(Path(work) / "real.npy")
    queries = np.load(Path(work) / "queries.npy")
    x, _ = corpus(real, n, seed)
    n_real = min(n, len(real))
    del real
    start = time.perf_counter()
    index = hnswlib.Index(space="cosine", dim=x.shape[1])
    index.init_index(max_elements=n, M=m, ef_construction=ef_construction, random_seed=seed)
    index.add_items(x, np.arange(n), num_threads=threads or -1)
    build_s = time.perf_counter() - start
    saved = Path(work) / f"index-{n}.hnsw"
    index.save_index(str(saved))
    hnsw_mb = saved.stat().st_size / MB
    saved.unlink()
    index.set_ef(max(ef_search, K))
    hnsw_ms, exact_ms, recall = [], [], []
    for q in queries:
        t = time.perf_counter()
        labels, _ = index.knn_query(q[None], k=K)
        hnsw_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        top = np.argpartition(-(x @ q), K)[:K]
        exact_ms.append((time.perf_counter() - t) * 1e3)
        recall.append(len(set(labels[0].tolist()) & set(top.tolist())) / K)
    return {"n": n, "n_real": n_real, "n_synthetic": n - n_real, "build_s": build_s, "hnsw_mb": hnsw_mb,
            "exact_mb": x.nbytes / MB, "peak_rss_mb": peak_rss_mb(), "hnsw_p50_ms": float(np.median(hnsw_ms)),
            "exact_p50_ms": float(np.median(exact_ms)), "recall@10": float(np.mean(recall))}


def run(real: np.ndarray, queries: np.ndarray, sizes: list[int], config: Config, out: Path, seed: int) -> dict:
    """One row per corpus size; real = passage embeddings, queries = question embeddings."""
    rng = np.random.default_rng(seed)
    queries = queries[rng.permutation(len(queries))[:MAX_QUERIES]]
    rows = []
    with tempfile.TemporaryDirectory(dir=Path(out).resolve()) as work:  # the points run from the repository's root
        np.save(Path(work) / "real.npy", np.ascontiguousarray(real, dtype=np.float32))
        np.save(Path(work) / "queries.npy", np.ascontiguousarray(queries, dtype=np.float32))
        for n in tqdm(sizes, desc="scale", unit="size"):
            params = [work, n, config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search, config.threads, seed]
            cmd = [sys.executable, "-m", "benchmarks.scale", *map(str, params)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
            if done.returncode != 0:
                raise RuntimeError(f"scale point n={n} failed:\n{done.stderr[-2000:]}")
            rows.append(json.loads(done.stdout.splitlines()[-1]))
    return {"real_vectors": len(real), "queries": len(queries), "k": K, "noise_norm": NOISE_NORM,
            "M": config.hnsw_m, "ef_construction": config.hnsw_ef_construction,
            "ef_search": config.hnsw_ef_search, "rows": rows}


if __name__ == "__main__":
    work, *numbers = sys.argv[1:]
    print(json.dumps(point(work, *map(int, numbers))))
