import os
import shutil
import sqlite3

import numpy as np
import pytest
from store_cases import check_the_kinds_of_passages_are_recorded, check_titles_in_the_order_added

from edge_rag.documents.chunk import make_document
from edge_rag.errors import InputError, StoreError
from edge_rag.storage import writer_lock
from edge_rag.storage.store import DB_FILE, Part, Store

DOCS = [
    make_document("The lighthouse was built in 1887. It guided ships into the harbour.", "Lighthouse"),
    make_document("The cafe serves soup and sandwiches. It opens at 09:30 every day.", "Cafe"),
    make_document("Tickets cost 16 pounds for adults. Children under five go free.", "Tickets"),
]


def _parts(docs, units):
    return [Part(d, 0, list(u), last=True, sha=d.doc_id) for d, u in zip(docs, units)]


def _add(store, encoder, docs):
    units = [[s for s in d.text.split(". ")] for d in docs]
    vectors = encoder.encode([t for u in units for t in u])
    return store.add(_parts(docs, units), vectors)


def test_round_trip_and_incremental_add(tmp_path, encoder):
    store = Store(tmp_path, encoder.dim, "enc-1")
    assert _add(store, encoder, DOCS[:2]) == 4
    version = store.version
    query = encoder.encode_one("When was the lighthouse built?")
    before = store.search(query, 3)
    assert before[0].title == "Lighthouse" and before[0].score > before[-1].score
    assert abs(before[0].distance - (2 - 2 * before[0].score)) < 1e-9  # squared L2, as the seeds' FAISS
    store.close()

    reopened = Store(tmp_path, encoder.dim, "enc-1")
    assert reopened.count == 4
    assert [(p.id, round(p.score, 5)) for p in reopened.search(query, 3)] == [(p.id, round(p.score, 5)) for p in before]
    assert _add(reopened, encoder, DOCS[2:]) == 2  # incremental
    assert reopened.count == 6 and reopened.version == version + 1
    assert reopened.search(encoder.encode_one("How much is an adult ticket?"), 1)[0].title == "Tickets"
    assert reopened.has_document(DOCS[0].doc_id)
    reopened.close()


def test_store_grows_past_initial_capacity(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(1500, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = [make_document(f"doc {i}", f"t{i}") for i in range(1500)]
    store = Store(tmp_path, 8)
    store.add(_parts(docs, [[d.text] for d in docs]), vectors)
    hits = store.search(vectors[1234], 1)
    assert hits[0].id == 1234 and hits[0].score > 0.999
    store.close()


@pytest.fixture
def saved_store(tmp_path, encoder):
    store = Store(tmp_path, encoder.dim, "enc-1")
    _add(store, encoder, DOCS)
    store.close()
    return tmp_path


def test_truncated_index_is_reported(saved_store, encoder):
    [path] = saved_store.glob("vectors*.hnsw")
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(StoreError, match="corrupt or truncated"):
        Store(saved_store, encoder.dim, "enc-1")


@pytest.mark.parametrize("damage", ["index", "passage"])
def test_a_damaged_store_names_a_fix_that_works(saved_store, encoder, damage, tmp_path_factory):
    """Every damage said "; re-index", and indexing the documents again into the same folder failed the same way
    (opening it, to index: a damaged index) or skipped them as indexed already (a passage whose checksum fails,
    `edge-rag index`): a loop. The message names a new folder, and indexing them there works."""
    if damage == "index":
        [path] = saved_store.glob("vectors*.hnsw")
        path.write_bytes(path.read_bytes()[:-100])
    else:
        with sqlite3.connect(saved_store / DB_FILE) as db:
            db.execute("UPDATE passages SET text = 'The lighthouse was built in 1788' WHERE id = 0")
        db.close()

    def opened_and_read() -> Store:
        store = Store(saved_store, encoder.dim, "enc-1")
        store.passages([0])
        return store

    with pytest.raises(StoreError, match="re-index into a new folder") as first:
        opened_and_read()
    with pytest.raises(StoreError) as again:
        opened_and_read()
    assert str(again.value) == str(first.value)
    fresh = Store(tmp_path_factory.mktemp("new"), encoder.dim, "enc-1")
    assert _add(fresh, encoder, DOCS) == fresh.count > 0


def test_missing_index_is_reported(saved_store, encoder):
    next(saved_store.glob("vectors*.hnsw")).unlink()
    with pytest.raises(StoreError, match="missing"):
        Store(saved_store, encoder.dim, "enc-1")


def test_corrupt_database_is_reported(tmp_path, encoder):
    (tmp_path / DB_FILE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a readable SQLite database"):
        Store(tmp_path, encoder.dim)


def test_an_unreadable_store_record_is_reported(saved_store, encoder):
    """A damaged meta row that quick_check passes (a key no longer UTF-8, as a flipped bit leaves it) is a
    StoreError saying what to do, as other damage is; before: sqlite3.OperationalError from the open."""
    with sqlite3.connect(saved_store / DB_FILE) as db:
        db.execute("INSERT INTO meta VALUES (CAST(x'ff6e6465' AS TEXT), '1')")
    db.close()
    with pytest.raises(StoreError, match="store record .* unreadable .*re-index"):
        Store(saved_store, encoder.dim, "enc-1")


@pytest.mark.parametrize(("key", "value"), [("version", "q"), ("dim", "3q4"), ("index_size", "1x"), ("next_id", "x"),
                                            ("unreachable", "[1,2"), ("unreachable", '["a"]'),
                                            ("index_file", "../vectors.1.0cb18483.hnsw")])
def test_a_damaged_value_in_the_store_record_is_reported(saved_store, encoder, key, value):
    """A flipped bit in a meta value (a digit turned into a letter) passes quick_check; before, opening the store
    failed with a bare ValueError (int(), json) and `edge-rag ask` printed a traceback; a next_id opened and failed
    the next commit; an index_file outside the folder was read, and the next commit removed it."""
    with sqlite3.connect(saved_store / DB_FILE) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    db.close()
    with pytest.raises(StoreError, match=f"store record holds {key} = .*re-index"):
        Store(saved_store, encoder.dim, "enc-1")


@pytest.mark.parametrize("create", [True, False])
def test_a_store_path_that_is_a_file_is_reported(tmp_path, encoder, create):
    """`edge-rag index --db notes.txt` failed with a bare FileExistsError from mkdir (a traceback); `edge-rag ask`
    said no store was there and to index into it, which failed so."""
    path = tmp_path / "notes.txt"
    path.write_text("not a store")
    with pytest.raises(StoreError, match="is a file, not a store folder"):
        Store(path, encoder.dim, "enc-1", create=create)
    assert path.read_text() == "not a store"


def test_a_store_folder_whose_name_is_not_utf8_is_reported(saved_store, encoder, tmp_path_factory):
    """hnswlib takes a path as UTF-8 text only: `edge-rag index --db caf\\xe9` (a Latin-1 name) encoded every passage
    then failed its first commit on a TypeError traceback, and a store moved there failed every question so."""
    latin1 = tmp_path_factory.mktemp("stores") / os.fsdecode(b"caf\xe9")
    with pytest.raises(StoreError, match="not UTF-8 text"):
        Store(latin1, encoder.dim, "enc-1")
    assert not latin1.exists()
    shutil.copytree(saved_store, latin1)
    with pytest.raises(StoreError, match="not UTF-8 text"):
        Store(latin1, encoder.dim, "enc-1", create=False)


def test_a_writer_lock_that_cannot_be_opened_is_a_store_error(saved_store, encoder):
    """writer.lock not openable (another user's file in a shared folder, a folder in its place after fsck): indexing
    failed with a bare IsADirectoryError/PermissionError traceback. Now a StoreError naming it; reading goes on."""
    (saved_store / writer_lock.LOCK_FILE).unlink()
    (saved_store / writer_lock.LOCK_FILE).mkdir()
    store = Store(saved_store, encoder.dim, "enc-1")
    count = store.count
    with pytest.raises(StoreError, match="cannot open the store's writer lock .*writer.lock"):
        _add(store, encoder, DOCS[:1])
    assert store.count == count and store.search(encoder.encode_one("lighthouse"), 1)


def test_other_encoder_or_dimension_is_refused(saved_store, encoder):
    with pytest.raises(StoreError, match="another encoder"):
        Store(saved_store, encoder.dim, "enc-2")
    with pytest.raises(StoreError, match="384-d vectors"):
        Store(saved_store, 128, "enc-1")


def test_failed_add_loses_nothing(saved_store, encoder):
    store = Store(saved_store, encoder.dim, "enc-1")
    with pytest.raises(ValueError):
        store.add(_parts([DOCS[0]], [["a", "b"]]), np.zeros((1, encoder.dim), dtype=np.float32))
    bad = make_document("Orphan passage.", "Nowhere")
    with pytest.raises(sqlite3.IntegrityError):  # a continuation part of a document that is not stored
        store.add([Part(bad, 3, [bad.text], last=True)], encoder.encode([bad.text]))
    store.close()
    again = Store(saved_store, encoder.dim, "enc-1")  # index and database still agree
    assert again.count == 6 and again.index.get_current_count() == 6
    again.close()


def test_the_kinds_of_passages_are_recorded(tmp_path):
    check_the_kinds_of_passages_are_recorded(lambda kind: Store(tmp_path, 8, "enc-1", passage_kind=kind), 8)


def test_titles_in_the_order_added(tmp_path):
    store = Store(tmp_path, 8, "enc-1")
    check_titles_in_the_order_added(store, 8)
    store.close()


def test_a_store_from_before_the_record_stays_unrecorded(tmp_path, encoder):
    """Its passages' kind is unknown: a commit under a stated kind does not make the store look all of it."""
    store = Store(tmp_path, encoder.dim, "enc-1", passage_kind="sentence:20")
    _add(store, encoder, DOCS[:1])
    store.close()
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute("DELETE FROM meta WHERE key = 'passage_kinds'")  # as a store made before the record
    db.close()
    store = Store(tmp_path, encoder.dim, "enc-1", passage_kind="sentence:20")
    _add(store, encoder, DOCS[1:2])
    assert store.passage_kinds == frozenset()
    store.close()


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, float("inf"), True])
def test_a_lock_timeout_that_is_no_finite_wait_is_refused(tmp_path, timeout) -> None:
    """``EdgeRAG(lock_timeout=nan)`` (or ``--wait nan``) waited forever for a busy store: no time passes NaN. The store
    refuses it when it opens (it did at its first write), before it makes its folder."""
    with pytest.raises(InputError, match="lock_timeout"):
        writer_lock.acquire(tmp_path, timeout)
    with pytest.raises(InputError, match="lock_timeout"):
        Store(tmp_path / "db", 8, lock_timeout=timeout)
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize("where", ["file", "file/db"])
def test_a_store_path_that_a_file_is_in_the_way_of_is_a_store_error(tmp_path, where) -> None:
    """``edge-rag index --db notes.txt`` (or ``--db notes.txt/db``) ended in a traceback of FileExistsError
    (NotADirectoryError) from making the folder: now one line naming the path."""
    (tmp_path / "file").write_text("not a store")
    with pytest.raises(StoreError, match=f"{tmp_path / 'file'} is a file"):
        Store(tmp_path / where, 384)


def test_a_second_store_of_this_process_is_named_as_such(tmp_path) -> None:
    """Two EdgeRAGs of one kiosk app on one folder: the second writer was told the store "is being written by another
    process (pid N)", N being its own pid, and pointed at the CLI's --wait only."""
    first, second = Store(tmp_path, 384), Store(tmp_path, 384)
    with first.writing():
        with pytest.raises(StoreError, match=r"another store object of this process .*lock_timeout"), second.writing():
            pass
    first.close()
    second.close()
