"""The stores-at-scale benchmark (benchmarks/scale_backends.py) at a tiny size on both real stores, its steps run
in this process: every build (with and without the full-text index) reports its figures, in range, and lexical
search over the corpus's real texts returns passages that hold a word of the question. Never timings. pgvector
needs the throw-away server (conftest ``pg_admin_url``) and skips without it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import scale_backends
from benchmarks.data import LOADERS
from edge_rag.config import Config
from edge_rag.documents.chunk import iter_units
from edge_rag.retrieval.lexical import query_terms
from edge_rag.storage.store_db import CONTEXT_NEIGHBOURS
from edge_rag.storage.stores import open_store

N = 2_000  # passages: more than the real sentences below, so noisy copies carry their source's text
DIM = 32
QUESTIONS = 30
CONFIG = Config(hnsw_m=8, hnsw_ef_construction=50, hnsw_ef_search=32)


@pytest.fixture(scope="module")
def inputs(squad_path: Path) -> dict:
    """Real SQuAD sentences ([title, text]) and questions, with seeded random unit vectors for both."""
    docs, items = LOADERS["squad"](squad_path)
    texts = [[d.title, unit] for d in docs[:60] for unit in iter_units(d)]
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(texts) + QUESTIONS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    assert len(texts) < N
    return {"real": vectors[:len(texts)], "queries": vectors[len(texts):], "texts": texts,
            "questions": [q.question for q in items[:QUESTIONS]]}


@pytest.fixture(scope="module", params=["embedded", "pgvector"])
def built(request: pytest.FixtureRequest, inputs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One backend's benchmark point, each step in this process: built with and without the full-text index, and
    the device step on the full store."""
    backend = request.param
    admin = request.getfixturevalue("pg_admin_url") if backend == "pgvector" else ""
    work = tmp_path_factory.mktemp(f"scale-{backend}")
    scale_backends.write_inputs(work, inputs["real"], inputs["queries"], inputs["texts"], inputs["questions"])
    hnsw = (CONFIG.hnsw_m, CONFIG.hnsw_ef_construction, CONFIG.hnsw_ef_search)
    rows, dbs = {}, {}
    for full_text in (True, False):
        dbs[full_text] = (str(work / f"store-{full_text}") if backend == "embedded"
                          else scale_backends.fresh_database(admin, f"edge_rag_scale_test_{int(full_text)}"))
        rows[full_text] = scale_backends.build(str(work), backend, dbs[full_text], N, *hnsw, 0, int(full_text))
    rows[True] |= scale_backends.device(str(work), dbs[True], *hnsw)
    return {"backend": backend, "rows": rows, "db": dbs[True]}


def test_built_with_and_without_full_text(built: dict):
    rows = built["rows"]
    for full_text, r in rows.items():
        assert (r["backend"], r["n"], r["full_text"]) == (built["backend"], N, full_text)
        assert 0.0 <= r["recall@10"] <= 1.0 and r["disk_mb"] > 0 and r["build_s"] > 0
        assert ("lexical_p50_ms" in r) == ("hybrid_p50_ms" in r) == ("device_rss_mb" in r) == full_text
        assert ("inserts_per_s" in r) == (built["backend"] == "pgvector")
    assert rows[True]["disk_mb"] > rows[False]["disk_mb"]  # the index takes room on disk
    table = scale_backends.report({"queries": QUESTIONS, "k": 10, "M": CONFIG.hnsw_m, "rows": list(rows.values()),
                                   "ef_construction": CONFIG.hnsw_ef_construction, "ef_search": CONFIG.hnsw_ef_search})
    assert table.count(f"| {N:,} | {built['backend']} | ") == 4  # two builds, in the build and the search table


def test_lexical_hits_hold_a_word_of_the_question(built: dict, inputs: dict):
    """Every lexical hit holds a word of the question in its title, its text or its context (the passages of its
    document within CONTEXT_NEIGHBOURS positions: the benchmark's documents hold 5 passages each)."""
    store = open_store(built["db"], DIM, scale_backends.ENCODER_ID, CONFIG, create=False)
    try:
        found = 0
        for question in inputs["questions"]:
            terms = query_terms(question)
            hits = store.passages([i for i, _ in store.search_text(terms, 10)])
            found += bool(hits)
            for p in hits:  # both engines stem (porter / snowball): a stem keeps the word's first letters
                around = range(p.id - CONTEXT_NEIGHBOURS, p.id + CONTEXT_NEIGHBOURS + 1)
                text = " ".join(f"{q.title} {q.text}" for q in store.passages(list(around)) if q.doc_id == p.doc_id)
                assert any(t[:3] in text.lower() for t in terms), (question, p.text)
        assert found >= QUESTIONS // 2
    finally:
        store.close()
