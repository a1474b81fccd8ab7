"""The operator's API (/api/admin, edge_rag/serve/admin.py) on a real server over the sample store: token and
origin rules, labels grouped and exported as `edge-rag calibrate` reads them, the passage search, calibration as a
job giving the command's own table, apply (swapped in, kept across a restart), and the plain refusals that keep the
old certificate: too few labels, labels older than the documents, a calibration older than the documents."""
from __future__ import annotations

import datetime
import json
import os
import queue
import shutil
import threading
import time
import tracemalloc
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
serving = pytest.importorskip("serving", reason="the serve extra (starlette, uvicorn, httpx) is not installed")

from admin_cases import LEAST, OFF_TOPIC, logged_server, sample_labels  # noqa: E402

from edge_rag.cli.commands import main  # noqa: E402
from edge_rag.config import Config  # noqa: E402
from edge_rag.decision import calibrate  # noqa: E402
from edge_rag.decision.certify import Calibration  # noqa: E402
from edge_rag.decision.labels import Labels, export, groups  # noqa: E402
from edge_rag.pipeline import EdgeRAG  # noqa: E402
from edge_rag.serve import question_log  # noqa: E402
from edge_rag.serve.admin_cal import Files  # noqa: E402
from edge_rag.serve.admin_cal import calibrate as calibrate_job  # noqa: E402
from edge_rag.serve.config import ServeConfig  # noqa: E402
from edge_rag.serve.jobs import Job, Jobs  # noqa: E402
from edge_rag.serve.question_log import QuestionLog  # noqa: E402
from edge_rag.serve.suggest import suggestions  # noqa: E402
from edge_rag.types import Route  # noqa: E402

AUTH = serving.WRITE


def upload(url: str, name: str, text: str) -> None:
    accepted = httpx.post(f"{url}/api/documents", files={"file": (name, text.encode())}, headers=AUTH, timeout=60)
    assert serving.wait_job(url, accepted)["state"] == "done"


def in_force(url: str) -> dict:
    return httpx.get(f"{url}/api/health", timeout=60).json()["decision"]


@pytest.fixture(scope="module")
def server(sample_db, tmp_path_factory):
    folder = tmp_path_factory.mktemp("admin")
    rag, running = logged_server(sample_db, folder)
    with running as url:
        yield url, rag, folder


def test_the_operator_api_needs_the_token_and_this_origin(server, sample_db, tmp_path):
    url, _, _ = server
    page = httpx.get(f"{url}/admin", timeout=30)
    assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "Margaret" not in page.text  # the page is a shell: the data come with the token only
    for path in ("/api/admin/questions", "/api/admin/export", "/api/admin/search?q=museum"):
        assert httpx.get(url + path, timeout=30).status_code == 401
        assert httpx.get(url + path, headers={"authorization": "Bearer wrong"}, timeout=30).status_code == 401
        foreign = httpx.get(url + path, headers={**AUTH, "origin": "http://evil.example"}, timeout=30)
        assert foreign.status_code == 403 and "evil.example" in foreign.json()["error"]
    label = {"question": OFF_TOPIC[0], "label": "off-topic"}
    assert httpx.post(f"{url}/api/admin/labels", json=label, timeout=30).status_code == 401
    assert httpx.post(f"{url}/api/admin/labels", json=label, headers={**AUTH, "sec-fetch-site": "cross-site"},
                      timeout=30).status_code == 403
    assert httpx.post(f"{url}/api/admin/calibrate", timeout=30).status_code == 401


def test_labels_are_grouped_and_export_as_the_file_calibrate_reads(server, tmp_path):
    url, _, _ = server
    first = sample_labels()[0]
    saved = httpx.post(f"{url}/api/admin/labels", headers=AUTH, timeout=30,
                       json={"question": first["question"].lower(), "label": "answer", "answers": [first["answer"]]})
    assert saved.status_code == 200 and saved.json()["answer"] == [first["answer"]]
    bad = httpx.post(f"{url}/api/admin/labels", headers=AUTH, json={"question": "x?", "label": "answer",
                                                                    "answers": []}, timeout=30)
    assert bad.status_code == 400 and "answer text" in bad.json()["error"]
    listing = httpx.get(f"{url}/api/admin/questions", headers=AUTH, timeout=30).json()
    groups = listing["questions"]
    assert groups[0]["times"] == 2 and groups[0]["label"]["label"] == "answer"  # asked last, twice, labelled
    assert len(groups) == len(sample_labels()) and listing["labelled"] == 1
    exported = tmp_path / "labelled.jsonl"
    exported.write_text(httpx.get(f"{url}/api/admin/export", headers=AUTH, timeout=30).text, encoding="utf-8")
    read = calibrate.load_questions(exported)
    assert [q.answers for q in read] == [(first["answer"],)] * 2


def test_the_search_shows_passages_and_never_the_device_answer(server):
    url, _, _ = server
    found = httpx.get(f"{url}/api/admin/search", params={"q": "museum close 31 December"}, headers=AUTH,
                      timeout=30).json()["passages"]
    assert any("15:00" in p["text"] for p in found)
    assert all(set(p) == {"title", "text"} for p in found)
    typed_wide = httpx.get(f"{url}/api/admin/search", params={"q": "ｍｕｓｅｕｍ ｃｌｏｓｅ ３１ Ｄｅｃｅｍｂｅｒ"},
                           headers=AUTH, timeout=30).json()["passages"]  # a CJK keyboard's full-width mode
    assert typed_wide == found  # as the kiosk asks such a question (check_question); it found nothing before


def test_too_few_labels_are_refused_plainly_and_the_old_certificate_stays(server):
    url, _, _ = server
    before = in_force(url)
    refused = httpx.post(f"{url}/api/admin/calibrate", headers=AUTH, timeout=30)
    assert refused.status_code == 409 and f"at least {LEAST}" in refused.json()["error"]
    assert in_force(url) == before and before["certificate"]["source"] == "shipped"


def test_calibrating_gives_the_commands_table_and_apply_swaps_and_persists(server, bundle_dir, tmp_path):
    url, rag, folder = server
    labelled = tmp_path / "labels.json"
    labelled.write_text(json.dumps(sample_labels()), encoding="utf-8")
    imported = httpx.post(f"{url}/api/admin/import", content=labelled.read_bytes(), headers=AUTH, timeout=30)
    assert imported.status_code == 200 and imported.json()["labelled"] == len(sample_labels())
    job = serving.wait_job(url, httpx.post(f"{url}/api/admin/calibrate", headers=AUTH, timeout=30))
    assert job["state"] == "done", job
    assert job["questions"] == len(sample_labels()) + 1 and job["without_answer"] == sum(
        e["answer"] is None for e in sample_labels())

    # `edge-rag calibrate` on the labelled questions file the job wrote: the same table
    out = tmp_path / "cli.json"
    assert main(["calibrate", "--questions", str(Path(rag.store.folder) / "labelled-questions.jsonl"), "--out",
                 str(out), "--db", str(rag.store.folder), "--bundle", str(bundle_dir)]) == 0
    assert calibrate.rows(Calibration.load(out), "neural", rag.config.delta) == job["table"]

    assert (Path(rag.store.folder) / "labelled-questions.jsonl").stat().st_mode & 0o077 == 0
    cached = {"question": sample_labels()[1]["question"]}
    assert httpx.post(f"{url}/api/ask", json=cached, timeout=300).json()["n_cal"] != job["questions"]
    bad = httpx.post(f"{url}/api/admin/apply", json={"calibration": job["id"], "max_error_rate": 7}, headers=AUTH,
                     timeout=30)
    assert bad.status_code == 400 and in_force(url)["certificate"]["source"] == "shipped"
    for calibration in ([job["id"]], {job["id"]: 1}, None):  # not a job id: refused saying what to send (was a 500)
        bad = httpx.post(f"{url}/api/admin/apply", json={"calibration": calibration, "max_error_rate": 0.5},
                         headers=AUTH, timeout=30)
        assert bad.status_code == 400 and "calibration" in bad.json()["error"], bad.text
    row = max(job["table"], key=lambda r: (r["n_answered"], r["alpha"]))
    applied = httpx.post(f"{url}/api/admin/apply", json={"calibration": job["id"], "max_error_rate": row["alpha"]},
                         headers=AUTH, timeout=60)
    assert applied.status_code == 200, applied.text
    now = in_force(url)
    assert now["certificate"]["source"] == "operator" and now["certificate"]["questions"] == job["questions"]
    assert now["certificate"]["labelled"] == job["labelled"] and now["threshold"] == row["threshold"]
    assert now["max_error_rate"] == row["alpha"] and "labelled by its operator" in now["summary"]
    answer = httpx.post(f"{url}/api/ask", json={"question": OFF_TOPIC[1]}, timeout=300).json()
    assert answer["route"] == "REFUSE" and answer["n_cal"] == job["questions"] and answer["alpha"] == row["alpha"]
    again = httpx.post(f"{url}/api/ask", json=cached, timeout=300).json()  # answered before: not from the cache
    assert again["n_cal"] == job["questions"] and again["alpha"] == row["alpha"]

    # a restart keeps it
    from edge_rag.serve.app import create_app
    from edge_rag.serve.health import decision

    with EdgeRAG(rag.store.folder, config=Config(temperature=0.0, index_threads=1)) as again:
        create_app(again, ServeConfig(port=0, token=serving.TOKEN))
        kept = decision(again)
        assert kept["certificate"] == now["certificate"] and kept["threshold"] == now["threshold"]

    # the documents change: the calibration and the labels are older than them; the certificate in force stays
    upload(url, "new-hours.txt", "Winter opening hours\n\nFrom November the museum opens at 11:00 on Mondays.")
    stale = httpx.post(f"{url}/api/admin/apply", json={"calibration": job["id"], "max_error_rate": row["alpha"]},
                       headers=AUTH, timeout=60)
    assert stale.status_code == 409 and "documents changed" in stale.json()["error"]
    again = httpx.post(f"{url}/api/admin/calibrate", headers=AUTH, timeout=30)
    assert again.status_code == 409 and "before the documents last changed" in again.json()["error"]
    assert now["certificate"]["documents_changed"] is False and "before the documents" not in now["summary"]
    changed = in_force(url)  # in force still, and saying it was measured on other documents (it said nothing)
    assert changed["certificate"] == {**now["certificate"], "documents_changed": True}
    assert "measured before the documents last changed" in changed["summary"], changed["summary"]
    listing = httpx.get(f"{url}/api/admin/questions", headers=AUTH, timeout=30).json()
    assert listing["stale"] == len(sample_labels())


def test_a_listing_holds_one_page_whatever_the_log_holds(sample_db, tmp_path):
    """A full question log (MAX_BYTES, ~180,000 questions) listed whole rose the server's peak RSS by ~300 MB per
    view of /admin (every group and its JSON at once). A page holds what its questions need: here a page of 10 of a
    log of 5,000 distinct questions, its traced peak bounded by the page (a block read back from the log's end, ten
    groups), and the pages together list every question once, newest first, then the labelled ones never asked."""
    rag, running = logged_server(sample_db, tmp_path)
    log = QuestionLog(tmp_path / "questions.jsonl")
    asked = [f"Visitor question number {n}: when does the museum open on a holiday Monday?" for n in range(5000)]
    for question in asked:
        log.add(question)
    with running as url:
        imported = {"question": "Never asked at this kiosk?", "label": "off-topic"}
        assert httpx.post(f"{url}/api/admin/labels", json=imported, headers=AUTH, timeout=30).status_code == 200
        tracemalloc.start()
        try:
            page = httpx.get(f"{url}/api/admin/questions", params={"limit": 10}, headers=AUTH, timeout=60)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000 + 10 * 20_000, peak  # ~0.35 MB; the whole listing: 7.8 MB traced
        listing = page.json()
        assert [g["question"] for g in listing["questions"]] == asked[::-1][:10] and listing["more"]
        shown: list[dict] = []
        while not shown or listing["more"]:
            listing = httpx.get(f"{url}/api/admin/questions", params={"offset": len(shown), "limit": 1000},
                                headers=AUTH, timeout=60).json()
            assert len(listing["questions"]) <= 1000
            shown += listing["questions"]
        samples = [g["question"] for g in sample_labels()]  # the first asked again last (typed differently)
        assert [g["question"].casefold() for g in shown] == [
            q.casefold() for q in asked[::-1] + samples[:1] + samples[:0:-1] + [imported["question"]]]
        assert [g["times"] for g in shown[len(asked):-1]] == [2] + [1] * (len(samples) - 1)
        assert listing["labelled"] == 1 and shown[-1]["label"]["label"] == "off-topic"
        for bad in ({"limit": 1001}, {"limit": "-1"}, {"offset": "x"}):
            assert httpx.get(f"{url}/api/admin/questions", params=bad, headers=AUTH, timeout=30).status_code == 400


def _traced(call):
    """(what ``call`` returns, the peak memory Python traced meanwhile: the in-process server's too)."""
    tracemalloc.start()
    try:
        out = call()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _long_log(folder: Path, n: int) -> Path:
    """The log of ``logged_server``'s folder, then ``n`` more questions in its format, a few of them labelled."""
    path = folder / "questions.jsonl"
    labelled = [g["question"] for g in sample_labels()]
    with open(path, "a", encoding="utf-8") as f:
        for i in range(n):
            question = labelled[i // 1000 % 3] if i % 1000 == 999 else f"Visitor question {i}: is the museum open?"
            when = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(minutes=i)
            f.write(json.dumps({"question": question, "asked": when.isoformat(timespec="seconds")},
                               ensure_ascii=False) + "\n")
    return path


def test_a_deep_page_of_the_listing_holds_no_more_than_the_first(sample_db, tmp_path):
    """A page kept the key of every question newer than it, and the log was read twice (back to the page, then whole
    to count): a page at offset 240,000 of a 1M-question log (its first 33 MB read) rose a real server's RSS by
    28-43 MB. The log is read once now and those keys are kept in a temporary SQLite file (its memory, ~2 MB of
    cache, is SQLite's own): a page deep in a log of 20,000 questions traces as little as the first; the deep page is
    that slice of the whole listing; the first page counts how often its questions were asked as the log holds."""
    rag, running = logged_server(sample_db, tmp_path)
    path = _long_log(tmp_path, 20_000)
    with running as url:
        def page(offset: int) -> dict:
            got = httpx.get(f"{url}/api/admin/questions", params={"offset": offset, "limit": 10}, headers=AUTH,
                            timeout=60)
            assert got.status_code == 200, got.text
            return got.json()

        first, _ = _traced(lambda: page(0))
        deep, peak = _traced(lambda: page(19_900))
        assert peak < 1_000_000 + 10 * 20_000, peak  # ~0.4 MB; the keys held: 4.6 MB
        held = Labels(tmp_path / "db" / "labels.sqlite").all()
        whole, _ = groups(held, question_log.newest(path), rag.store.stamp)
        assert deep["questions"] == whole[19_900:19_910] and deep["more"]
        asked = Counter(q.casefold().strip() for q, _ in question_log.lines(path))
        assert [g["times"] for g in first["questions"]] == [asked[g["key"]] for g in first["questions"]]
        assert first["questions"][0]["times"] > 1


def test_a_question_is_logged_while_listings_fill_the_default_threads(sample_db, tmp_path, monkeypatch):
    """A question is logged before it is answered, and was logged on asyncio's default threads (cores + 4), where
    /admin's reads run: 8 listings of a deep page of a 30 MB log held a real server's question 12 s (0.02 s alone).
    The log has a thread of its own: here listings hold every default thread (their log read waits) and a question
    is answered all the same, before any listing is let go."""
    from edge_rag.serve import question_log as logged

    holding, release = threading.Semaphore(0), threading.Event()

    def held_newest(path):
        holding.release()
        release.wait(timeout=120)
        return iter(())

    monkeypatch.setattr(logged, "newest", held_newest)
    rag, running = logged_server(sample_db, tmp_path)
    with running as url:
        fill = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor (ThreadPoolExecutor's default)
        listings = [threading.Thread(target=lambda: httpx.get(f"{url}/api/admin/questions", headers=AUTH, timeout=180))
                    for _ in range(fill)]
        timer = threading.Timer(20, release.set)  # the old code's question waited for this (no timing assertion)
        for t in listings:
            t.start()
        try:
            for _ in range(fill):
                assert holding.acquire(timeout=60)  # every default thread holds a listing
            timer.start()
            answered = httpx.post(f"{url}/api/ask", json={"question": OFF_TOPIC[0]}, timeout=180)
            assert answered.status_code == 200 and not release.is_set(), "the question waited for the listings"
        finally:
            timer.cancel()
            release.set()
            for t in listings:
                t.join()
        assert OFF_TOPIC[0] in (tmp_path / "questions.jsonl").read_text(encoding="utf-8").splitlines()[-1]


def test_the_export_streams_the_log_and_holds_the_labels_alone(sample_db, tmp_path):
    """The export read the whole question log into a list, then the file it sends: a log of 250,000 questions (its
    first 33 MB, all that is read) rose a real server's RSS by 67 MB at its peak. It now reads the log a line at a
    time as it sends: here 30,000 questions, its traced peak bounded by a chunk, and the file is the one the old
    code sent (its expression, on the same log and labels)."""
    rag, running = logged_server(sample_db, tmp_path)
    path = _long_log(tmp_path, 30_000)
    with running as url:
        for entry in sample_labels()[:3]:
            body = {"question": entry["question"], "label": "not-in-documents"}
            assert httpx.post(f"{url}/api/admin/labels", json=body, headers=AUTH, timeout=30).status_code == 200
        sent, peak = _traced(lambda: httpx.get(f"{url}/api/admin/export", headers=AUTH, timeout=60))
        assert sent.status_code == 200 and sent.headers["content-type"] == "application/x-ndjson"
        assert peak < 1_500_000, peak  # the whole log read: 7 MB
        held = Labels(tmp_path / "db" / "labels.sqlite").all()
        old = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in export(held, question_log.lines(path)))
        assert sent.text == old and old.count("\n") == 30 + 3 + 1  # the first asked once more


def test_calibrating_holds_the_labelled_askings_not_the_log(sample_db, tmp_path):
    """The calibration read the whole question log into a list to pick its labelled askings: a log of 250,000
    questions rose a real server's RSS by 59 MB, kept after the job was sent. It reads a line at a time now, holding
    only the labelled askings: here 30,000 questions, too few labelled (so a plain 409 and no job), the traced peak
    bounded, the count of labelled askings the old code's."""
    rag, running = logged_server(sample_db, tmp_path)
    path = _long_log(tmp_path, 30_000)
    with running as url:
        body = {"question": sample_labels()[1]["question"], "label": "off-topic"}
        assert httpx.post(f"{url}/api/admin/labels", json=body, headers=AUTH, timeout=30).status_code == 200
        refused, peak = _traced(lambda: httpx.post(f"{url}/api/admin/calibrate", headers=AUTH, timeout=60))
        assert peak < 1_500_000, peak  # the whole log read: 7 MB
        held = Labels(tmp_path / "db" / "labels.sqlite").all()
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"].startswith(f"{len(export(held, question_log.lines(path)))} labelled question")


def _finished(job: Job) -> Job:
    deadline = time.monotonic() + 600  # a bound on a hung job, not a timing assertion
    while not job.finished:
        assert time.monotonic() < deadline, job.to_dict()
        time.sleep(0.1)
    return job


def test_a_calibration_job_makes_no_indexing_encoder_session(sample_db, tmp_path):
    """The indexing thread made the indexing encoder session (a second ONNX session, ~100 MB at the smallest batch)
    before every job, calibration and removal too, which never encode a passage. Only a job that encodes makes it
    now: on an EdgeRAG whose plan holds no such session (index_threads 0, where making it is a BudgetError) the
    admin's calibration runs to its table, and a job that asks for the encoder fails saying it is not planned."""
    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    with EdgeRAG(db, config=Config(temperature=0.0)) as rag:
        assert not rag.config.index_threads
        jobs = Jobs(rag)
        try:
            entries = sample_labels()
            cal = _finished(jobs.submit("calibrate", 0, lambda job: calibrate_job(
                rag, Files(tmp_path), entries, "2026-01-01T00:00:00+00:00", job, rag.store.stamp)[1]))
            assert cal.state == "done", cal.to_dict()
            assert cal.result["questions"] == len(entries) and cal.result["table"]
            encodes = _finished(jobs.submit("upload", 1, lambda job: {"dim": jobs.encoder().dim}))
            assert encodes.state == "failed" and encodes.error["status"] == 507, encodes.to_dict()
            assert "index_threads" in encodes.error["error"]
        finally:
            jobs.close()


def test_the_suggested_questions_follow_the_certificate_in_force(sample_db, bundle_dir, tmp_path):
    """The kiosk page's suggested questions were kept until the documents changed: after the operator applied a
    certificate that refuses them (here: one at alpha 0.01), the page went on offering six questions, each refused."""
    shutil.copytree(sample_db, tmp_path / "db")
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        offered = suggestions(rag, 6)
        assert offered
        for alpha in (0.01, rag.config.max_error_rate):
            rag.use_calibration(rag.certified.shipped, alpha)
            now = suggestions(rag, 6)
            assert all(rag.decide(q).route is not Route.REFUSE for q in now), (alpha, now)
        assert now == offered


def test_saving_a_label_while_the_store_is_busy_holds_up_no_other_request(server):
    """Saving a label read the store's version on the event loop (an argument of the call sent to a thread): while a
    commit step held the store's lock, every request of every client waited with it. Here the test holds that lock
    while a label is saved: the kiosk page is served meanwhile, and the label is saved once the lock is let go."""
    url, rag, _ = server
    lock, saved = rag.store._lock, queue.Queue()
    label = {"question": OFF_TOPIC[0], "label": "off-topic"}
    thread = threading.Thread(target=lambda: saved.put(httpx.post(f"{url}/api/admin/labels", json=label,
                                                                  headers=AUTH, timeout=300)))
    with lock:
        thread.start()
        deadline = time.monotonic() + 60
        while not lock._queue:  # the save waits for the store
            assert time.monotonic() < deadline, "the label's save never asked for the store"
            time.sleep(0.01)
        page = httpx.get(f"{url}/", timeout=30)  # before: ReadTimeout, the event loop waited for the lock
        assert page.status_code == 200 and saved.empty()
    thread.join(300)
    assert saved.get(timeout=1).status_code == 200
    httpx.post(f"{url}/api/admin/labels", json={**label, "label": None}, headers=AUTH, timeout=30)


class _EvictedOnLookup(dict):
    """The calibrations kept for Apply, each evicted by a calibration job's thread right after it is looked up."""

    def __contains__(self, key: object) -> bool:
        found = super().__contains__(key)
        self.pop(key, None)
        return found

    def get(self, key, default=None):
        found = super().get(key, default)
        self.pop(key, None)
        return found


@contextmanager
def _admin(sample_db: Path, tmp_path: Path):
    """(EdgeRAG, its Admin, a client of the Admin's routes, the shipped calibration as a calibration job's content)
    over a copy of the sample store."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from edge_rag.decision.certify import CALIBRATION_ASSET
    from edge_rag.serve.admin import Admin
    from edge_rag.serve.errors import HANDLERS
    from edge_rag.serve.pages import STATIC

    shutil.copytree(sample_db, tmp_path / "db")
    content = json.loads(CALIBRATION_ASSET.read_text(encoding="utf-8"))
    content["source"]["operator"] = {"labelled": "2026-01-01T00:00:00+00:00"}
    with EdgeRAG(tmp_path / "db", config=Config(temperature=0.0)) as rag:
        jobs = Jobs(rag)
        admin = Admin(rag, ServeConfig(port=0, token=serving.TOKEN, question_log=str(tmp_path / "q.jsonl")), jobs,
                      STATIC, {})
        try:
            app = Starlette(routes=admin.routes(), exception_handlers=HANDLERS)  # the server's answers to errors
            yield rag, admin, TestClient(app, raise_server_exceptions=False), content
        finally:
            jobs.close()
            admin.close()


def test_a_calibration_evicted_while_it_is_applied_is_applied_or_not_found(sample_db, tmp_path):
    """Apply looked a calibration up twice (``in``, then ``[]``): a calibration job's thread evicting it in between
    (the sixth kept) made the request a 500 (5 of 5 with the window widened); one look now, and the content it
    found is applied."""
    with _admin(sample_db, tmp_path) as (rag, admin, client, content):
        admin._candidates = _EvictedOnLookup(job=(content, rag.store.stamp))
        applied = client.post("/api/admin/apply", json={"calibration": "job", "max_error_rate": 0.1}, headers=AUTH)
        assert applied.status_code == 200, applied.text
        assert applied.json()["decision"]["certificate"]["source"] == "operator"
        gone = client.post("/api/admin/apply", json={"calibration": "job", "max_error_rate": 0.1}, headers=AUTH)
        assert gone.status_code == 404


def test_no_commit_lands_between_the_version_check_and_the_swap(sample_db, tmp_path):
    """Apply checked the store's version, wrote the certificate, then swapped it in: a commit in between put in force
    a calibration measured on documents the store no longer held (swapped at version 2, measured at 1, with the
    window widened). It now holds the writers' lock from the check to the swap, without waiting for it: while an
    indexing run holds it (here: this test, as a run does) apply is refused at once and the certificate stays."""
    with _admin(sample_db, tmp_path) as (rag, admin, client, content):
        admin._candidates = {"job": (content, rag.store.stamp)}
        body = {"calibration": "job", "max_error_rate": 0.1}
        writing, done = threading.Event(), threading.Event()

        def run() -> None:
            with rag.store.writing():
                writing.set()
                assert done.wait(300)
                rag.add_documents(["From November the museum opens at 11:00 on Mondays."])

        indexing = threading.Thread(target=run)
        indexing.start()
        assert writing.wait(300)
        busy = client.post("/api/admin/apply", json=body, headers=AUTH)
        done.set()
        indexing.join(300)
        assert busy.status_code == 409 and "being changed" in busy.json()["error"], busy.text
        assert rag.certified.calibration_path != admin.files.certificate
        stale = client.post("/api/admin/apply", json=body, headers=AUTH)
        assert stale.status_code == 409 and "documents changed" in stale.json()["error"]
        admin._candidates = {"job": (content, rag.store.stamp)}
        assert client.post("/api/admin/apply", json=body, headers=AUTH).status_code == 200
        assert rag.certified.calibration_path == admin.files.certificate


def test_labels_are_checked_against_the_documents_the_calibration_measures(sample_db, tmp_path):
    """Calibrate checked the labels against the documents when pressed, but measured them when its job ran, after
    the jobs queued before it: an upload still running then committed in between, and a calibration of labels saved
    before the documents changed was made and applied (its version the upload's). The job now refuses, as Calibrate
    refuses labels older than the documents, and the certificate in force stays."""
    with _admin(sample_db, tmp_path) as (rag, admin, client, _):
        labelled = tmp_path / "labels.jsonl"
        entries = sample_labels() * -(-admin.config.min_labels // len(sample_labels()))  # each asked a few times
        labelled.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
        assert client.post("/api/admin/import", content=labelled.read_bytes(), headers=AUTH).status_code == 200
        release = threading.Event()
        upload = admin.jobs.submit("upload", 1, lambda job: (release.wait(300), rag.add_documents(
            ["From November the museum opens at 11:00 on Mondays."]), {})[-1])  # an upload still being indexed
        pressed = client.post("/api/admin/calibrate", headers=AUTH)
        assert pressed.status_code == 202, pressed.text
        release.set()
        assert _finished(upload).state == "done", upload.to_dict()
        job = _finished(admin.jobs.get(pressed.json()["id"]))
        assert job.state == "failed", job.to_dict()
        assert "before the documents last changed" in job.error["error"]
        assert client.post("/api/admin/apply", json={"calibration": job.id, "max_error_rate": 0.5},
                           headers=AUTH).status_code == 404
        assert rag.certified.calibration_path == rag.certified.shipped

