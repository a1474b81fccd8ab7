"""``edge-rag serve`` on a PostgreSQL + pgvector store, over real HTTP (real uvicorn on 127.0.0.1, the tests'
throw-away PostgreSQL: conftest.pg_admin_url). Its own file, so its server's memory is not counted by the memory
planner of the other PostgreSQL tests (they plan in their own process)."""
from __future__ import annotations

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
