"""Every passage is found by its own vector, and the doctor fails a store where one is not (issue #43).

Before: after the sample corpus + 26,001 near-duplicate passages, 39 museum passages were returned for no query, not
even their own vector, and ``edge-rag doctor`` said "ok, recall 0.990" while its worst query scored 0.0. A sparse
graph (M 6, ef_construction 12) over random vectors leaves the same kind of hole in a second: its graph alone misses
some of its own vectors (tests/test_recall.py shows it on the near-duplicate load, both stores)."""
import sqlite3

import numpy as np
import pytest

from edge_rag.documents.chunk import make_document
from edge_rag.storage import reachability
from edge_rag.storage.doctor import RecallReport, check_recall, unreachable
from edge_rag.storage.store import DB_FILE, Part, Store

DIM, N = 32, 3000


def _sparse_store(folder) -> Store:
    store = Store(folder, DIM, m=6, ef_construction=12, ef_search=16)
    vectors = np.random.default_rng(0).normal(size=(N, DIM)).astype(np.float32)
    docs = [make_document(f"random passage {i}", f"doc {i}") for i in range(N)]
    for at in range(0, N, 1000):  # three commits: each one looks again
        store.add([Part(d, 0, [d.text], True, d.doc_id) for d in docs[at:at + 1000]], vectors[at:at + 1000])
    return store


def _graph_misses(store: Store) -> list[int]:
    return reachability.sweep(store.index, store.index.get_ids_list(), store.ef_search, lambda: store._lock)


@pytest.fixture
def sparse(tmp_path):
    store = _sparse_store(tmp_path / "db")
    yield store
    store.close()


def test_every_passage_is_found_by_its_own_vector(sparse, tmp_path):
    misses = _graph_misses(sparse)
    assert misses, "the graph reaches every vector: this test shows nothing, make it sparser"
    assert unreachable(sparse) == []
    for label in misses[:5]:
        vector = sparse.index.get_items([label], return_type="numpy")[0]
        assert sparse.search(vector, 1)[0].id == label
    reopened = Store(tmp_path / "db", DIM, m=6, ef_construction=12, ef_search=16)  # recorded with the commit
    assert unreachable(reopened) == []
    gone = sparse.passages(misses[:3])
    reopened.close()
    queries = sparse.index.get_items(misses[:3], return_type="numpy")
    sparse.remove([p.doc_id for p in gone])  # removed: never returned, not even by the exact half
    assert unreachable(sparse) == []
    assert not {p.id for p in gone} & {h.id for q in queries for h in sparse.search(q, 10)}


def test_the_doctor_fails_a_store_with_an_unreachable_passage(sparse, tmp_path):
    """A store written before this change has no record of its unreachable passages: the doctor counts them."""
    sparse.close()
    with sqlite3.connect(tmp_path / "db" / DB_FILE) as db:
        db.execute("DELETE FROM meta WHERE key = 'unreachable'")
    old = Store(tmp_path / "db", DIM, m=6, ef_construction=12, ef_search=16)
    report = check_recall(old, reach=True)
    old.close()
    assert report.unreachable and not report.ok and "unreachable" in report.summary(), report.summary()
    # The report: a mean that passes, one query at 0.0, no unreachable count: the worst query fails it.
    assert not RecallReport(26_469, 100, 10, 366, 0.990, 0.0, 1.0, 10.0).ok


def test_a_passage_repeated_verbatim_is_held_once_beside_the_graph(tmp_path):
    """A footer on every page: its copies beyond the K a search returns are unreachable, and the exact half held a
    copy of the vector for each (10% of 30k passages repeated: +10 MB, unpriced by the plan; 13 ms a question). One
    row per distinct vector now, with the same results."""
    rng = np.random.default_rng(1)
    footer = make_document("Contact us | Privacy | Imprint", "footer")
    pages = [make_document(f"page {i}", f"page {i}") for i in range(500)]
    vectors = np.concatenate([rng.normal(size=(500, DIM)), np.repeat(rng.normal(size=(1, DIM)), 300, axis=0)])
    parts = [Part(p, 0, [p.text], True, p.doc_id) for p in pages] + [Part(footer, 0, [footer.text] * 300, True, "f")]
    store = Store(tmp_path, DIM, m=16, ef_construction=32)
    store.add(parts, vectors.astype(np.float32))
    for held in (store, Store(tmp_path, DIM, m=16, ef_construction=32)):  # at the commit, and as recorded
        exact = held._exact
        assert len(exact.labels) >= 300 - reachability.K, "the repeats are reachable: this test shows nothing"
        distinct = np.unique(held.index.get_items(exact.labels, return_type="numpy"), axis=0)
        assert exact.vectors.shape == distinct.shape, (exact.vectors.shape, distinct.shape)
        found = held.search(vectors[-1].astype(np.float32), 10)
        assert [p.doc_id for p in found] == [footer.doc_id] * 10 and min(p.score for p in found) > 0.999
        held.close()
