"""Who may change the kiosk's answers, over real HTTP (real uvicorn on 127.0.0.1, real models and store).

Issue #26: a loopback server without a token took uploads from anyone, with any Origin or Host; a JSON
record reusing a document's id replaced it ("adult tickets cost 999 pounds"); a bare token without
``Bearer`` was accepted; an edited file uploaded again kept both versions; nothing could be removed.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'edge-rag[serve]'")

import serving  # noqa: E402
from conftest import SAMPLE_DOCS  # noqa: E402
from docmaker import nested_html, pdf_bomb_bytes  # noqa: E402
from serving import WRITE, running_server, wait_job  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402

from edge_rag.config import Config  # noqa: E402
from edge_rag.errors import EdgeRAGError  # noqa: E402
from edge_rag.memory import plan, stored_passages  # noqa: E402
from edge_rag.models.bundle import Bundle  # noqa: E402
from edge_rag.pipeline import EdgeRAG  # noqa: E402
from edge_rag.serve.app import create_app  # noqa: E402
from edge_rag.serve.auth import token_from_file  # noqa: E402
from edge_rag.serve.config import ServeConfig  # noqa: E402
from edge_rag.serve.uploads import COPY_CHUNK, TEMP_PREFIX, save_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
T = httpx.Timeout(300.0, connect=10.0)
TICKETS = "How much does an adult ticket cost?"
FORGED = "Adult tickets cost 999 pounds."


@pytest.fixture(scope="module")
def servers(bundle_dir, sample_db, tmp_path_factory):
    """(writable URL, its EdgeRAG, read-only URL): two servers over copies of the sample store."""
    rags, urls = [], []
    for name in ("writable", "read-only"):
        db = tmp_path_factory.mktemp(name) / "db"
        shutil.copytree(sample_db, db)
        # the read-only one plans no indexing encoder: it never indexes (test_config plans one, for servers with writes)
        config = serving.test_config().with_(index_threads=int(name == "writable"))
        rags.append(EdgeRAG(db, bundle=bundle_dir, config=config))
    token = {"writable": "test-write-token", "read-only": None}
    with running_server(rags[0], ServeConfig(port=0, question_timeout_s=900, token=token["writable"])) as url, \
            running_server(rags[1], ServeConfig(port=0, question_timeout_s=900, token=None)) as ro_url:
        urls = [url, ro_url]
        yield urls[0], rags[0], urls[1], rags[1]


def _forged_upload(rag: EdgeRAG) -> dict:
    tickets = rag.store.documents_from(str((SAMPLE_DOCS / "03-tickets-and-prices.md").resolve()))
    assert len(tickets) == 1
    record = [{"id": tickets[0], "title": "Tickets and Prices", "text": FORGED}]
    return {"file": ("prices.json", json.dumps(record).encode())}


def _answer(url: str, question: str) -> dict:
    r = httpx.post(f"{url}/api/ask", json={"question": question}, timeout=T)
    assert r.status_code == 200, r.text
    return r.json()


def test_read_only_server_refuses_every_write(servers):
    _, _, url, rag = servers
    before = rag.store.count
    doc_id = rag.store.documents_from(str((SAMPLE_DOCS / "03-tickets-and-prices.md").resolve()))[0]
    for headers in ({}, WRITE, {"origin": url}, {"authorization": "Bearer anything"}):
        up = httpx.post(f"{url}/api/documents", files=_forged_upload(rag), headers=headers, timeout=T)
        rm = httpx.delete(f"{url}/api/documents/{doc_id}", headers=headers, timeout=T)
        for r in (up, rm):
            assert r.status_code == 403 and r.json()["status"] == 403
            assert "read-only" in r.json()["error"] and "--token" in r.json()["error"]
    assert rag.store.count == before
    assert "999" not in (_answer(url, TICKETS)["answer"] or "")


@pytest.mark.parametrize("headers", [
    {"origin": "http://evil.example"},
    {"origin": "null"},
    {"origin": "http://127.0.0.1:1"},
    {"host": "evil.example"},
    {"host": "evil.example", "origin": "http://evil.example"},
    {"host": "127.0.0.1:1"},
])
def test_foreign_origin_or_host_changes_nothing(servers, headers):
    """A page on another site (a form post, DNS rebinding): refused before the token is even looked at."""
    url, rag, _, _ = servers
    before = rag.store.version
    up = httpx.post(f"{url}/api/documents", files=_forged_upload(rag), headers={**WRITE, **headers}, timeout=T)
    form = httpx.post(f"{url}/api/documents", data={"file": "x"}, headers={**WRITE, **headers}, timeout=T)
    ask = httpx.post(f"{url}/api/ask", json={"question": TICKETS}, headers=headers, timeout=T)
    for r in (up, form, ask):
        assert r.status_code == 403 and r.json()["status"] == 403, r.text
    assert rag.store.version == before
    # The same requests from the kiosk's own page pass the check.
    assert httpx.post(f"{url}/api/ask", json={"question": TICKETS}, headers={"origin": url}, timeout=T).status_code == 200


def test_json_id_overwrite_needs_the_token(servers):
    """Replacing a stored document by id is a write like any other: 401 without the Bearer token; with it,
    the record replaces the document (docs/reference/http.md says which documents a writer replaces)."""
    url, rag, _, _ = servers
    for auth in ({}, {"authorization": "test-write-token"}, {"authorization": "Bearer wrong"}):
        r = httpx.post(f"{url}/api/documents", files=_forged_upload(rag), headers=auth, timeout=T)
        assert r.status_code == 401, auth
    assert "999" not in (_answer(url, TICKETS)["answer"] or "")
    job = wait_job(url, httpx.post(f"{url}/api/documents", files=_forged_upload(rag), headers=WRITE, timeout=T))
    assert job["state"] == "done" and job["files"][0]["passages"] == 1
    assert "999" in (_answer(url, TICKETS)["answer"] or "")


def test_wrong_tokens_slow_their_address_down_never_its_questions(servers, monkeypatch):
    """Wrong API tokens were read without limit: two-letter guesses found a 2-character --token in 0.8 s (818 a
    second, `edge-rag serve`). Past FREE_TRIES wrong ones, an address waits before a token of its is read again (429,
    Retry-After), twice as long each time up to MAX_WAIT_S, even with another X-Forwarded-For on each guess (any
    script on the kiosk's own browser may set one); its questions are answered meanwhile, and past the wait the right
    token is taken (staff are never shut out for good) and clears the count."""
    from edge_rag.serve import auth

    url = servers[0]
    now = [1000.0]
    monkeypatch.setattr(auth, "monotonic", lambda: now[0])  # the server's clock, moved here: no test waits for it

    def guess(i: int) -> int:
        spoofed = {"authorization": f"Bearer guess{i}", "x-forwarded-for": f"10.0.{i // 250}.{i % 250 + 1}"}
        return httpx.delete(f"{url}/api/documents/none", headers=spoofed, timeout=T).status_code

    def staff() -> httpx.Response:
        return httpx.delete(f"{url}/api/documents/none", headers=WRITE, timeout=T)

    assert [guess(i) for i in range(auth.FREE_TRIES + 1)] == [401] * (auth.FREE_TRIES + 1)
    waits = []
    for i in range(9):
        held = staff()
        assert held.status_code == 429 and guess(i) == 429, held.text  # no token of the address is read
        assert _answer(url, TICKETS)["route"] == "RAG"  # a question needs no token: never held up
        waits.append(int(held.headers["retry-after"]))
        now[0] += waits[-1]
        assert guess(i) == 401  # read again, and wrong: a longer wait
    assert waits == sorted(waits) and waits[0] >= 1 and waits[-1] == auth.MAX_WAIT_S, waits
    now[0] += auth.MAX_WAIT_S
    assert staff().status_code == 404  # the right token, taken: "no document with id 'none'"
    assert guess(0) == 401 and staff().status_code == 404  # the count was cleared: free tries again
    tries = auth.Tries()  # a day of guesses, one a minute: the wait stays MAX_WAIT_S (2.0 ** 1024 overflowed)
    for _ in range(1440):
        tries.failed("10.0.0.1")
    with pytest.raises(HTTPException) as held:
        tries.check("10.0.0.1")
    assert held.value.headers == {"Retry-After": str(int(auth.MAX_WAIT_S))}


def test_wrong_tokens_from_one_ipv6_64_count_as_one_address(monkeypatch):
    """An IPv6 device may take any address of its /64 (privacy addresses rotate in it): guesses from a new address
    each were all read (12 of 12 from 2001:db8::1 .. ::c, each with its own FREE_TRIES), as were an IPv4 client's
    through a dual-stack socket (::ffff:10.0.0.1) beside its plain address. They count as one address now."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from edge_rag.serve import auth
    from edge_rag.serve.auth import FREE_TRIES, require_writer

    monkeypatch.setattr(auth, "monotonic", lambda: 1000.0)  # the server's clock stands still: no wait ends mid-test
    def write(request):
        require_writer(request, "the-token")
        return PlainTextResponse("written")

    app = Starlette(routes=[Route("/w", write, methods=["POST"])])

    def guess(host: str, token: str = "wrong") -> int:
        with TestClient(app, client=(host, 50000)) as client:
            return client.post("/w", headers={"authorization": f"Bearer {token}"}).status_code

    assert [guess(f"2001:db8::{i + 1:x}") for i in range(FREE_TRIES + 2)] == [401] * (FREE_TRIES + 1) + [429]
    assert guess("2001:db8:0:1::1") == 401  # the next /64: another device
    assert [guess(h) for h in ["10.0.0.1", "::ffff:10.0.0.1"] * (FREE_TRIES // 2 + 1)][-1] == 429
    assert guess("10.0.0.2", "the-token") == 200


def test_reupload_of_an_edited_file_replaces_it_and_delete_removes_it(servers):
    url, rag, _, _ = servers
    before = rag.store.count
    v1 = b"# Lockers\n\nCoin lockers cost 1 pound and are next to the cloakroom."
    v2 = b"# Lockers\n\nCoin lockers cost 2 pounds and are next to the cloakroom."
    for version in (v1, v2, v2):
        job = wait_job(url, httpx.post(f"{url}/api/documents", files={"file": ("lockers.md", version)},
                                       headers=WRITE, timeout=T))
        assert job["state"] == "done", job
    assert rag.store.count == before + 1  # one version only; the identical third upload added nothing
    ids = job["files"][0]["ids"]  # the upload's job names the document, as a client must to remove it
    assert ids == rag.store.documents_from("upload:lockers.md") and len(ids) == 1
    text = rag.store.passages([p.id for p in rag.store.search(rag.encoder.encode_one("coin lockers"), 1)])[0].text
    assert "2 pounds" in text
    r = httpx.delete(f"{url}/api/documents/{ids[0]}", headers=WRITE, timeout=T)
    job = wait_job(url, r)
    assert job["state"] == "done" and job["passages_removed"] == 1
    assert rag.store.count == before and rag.store.document(ids[0]) is None
    assert httpx.delete(f"{url}/api/documents/{ids[0]}", headers=WRITE, timeout=T).status_code == 404


def test_hostile_uploads_are_refused_naming_the_file_and_leave_nothing_behind(servers, tmp_path, monkeypatch):
    """Issue #43: a PDF bomb took the server past 6 GB; 1,000,000 nested <div> never finished parsing (and held
    SIGTERM); a lone surrogate in a JSON text or title was an HTTP 500. Each is refused with 422 naming the file
    as the client sent it; nothing is stored and no temporary folder stays."""
    pytest.importorskip("pypdfium2", reason="the ingest extra is not installed: pip install 'edge-rag[ingest]'")
    pytest.importorskip("selectolax", reason="the ingest extra is not installed: pip install 'edge-rag[ingest]'")
    url, rag, _, _ = servers
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the server puts its upload folders
    before = rag.store.version
    hostile = {"bomb.pdf": (pdf_bomb_bytes(20), "refused"),  # which limit it hit: test_ingest (time is shared here)
               "deep.html": (nested_html(1_000_000).encode(), "nests HTML elements more than 512 deep"),
               "text.json": (b'[{"text": "\\ud800"}]', "record 0's text is not valid Unicode text"),
               "title.jsonl": (b'{"title": "\\udc00", "text": "Fine."}\n', "record 0's title is not valid Unicode")}
    for name, (body, reason) in hostile.items():
        r = httpx.post(f"{url}/api/documents", files={"file": (f"uploads/{name}", body)}, headers=WRITE, timeout=T)
        assert r.status_code == 422 and r.json()["status"] == 422, r.text
        assert r.json()["error"].startswith(f"uploads/{name}") and reason in r.json()["error"], r.text
    assert rag.store.version == before
    assert list(tmp_path.iterdir()) == []


def test_an_upload_past_the_limit_is_refused_whatever_length_it_declares(servers):
    """A body framed by Transfer-Encoding: chunked with Content-Length: 100 beside it: the server reads the chunks,
    and the limit counted only the declared length, so 60 MiB were taken whole into memory and indexed. The bytes
    that come in are counted now: 413, and nothing stored."""
    url, rag, _, _ = servers
    port, before, limit = int(url.rsplit(":", 1)[1]), rag.store.version, ServeConfig().max_upload_bytes
    block = b" " * (2**20 - 1) + b"\n"
    head = (f"POST /api/documents HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {WRITE['authorization']}\r\n"
            "Content-Type: multipart/form-data; boundary=B\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n")
    part = b'--B\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
    with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it may stop reading once past the limit
            client.sendall(head.encode())
            for piece in [part, *[block] * (limit // len(block) + 1), b"Open at nine.\r\n--B--\r\n", b""]:
                client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        reply = client.recv(4096).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 413"), reply[:300]
    assert rag.store.version == before


def test_files_are_known_by_their_path_and_a_reupload_in_another_case_replaces(servers):
    """Issue #43: a/same.txt and b/same.txt in one upload: "2 files done", one stored. Tours.TXT, then tours.txt:
    both price versions stayed and the kiosk answered the old one; so did Crêpes.txt sent decomposed (as a Mac may),
    then composed. One name sent twice in one upload: refused."""
    url, rag, _, _ = servers
    before = rag.store.count
    same = [("file", ("a/same.txt", b"The east wing lift is out of order today.")),
            ("file", ("b/same.txt", b"The west wing cafe opens at nine o'clock."))]
    job = wait_job(url, httpx.post(f"{url}/api/documents", files=same, headers=WRITE, timeout=T))
    assert job["state"] == "done" and [(f["file"], f["passages"]) for f in job["files"]] == [("a/same.txt", 1),
                                                                                            ("b/same.txt", 1)]
    assert rag.store.count == before + 2
    assert [len(rag.store.documents_from(f"upload:{name}")) for name in ("a/same.txt", "b/same.txt")] == [1, 1]
    # and a name a Mac sends decomposed ('e' + U+0302), sent again composed from another machine: replaced too
    crepes = unicodedata.normalize("NFD", "Crêpes.txt"), unicodedata.normalize("NFC", "crêpes.txt")
    for (name, price), what in zip([("Tours.TXT", 12), ("tours.txt", 15), (crepes[0], 6), (crepes[1], 8)],
                                   ["guided tour of the clock tower"] * 2 + ["crepe on the roof terrace"] * 2):
        body = f"A {what} costs {price} pounds.".encode()
        job = wait_job(url, httpx.post(f"{url}/api/documents", files={"file": (name, body)}, headers=WRITE, timeout=T))
        assert job["state"] == "done", job
    assert rag.store.count == before + 4 and len(rag.store.documents_from("upload:tours.txt")) == 1
    assert len(rag.store.documents_from(f"upload:{crepes[1]}")) == 1
    for what, price in (("guided tour of the clock tower", 15), ("crepe on the roof terrace", 8)):
        hit = rag.store.search(rag.encoder.encode_one(what), 1)
        assert f"{price} pounds" in rag.store.passages([hit[0].id])[0].text
    for twice in ([("file", ("Map.txt", b"The map is at the entrance.")), ("file", ("./map.TXT", b"Another map."))],
                  [("file", (name, b"Crepes all day.")) for name in crepes]):
        r = httpx.post(f"{url}/api/documents", files=twice, headers=WRITE, timeout=T)
        assert r.status_code == 400 and "same file" in r.json()["error"] and rag.store.count == before + 4


def test_an_upload_is_saved_a_chunk_at_a_time(tmp_path):
    """An upload was read whole into memory and written on the event loop; it is copied from the multipart parser's
    spooled file a chunk at a time (in a worker thread): memory for one chunk, whatever the file's size."""
    from starlette.datastructures import UploadFile

    data = os.urandom(16 * COPY_CHUNK)
    spooled = tempfile.SpooledTemporaryFile(max_size=COPY_CHUNK)  # as Starlette's parser keeps a large file
    spooled.write(data)
    spooled.seek(0)  # as the parser leaves it
    tracemalloc.start()
    try:
        saved = asyncio.run(save_files([UploadFile(spooled, filename="big/notes.txt")], tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        spooled.close()
    assert [(name, path.read_bytes() == data) for name, path in saved] == [("big/notes.txt", True)]
    assert peak < 4 * COPY_CHUNK, peak


def test_upload_folders_left_by_killed_servers_are_removed_at_start(servers, tmp_path, monkeypatch):
    """Issue #43: the server killed mid-upload left its temporary folder behind. The next start removes the
    folders whose server is gone and keeps those of running ones. A folder named with a number no pid can be, or
    with a digit int() does not read (any user can make one in the shared temporary folder), stopped the server from
    starting (OverflowError, ValueError). A container's entrypoint has pid 1 at every start: the folders of one
    killed, named with the pid the next start has, were kept (3 real SIGKILLs under `unshare -pf`: 3 folders, 15 MB);
    this pid's folders made before this process started are removed, those made since (another server's) kept."""
    _, rag, _, _ = servers
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process now
    with subprocess.Popen(["sleep", "60"]) as running:
        stale, live = tmp_path / f"edge-rag-upload-{gone.pid}-x1", tmp_path / f"edge-rag-upload-{running.pid}-x2"
        other, huge = tmp_path / "edge-rag-upload-notmine", tmp_path / f"edge-rag-upload-{2**64}-x3"
        superscript = tmp_path / "edge-rag-upload-\u00b2-x4"  # a digit to str.isdigit, not to int()
        before, since = (tmp_path / f"edge-rag-upload-{os.getpid()}-{x}" for x in ("x5", "x6"))
        for folder in (stale / "000", live / "000", other, huge, superscript, before, since):
            folder.mkdir(parents=True)
        (stale / "000" / "bomb.pdf").write_bytes(b"%PDF-1.4")
        os.utime(before, (0, 0))  # as a killed process that had this pid left it
        create_app(rag, ServeConfig(port=0, token=serving.TOKEN))
        kept = [live.name, other.name, superscript.name, since.name]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
        running.kill()


def test_token_file_is_made_once_private_and_kept(tmp_path):
    path = tmp_path / "token"
    token, created = token_from_file(path)
    assert created and len(token) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token_from_file(path) == (token, False)
    path.chmod(0o644)
    with pytest.raises(EdgeRAGError, match="readable by other users"):
        token_from_file(path)


def test_a_token_file_that_is_a_folder_or_not_text_is_named_as_such(tmp_path):
    """--token-file naming a folder or a file of bytes: one clear line (a traceback, or 'chmod 600' for a folder)."""
    folder, binary = tmp_path / "tokens", tmp_path / "token"
    folder.mkdir(mode=0o700)
    binary.write_bytes(b"\xff\xfe token")
    binary.chmod(0o600)
    with pytest.raises(EdgeRAGError, match="is not a file"):
        token_from_file(folder)
    folder.chmod(0o755)
    with pytest.raises(EdgeRAGError, match="is not a file"):
        token_from_file(folder)
    with pytest.raises(EdgeRAGError, match="cannot read token file"):
        token_from_file(binary)


def test_an_app_with_writes_needs_its_indexing_encoder_planned(servers):
    """Writes index with a second encoder session: an EdgeRAG whose memory plan lacks it cannot serve them."""
    _, _, _, read_only = servers
    assert "indexing encoder" not in [c.name for c in read_only.plan.components]
    with pytest.raises(EdgeRAGError, match=r"index_threads"):
        create_app(read_only, ServeConfig(port=0, token=serving.TOKEN))


def _serve(db: Path, bundle_dir: Path, *options: str) -> subprocess.Popen:
    """The real `edge-rag serve` over ``db`` on a free port (stdout, stderr: pipes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("EDGE_RAG_TOKEN", None)
    return subprocess.Popen([sys.executable, "-m", "edge_rag", "serve", "--db", str(db), "--bundle", str(bundle_dir),
                             "--port", "0", *options], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _refusal(db: Path, bundle_dir: Path, *options: str) -> str:
    """The one-line error of a server that refuses to start (exit 2)."""
    proc = _serve(db, bundle_dir, *options)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and not out, (out, err[-2000:])
    line = err.strip()
    assert "\n" not in line and line.startswith("edge-rag: error: "), line
    return line


def _smallest_plan(line: str) -> tuple[float, int]:
    """(the runtime base the server measured, the budget its smallest plan needs), from its refusal of 1 MB."""
    base = re.search(r"^edge-rag: error: runtime base needs ~(\d+) MB", line)
    least = re.search(r"raise memory_budget_mb \(--memory-mb\) to at least (\d+)$", line)
    assert base and least, line
    return float(base[1]), int(least[1])


def test_a_server_with_writes_refuses_a_budget_without_room_for_its_indexing_encoder(bundle_dir, sample_db, tmp_path):
    """`edge-rag serve` with a token indexed uploads in a second encoder session that the memory plan left out: a
    server the plan said fits could exceed its budget at its first upload. In a budget between the smallest plan
    without that session and with it: plain EdgeRAG plans to fit (it plans no second session), the read-only server
    starts (it never indexes), and the server with writes refuses to start, exit 2, with one line naming the indexing
    encoder and the budget, before it loads any model. Both smallest plans are the servers' own: what each says it
    needs when refused 1 MB (its runtime base is its own RSS, which differs by machine and library versions)."""
    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    base, read_only = _smallest_plan(_refusal(db, bundle_dir, "--memory-mb", "1"))
    _, writes = _smallest_plan(_refusal(db, bundle_dir, "--memory-mb", "1", "--token", "s3cret-write-token"))
    assert writes > read_only
    budget = (read_only + writes) // 2  # half the indexing encoder's part of room either way
    plain = plan(Bundle.load(bundle_dir), Config(memory_budget_mb=budget), stored_passages(db), base,
                 generator=False)
    assert "indexing encoder" not in [c.name for c in plain.components] and plain.total_mb <= budget, str(plain)

    proc = _serve(db, bundle_dir, "--memory-mb", str(budget))
    try:
        first = proc.stdout.readline()  # "edge-rag: serving ..." once it listens; "" if it exits instead
        assert "read-only" in first, (first, proc.stderr.read()[-2000:] if not first else "")
        url = first.split(" on ")[1].strip().rstrip("/")
        assert httpx.get(f"{url}/api/health", timeout=T).json()["plan"]["budget_mb"] == budget
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    line = _refusal(db, bundle_dir, "--memory-mb", str(budget), "--token", "s3cret-write-token")
    assert line.startswith("edge-rag: error: indexing encoder needs ~"), line
    assert f"of the {budget} MB budget remain after runtime base" in line and "raise memory_budget_mb" in line


def _writing_stdout(pid: int) -> bool:
    """Whether process ``pid``'s main thread is blocked writing to its stdout, a pipe (Linux /proc)."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        pytest.skip("needs Linux /proc/PID/wchan and /proc/PID/syscall")
    return "pipe" in wchan and len(call) > 1 and int(call[1], 16) == 1  # waits on a pipe, first argument fd 1


def test_sigterm_while_the_server_says_it_serves_stops_it_cleanly(bundle_dir, sample_db, tmp_path):
    """`edge-rag serve` printed its "serving" line before it installed its SIGTERM handler: a SIGTERM sent on
    seeing the line could end the process by the signal (-15: no "stopped", nothing closed) instead of the clean
    shutdown (exit 0). Sent on seeing the line that is a race; here it is not: the server's stdout is a full pipe,
    so the server is held writing its serving line, and SIGTERM is sent while it is (the handler must be in place
    by then), before the pipe is drained."""
    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"-" * 4096)
    os.set_blocking(write_end, True)  # the server's writes wait for room (the flag is the pipe's, shared)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("EDGE_RAG_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "edge_rag", "serve", "--db", str(db), "--bundle",
                             str(bundle_dir), "--port", "0"], env=env, cwd=ROOT, stdout=write_end,
                            stderr=subprocess.PIPE)
    os.close(write_end)
    with open(read_end, "rb") as out, ThreadPoolExecutor(1) as pool:
        try:
            deadline = time.monotonic() + 300  # loading the models; not a timing assertion
            while not _writing_stdout(proc.pid):
                if proc.poll() is not None:
                    pytest.fail(f"the server ended ({proc.returncode}): {proc.stderr.read()[-2000:]!r}")
                if time.monotonic() > deadline:
                    pytest.fail("the server did not come to its serving line")
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            drained = pool.submit(out.read)  # makes room: the server goes on, and ends
            proc.wait(timeout=120)
            text = drained.result(timeout=60).decode().lstrip("-")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0 and text.endswith("edge-rag: stopped\n"), (proc.returncode, text,
                                                                          proc.stderr.read()[-2000:])



UPLOADS = 8  # more uploads than asyncio's default executor has threads on a 2-core device (min(32, cores + 4))


def test_uploads_being_parsed_hold_up_no_question(bundle_dir, sample_db, tmp_path):
    """Uploads were parsed in asyncio's default executor, where a logged question's append to the question log runs
    too: with as many uploads being parsed as it has threads, every question waited for a parse to end (8 HTML
    uploads of 3.5 MB: a question took 8.5 s instead of 0.2). Here each parse child is frozen (SIGSTOP) as it starts:
    the question is answered while they are, and every upload is indexed once they go on."""
    psutil = pytest.importorskip("psutil")
    shutil.copytree(sample_db, tmp_path / "db")
    rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=serving.test_config())
    config = ServeConfig(port=0, question_timeout_s=900, token=serving.TOKEN, question_log=str(tmp_path / "q.jsonl"))
    html = b"<html><body><p>The roof garden opens in May.</p></body></html>"
    with running_server(rag, config) as url, ThreadPoolExecutor(UPLOADS) as pool:
        with _frozen_parses(psutil) as frozen:
            uploads = [pool.submit(httpx.post, f"{url}/api/documents", files={"file": (f"garden{i}.html", html)},
                                   headers=WRITE, timeout=T) for i in range(UPLOADS)]
            while _saved_uploads() < UPLOADS or not frozen:  # every upload is being parsed or waits for it
                assert not any(u.done() for u in uploads), [u.result().text for u in uploads if u.done()]
                time.sleep(0.01)
            assert _answer(url, TICKETS)["route"] == "RAG"
            # before: answered only once the frozen parses had been killed at their time limit
            assert all(p.is_running() and p.status() == psutil.STATUS_STOPPED for p in frozen)
        jobs = [wait_job(url, u.result()) for u in uploads]
        assert [j["state"] for j in jobs] == ["done"] * UPLOADS, jobs


@contextlib.contextmanager
def _frozen_parses(psutil):
    """The list of this process's parse children, each stopped (SIGSTOP) as soon as it is seen; continued on exit."""
    frozen: list = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    if child not in frozen and "parse_child" in " ".join(child.cmdline()):
                        child.suspend()
                        frozen.append(child)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield frozen
    finally:
        done.set()
        watcher.join()
        for child in frozen:
            with contextlib.suppress(psutil.Error):
                child.resume()


# An upload parsed and waiting for its job in a server of its own (its folder under TMPDIR); told to go on, the job
# reads its documents (unstash) and says how many it found.
WAITING_UPLOAD = """
import asyncio, io, sys
from concurrent.futures import ThreadPoolExecutor
from starlette.datastructures import UploadFile
from edge_rag.documents.parse_child import Parser
from edge_rag.serve.uploads import Folders, unstash
async def main():
    folders = Folders()
    upload = UploadFile(io.BytesIO(b"The museum opens at nine."), filename="hours.txt")
    folder, saved = await folders.save_and_parse([upload], Parser(), ThreadPoolExecutor(1))
    print("waiting", flush=True)
    sys.stdin.readline()
    with folders.done(folder):
        print(len(unstash(saved[0][1])))
asyncio.run(main())
"""


def test_an_upload_waiting_for_its_job_is_kept_by_a_server_in_another_pid_namespace(tmp_path):
    """A server starting in another pid namespace (a container sharing /tmp, here `unshare -pf`) sees no process
    under a live server's pid: it took that server's upload folder, parsed and waiting for its job, for a killed
    server's and removed it, and the job found no documents. A folder whose server holds it is kept, whoever looks."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a pid namespace needs root and unshare")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    live = subprocess.Popen([sys.executable, "-c", WAITING_UPLOAD], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert live.stdout.readline() == "waiting\n"
    other = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-c",
                            "from edge_rag.serve.uploads import remove_stale_folders; remove_stale_folders()"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    if other.returncode != 0 and "unshare" in other.stderr:
        live.kill()
        pytest.skip(f"no pid namespace here: {other.stderr.strip()}")
    out, _ = live.communicate("\n", timeout=60)
    assert other.returncode == 0 and live.returncode == 0 and out == "1\n", (other.stderr, out)
    assert not list(tmp_path.glob(f"{TEMP_PREFIX}*")), "the job removes its folder"


def _saved_uploads() -> int:
    """Upload folders of this process holding their file (saved: its parse is next)."""
    return sum(1 for f in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}{os.getpid()}-*/000/*.html"))


def test_uploads_waiting_for_their_job_hold_no_documents_in_memory(bundle_dir, sample_db, tmp_path):
    """Uploads are parsed before their 202 and then wait for the one indexing thread; their documents waited in
    memory, which no memory plan prices (it prices those of the upload being indexed), however many were queued: an
    operator's script sending a folder file by file while a long one is indexed held every file's text (here 2.5M
    characters of 4 waiting uploads; 20 uploads of 2 MB raised RSS by 120 MB, 92 with them on disk). They now wait in
    the upload's folder beside its files: none is in memory while the long one is indexed, and the folders of the jobs
    a shutdown drops are removed with it."""
    import gc

    from edge_rag.types import Document

    shutil.copytree(sample_db, tmp_path / "db")
    rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(index_threads=1))
    words = "museum harbour light ship engine crew ticket gallery planet star lens tower steam pump visitor".split()
    long = ". ".join(" ".join(words[(i + j) % 15] for j in range(9)).capitalize() for i in range(40_000)) + "."
    with running_server(rag) as url:
        first = httpx.post(f"{url}/api/documents", files={"file": ("long.txt", long)}, headers=WRITE, timeout=T)
        waiting = [httpx.post(f"{url}/api/documents", files={"file": (f"wait{i}.txt", f"Room {i} opens in May. " * 30_000)},
                              headers=WRITE, timeout=T) for i in range(4)]
        assert [r.status_code for r in [first, *waiting]] == [202] * 5
        states = [httpx.get(url + r.headers["location"], timeout=T).json()["state"] for r in [first, *waiting]]
        held = sum(len(o.text) for o in gc.get_objects() if isinstance(o, Document) and o.source.startswith("upload:wait"))
        assert states == ["running"] + ["queued"] * 4 and held == 0, (states, held)
    assert not list(Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}{os.getpid()}-*")), "the dropped jobs' folders"
