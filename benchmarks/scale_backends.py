"""The two passage stores side by side at scale: embedded (SQLite + hnswlib) vs PostgreSQL + pgvector.

The same vectors (``scale.corpus``: real passage embeddings topped up with noisy copies) and the same
question embeddings go to both, through the real store classes (``open_store``). Per size and backend:
build time, query p50 / p95 of ``store.search`` (top-10 with passage texts; for pgvector including the
loopback round trip), recall@10 against exact search, and the **device RSS**: a fresh process that
imports edge_rag, opens the store and runs every query (VmHWM). The models are not loaded there: they
cost the same on both sides, so the difference is the store's. Each step runs in its own process.

pgvector is bulk-loaded as its documentation advises for an initial load (COPY, then CREATE INDEX with a
large ``maintenance_work_mem``); incremental ``PgStore.add`` inserts go through the HNSW index one row
at a time and are much slower (``inserts_per_s``: 1,000 rows added to the built store). The server is a
throw-away one (benchmarks/pgserver.py) unless ``$EDGE_RAG_PG_URL`` names one (its role needs CREATEDB).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from tqdm import tqdm

from benchmarks.rss import peak_rss_mb
from benchmarks.scale import MAX_QUERIES, K, corpus

if TYPE_CHECKING:  # importing edge_rag at module level would be measured in the device processes
    from edge_rag import Config

MIN_SIZE = 10_000  # make bench compares the stores at its scale sizes from here up (quick: 10k, 100k; FULL: + 1M)
ENCODER_ID = "scale-benchmark"
DB_ENV = "EDGE_RAG_SCALE_DB"
INSERT_SAMPLE = 1_000
SERVER_SETTINGS = {"shared_buffers": "2GB", "max_parallel_maintenance_workers": "1", "max_wal_size": "4GB"}
MAINTENANCE_BYTES_PER_VECTOR = 4096  # vector + HNSW graph while CREATE INDEX builds in memory (measured ~2.4 kB)


def _store_args(dim: int, m: int, efc: int, efs: int):
    from edge_rag.config import Config

    return dim, ENCODER_ID, Config(hnsw_m=m, hnsw_ef_construction=efc, hnsw_ef_search=efs)


def _timed_queries(store, queries: np.ndarray, x: np.ndarray) -> dict:
    ms, recall = [], []
    for q in queries:
        t = time.perf_counter()
        hits = store.search(q, K)
        ms.append((time.perf_counter() - t) * 1e3)
        exact = np.argpartition(-(x @ q), K)[:K]
        recall.append(len({p.id for p in hits} & set(exact.tolist())) / K)
    return {"p50_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)), "recall@10": float(np.mean(recall))}


def build(work: str, backend: str, db: str, n: int, m: int, efc: int, efs: int, seed: int) -> dict:
    """Build one store of ``n`` passages and query it (its own process)."""
    from edge_rag.stores import Part, open_store
    from edge_rag.types import Document

    real = np.load(Path(work) / "real.npy")
    queries = np.load(Path(work) / "queries.npy")
    x, _ = corpus(real, n, seed)
    del real
    docs = [Document(f"v{i}", "", f"passage {i}") for i in range(n)]
    start = time.perf_counter()
    store = open_store(db, *_store_args(x.shape[1], m, efc, efs))
    if backend == "embedded":
        store.add([Part(d, 0, [d.text], last=True) for d in docs], x)
    else:
        _bulk_load(store, docs, x, m, efc)
    build_s = time.perf_counter() - start
    row = {"backend": backend, "n": n, "build_s": build_s, **_timed_queries(store, queries, x)}
    if backend == "pgvector":
        row["server_p50_ms"] = _server_p50(store, queries)
        # incremental adds into the built index, one transaction
        extra = [Document(f"w{i}", "", f"added {i}") for i in range(INSERT_SAMPLE)]
        t = time.perf_counter()
        store.add([Part(d, 0, [d.text], last=True) for d in extra], x[:INSERT_SAMPLE])
        row["inserts_per_s"] = INSERT_SAMPLE / (time.perf_counter() - t)
    store.close()
    return {**row, "build_peak_rss_mb": peak_rss_mb()}


def _server_p50(store, queries: np.ndarray) -> float:
    """Median execution time inside PostgreSQL (EXPLAIN ANALYZE): the query without the round trip and
    without the wait for a CPU, which on a loaded machine dominates the client-side figure."""
    from edge_rag.pgstore import _SEARCH

    ms = []
    with store.pool.connection() as conn:
        for q in queries:
            plan = conn.execute("EXPLAIN (ANALYZE, TIMING OFF) " + _SEARCH, (q, K)).fetchall()
            ms += [float(line[0].split(":")[1].split()[0]) for line in plan if line[0].startswith("Execution Time")]
    return float(np.median(ms))


def _bulk_load(store, docs: list, x: np.ndarray, m: int, efc: int) -> None:
    """COPY every row, then build the HNSW index once (pgvector's advice for an initial load)."""
    from edge_rag.pgstore import DOCUMENTS, META, PASSAGES

    mem_mb = max(1024, len(x) * MAINTENANCE_BYTES_PER_VECTOR // 2**20)
    with store.pool.connection() as conn, conn.transaction():
        conn.execute(f"DROP INDEX {PASSAGES}_hnsw")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {DOCUMENTS} (doc_id, title, source) FROM STDIN") as copy:
                for d in docs:
                    copy.write_row((d.doc_id, d.title, "scale"))
            with cur.copy(f"COPY {PASSAGES} (id, doc_id, title, text, position, embedding) FROM STDIN "
                          "(FORMAT BINARY)") as copy:
                copy.set_types(["int8", "text", "text", "text", "int4", "vector"])
                for i, d in enumerate(docs):
                    copy.write_row((i, d.doc_id, d.title, d.text, 0, x[i]))
        conn.execute(f"SET LOCAL maintenance_work_mem = '{mem_mb}MB'")
        conn.execute(f"CREATE INDEX {PASSAGES}_hnsw ON {PASSAGES} USING hnsw (embedding vector_cosine_ops) "
                     f"WITH (m = {m}, ef_construction = {efc})")
        conn.execute(f"UPDATE {META} SET value = %s WHERE key = 'count'", (str(len(docs)),))
        conn.execute(f"UPDATE {META} SET value = '1' WHERE key = 'version'")
        conn.execute(f"ANALYZE {PASSAGES}")


def device(work: str, db: str, m: int, efc: int, efs: int) -> dict:
    """What a device holds: edge_rag imported, the store open, every query run (its own process)."""
    import edge_rag  # noqa: F401 — the runtime's libraries, as on a device
    from edge_rag.stores import open_store

    queries = np.load(Path(work) / "queries.npy")
    base = peak_rss_mb()
    start = time.perf_counter()
    store = open_store(db, *_store_args(queries.shape[1], m, efc, efs))
    open_s = time.perf_counter() - start
    for q in queries:
        store.search(q, K)
    store.close()
    return {"device_rss_mb": peak_rss_mb(), "device_base_mb": base, "open_s": open_s, "load_avg": os.getloadavg()[0]}


def _worker(step: str, db: str, *args: object) -> dict:
    """Run ``step`` in a fresh process; the store's URL goes by environment, never on a command line."""
    cmd = [sys.executable, "-m", "benchmarks.scale_backends", step, *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, DB_ENV: db})
    if done.returncode != 0:
        raise RuntimeError(f"{step} {args[:3]} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def run(real: np.ndarray, queries: np.ndarray, sizes: list[int], config: Config, out: Path, seed: int) -> dict:
    """Both backends at every size; pgvector is skipped, with the reason, when no server can be had."""
    rng = np.random.default_rng(seed)
    queries = queries[rng.permutation(len(queries))[:MAX_QUERIES]]
    hnsw = (config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search)
    server, admin = None, os.environ.get("EDGE_RAG_PG_URL")
    result: dict = {"queries": len(queries), "k": K, "M": hnsw[0], "ef_construction": hnsw[1], "ef_search": hnsw[2],
                    "rows": []}
    try:
        if not admin:
            from benchmarks.pgserver import PgServer

            server = PgServer(SERVER_SETTINGS).start()
            admin = server.url
    except (ImportError, RuntimeError) as exc:
        result["pgvector_skipped"] = str(exc)
    try:
        with tempfile.TemporaryDirectory(dir=out) as work:
            np.save(Path(work) / "real.npy", np.ascontiguousarray(real, dtype=np.float32))
            np.save(Path(work) / "queries.npy", np.ascontiguousarray(queries, dtype=np.float32))
            for n in tqdm(sizes, desc="stores at scale", unit="size"):
                dbs = {"embedded": str(Path(work) / f"store-{n}")}
                if admin:
                    dbs["pgvector"] = _database(admin, f"edge_rag_scale_{n}")
                for backend, db in dbs.items():
                    row = _worker("build", db, work, backend, n, *hnsw, seed)
                    result["rows"].append({**row, **_worker("device", db, work, *hnsw)})
    finally:
        if server:
            server.stop()
    return result


def _database(admin_url: str, name: str) -> str:
    """A fresh database ``name`` on the server; its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


def report(result: dict) -> str:
    """The side-by-side table for report.md."""
    if not result.get("rows"):
        return ""
    head = (f"\nBoth stores, same vectors and {result['queries']} queries, top-{result['k']} with passage texts "
            f"(HNSW M={result['M']}, ef_construction={result['ef_construction']}, ef_search={result['ef_search']}). "
            "Device RSS = a fresh process with edge_rag imported and the store open, after every query (models "
            "not loaded: the same on both sides). pgvector: bulk COPY + CREATE INDEX; p50/p95 include the "
            "loopback round trip and the wait for a CPU (server = execution inside PostgreSQL); load = the "
            "machine's 1-minute load average at the time.\n")
    if "pgvector_skipped" in result:
        head += f"pgvector skipped: {result['pgvector_skipped']}\n"
    rows = []
    for r in result["rows"]:
        rows.append([f"{r['n']:,}", r["backend"], f"{r['build_s']:.1f}", f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}",
                     f"{100 * r['recall@10']:.1f}%", f"{r['device_rss_mb']:.0f}",
                     f"{r['inserts_per_s']:.0f}" if "inserts_per_s" in r else "–",
                     f"{r['server_p50_ms']:.2f}" if "server_p50_ms" in r else "–", f"{r['load_avg']:.1f}"])
    lines = ["| vectors | store | build s | p50 ms | p95 ms | recall@10 | device RSS MB | adds/s after | server p50 ms "
             "| load |", "|---|---|---|---|---|---|---|---|---|---|"] + ["| " + " | ".join(r) + " |" for r in rows]
    return head + "\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    step, work, *params = sys.argv[1:]
    if step == "build":
        backend, *numbers = params
        print(json.dumps(build(work, backend, os.environ[DB_ENV], *map(int, numbers))))
    else:
        print(json.dumps(device(work, os.environ[DB_ENV], *map(int, params))))
