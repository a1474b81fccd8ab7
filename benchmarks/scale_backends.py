"""The two passage stores side by side at scale: embedded (SQLite + hnswlib) vs PostgreSQL + pgvector.

The same corpus (``scale.corpus``: real passage embeddings topped up with noisy copies, each row carrying its
source passage's title and text, so vector and text agree) and the same real questions (their embeddings and
their texts) go to both, through the real store classes (``open_store``). Per size and backend, each store is
built twice: as shipped, with its full-text index (SQLite FTS5 / a generated tsvector column + GIN), and without
it (``drop_full_text``, benchmark only), to show what the index costs. Per build: build time, size on disk,
query p50 / p95 of dense ``store.search`` (top-10 with passage texts; for pgvector including the loopback round
trip), of lexical ``store.search_text`` and of hybrid ``retrieve.search`` (the default Config: both, fused), and
recall@10 of dense against exact search. For the shipped store, the **device RSS**: a fresh process that imports
edge_rag, opens the store and retrieves every question as the pipeline does (VmHWM). The models are not loaded
there: they cost the same on both sides, so the difference is the store's. Each step runs in its own process.

pgvector is bulk-loaded as its documentation advises for an initial load (COPY, then CREATE INDEX with a
large ``maintenance_work_mem``; PostgreSQL computes the tsvector column during the COPY); incremental
``PgStore.add`` inserts go through the indexes one row at a time and are much slower (``inserts_per_s``: 1,000
rows added to the built store). The server is a throw-away one (benchmarks/pgserver.py) unless
``$EDGE_RAG_PG_URL`` names one (its role needs CREATEDB).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from tqdm import tqdm

from benchmarks.rss import peak_rss_mb
from benchmarks.scale import MAX_QUERIES, MB, K, corpus, corpus_sizes, documents

if TYPE_CHECKING:  # importing edge_rag at module level would be measured in the device processes
    from edge_rag import Config
    from edge_rag.storage.store import Store
    from edge_rag.storage.stores import PassageStore

MIN_SIZE = 10_000  # make bench compares the stores at its scale sizes from here up (quick: 10k, 100k; FULL: + 1M)
ENCODER_ID = "scale-benchmark"
DB_ENV = "EDGE_RAG_SCALE_DB"
INSERT_SAMPLE = 1_000
SERVER_SETTINGS = {"shared_buffers": "2GB", "max_parallel_maintenance_workers": "1", "max_wal_size": "4GB"}
ROWS_FILE = "scale_stores.jsonl"  # in the output folder: each row as it is measured
MAINTENANCE_BYTES_PER_VECTOR = 4096  # vector + HNSW graph while CREATE INDEX builds in memory (measured ~2.4 kB)


def stored_passages(store: Store) -> tuple[np.ndarray, list[list[str]]]:
    """Every passage of an embedded store: its vectors and [title, text], in step (the scale corpus's sources)."""
    rows = store.db.execute("SELECT id, title, text FROM passages ORDER BY id").fetchall()
    vectors = store.index.get_items([r[0] for r in rows], return_type="numpy")
    return np.asarray(vectors, dtype=np.float32), [[title, text] for _, title, text in rows]


def _config(m: int, efc: int, efs: int) -> Config:
    from edge_rag.config import Config

    return Config(hnsw_m=m, hnsw_ef_construction=efc, hnsw_ef_search=efs)


def write_inputs(work: Path, real: np.ndarray, queries: np.ndarray, texts: list[list[str]], questions: list[str]
                 ) -> None:
    """What the step processes read from ``work``: the real passage vectors with their [title, text], the question
    embeddings with their texts."""
    np.save(work / "real.npy", np.ascontiguousarray(real, dtype=np.float32))
    np.save(work / "queries.npy", np.ascontiguousarray(queries, dtype=np.float32))
    (work / "texts.json").write_text(json.dumps(texts), "utf-8")
    (work / "questions.json").write_text(json.dumps(questions), "utf-8")


def _inputs(work: str) -> tuple[np.ndarray, list[str]]:
    """The question embeddings and their texts."""
    return np.load(Path(work) / "queries.npy"), json.loads((Path(work) / "questions.json").read_text("utf-8"))


def build(work: str, backend: str, db: str, n: int, m: int, efc: int, efs: int, seed: int, full_text: int) -> dict:
    """Build one store of ``n`` passages, with or without its full-text index, and query it (its own process)."""
    from edge_rag.storage.stores import open_store

    real = np.load(Path(work) / "real.npy")
    texts = json.loads((Path(work) / "texts.json").read_text("utf-8"))
    queries, questions = _inputs(work)
    x, source = corpus(real, n, seed)
    del real
    parts = documents([tuple(texts[j]) for j in source.tolist()])
    config = _config(m, efc, efs)
    store = open_store(db, x.shape[1], ENCODER_ID, config)
    if not full_text:
        drop_full_text(store, backend)
    start = time.perf_counter()
    if backend == "embedded":
        store.add(parts, x)
    else:
        _bulk_load(store, parts, x, m, efc, bool(full_text))
    def reopen() -> PassageStore:
        return open_store(db, x.shape[1], ENCODER_ID, config)

    row = {"backend": backend, "n": n, "full_text": bool(full_text), "build_s": time.perf_counter() - start,
           "disk_mb": _disk_mb(store, backend),
           **_searches(store, reopen, queries, questions, x, config, bool(full_text))}
    if backend == "pgvector":
        from edge_rag.storage.pgsql import SEARCH, SEARCH_TEXT

        row["server_p50_ms"] = _server_p50(store, SEARCH, [{"q": q, "k": K, "exact": []} for q in queries])
        if full_text:
            row["server_lexical_p50_ms"] = _server_p50(store, SEARCH_TEXT, _lexical_params(store, questions))
        # incremental adds into the built indexes, one transaction
        extra = documents([(p.doc.title, t) for p in parts for t in p.texts][:INSERT_SAMPLE], prefix="w")
        t = time.perf_counter()
        store.add(extra, x[:INSERT_SAMPLE])
        row["inserts_per_s"] = len(extra) / (time.perf_counter() - t)
    store.close()
    return {**row, "build_peak_rss_mb": peak_rss_mb()}


def drop_full_text(store: PassageStore, backend: str) -> None:
    """Benchmark only: take the full-text index out of a new, empty store (SQLite: the FTS5 table and its triggers;
    PostgreSQL: the tsvector column and its GIN index), to measure what the index costs. The store classes add
    it back when the store is next opened, so a store built without it is only ever used through this object."""
    if backend == "embedded":
        from edge_rag.storage.store_db import FTS_TABLE

        triggers = store.db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'passages'")
        store.db.executescript("".join(f"DROP TRIGGER {name};" for (name,) in triggers.fetchall())
                               + f"DROP TABLE {FTS_TABLE};")
    else:
        from edge_rag.storage.pgsql import PASSAGES

        with store.pool.connection() as conn:
            conn.execute(f"ALTER TABLE {PASSAGES} DROP COLUMN tsv")  # its GIN index goes with it


def _searches(store: PassageStore, reopen: Callable[[], PassageStore], queries: np.ndarray, questions: list[str],
              x: np.ndarray, config: Config, full_text: bool) -> dict:
    """p50 / p95 of every search the store supports (lexical and hybrid need the full-text index), one question at
    a time, and recall@10 of dense search against exact search. Lexical and hybrid each start on a freshly opened
    store: the embedded one remembers the postings of the words it searched, all known to a second pass."""
    from edge_rag.retrieval.lexical import query_terms
    from edge_rag.retrieval.retrieve import search

    modes = {"dense": lambda st, q, s: st.search(q, K)}
    if full_text:
        modes["lexical"] = lambda st, q, s: st.search_text(query_terms(s), K)
        modes["hybrid"] = lambda st, q, s: search(st, q, s, K, config)
    row: dict = {}
    for name, run_one in modes.items():
        st, ms = store if name == "dense" else reopen(), []
        for q, s in zip(queries, questions):
            t = time.perf_counter()
            run_one(st, q, s)
            ms.append((time.perf_counter() - t) * 1e3)
        if st is not store:
            st.close()
        row |= {f"{name}_p50_ms": float(np.median(ms)), f"{name}_p95_ms": float(np.percentile(ms, 95))}
    recall = []
    for q in queries:
        exact = np.argpartition(-(x @ q), K)[:K]
        recall.append(len({p.id for p in store.search(q, K)} & set(exact.tolist())) / K)
    return {**row, "recall@10": float(np.mean(recall))}


def _disk_mb(store: PassageStore, backend: str) -> float:
    """The store's size on disk: SQLite pages (WAL included) + the hnswlib file, or PostgreSQL's two tables with
    their indexes."""
    if backend == "embedded":
        page_count = store.db.execute("PRAGMA page_count").fetchone()[0]
        page_size = store.db.execute("PRAGMA page_size").fetchone()[0]
        return (page_count * page_size + (store.folder / store.index_file).stat().st_size) / MB
    from edge_rag.storage.pgsql import DOCUMENTS, PASSAGES

    with store.pool.connection() as conn:
        size = conn.execute("SELECT pg_total_relation_size(%s) + pg_total_relation_size(%s)",
                            (PASSAGES, DOCUMENTS)).fetchone()[0]
    return size / MB


def _server_p50(store: PassageStore, sql: str, params: list) -> float:
    """Median execution time inside PostgreSQL (EXPLAIN ANALYZE): the query without the round trip and
    without the wait for a CPU, which on a loaded machine dominates the client-side figure."""
    ms = []
    with store.pool.connection() as conn:
        for p in params:
            plan = conn.execute("EXPLAIN (ANALYZE, TIMING OFF) " + sql, p).fetchall()
            ms += [float(line[0].split(":")[1].split()[0]) for line in plan if line[0].startswith("Execution Time")]
    return float(np.median(ms))


def _lexical_params(store: PassageStore, questions: list[str]) -> list[tuple]:
    """SEARCH_TEXT's parameters for each question with content words, as ``PgStore.search_text`` makes them."""
    from edge_rag.retrieval.lexical import query_terms
    from edge_rag.storage.pgsql import postings, text_search_params

    with store.pool.connection() as conn:
        return [text_search_params(terms, postings(conn, terms), K)
                for terms in filter(None, map(query_terms, questions))]


def _bulk_load(store: PassageStore, parts: list, x: np.ndarray, m: int, efc: int, full_text: bool) -> None:
    """COPY every row with its context, then build the HNSW (and GIN) index once (pgvector's advice for an initial
    load)."""
    from edge_rag.storage.pgsql import DOCUMENTS, META, PASSAGES, part_contexts

    mem_mb = max(1024, len(x) * MAINTENANCE_BYTES_PER_VECTOR // 2**20)
    with store.pool.connection() as conn, conn.transaction():
        conn.execute(f"DROP INDEX {PASSAGES}_hnsw")
        if full_text:
            conn.execute(f"DROP INDEX {PASSAGES}_tsv")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {DOCUMENTS} (doc_id, title, source) FROM STDIN") as copy:
                for p in parts:
                    copy.write_row((p.doc.doc_id, p.doc.title, "scale"))
            with cur.copy(f"COPY {PASSAGES} (id, doc_id, title, text, position, context, embedding) FROM STDIN "
                          "(FORMAT BINARY)") as copy:
                copy.set_types(["int8", "text", "text", "text", "int4", "text", "vector"])
                context, _ = part_contexts(conn, parts, 0)  # whole documents: no stored neighbours to read
                rows = ((p.doc.doc_id, p.doc.title, text, pos) for p in parts for pos, text in enumerate(p.texts))
                for i, (doc_id, title, text, pos) in enumerate(rows):
                    copy.write_row((i, doc_id, title, text, pos, context[i], x[i]))
        conn.execute(f"SET LOCAL maintenance_work_mem = '{mem_mb}MB'")
        conn.execute(f"CREATE INDEX {PASSAGES}_hnsw ON {PASSAGES} USING hnsw (embedding vector_cosine_ops) "
                     f"WITH (m = {m}, ef_construction = {efc})")
        if full_text:
            conn.execute(f"CREATE INDEX {PASSAGES}_tsv ON {PASSAGES} USING gin (tsv)")
        conn.execute(f"UPDATE {META} SET value = %s WHERE key = 'count'", (str(len(x)),))
        conn.execute(f"UPDATE {META} SET value = '1' WHERE key = 'version'")
        conn.execute(f"ANALYZE {PASSAGES}")


def device(work: str, db: str, m: int, efc: int, efs: int) -> dict:
    """What a device holds: edge_rag imported, the store open, every question retrieved as the pipeline does
    (the default Config: hybrid) (its own process)."""
    import edge_rag  # noqa: F401 — the runtime's libraries, as on a device
    from edge_rag.retrieval.retrieve import search
    from edge_rag.storage.stores import open_store

    queries, questions = _inputs(work)
    config = _config(m, efc, efs)
    base = peak_rss_mb()
    start = time.perf_counter()
    store = open_store(db, queries.shape[1], ENCODER_ID, config)
    open_s = time.perf_counter() - start
    for q, s in zip(queries, questions):
        search(store, q, s, K, config)
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


def run(real: np.ndarray, queries: np.ndarray, texts: list[list[str]], questions: list[str], sizes: list[int],
        config: Config, out: Path, seed: int) -> dict:
    """Both backends at every size, each with and without its full-text index; ``texts`` ([title, text]) go with
    the rows of ``real``, ``questions`` with those of ``queries``. pgvector is skipped, with the reason, when no
    server can be had."""
    rng = np.random.default_rng(seed)
    picked = rng.permutation(len(queries))[:MAX_QUERIES]
    hnsw = (config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search)
    server, admin = None, os.environ.get("EDGE_RAG_PG_URL")
    result: dict = {"queries": len(picked), "k": K, "M": hnsw[0], "ef_construction": hnsw[1], "ef_search": hnsw[2],
                    "rows": []}
    try:
        if not admin:
            from benchmarks.pgserver import PgServer

            server = PgServer(SERVER_SETTINGS).start()
            admin = server.url
    except (ImportError, RuntimeError) as exc:
        result["pgvector_skipped"] = str(exc)
    (out / ROWS_FILE).unlink(missing_ok=True)  # an earlier run's rows: appended to, the file held two runs' rows
    try:
        with tempfile.TemporaryDirectory(dir=out) as work:
            write_inputs(Path(work), real, queries[picked], texts, [questions[i] for i in picked])
            for n in tqdm(sizes, desc="stores at scale", unit="size"):
                for backend in ["embedded"] + (["pgvector"] if admin else []):
                    for full_text in (1, 0):
                        db = (str(Path(work) / f"store-{n}-{full_text}") if backend == "embedded"
                              else fresh_database(admin, f"edge_rag_scale_{n}"))
                        row = _worker("build", db, work, backend, n, *hnsw, seed, full_text)
                        if full_text:  # opening a store adds its full-text index back: only the full one is reopened
                            row |= _worker("device", db, work, *hnsw)
                        result["rows"].append(row)
                        with open(out / ROWS_FILE, "a", encoding="utf-8") as f:  # a long run's finished rows survive
                            f.write(json.dumps(row) + "\n")
    finally:
        if server:
            server.stop()
    return result


def fresh_database(admin_url: str, name: str) -> str:
    """A fresh database ``name`` on the server; its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


def _ms(r: dict, name: str) -> str:
    """"p50 / p95" of one search, or – when the build had no such search."""
    return f"{r[name + '_p50_ms']:.2f} / {r[name + '_p95_ms']:.2f}" if name + "_p50_ms" in r else "–"


def _cell(r: dict, key: str, fmt: str) -> str:
    return format(r[key], fmt) if key in r else "–"


def _table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def report(result: dict) -> str:
    """The side-by-side tables for report.md: building, then searching."""
    if not result.get("rows"):
        return ""
    head = (f"\nBoth stores, same passages and {result['queries']} real questions, top-{result['k']} with passage "
            f"texts (HNSW M={result['M']}, ef_construction={result['ef_construction']}, "
            f"ef_search={result['ef_search']}); each built with its full-text index (FTS5 / tsvector + GIN) and "
            "without it. Build = loading every passage and building the indexes; disk = SQLite pages + hnswlib file, "
            "or the PostgreSQL tables with their indexes. pgvector: bulk COPY + CREATE INDEX; adds/s = 1,000 "
            "passages added to the built store in one transaction.\n")
    if "pgvector_skipped" in result:
        head += f"pgvector skipped: {result['pgvector_skipped']}\n"
    rows = result["rows"]
    label = [[f"{r['n']:,}", r["backend"], "yes" if r["full_text"] else "no"] for r in rows]
    build = _table(["passages", "store", "full-text", "build s", "disk MB", "build peak RSS MB", "adds/s after"],
                   [lab + [f"{r['build_s']:.1f}", f"{r['disk_mb']:.0f}", f"{r['build_peak_rss_mb']:.0f}",
                           _cell(r, "inserts_per_s", ".0f")] for lab, r in zip(label, rows)])
    search = _table(["passages", "store", "full-text", "dense p50 / p95 ms", "recall@10", "lexical p50 / p95 ms",
                     "hybrid p50 / p95 ms", "server p50 ms dense / lexical", "device RSS MB", "load"],
                    [lab + [_ms(r, "dense"), f"{100 * r['recall@10']:.1f}%", _ms(r, "lexical"), _ms(r, "hybrid"),
                            f"{_cell(r, 'server_p50_ms', '.2f')} / {_cell(r, 'server_lexical_p50_ms', '.2f')}",
                            _cell(r, "device_rss_mb", ".0f"), _cell(r, "load_avg", ".1f")]
                     for lab, r in zip(label, rows)])
    notes = ("\nClient-side p50 / p95 include, for pgvector, the loopback round trip and the wait for a CPU (server = "
             "execution inside PostgreSQL, EXPLAIN ANALYZE). Lexical = `store.search_text` of the question's content "
             "words; hybrid = `retrieve.search` with the default Config (dense + lexical, fused; exact cosines of "
             "lexical-only hits). Device RSS = a fresh process with edge_rag imported and the full store open, after "
             "retrieving every question as the pipeline does (models not loaded: the same on both sides); load = the "
             "machine's 1-minute load average at the time.\n")
    return head + "\n" + build + "\n" + search + notes


def main(argv: list[str]) -> None:
    """``python -m benchmarks.scale_backends --sizes 10k,100k``: only this section of ``make bench``, on the quick
    run's inputs (the pooled SQuAD and HotpotQA stores, the questions ``--n`` of each test split); the report is
    printed and written to OUT/scale_stores.md."""
    import argparse

    from edge_rag import EdgeRAG
    from edge_rag.models.bundle import ROLE_ENCODER, Bundle
    from edge_rag.models.registry import default_bundle, home

    from . import data
    from .systems import bench_config

    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_backends", description=main.__doc__.splitlines()[0])
    p.add_argument("--sizes", type=corpus_sizes, default=[MIN_SIZE, 10 * MIN_SIZE], help="e.g. 10k,100k")
    p.add_argument("--n", type=int, default=100, help="questions per dataset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    p.add_argument("--profile", default="gemma")
    p.add_argument("--bundle", type=Path, default=None, help="bundle folder (default: the profile's)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--index-cache", type=Path, default=home() / "bench", help="where dataset indexes are kept")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bundle = Bundle.load(args.bundle or default_bundle(args.profile))
    encoder_sha = bundle.sha256(ROLE_ENCODER)
    config = bench_config(args.threads)
    vectors, queries, texts, questions = [], [], [], []
    for name, path in data.FILES.items():
        ds = data.load(name, path, args.n, args.seed)
        db, _ = data.open_index(ds, bundle.root, encoder_sha, config, args.index_cache)
        with EdgeRAG(db, bundle=bundle.root, config=config) as rag:
            passage_vectors, passage_texts = stored_passages(rag.store)
            questions += [q.question for q in ds.items]
            queries.append(rag.encoder.encode([q.question for q in ds.items]))
        vectors.append(passage_vectors)
        texts += passage_texts
    result = run(np.concatenate(vectors), np.concatenate(queries), texts, questions, args.sizes, config, args.out,
                 args.seed)
    (args.out / "scale_stores.md").write_text(report(result), encoding="utf-8")
    print(report(result))


if __name__ == "__main__":
    step, *rest = sys.argv[1:] or [""]
    if step == "build":
        work, backend, *numbers = rest
        print(json.dumps(build(work, backend, os.environ[DB_ENV], *map(int, numbers))))
    elif step == "device":
        work, *numbers = rest
        print(json.dumps(device(work, os.environ[DB_ENV], *map(int, numbers))))
    else:
        main(sys.argv[1:])
