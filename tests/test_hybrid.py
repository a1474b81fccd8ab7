"""Hybrid retrieval on the real stores: the full-text index commits with the passages, survives a crash mid-commit,
is built for stores made before it, and one search returns one fused list carrying both scores."""
from __future__ import annotations

import math
import sqlite3
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from lexical_cases import (
    GREETING,
    NUMBER_TEXTS,
    TERMS,
    check_a_long_question_keeps_its_rarest_words,
    check_numbers_match_as_written,
    check_rarest_terms_pick_the_candidates,
    check_words_match_in_every_script,
)

from edge_rag import Config, EdgeRAG
from edge_rag.config import ConfigError
from edge_rag.documents.chunk import make_document
from edge_rag.retrieval import retrieve
from edge_rag.retrieval.lexical import Postings, candidate_terms, fts5_query, query_terms, rarest, tsquery
from edge_rag.storage.store import Store
from edge_rag.storage.store_db import DB_FILE, FTS_TABLE, Part


class Crash(Exception):
    """Raised by a fault hook inside the commit."""


def test_query_terms_carry_only_words():
    assert query_terms("What does 'DROP TABLE' -- \"cost\" OR NEAR(x)?") == ["cost", "drop", "near", "table"]
    assert query_terms("the and of it?") == [] and query_terms("🙂🙂") == []
    terms = ["adult", "ticket"]
    assert fts5_query(terms) == '"adult" OR "ticket"' and tsquery(terms) == "'adult' | 'ticket'"



def test_underscores_split_words_as_the_engines_do():
    """Both engines split "_the_" (Markdown emphasis) and "opening_hours" at the underscore; the question kept them
    whole, so their stop words reached the query and matched nearly every passage (74 ms a search at 50k passages)."""
    assert query_terms("what is _the_ price __of__ _a_ ticket?") == query_terms("what is the price of a ticket?")
    assert query_terms("_the_ _of_") == [] and query_terms("opening_hours") == ["hours", "opening"]

@pytest.mark.parametrize("form", ["NFC", "NFD"])
def test_an_accented_question_finds_its_words_in_either_unicode_form(tmp_path, form):
    """A question typed with combining accents (NFD) asks for the words the index holds, not for the pieces between
    the accents ("pe", "rez"): the lexical search finds the passage that names the person."""
    texts = ["Enrique Pérez de Guzmán bought the rights in 1430.", "The museum keeps old maps of the islands.",
             "A French nobleman, Jean de Béthencourt, led the expedition."]
    store = Store(tmp_path, 8, "enc")
    docs = [make_document(t, f"doc{i}") for i, t in enumerate(texts)]
    store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, texts)], np.eye(8, dtype=np.float32)[:3])
    question = unicodedata.normalize(form, "Who was Pérez? And İstanbul?")
    assert query_terms(question) == ["istanbul", "pérez"]  # "İ" lower-cases to "i" and a dot; PostgreSQL holds "i"
    found = retrieve.search(store, np.eye(8, dtype=np.float32)[1], question, 3, Config(retrieval="lexical")).passages
    assert [p.text for p in found] == texts[:1] and found[0].lexical > 0
    store.close()


def test_candidate_terms_are_the_rarest_within_the_budget():
    terms, postings = ["film", "one", "zeppelin", "airship"], [700, 1900, 40, 300]
    assert candidate_terms(terms, postings, 1000) == (["zeppelin", "airship"], ["film", "one"])
    assert candidate_terms(terms, postings, 10) == (["zeppelin"], ["film", "one", "airship"])  # always one
    assert candidate_terms(terms, postings, 10**6) == (["zeppelin", "airship", "film", "one"], [])


def test_rarest_terms_pick_the_candidates(tmp_path):
    store = Store(tmp_path, 8, "enc")
    check_rarest_terms_pick_the_candidates(store, 8)
    store.close()


def test_numbers_match_as_written(tmp_path):
    """And SQLite ranks first the passage holding the number, not one holding its digits apart ("3" and "7"; "26"
    twice and a "000"), which "3" OR "7" and "26" OR "000" ranked first."""
    store = Store(tmp_path, 8, "enc")
    vectors = check_numbers_match_as_written(store, 8)
    lexical = Config(retrieval="lexical")
    for question, holding, apart in (("What was 3.7?", 2, 3), ("Who were the 26,000?", 1, 0)):
        found = retrieve.search(store, vectors[apart], question, 4, lexical).passages
        assert [p.text for p in found[:2]] == [NUMBER_TEXTS[holding], NUMBER_TEXTS[apart]]
    store.close()


def test_words_match_whole_in_every_script(tmp_path):
    store = Store(tmp_path, 8, "enc")
    check_words_match_in_every_script(store, 8)
    store.close()


def test_a_long_question_keeps_its_rarest_words(tmp_path):
    """And SQLite's BM25 ranks the subject's passage first: the 40 common words weigh next to nothing."""
    store = Store(tmp_path, 16, "enc")
    _, subject = check_a_long_question_keeps_its_rarest_words(store, 16)
    terms = query_terms(" ".join(GREETING) + " zeppelin")
    assert len(terms) == 41 and rarest(terms, [10] * 40 + [1]) == (GREETING[:31] + ["zeppelin"], [10] * 31 + [1])
    assert rarest(["qwerty", "zeppelin"], [0, 1]) == (["zeppelin"], [1])  # a word no passage holds takes no place
    assert store.search_text(["qwerty"], 5) == []
    [first, *_] = store.search_text(terms, 5)
    assert store.passages([first[0]])[0].text == subject
    store.close()


def test_postings_are_counted_once_per_store_version():
    calls = []

    def count(terms: list[str]) -> list[int]:
        calls.append(terms)
        return [len(t) for t in terms]

    postings = Postings()
    assert postings.of(["ab", "abc", "ab"], 1, count) == [2, 3, 2] and calls == [["ab", "abc"]]
    assert postings.of(["abc", "abcd"], 1, count) == [3, 4] and calls[1:] == [["abcd"]]
    assert postings.of(["abc"], 2, count) == [3] and calls[2:] == [["abc"]]  # a commit: counted again


def test_searches_in_many_threads_find_what_one_finds(sample_rag):
    """Lexical searches run on their own connections beside dense ones (retrieve.search): 8 threads asking at
    once get what one thread asking alone gets."""
    rag = sample_rag
    questions = ["How much does an adult ticket cost?", "When does the museum open on Sunday?",
                 "Where can visitors park?", "Is the cafe open late?", "the and of it"]
    vectors = rag.encoder.encode(questions)

    def ask(i: int) -> list[tuple[int, float, float]]:
        found = retrieve.search(rag.store, vectors[i], questions[i], 10, rag.config)
        return [(p.id, round(p.score, 5), p.lexical) for p in found.passages]

    alone = [ask(i) for i in range(len(questions))]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, [i for _ in range(20) for i in range(len(questions))], timeout=120))
    assert together == alone * 20 and any(lex > 0 for hits in alone for _, _, lex in hits)


def test_a_lexical_hit_another_process_committed_since_is_left_out(tmp_path):
    """The full-text index is read without the search lock, so it may find a passage another process committed
    that this store's vectors do not hold yet: the fused list leaves it out instead of failing the question."""
    reader, writer = Store(tmp_path, 8, "enc"), Store(tmp_path, 8, "enc")
    doc = make_document("The zeppelin hangar held airships", "late")
    writer.add([Part(doc, 0, [doc.text], last=True, sha="late")], np.eye(8, dtype=np.float32)[:1])
    [(pid, score)] = reader.search_text(["zeppelin"], 5)  # SQLite shows the commit at once
    query = np.eye(8, dtype=np.float32)[0]
    assert reader.scored(query, [pid]) == []  # the vector is in the writer's index file, not loaded here
    assert retrieve.with_cosines(reader, query, [], {pid: score}) == {}
    writer.close()
    reader.close()


def test_budgeted_full_text_searches_in_many_threads(tmp_path):
    """16 threads at once, each search two FTS5 queries, on the store's few read connections: each gets its turn
    and what one thread alone gets (a deadlock guard fails the test instead of hanging it)."""
    store = Store(tmp_path, 8, "enc")
    check_rarest_terms_pick_the_candidates(store, 8)  # fills the store: "museum" common, "zeppelin" rare
    alone = store.search_text(TERMS, 5, budget=10)
    found: list = []
    threads = [threading.Thread(target=lambda: found.extend(store.search_text(TERMS, 5, budget=10) for _ in range(12)),
                                daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "full-text searches deadlocked"
    assert found == [alone] * 192
    store.close()


def test_config_names_the_retrievers():
    assert Config().retrieval == "hybrid"
    with pytest.raises(ConfigError, match="allowed values are hybrid, dense, lexical, none"):
        Config(retrieval=True)


def fts_rows(folder) -> set[int]:
    with sqlite3.connect(folder / DB_FILE) as db:
        return {r[0] for r in db.execute(f"SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH 'ticket OR cafe OR ships'")}


def test_full_text_index_commits_with_the_passages(tmp_path, encoder):
    texts = [["The lighthouse guided ships", "It was built in 1887"], ["Adult tickets cost 16 pounds", "The cafe opens at 9"]]
    ds = [make_document(" ".join(t), f"doc{i}") for i, t in enumerate(texts)]
    store = Store(tmp_path, encoder.dim, "enc")
    store.add([Part(d, 0, t, last=True, sha=d.doc_id) for d, t in zip(ds, texts)], encoder.encode(sum(texts, [])))
    hits = store.search_text(query_terms("How much is an adult ticket?"), 5)
    assert [store.passages([i])[0].text for i, _ in hits][:1] == ["Adult tickets cost 16 pounds"]
    assert hits[0][1] > 0 and fts_rows(tmp_path) == {0, 1, 2, 3}  # 1 by its context: "...guided ships"

    def crash(step: str) -> None:
        if step == "rows_written":  # inside the one transaction: passages and full text roll back together
            raise Crash(step)

    store.fault_hook = crash
    with pytest.raises(Crash):
        store.remove([ds[1].doc_id])
    assert fts_rows(tmp_path) == {0, 1, 2, 3}
    store.fault_hook = None
    store.remove([ds[1].doc_id])
    assert fts_rows(tmp_path) == {0, 1} and store.search_text(["ticket"], 5) == []
    store.close()


def _fts_levels(folder) -> int:
    """The level count of the full-text index's structure record (FTS5's data row 10: a 4-byte cookie, then it as
    a varint)."""
    with sqlite3.connect(folder / DB_FILE) as db:
        record = db.execute(f"SELECT block FROM {FTS_TABLE}_data WHERE id = 10").fetchone()[0]
    db.close()
    levels = 0
    for byte in record[4:]:
        levels = levels << 7 | byte & 0x7F
        if byte < 0x80:
            return levels
    raise AssertionError("truncated structure record")


def _commit_words(store, i: int) -> None:
    """One commit of a three-passage document of 30 words of its own (the index soon spans several pages)."""
    doc = make_document(f"Document {i}", doc_id=f"d{i}")
    texts = [" ".join(f"w{i}x{j}y{w}" for w in range(10)) for j in range(3)]
    store.add([Part(doc, 0, texts, last=True, sha=doc.doc_id)], np.eye(8, dtype=np.float32)[:3])


def test_commits_keep_the_full_text_index_whole(tmp_path):
    """Each commit merges the index's segments (store_fts_index.merge): after 40 commits and a removal FTS5's own
    integrity check against the passages passes, each passage is found by its word, and the index's structure
    keeps a few levels. Before: each commit's 'merge' < 0 added two levels once the index spanned two pages (70
    after these 40 commits), until SQLite called the record malformed (~1,000 commits) and the store never opened
    again."""
    store = Store(tmp_path, 8, "enc")
    for i in range(40):
        _commit_words(store, i)
    store.remove(["d7"])
    assert _fts_levels(tmp_path) <= 8
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")
    db.close()
    assert [len(store.search_text([f"w{i}x1y2"], 5)) for i in range(40)] == [3 * (i != 7) for i in range(40)]  # by context too
    store.close()


def test_a_full_text_index_sqlite_will_not_load_is_rebuilt_when_the_store_opens(tmp_path):
    """Its structure record damaged (as earlier versions' commits left it, past ~1,000 of them), the store opened
    anyway: the index is rebuilt from the passages and finds them."""
    store = Store(tmp_path, 8, "enc")
    for i in range(3):
        _commit_words(store, i)
    store.close()
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute(f"UPDATE {FTS_TABLE}_data SET block = ? WHERE id = 10", (b"\0\0\0\0\xff\xff\xff\x7f",))
    db.close()
    store = Store(tmp_path, 8, "enc", create=False)
    assert [len(store.search_text([f"w{i}x1y2"], 5)) for i in range(3)] == [3, 3, 3]
    _commit_words(store, 3)
    assert store.search_text(["w3x0y0"], 5) and store.count == 12
    store.close()


def _old_store(folder, fts: bool) -> None:
    """Make the store in ``folder`` what an earlier version wrote: no contexts, and a full-text index of title and
    text only (``fts``) or none."""
    with sqlite3.connect(folder / DB_FILE) as db:
        for name in ("passages_fts_insert", "passages_fts_delete", "passages_fts_update"):
            db.execute(f"DROP TRIGGER {name}")
        db.execute(f"DROP TABLE {FTS_TABLE}")
        db.execute("UPDATE passages SET context = NULL")
        if fts:
            for statement in (
                    f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5(title, text, content='passages', content_rowid='id', "
                    "tokenize='porter unicode61')",
                    f"CREATE TRIGGER passages_fts_insert AFTER INSERT ON passages BEGIN INSERT INTO {FTS_TABLE}(rowid, "
                    "title, text) VALUES (new.id, new.title, new.text); END",
                    f"CREATE TRIGGER passages_fts_delete AFTER DELETE ON passages BEGIN INSERT INTO {FTS_TABLE}("
                    f"{FTS_TABLE}, rowid, title, text) VALUES ('delete', old.id, old.title, old.text); END",
                    f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')"):
                db.execute(statement)


@pytest.mark.parametrize("fts", [False, True], ids=["no full-text index", "no context column"])
def test_a_store_from_before_the_full_text_index_gets_one(tmp_path, bundle_dir, fts):
    """Opened, an older store gets the current index (contexts computed from its passages), in one transaction;
    removing a document afterwards keeps the index whole."""
    with EdgeRAG(tmp_path, bundle=bundle_dir) as rag:
        rag.add_documents([make_document("Adult tickets cost 16 pounds. The cafe opens at nine.", "Visit"),
                           make_document("The lighthouse guided ships. It was built in 1887.", "Light",
                                         doc_id="light")])
    _old_store(tmp_path, fts)
    with EdgeRAG(tmp_path, bundle=bundle_dir) as rag:
        assert len(rag.store.search_text(["ticket", "cafe"], 10)) == 2  # each sentence of "Visit", one by context
        assert rag.decide("How much is an adult ticket?").passages[0].title == "Visit"
        rag.remove(["light"])
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")
        assert [r[0] for r in db.execute("SELECT context FROM passages ORDER BY position")] == [
            "The cafe opens at nine.", "Adult tickets cost 16 pounds."]


@pytest.mark.parametrize("question", ["What does a concession ticket cost?", "Who was Big Mary?"])
def test_one_fused_list_with_both_scores(sample_rag, question):
    rag = sample_rag
    vector = rag.encoder.encode_one(question)
    # a heavy lexical weight makes sure BM25-only hits reach the top 20 of this small corpus
    found = retrieve.search(rag.store, vector, question, 20, rag.config.with_(lexical_weight=2.0))
    dense = rag.store.search(vector, rag.store.count)
    cosine = {p.id: p.score for p in dense}
    assert len(found.passages) == 20 and len({p.id for p in found.passages}) == 20
    assert [p.fused for p in found.passages] == sorted((p.fused for p in found.passages), reverse=True)
    assert any(p.lexical > 0 for p in found.passages) and any(p.id not in {d.id for d in dense[:20]}
                                                              for p in found.passages if p.lexical > 0)
    for p in found.passages:  # every hit carries its exact cosine, lexical-only hits too
        assert math.isclose(p.score, cosine[p.id], abs_tol=1e-5)
    # fused = cosine + a bonus for the BM25 rank; the list is the best 20 of both lists' passages by it
    lexical = [pid for pid, _ in rag.store.search_text(query_terms(question), 20)]
    k, w = rag.config.fusion_k, 2.0
    fused = {pid: cosine[pid] + (w / (k + lexical.index(pid) + 1) if pid in lexical else 0.0)
             for pid in [d.id for d in dense[:20]] + lexical}
    assert all(math.isclose(p.fused, fused[p.id], abs_tol=1e-5) for p in found.passages)
    assert found.passages[-1].fused >= max(f for pid, f in fused.items() if pid not in {p.id for p in found.passages}) - 1e-5
    assert math.isclose(found.nearest.score, dense[0].score, abs_tol=1e-6)  # the distance floor stays dense


@pytest.mark.parametrize("question", ["the and of it", "🙂 ❤️ 🙂", "Ποιο είναι το ωράριο;"])
def test_no_indexable_word_falls_back_to_dense(sample_rag, question):
    rag = sample_rag
    vector = rag.encoder.encode_one(question)
    found = retrieve.search(rag.store, vector, question, 10, rag.config)
    assert [p.id for p in found.passages] == [p.id for p in rag.store.search(vector, 10)]
    assert all(p.lexical == 0 for p in found.passages)


def test_a_question_typed_in_full_width_is_asked_in_ascii(sample_rag):
    """A Chinese or Japanese input method in full-width mode types "ｔｉｃｋｅｔ １６": the encoder read [UNK]s and the
    full-text index held no such word. Full-width letters, digits and signs are the question in ASCII: the same
    question, passages and route."""
    question = "How much does an adult ticket cost for 16 year olds?"
    typed = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in question)
    assert typed != question and query_terms(question) == ["16", "adult", "cost", "much", "olds", "ticket", "year"]
    asked, expected = sample_rag.decide(typed), sample_rag.decide(question)
    assert asked.question == question and asked.passages == expected.passages and asked.route == expected.route


def test_lexical_and_dense_modes(sample_rag):
    rag, question = sample_rag, "How much does an adult ticket cost?"
    vector = rag.encoder.encode_one(question)
    lexical = retrieve.search(rag.store, vector, question, 5, rag.config.with_(retrieval="lexical"))
    assert all(p.lexical > 0 for p in lexical.passages)
    assert [p.lexical for p in lexical.passages] == sorted((p.lexical for p in lexical.passages), reverse=True)
    dense = retrieve.search(rag.store, vector, question, 5, rag.config.with_(retrieval="dense"))
    assert np.allclose([p.score for p in dense.passages], [p.score for p in rag.store.search(vector, 5)])
    assert math.isclose(lexical.nearest.score, dense.nearest.score)


def test_a_document_committed_in_parts_gets_the_contexts_it_would_get_in_one(tmp_path):
    """A long document comes in several commits (indexing.py): the last passages of one commit get the rest of their
    context with the next, so the index ends as if the document had come in one; each passage is found by the word
    of a neighbour within CONTEXT_NEIGHBOURS (2) positions, below the passage holding it."""
    texts = [f"Sentence {w} here" for w in "alpha bravo charlie delta echo foxtrot golf".split()]
    doc = make_document(" ".join(texts), "Long", doc_id="long")
    vectors = np.eye(8, dtype=np.float32)[:7]
    one, split = Store(tmp_path / "one", 8, "enc"), Store(tmp_path / "split", 8, "enc")
    one.add([Part(doc, 0, texts, last=True, sha="s")], vectors)
    split.add([Part(doc, 0, texts[:3], last=False, sha="s")], vectors[:3])
    split.add([Part(doc, 3, texts[3:], last=True, sha="s")], vectors[3:])
    stored = []
    for folder in (tmp_path / "one", tmp_path / "split"):
        with sqlite3.connect(folder / DB_FILE) as db:
            db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")
            stored.append(db.execute("SELECT id, context FROM passages ORDER BY id").fetchall())
    assert stored[0] == stored[1]
    assert stored[1][2][1] == "Sentence alpha here Sentence bravo here Sentence delta here Sentence echo here"
    found = [i for i, _ in split.search_text(["delta"], 10)]
    assert found[0] == 3 and sorted(found) == [1, 2, 3, 4, 5]
    one.close()
    split.close()
