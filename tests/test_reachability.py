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
