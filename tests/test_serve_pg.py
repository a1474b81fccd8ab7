"""``edge-rag serve`` on a PostgreSQL + pgvector store, over real HTTP (real uvicorn on 127.0.0.1, the tests'
throw-away PostgreSQL: conftest.pg_admin_url). Its own file, so its server's memory is not counted by the memory
planner of the other PostgreSQL tests (they plan in their own process)."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SAMPLE_DOCS

from edge_rag.config import Config

httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
serving = pytest.importorskip("serving", reason="the serve extra (starlette, uvicorn, httpx) is not installed")
pytest.importorskip("psycopg", reason="the pg extra is not installed: pip install 'edge-rag[pg]'")


def test_the_kiosk_page_is_served_from_a_postgresql_store(sample_rag, pg_url, bundle_dir):
    """Issue #43: ``GET /api/kiosk`` answered 500 on every call on a PostgreSQL store (the suggestions read the
    embedded store's SQLite connection). Over real HTTP: the page's settings and suggested questions, made from the
    same document titles in the same order as the embedded store's; removing a document id with a NUL is a 404."""
    from edge_rag.pipeline import EdgeRAG

    remote = EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0, index_threads=1))
    remote.add_files([SAMPLE_DOCS])
    with serving.running_server(remote) as url:  # closes ``remote`` when it stops
        for _ in range(2):  # the second call is answered from the memo, as the first
            r = httpx.get(f"{url}/api/kiosk", timeout=300)
            assert r.status_code == 200, r.text
            kiosk = r.json()
            assert kiosk["questions"] and kiosk["decision"]["certified"], kiosk
        assert remote.store.titles(50) == sample_rag.store.titles(50) and len(remote.store.titles(3)) == 3
        # an id PostgreSQL text cannot hold is no stored document: 404 as on the embedded store (was a 500)
        gone = httpx.delete(f"{url}/api/documents/a%00b", headers=serving.WRITE, timeout=60)
        assert gone.status_code == 404, gone.text


def test_labels_and_a_calibration_of_a_store_made_again_at_its_url_are_stale(pg_url, bundle_dir, tmp_path):
    """/admin keyed labels and a calibration to apply on the store's version alone: a PostgreSQL store dropped and
    made again at its URL (the pool reconnects; versions from 1 again) took the old corpus's label as current (0 of
    1 stale), calibrated on it, and applied a calibration measured on the old store (200). They key on the store's
    stamp (identity and version) now: the label is stale, calibrating and applying are refused, the certificate in
    force stays."""
    import time

    import psycopg
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve.admin import Admin
    from edge_rag.serve.config import ServeConfig
    from edge_rag.serve.errors import HANDLERS
    from edge_rag.serve.jobs import Jobs
    from edge_rag.serve.pages import STATIC

    auth, question = serving.WRITE, "Who founded the Harbourlight Science Museum?"
    with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        rag.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
        jobs = Jobs(rag)
        admin = Admin(rag, ServeConfig(port=0, token=serving.TOKEN, question_log=str(tmp_path / "q.jsonl"),
                                       min_labels=1), jobs, STATIC, {})
        try:
            client = TestClient(Starlette(routes=admin.routes(), exception_handlers=HANDLERS),
                                raise_server_exceptions=False)
            label = {"question": question, "label": "answer", "answers": ["Ada Lovelace"]}
            assert client.post("/api/admin/labels", json=label, headers=auth).status_code == 200
            job = jobs.get(client.post("/api/admin/calibrate", headers=auth).json()["id"])
            deadline = time.monotonic() + 600  # a bound on a hung job, not a timing assertion
            while not job.finished:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert job.state == "done", job.to_dict()
            in_force = rag.certified.calibration_path
            with psycopg.connect(pg_url, autocommit=True) as conn:  # the operator starts the corpus over
                conn.execute("DROP TABLE edge_rag_passages, edge_rag_documents, edge_rag_meta")
            with EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0)) as operator:
                operator.add_documents(["The Harbourlight Science Museum was founded in 1923 by Marie Curie."])
            assert rag.store.version == job.result["store_version"] == 1
            listing = client.get("/api/admin/questions", headers=auth).json()
            assert listing["stale"] == listing["labelled"] == 1, listing
            calibrating = client.post("/api/admin/calibrate", headers=auth)
            assert calibrating.status_code == 409 and "documents last changed" in calibrating.json()["error"]
            applied = client.post("/api/admin/apply", json={"calibration": job.id, "max_error_rate": 0.1},
                                  headers=auth)
            assert applied.status_code == 409 and "documents changed" in applied.json()["error"], applied.text
            assert rag.certified.calibration_path == in_force
        finally:
            jobs.close()
            admin.close()


def test_an_unreachable_database_is_a_503_to_retry_and_a_broken_store_stays_a_500(pg_url, bundle_dir, monkeypatch,
                                                                                   tmp_path):
    """The database down (here: refusing connections, its sessions ended), a question, a streamed answer, the kiosk
    page, a removal and an upload's job failed with 500, as a bug would: a load balancer or a kiosk could not tell an
    outage (retry) from a fault; applying a calibration said "the documents are being changed" (409). They are 503
    now (health already was); the store's tables gone is still a 500."""
    import psycopg
    from test_pgstore import refusing_connections

    from edge_rag.errors import StoreUnavailable
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve import admin_cal
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "CONNECT_TIMEOUT_S", 1)  # the wait of a call while the server is down
    remote = EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0, index_threads=1))
    remote.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
    question = "Who founded the Harbourlight Science Museum?"
    with serving.running_server(remote) as url:
        stamp = remote.store.stamp
        with refusing_connections(pg_url):
            calls = {"ask": httpx.post(f"{url}/api/ask", json={"question": question}, timeout=60),
                     "kiosk": httpx.get(f"{url}/api/kiosk", timeout=60),
                     "remove": httpx.delete(f"{url}/api/documents/x", headers=serving.WRITE, timeout=60),
                     "health": httpx.get(f"{url}/api/health", timeout=60)}
            streamed = serving.sse_events(httpx.get(f"{url}/api/ask/stream", params={"q": question}, timeout=60))
            upload = serving.wait_job(url, httpx.post(f"{url}/api/documents", files={"file": ("a.txt", b"Ferries.")},
                                                      headers=serving.WRITE, timeout=60))
            with pytest.raises(StoreUnavailable):  # was NotReady (409): "the documents are being changed"
                admin_cal.apply(remote, admin_cal.Files(tmp_path), {}, stamp, 0.1)
        assert {name: r.status_code for name, r in calls.items()} == dict.fromkeys(calls, 503), calls["ask"].text
        assert streamed[-1][0] == "failed" and streamed[-1][1]["status"] == 503, streamed
        assert upload["state"] == "failed" and upload["status"] == 503, upload
        assert httpx.post(f"{url}/api/ask", json={"question": question}, timeout=60).status_code == 200
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP TABLE edge_rag_passages, edge_rag_documents, edge_rag_meta")
        gone = httpx.post(f"{url}/api/ask", json={"question": "When was the museum founded?"}, timeout=60)
        assert gone.status_code == 500 and "does not exist" in gone.json()["error"], gone.text


def test_an_upload_while_another_device_indexes_is_a_503_to_retry(pg_url, bundle_dir):
    """Another device indexing into the store (its writers' lock held): an upload's job failed with status 500 "being
    written by another process … retry when it is done", as a bug would (so did one into a folder store another
    process indexed). It is 503 (retry) now, and the same upload is added once that device is done."""
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.storage.pgstore import PgStore

    remote = EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0, index_threads=1))
    remote.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
    other = PgStore(pg_url, remote.store.dim)
    upload = {"file": ("ferry.txt", b"The ferry to the museum leaves every hour.")}
    with serving.running_server(remote) as url:
        with other.writing():
            busy = serving.wait_job(url, httpx.post(f"{url}/api/documents", files=upload, headers=serving.WRITE,
                                                    timeout=60))
        assert busy["state"] == "failed" and busy["status"] == 503, busy
        assert "being written by another process" in busy["error"], busy
        done = serving.wait_job(url, httpx.post(f"{url}/api/documents", files=upload, headers=serving.WRITE, timeout=60))
        assert done["state"] == "done" and remote.store.count == 2, done
    other.close()


def test_a_table_whose_data_file_is_gone_is_a_500_not_a_503_to_retry(pg_url, bundle_dir):
    """The passages table's data file removed (a damaged data directory): a question was a 503 ("retry") as an outage
    is, since psycopg raises every OperationalError alike ("could not open file …", SQLSTATE 58P01), so a kiosk or
    load balancer retried a store that will not come back. It is a 500, as the store's tables gone are."""
    import psycopg

    from edge_rag.pipeline import EdgeRAG

    remote = EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0, index_threads=1))
    remote.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        data = Path(conn.execute("SHOW data_directory").fetchone()[0])
        path = data / conn.execute("SELECT pg_relation_filepath('edge_rag_passages')").fetchone()[0]
        if not path.is_file():
            pytest.skip("the server's data directory is not on this machine")
        conn.execute("CHECKPOINT")  # then its sessions end: the pool's next ones open the file again
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid()")
    path.unlink()
    with serving.running_server(remote) as url:
        r = httpx.post(f"{url}/api/ask", json={"question": "Who founded the Harbourlight Science Museum?"}, timeout=60)
    remote.close()
    assert r.status_code == 500 and "could not open file" in r.json()["error"], r.text


def test_questions_asked_during_an_outage_fail_at_once_not_one_connection_wait_each(pg_url, bundle_dir, monkeypatch):
    """Questions run one at a time, and during an outage each waited the pool's connection timeout before its 503:
    five asked at once heard after 10, 20, 30, 40 and 50 s, each waiting on the others' work. Once one has found the
    database unreachable the others fail at once (pgbreaker), all within two connection waits; the first question
    once the database answers again is served."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from test_pgstore import refusing_connections

    from edge_rag.pipeline import EdgeRAG
    from edge_rag.storage import pgsql

    monkeypatch.setattr(pgsql, "CONNECT_TIMEOUT_S", 2)  # the wait of a call while the server is down
    remote = EdgeRAG(pg_url, bundle=bundle_dir, config=Config(temperature=0.0, index_threads=1))
    remote.add_documents(["The Harbourlight Science Museum was founded in 1887 by Ada Lovelace."])
    question = "Who founded the Harbourlight Science Museum?"

    def ask(words: str) -> tuple[int, float]:
        r = httpx.post(f"{url}/api/ask", json={"question": f"{question} {words}"}, timeout=120)
        return r.status_code, time.monotonic() - start

    with serving.running_server(remote) as url:
        with refusing_connections(pg_url), ThreadPoolExecutor(5) as asking:
            start = time.monotonic()
            answered = list(asking.map(ask, ["", "Please.", "Thanks.", "Who?", "Founder?"]))
        assert [status for status, _ in answered] == [503] * 5, answered
        assert max(after for _, after in answered) < 2 * pgsql.CONNECT_TIMEOUT_S, answered  # was 2, 4, 6, 8, 10 s
        assert httpx.post(f"{url}/api/ask", json={"question": question}, timeout=60).status_code == 200
