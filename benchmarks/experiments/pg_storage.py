"""Where a PostgreSQL store keeps its vectors, and what its searches cost: out of line (PostgreSQL's default for a row
past ~2 kB, which is how stores were written before ``pgsql.INLINE_VECTORS``) against in the row (now).

Usage: ``python -m benchmarks.experiments.pg_storage [--passages 11500] [--searches 50]`` (a throw-away server,
benchmarks/pgserver.py, unless ``$EDGE_RAG_PG_URL`` names one). Per storage, a fresh store gets the same passages
through ``PgStore.add`` (documents of 20 passages of 40 random words; seeded random unit vectors, 384-d: the planner's
choice and the scan's cost do not depend on what the vectors mean), then ``VACUUM ANALYZE``; prints JSON: the table's
own size, the access path PostgreSQL's plan takes for ``PgStore.search`` (top 10) and its p50 in ms.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import numpy as np

from benchmarks.pgserver import PgServer
from benchmarks.scale_backends import fresh_database
from edge_rag.documents.chunk import make_document
from edge_rag.storage import hnsw, pgsql
from edge_rag.storage.pgstore import PgStore
from edge_rag.storage.store import Part

DIM, PER_DOCUMENT, WORDS, K = 384, 20, 40, 10


def measure(url: str, storage: str, vectors: np.ndarray, searches: int) -> dict:
    """One fresh store with its vectors kept ``storage`` (PostgreSQL's EXTENDED: out of line; MAIN: in the row)."""
    import psycopg
    from pgvector.psycopg import register_vector

    rng = np.random.default_rng(1)
    vocabulary = [f"w{i:04d}" for i in range(5000)]
    store = PgStore(url, DIM, "random")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {pgsql.PASSAGES} ALTER COLUMN embedding SET STORAGE {storage}")
    parts = []
    for d in range(len(vectors) // PER_DOCUMENT):
        texts = [" ".join(rng.choice(vocabulary, WORDS)) for _ in range(PER_DOCUMENT)]
        doc = make_document(" ".join(texts), f"document {d}")
        parts.append(Part(doc, 0, texts, True, doc.doc_id))
    for at in range(0, len(parts), 50):
        store.add(parts[at:at + 50], vectors[at * PER_DOCUMENT:(at + 50) * PER_DOCUMENT])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {pgsql.PASSAGES}")
        register_vector(conn)
        conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(hnsw.ef_for(store.count, K, 64)),))
        plan = [r[0] for r in conn.execute("EXPLAIN " + pgsql.SEARCH, {"q": vectors[0], "k": K})]
        table_mb = conn.execute(f"SELECT pg_relation_size('{pgsql.PASSAGES}')").fetchone()[0] / 2**20
    store.search(vectors[0], K)  # warm: the pool's connections and the table's pages
    ms = []
    for v in vectors[1:searches + 1]:
        start = time.perf_counter()
        store.search(v, K)
        ms.append((time.perf_counter() - start) * 1000)
    store.close()
    return {"storage": storage, "passages": len(vectors), "table_mb": round(table_mb, 1),
            "plan": next(line.strip().removeprefix("->  ") for line in plan if "Scan" in line).split("  (")[0],
            "search_p50_ms": round(statistics.median(ms), 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiments.pg_storage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=11_500)
    p.add_argument("--searches", type=int, default=50)
    args = p.parse_args(argv)
    vectors = np.random.default_rng(0).normal(size=(args.passages, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with contextlib.ExitStack() as stack:
        admin = os.environ.get("EDGE_RAG_PG_URL") or stack.enter_context(PgServer({"fsync": "off"})).url
        rows = [measure(fresh_database(admin, f"edge_rag_storage_{s.lower()}"), s, vectors, args.searches)
                for s in ("EXTENDED", "MAIN")]
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
