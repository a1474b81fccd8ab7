"""Documents that change, bad documents, checked passages: on a real store with the real encoder."""
import contextlib
import gc
import json
import os
import sqlite3
import subprocess
import sys
import threading
import weakref

import pytest
from conftest import ROOT

from edge_rag.config import Config
from edge_rag.documents import chunk, indexing
from edge_rag.documents.chunk import doc_id_for, read_documents
from edge_rag.errors import InputError, StoreError
from edge_rag.pipeline import EdgeRAG
from edge_rag.retrieval.lexical import query_terms
from edge_rag.storage.store import DB_FILE
from edge_rag.types import Route

PRICES = "Adult tickets cost {price} pounds. Children under five go free. The museum opens at 10:00 every day."


@pytest.fixture
def rag(tmp_path, bundle_dir):
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0)) as r:
        yield r


def _texts(rag):
    return sorted(r[0] for r in rag.store.db.execute("SELECT text FROM passages"))


def test_reindexing_an_edited_file_replaces_its_passages(rag, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tickets.txt").write_text(PRICES.format(price=16))
    (docs / "cafe.txt").write_text("The cafe serves soup and sandwiches. It opens at 09:30 every day.")
    assert rag.add_files([docs]) == 5
    assert rag.add_files([docs]) == 0  # unchanged: a no-op
    (docs / "tickets.txt").write_text(PRICES.format(price=19))
    assert rag.add_files([docs]) == 3
    texts = _texts(rag)
    assert "Adult tickets cost 19 pounds." in texts and not any("16 pounds" in t for t in texts)
    assert rag.store.count == 5
    context = rag.decide("How much does an adult ticket cost?").context
    assert "19 pounds" in context and "16 pounds" not in context

    [cafe] = read_documents(docs / "cafe.txt")
    assert rag.remove(cafe.doc_id) == 2 and rag.store.count == 3
    with pytest.raises(InputError, match="no document with id"):
        rag.remove("no-such-id")


def test_removing_no_documents_commits_nothing(rag):
    """rag.remove([]) (a kiosk's sync finding nothing gone) made an empty commit: a new store version, so every cached
    answer of the store was a miss again, in every process, and the whole index file written again (20,000 passages:
    5.3 s, 32 MB written, at each call). It removes nothing and commits nothing."""
    rag.add_documents(PRICES.format(price=16))
    question = "How much does an adult ticket cost?"
    first, version, index_file = rag.ask(question), rag.store.version, rag.store.index_file
    assert rag.remove([]) == 0 and rag.remove(()) == 0
    assert (rag.store.version, rag.store.index_file) == (version, index_file)
    again = rag.ask(question)
    assert again.cache_hit and again.answer == first.answer


def test_a_file_indexed_before_its_passages_were_respelt_is_cut_again(rag, tmp_path, monkeypatch):
    """A file indexed before passages spelled out ligatures (or dropped soft hyphens) kept its old passages at every
    re-index, the file being unchanged: "\ufb01rst \ufb02oor" stayed, no word of "first floor". Re-indexing now cuts
    such a document again, once; a document without such characters is left alone."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "office.txt").write_text("The \ufb01nance o\ufb03ce is on the \ufb01rst \ufb02oor.")
    (docs / "cafe.txt").write_text("The cafe serves soup and sandwiches.")
    with monkeypatch.context() as old:  # the code before passages spelled ligatures out
        old.setattr(chunk, "_TYPESET", {})
        old.setattr(indexing, "content_sha", lambda doc: doc_id_for(doc.title, doc.text), raising=False)
        assert rag.add_files([docs]) == 2
    assert "The \ufb01nance o\ufb03ce is on the \ufb01rst \ufb02oor." in _texts(rag)
    assert not rag.store.search_text(query_terms("floor?"), 3)
    assert rag.add_files([docs]) == 1
    assert _texts(rag) == ["The cafe serves soup and sandwiches.", "The finance office is on the first floor."]
    assert rag.store.search_text(query_terms("floor?"), 3) and rag.add_files([docs]) == 0


def test_a_file_indexed_before_passages_were_cut_to_a_bound_is_cut_again(rag, tmp_path, monkeypatch):
    """A text without sentence ends was one passage per 64 KB; passages are now cut to MAX_UNIT_CHARS. Re-indexing an
    unchanged file cut before cuts it again, once; a document without a paragraph that long is left alone."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "rooms.txt").write_text(", ".join(f"room{k} holds exhibit{k}" for k in range(3000)))  # ~70 KB, no "."
    (docs / "cafe.txt").write_text("The cafe serves soup and sandwiches.")
    with monkeypatch.context() as old:  # the code before passages were cut to MAX_UNIT_CHARS
        old.setattr(chunk, "MAX_UNIT_CHARS", chunk.PARAGRAPH_WINDOW_CHARS * 2, raising=False)
        old.setattr(indexing, "content_sha", lambda doc: doc_id_for(doc.title, doc.text), raising=False)
        assert rag.add_files([docs]) == 3  # two windows of the run, and the cafe
    assert max(map(len, _texts(rag))) > chunk.PARAGRAPH_WINDOW_CHARS // 2
    assert rag.add_files([docs]) == len(chunk.chunk(read_documents(docs / "rooms.txt")[0])) > 3
    assert max(map(len, _texts(rag))) <= chunk.MAX_UNIT_CHARS and "The cafe serves soup and sandwiches." in _texts(rag)
    assert rag.add_files([docs]) == 0


def test_json_record_with_a_known_id_and_new_text_replaces_it(rag, tmp_path, caplog):
    path = tmp_path / "faq.json"
    path.write_text(json.dumps([{"id": "q1", "title": "Parking", "text": "Parking costs 8 pounds a day."}]))
    assert rag.add_files([path]) == 1
    path.write_text(json.dumps([{"id": "q1", "title": "Parking", "text": "Parking costs 9 pounds a day."}]))
    assert rag.add_files([path]) == 1
    assert _texts(rag) == ["Parking costs 9 pounds a day."]
    assert "changed: replacing its 1 stored passages" in caplog.text
    rag.add_documents(["Free text added by the API."])
    assert rag.store.count == 2
    with pytest.raises(InputError, match="reuses id 'q2' with a different text"):
        path.write_text(json.dumps([{"id": "q2", "text": "One."}, {"id": "q2", "text": "Two."}]))
        rag.add_files([path], strict=True)  # not strict, the file is skipped with this reason (a warning)
    assert rag.store.count == 2  # a bad file loses nothing


def test_a_document_reached_twice_in_one_call_is_stored_once(rag, tmp_path):
    """A folder and a file in it, or two identical copies: each file was planned alone, so their passages were
    stored twice. Now one add_files call plans each document once, and a second call finds nothing to do."""
    docs = tmp_path / "docs"
    for sub in ("x", "y"):
        (docs / sub).mkdir(parents=True)
        (docs / sub / "readme.txt").write_text("Lost property is kept at the front desk for thirty days.")
    (docs / "hours.md").write_text("# Hours\n\nThe museum opens at ten. It closes at six in the evening.")
    assert rag.add_files([docs, docs / "hours.md"]) == 3
    assert _texts(rag) == ["It closes at six in the evening.", "Lost property is kept at the front desk for thirty days.",
                           "The museum opens at ten."]
    assert rag.add_files([docs]) == 0 and rag.store.count == 3  # nothing added, nothing removed


def test_one_file_or_text_alone_is_not_read_letter_by_letter(rag, tmp_path, monkeypatch):
    """A str was iterated: add_files("notes.md") took its "." for the working folder (and any "/" for the whole disk),
    indexing a private file beside it; add_documents("text") stored one document per letter. One alone is one now;
    None, a number or bytes are an InputError."""
    (tmp_path / "notes.md").write_text("# Lockers\n\nLockers are on level two by the stairs.")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "staff.txt").write_text("The staff wifi password is hunter2.")
    monkeypatch.chdir(tmp_path)
    rag.add_files("notes.md")
    assert _texts(rag) == ["Lockers are on level two by the stairs."]
    rag.add_documents("The cafe on the ground floor opens at nine.")
    assert _texts(rag) == ["Lockers are on level two by the stairs.", "The cafe on the ground floor opens at nine."]
    for call in (lambda: rag.add_files(None), lambda: rag.add_files([5]), lambda: rag.add_documents(None),
                 lambda: rag.add_documents(b"bytes"), lambda: rag.remove(None)):
        with pytest.raises(InputError):
            call()


def test_an_empty_path_is_named_not_read_as_the_working_folder(rag, tmp_path, bundle_dir, monkeypatch):
    """Path("") is ".": add_files("") (an unset setting, `edge-rag index ""`) indexed the working folder and all below
    it, a private file too, and EdgeRAG("") made its store there. An empty path is skipped, named; the rest is read."""
    (tmp_path / "notes.md").write_text("# Lockers\n\nLockers are on level two by the stairs.")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "staff.txt").write_text("The staff wifi password is hunter2.")
    monkeypatch.chdir(tmp_path)
    skipped = []
    rag.add_files(["", "notes.md"], on_skip=lambda path, reason: skipped.append(reason))
    assert _texts(rag) == ["Lockers are on level two by the stairs."] and skipped == ["the path is empty"]
    with pytest.raises(InputError, match="nothing indexed"):
        rag.add_files("", on_skip=lambda path, reason: None)
    with pytest.raises(StoreError, match="no store named"):
        EdgeRAG("", bundle=bundle_dir)
    assert not (tmp_path / DB_FILE).exists()


@pytest.mark.parametrize("given, named", [({"config": {"k": 3}}, "config must be Config or None, not dict"),
                                          ({"lock_timeout": "5"}, "lock_timeout must be int or float, not str"),
                                          ({"db": b"db"}, "db must be str or PathLike, not bytes"),
                                          ({"calibration": 1}, "calibration must be str or PathLike or None, not int"),
                                          *(({"lock_timeout": t}, f"lock_timeout must be a finite .* not {t}")
                                            for t in (float("nan"), float("inf"), -1.0, True))])
def test_an_argument_of_the_wrong_type_is_named_at_once(tmp_path, bundle_dir, given, named):
    """Settings a kiosk app read from JSON: a dict for the Config raised AttributeError ('dict' object has no attribute
    'reader') deep inside, bytes for the folder a TypeError of pathlib, and a str timeout passed until the first
    write; so did a NaN, infinite or negative one (a PostgreSQL store's writer waited forever for NaN or inf), and
    True waited a second. Each is one InputError naming the argument and what it must be, before anything is
    loaded."""
    with pytest.raises(InputError, match=f"EdgeRAG's {named}"):
        EdgeRAG(**{"db": tmp_path / "db", "bundle": bundle_dir, **given})
    assert not (tmp_path / "db").exists()


def test_a_closed_edgerag_says_so_and_a_failed_write_leaves_no_lock_behind(rag, tmp_path, bundle_dir):
    """A closed EdgeRAG raised sqlite3.ProgrammingError from every method, and a write on it failed after taking the
    store's file lock, keeping it until the process ended: every later writer, in this process or another, was
    refused as "being written by another process". Applying a calibration (the server's /admin "Apply") raised it
    still; warm_up and the generator loaded their models (a closed EdgeRAG kept them until dropped)."""
    rag.close()
    for call in (lambda: rag.add_documents("The lift is by the stairs."), lambda: rag.ask("Where is the lift?"),
                 lambda: rag.decide("Where is the lift?"), lambda: rag.remove("x"),
                 lambda: rag.use_calibration(rag.certified.shipped, 0.1), rag.warm_up, lambda: rag.generator):
        with pytest.raises(StoreError, match="was closed"):
            call()
    with pytest.raises(sqlite3.ProgrammingError), rag.store.writing():  # the reload under the lock fails
        pass
    with EdgeRAG(tmp_path / "gen", bundle=bundle_dir, config=Config(certified=False)) as generating:
        assert generating.plan.generator  # llama.cpp is in its plan: open, the property loads it
    with pytest.raises(StoreError, match="was closed"):
        _ = generating.generator
    assert generating._generator is None
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0)) as again:
        assert again.add_documents("The lift is by the stairs.") == 1


def test_a_call_running_when_another_thread_closes_says_so(tmp_path, bundle_dir, monkeypatch):
    """A kiosk closing its EdgeRAG while questions or an indexing run were in flight on other threads: those calls
    failed with sqlite3.ProgrammingError ("Cannot operate on a closed database."), not as closed. The close is made
    here at a known point of each call: as its question is encoded, or after its first batch is encoded."""
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir) as rag:
        rag.add_documents("The lift is by the stairs, beside the cloakroom on the ground floor.")
    for call in ("ask", "decide", "ask_stream"):
        rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(cache_size=0))
        encode_one = rag.encoder.encode_one
        monkeypatch.setattr(rag.encoder, "encode_one", lambda text, rag=rag, encode=encode_one: (rag.close(), encode(text))[1])
        with pytest.raises(StoreError, match="was closed"):
            list(getattr(rag, call)("Where is the lift?")) if call == "ask_stream" else getattr(rag, call)("Where is the lift?")
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir) as writer:
        with pytest.raises(StoreError, match="was closed"):
            writer.add_documents("The café is on the first floor.", progress=lambda done, planned: writer.close())
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir) as again:  # the store as it was, and writable
        assert again.store.count == 1 and again.add_documents("The café is on the first floor.") == 1


def test_a_commit_in_flight_when_another_thread_closes_keeps_the_store_s_writer_lock(tmp_path, bundle_dir):
    """close() released the store's writer lock while another thread's commit ran on: the kiosk, opening the store
    again meanwhile, removed a document, its writer took the commit's new index file for an orphan and removed it,
    and the commit then named it: the store was lost ("vector index ... is missing; re-index"). The thread writing
    keeps the lock to its run's end; the other writer is refused meanwhile."""
    db = tmp_path / "db"
    with EdgeRAG(db, bundle=bundle_dir) as first:
        first.add_documents("The café is on the first floor.")
    rag, refused = EdgeRAG(db, bundle=bundle_dir), []

    def close_and_write_again(step: str) -> None:
        if step == "index_saved":
            closing = threading.Thread(target=rag.close)
            closing.start()
            closing.join(30)
            with EdgeRAG(db, bundle=bundle_dir) as other:
                try:
                    other.remove(other.store.db.execute("SELECT doc_id FROM documents").fetchone()[0])
                except StoreError as exc:
                    refused.append(str(exc))

    rag.store.fault_hook = close_and_write_again
    with contextlib.suppress(StoreError):
        rag.add_documents("The lift is beside the cloakroom on the ground floor.")
    assert refused and "being written by another store object" in refused[0]
    with EdgeRAG(db, bundle=bundle_dir) as again:  # whole, and writable
        assert again.store.count == 2 and again.add_documents("The shop sells postcards.") == 1


def test_indexing_stops_once_another_thread_closes(tmp_path, bundle_dir, monkeypatch):
    """A run closed by another thread encoded on to its next commit, holding the store's writer lock all along (its
    commit would then fail): a commit takes half the store's size in passages, so at 20,000 passages up to 10,000 more
    passages were encoded for nothing, and no other writer could write meanwhile (2.9 s here with 3,000 short ones).
    It now stops as the batch in hand ends. Here batches of 4 passages and a store of 40 (commits of 20)."""
    monkeypatch.setattr(indexing, "INDEX_BATCH_PASSAGES", 4)
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir) as first:
        first.add_documents([f"Exhibit {i} is a model ship." for i in range(40)])
    rag, after = EdgeRAG(tmp_path / "db", bundle=bundle_dir), []
    encode = rag.encoder.encode
    monkeypatch.setattr(rag.encoder, "encode", lambda texts: (rag.closed and after.append(len(texts)), encode(texts))[1])

    def close(done: int, planned: int) -> None:
        closing = threading.Thread(target=rag.close)
        closing.start()
        closing.join(30)

    with pytest.raises(StoreError, match="was closed"):
        rag.add_documents([f"Room {i} holds a painting of the harbour." for i in range(40)], progress=close)
    assert after == []  # no batch encoded once closed
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir) as again:
        assert again.store.count == 40 and again.add_documents("The café is on the first floor.") == 1


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "never-closed"])
def test_an_edgerag_dropped_frees_its_models_at_once(tmp_path, bundle_dir, closed):
    """The store's callback to its EdgeRAG (Store.admit) made a cycle: a dropped EdgeRAG kept its encoder, reader and
    llama.cpp model until Python's cycle collector happened to run. Five opened and closed in turn grew the process
    from 445 to 1,518 MB with the generator loaded, and the next one's plan, priced from that RSS, refused; so did the
    sixth of a kiosk app whose EdgeRAGs went out of scope unclosed (444, 801, 1157, 1514, 1600 MB: BudgetError)."""
    rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir)
    rag.add_documents("The lift is by the stairs, beside the cloakroom on the ground floor.")
    rag.ask("Where is the lift?")
    if closed:
        rag.close()
    encoder, store = weakref.ref(rag.encoder), weakref.ref(rag.store)
    gc.disable()  # freed by reference counting alone, as it is the moment the last reference goes
    try:
        del rag
        assert encoder() is None and store() is None
    finally:
        gc.enable()


def test_a_closed_edgerag_still_referenced_frees_its_llama_model(tmp_path, bundle_dir):
    """``rag.close(); rag = EdgeRAG(...)`` ("open the store again", its StoreError says) opened the new EdgeRAG while
    the closed one, still referenced, held its llama.cpp model: 444 MB of RSS, 178 without it, so the new one's plan,
    priced from that RSS, refused (BudgetError) under a memory_budget_mb of 700 or 900 that one EdgeRAG fits."""
    rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(certified=False))
    model = weakref.ref(rag.generator)
    gc.disable()  # freed by close() itself, not by a collection that happened to run
    try:
        rag.close()
        assert model() is None
    finally:
        gc.enable()


def test_an_edgerag_closed_while_its_llama_model_loads_does_not_keep_it(tmp_path, bundle_dir):
    """close() while the first GPT question loaded llama.cpp: the load finished after close() dropped the model and
    kept it in the closed EdgeRAG (RSS 572, 885, 917 MB over three in turn, still referenced; 253-287 now). The
    question is told it was closed and nothing is kept."""
    rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(certified=False))
    told: list[Exception] = []

    def load() -> None:
        try:
            _ = rag.generator
        except StoreError as exc:
            told.append(exc)

    loading = threading.Thread(target=load)
    loading.start()
    while not rag._generator_lock.locked() and loading.is_alive():
        pass  # until it loads
    rag.close()
    loading.join()
    assert rag._generator is None and len(told) == 1 and "was closed" in str(told[0]), told


def test_one_id_with_two_texts_in_two_files_skips_the_second(rag, tmp_path):
    """Two JSONL files giving id "1" different texts replaced each other on every re-index. Now the second file is
    skipped with a reason naming the first, and re-indexing keeps what is stored."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.jsonl").write_text(json.dumps({"id": "1", "text": "Parking costs five pounds per day."}))
    (docs / "b.jsonl").write_text(json.dumps({"id": "1", "text": "Coin lockers are next to the cloakroom."}))
    skipped: list[tuple[str, str]] = []
    for added in (1, 0):
        assert rag.add_files([docs], on_skip=lambda p, why: skipped.append((p.name, why))) == added
        assert _texts(rag) == ["Parking costs five pounds per day."]
    assert [name for name, _ in skipped] == ["b.jsonl", "b.jsonl"]
    assert "share the id '1' with different texts" in skipped[0][1] and "a.jsonl" in skipped[0][1]


def test_a_record_moved_to_another_file_stays(rag, tmp_path):
    """A record moved from a.jsonl to b.jsonl was removed as gone from a.jsonl (and found stored in b.jsonl)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    hours, lockers, shop = (json.dumps({"id": i, "text": t}) for i, t in [
        ("hours", "The museum opens at ten."), ("lockers", "Coin lockers are next to the cloakroom."),
        ("shop", "The gift shop sells maps.")])
    (docs / "a.jsonl").write_text(f"{hours}\n{lockers}\n")
    (docs / "b.jsonl").write_text(f"{shop}\n")
    assert rag.add_files([docs]) == 3
    (docs / "a.jsonl").write_text(f"{hours}\n")
    (docs / "b.jsonl").write_text(f"{shop}\n{lockers}\n")
    for _ in range(2):
        assert rag.add_files([docs]) == 0 and rag.store.count == 3
        assert rag.store.document("lockers") is not None


def test_file_names_that_are_not_utf8_are_indexed(rag, tmp_path):
    """A file named in Latin-1 (an old system's USB stick) gave a title and source with lone surrogates, and the
    UnicodeEncodeError stopped the whole folder. Now the bytes that are not UTF-8 show as U+FFFD."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Lockers\n\nCoin lockers are next to the cloakroom.")
    (docs / os.fsdecode(b"caf\xe9.txt")).write_text("The cafe sells tea and scones until four.")
    (docs / os.fsdecode(b"gift-sh\xf6p.html")).write_text("<p>The gift shop sells maps and postcards.</p>")
    assert rag.add_files([docs], strict=True) == 3
    titles = sorted(r[0] for r in rag.store.db.execute("SELECT title FROM documents"))
    assert titles == ["Lockers", "caf\ufffd", "gift sh\ufffdp"]
    assert rag.add_files([docs], strict=True) == 0 and rag.store.count == 3  # its source is found again


@pytest.mark.parametrize("content, message", [
    ("null", "expected a list of objects .* found null"),
    ("5", "found a JSON int"),
    ('"text"', "found a JSON string"),
    ('{"foo": [1]}', "found an object with keys \\['foo'\\]"),
    ('[{"text": "fine"}, 7]', "record 1 is a JSON int, not an object"),
])
def test_json_of_the_wrong_shape_is_named_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InputError, match=f"bad.json: .*{message}"):
        read_documents(path)


def test_documents_with_nothing_readable_are_skipped_with_a_warning(rag, tmp_path, caplog):
    (tmp_path / "nuls.txt").write_bytes(b"\0" * 4096)
    (tmp_path / "controls.txt").write_bytes(b"\x01\x02\x1b\x7f \n\t\x00\x0c")
    (tmp_path / "ok.txt").write_text("A real sentence about the museum.\0")
    assert rag.add_files([tmp_path / "nuls.txt", tmp_path / "controls.txt", tmp_path / "ok.txt"]) == 1
    assert _texts(rag) == ["A real sentence about the museum."]
    assert caplog.text.count("no readable text") == 2
    with pytest.raises(InputError, match="lone surrogate"):
        rag.add_documents(["bad \udc80 text"])
    with pytest.raises(InputError, match="must be a str or a Document, not int"):
        rag.add_documents([5])


def test_a_flipped_passage_is_caught_by_its_checksum(rag, tmp_path):
    rag.add_documents([PRICES.format(price=16)])
    folder = rag.store.folder
    rag.close()
    path = folder / DB_FILE
    data = path.read_bytes()
    assert b"16 pounds" in data  # in the passage's text and in its neighbours' contexts
    path.write_bytes(data.replace(b"16 pounds", b"61 pounds"))  # bit rot inside rows: structure still valid
    reopened = EdgeRAG(folder, bundle=rag.bundle.root)
    with pytest.raises(StoreError, match="fails its checksum"):
        reopened.decide("How much does an adult ticket cost?")
    reopened.close()


def test_a_database_removed_under_a_running_store_is_a_store_error_and_not_made_again(rag):
    """passages.sqlite removed while the store runs (a card swapped, a clean-up script): the next question's full-text
    search opened a new connection, which made a new empty database, and failed with sqlite3's OperationalError 'no
    such table: passages_fts' (the kiosk: 500 "internal error"); a write did the same on its own connection. Each is
    now the StoreError naming the store, and no file is made: the folder still holds the index and no database."""
    rag.add_documents([PRICES.format(price=16)])
    folder = rag.store.folder
    rag.close()
    with EdgeRAG(folder, bundle=rag.bundle.root) as reopened:  # connections made from here on are new ones
        (folder / DB_FILE).unlink()
        for call in (lambda: reopened.decide("How much does an adult ticket cost?"),
                     lambda: reopened.add_documents(["The lift is by the stairs."])):
            with pytest.raises(StoreError, match="cannot be read .*unable to open database file"):
                call()
            assert not (folder / DB_FILE).exists()


def test_a_corrupt_database_page_is_caught_when_the_store_opens(rag, tmp_path):
    rag.add_documents([f"Sentence number {i} about the harbour museum and its ships." for i in range(300)])
    folder = rag.store.folder
    rag.close()
    path = folder / DB_FILE
    data = bytearray(path.read_bytes())
    page = 4096
    data[3 * page : 3 * page + 512] = os.urandom(512)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt|not a readable SQLite"):
        EdgeRAG(folder, bundle=rag.bundle.root)


def test_store_files_are_never_world_writable(tmp_path, bundle_dir):
    old = os.umask(0)
    try:
        with EdgeRAG(tmp_path / "db", bundle=bundle_dir) as rag:
            rag.add_documents(["One sentence about permissions on a kiosk."])
            index = rag.store.folder / rag.store.index_file
    finally:
        os.umask(old)
    assert not index.stat().st_mode & 0o022 and not (tmp_path / "db").stat().st_mode & 0o022


def test_cli_remove_and_ask_on_a_missing_store(tmp_path, bundle_dir):
    docs = tmp_path / "tickets.txt"
    docs.write_text(PRICES.format(price=16))
    db = tmp_path / "db"
    cli = [sys.executable, "-m", "edge_rag"]
    common = ["--db", str(db), "--bundle", str(bundle_dir)]
    run = subprocess.run(cli + ["index", str(docs), "--quiet"] + common, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    # the file named twice is one document (it said "removed 2 document(s)")
    run = subprocess.run(cli + ["remove", str(docs), str(docs)] + common, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and "removed 1 document(s), 3 passages" in run.stdout, run.stdout + run.stderr
    assert "now holds 0" in run.stdout
    run = subprocess.run(cli + ["ask", "hi", "--db", str(tmp_path / "dbb"), "--bundle", str(bundle_dir)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "no passage store" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "dbb").exists()
    run = subprocess.run(cli + ["index", str(docs), "--memory-mb", "0"] + common, capture_output=True, text=True)
    assert run.returncode == 2 and "must be positive" in run.stderr
    with sqlite3.connect(db / DB_FILE) as con:
        assert con.execute("SELECT COUNT(*) FROM passages").fetchone()[0] == 0


def test_cli_removing_a_file_nothing_was_indexed_from_says_so(tmp_path, bundle_dir, capsys):
    """`edge-rag remove venue-docs/old-prices.md` run twice (docs/guides/quickstart.md) said the second time "no
    document with id 'venue-docs/old-prices.md'", as if the file had not been looked at; it says that nothing was
    indexed from it either, and removes nothing."""
    from edge_rag.cli.commands import main

    docs, db = tmp_path / "old-prices.md", tmp_path / "db"
    docs.write_text(PRICES.format(price=12))
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_documents(["The café opens at 9:00 every day."])
    assert main(["remove", str(docs), "--db", str(db), "--bundle", str(bundle_dir)]) == 2
    err = capsys.readouterr().err
    assert f"no document with id '{docs}'" in err and "nor one indexed from a file of that name" in err, err
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        assert rag.store.count == 1


def test_cli_remove_run_from_a_folder_since_removed(tmp_path, bundle_dir):
    """`edge-rag remove DOC_ID` run from a working folder since removed (a release folder swapped away) ended on
    FileNotFoundError's traceback, resolving DOC_ID as a file name; the document is removed by its id."""
    docs, db, gone = tmp_path / "tickets.txt", tmp_path / "db", tmp_path / "gone"
    docs.write_text(PRICES.format(price=16))
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_files([docs])
        [doc_id] = rag.store.documents_from(str(docs.resolve()))
    gone.mkdir()

    def leave() -> None:
        os.chdir(gone)
        os.rmdir(gone)
    run = subprocess.run([sys.executable, "-m", "edge_rag", "remove", doc_id, "--db", str(db), "--bundle",
                          str(bundle_dir)], capture_output=True, text=True, preexec_fn=leave)
    assert run.returncode == 0 and "removed 1 document(s)" in run.stdout and "now holds 0" in run.stdout, run.stderr


def test_cli_question_with_invalid_utf8_is_an_error_not_a_traceback(tmp_path, bundle_dir, sample_rag):
    cli = [sys.executable, "-m", "edge_rag", "ask", b"caf\xe9 hours?".decode("utf-8", "surrogateescape"),
           "--db", str(sample_rag.store.folder), "--bundle", str(bundle_dir)]
    run = subprocess.run([os.fsencode(a) for a in cli], capture_output=True, cwd=ROOT)
    err = run.stderr.decode(errors="replace")
    assert run.returncode == 2 and "not valid Unicode" in err and "Traceback" not in err


def test_sample_answers_still_route(sample_rag):
    assert sample_rag.ask("Who founded the Harbourlight Science Museum?").route is Route.RAG
