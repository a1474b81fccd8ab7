"""A full disk while indexing (issue #43): the upload job failed with HTTP 500 and the raw ``OperationalError:
database or disk is full``, and ``edge-rag index`` printed a traceback (exit 1). Now it is a plain error
(job status 507; the CLI's one line, exit 2) and the store keeps what it held.

The disk is real: a small tmpfs mounted for the test (root only; skipped with the reason otherwise), filled to
the last byte by a file before the command, or through the store's commit hook at a step of the commit.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

from edge_rag.cli.commands import main
from edge_rag.config import Config
from edge_rag.documents import indexing
from edge_rag.documents.chunk import make_document
from edge_rag.errors import DiskFullError, StoreError
from edge_rag.pipeline import EdgeRAG
from edge_rag.serve import question_log
from edge_rag.serve.question_log import QuestionLog
from edge_rag.storage.store_db import DB_FILE

LOCKERS = "Coin lockers cost one pound and are next to the cloakroom."
# 60 passages in one commit: its rows need more log space than a full disk has (the first test's index_saved case), its
# index file more than one page
TOURS = " ".join(f"Guided tour number {n} of the clock tower starts at {n % 12 + 1} o'clock." for n in range(60))


@pytest.fixture
def disk(tmp_path: Path):
    """A 32 MB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that can fill up) needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True,
                         text=True)
    if run.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; returns it (unlink it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for block in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


@pytest.mark.parametrize("full_at", ["begin", "index_saved"])
def test_disk_full_during_a_commit(disk: Path, bundle_dir: Path, full_at: str) -> None:
    """Full from the commit's start (the index file cannot be saved: ENOSPC), or once the index file is saved
    (SQLite's own "database or disk is full" for the transaction): the commit fails whole, the store is intact."""
    db = disk / "db"
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_documents([make_document(LOCKERS, "Lockers")])
        count, version = rag.store.count, rag.store.version
        with contextlib.closing(sqlite3.connect(db / DB_FILE)) as log:  # each commit lands in passages.sqlite, and
            assert log.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # the next reuses the log: empty it
        rag.store.fault_hook = lambda step: fill(disk) if step == full_at else None
        with pytest.raises(DiskFullError, match=f"the disk holding the store {db} is full: the write in hand was rolled back"):
            rag.add_documents([make_document(TOURS, "Tours")])
        rag.store.fault_hook = None
        assert (rag.store.count, rag.store.version) == (count, version)
        (disk / "filler").unlink()
        assert rag.add_documents([make_document(TOURS, "Tours")]) > 0  # space again: the same documents go in
        count = rag.store.count
    with EdgeRAG(db, bundle=bundle_dir, create=False) as rag:
        assert rag.store.count == count


def test_cli_index_on_a_full_disk_is_one_line_and_exit_2(disk: Path, bundle_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    db = disk / "db"
    (tmp_path / "lockers.txt").write_text(LOCKERS, encoding="utf-8")
    (tmp_path / "tours.txt").write_text(TOURS, encoding="utf-8")
    common = ["--db", str(db), "--bundle", str(bundle_dir), "--quiet"]
    assert main(["index", str(tmp_path / "lockers.txt"), *common]) == 0
    capsys.readouterr()
    fill(disk)
    assert main(["index", str(tmp_path / "tours.txt"), *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"edge-rag: error: the disk holding the store {db} is full"), err
    (disk / "filler").unlink()
    with EdgeRAG(db, bundle=bundle_dir, create=False) as rag:
        assert rag.store.count == 1


def test_upload_on_a_full_disk_fails_its_job_with_507(disk: Path, bundle_dir: Path, sample_db: Path) -> None:
    httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
    serving = pytest.importorskip("serving", reason="the serve extra is not installed: pip install 'edge-rag[serve]'")
    db = disk / "db"
    shutil.copytree(sample_db, db)
    rag = EdgeRAG(db, bundle=bundle_dir, config=serving.test_config())
    before = rag.store.count
    with serving.running_server(rag) as url:
        fill(disk)
        r = httpx.post(f"{url}/api/documents", files={"file": ("tours.txt", TOURS.encode())},
                       headers=serving.WRITE, timeout=120)
        job = serving.wait_job(url, r)
        assert job["state"] == "failed" and job["status"] == 507, job["error"]
        assert job["error"].startswith("the disk holding the store") and "Error" not in job["error"], job
        assert rag.store.count == before


def test_a_short_index_file_is_never_committed(disk: Path, bundle_dir: Path) -> None:
    """hnswlib does not check its writes: on a full disk it saved a short index file, and a removal, whose rows
    fit in the space SQLite's log already had, committed it: the store's index was broken from then on."""
    db = disk / "db"
    tours, lockers = make_document(TOURS, "Tours"), make_document(LOCKERS, "Lockers")
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_documents([tours, lockers])
        count = rag.store.count
        with contextlib.closing(sqlite3.connect(db / DB_FILE)) as log:  # the next commit reuses the log's space
            assert log.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0
        rag.store.fault_hook = lambda step: fill(disk) if step == "begin" else None
        with pytest.raises(DiskFullError, match="is full: the write in hand was rolled back"):
            rag.remove([lockers.doc_id])
        rag.store.fault_hook = None
    (disk / "filler").unlink()
    with EdgeRAG(db, bundle=bundle_dir, create=False) as rag:
        assert rag.store.count == count and rag.store.document(lockers.doc_id) is not None
        assert rag.remove([lockers.doc_id]) == 1 and rag.store.count == count - 1


def test_a_store_on_a_read_only_disk_answers_and_refuses_writes(disk: Path, bundle_dir: Path) -> None:
    """A store on a read-only mount (an overlay root, read-only media, a card the kernel remounted read-only after I/O
    errors) could not be opened to ask it: 'the store folder … is read-only: SQLite writes its -wal and -shm files'.
    It now answers (its persistent answer cache kept in memory), and a write says the folder is read-only; indexing
    into a new or an empty folder there says no store can be made there. The store is whole once the disk is
    writable again."""
    db = disk / "db"
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_documents([make_document(LOCKERS, "Lockers")])
        count = rag.store.count
    files = sorted(p.name for p in db.iterdir())
    (disk / "empty").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    with EdgeRAG(db, bundle=bundle_dir, create=False, config=Config(persistent_cache=True)) as rag:
        assert rag.store.count == count and not rag.ask("How much do the coin lockers cost?").cache_hit
        assert rag.ask("How much do the coin lockers cost?").cache_hit  # kept in memory
        with pytest.raises(StoreError, match="the store folder is read-only here"):
            rag.add_documents([make_document(TOURS, "Tours")])
    with pytest.raises(StoreError, match="cannot make the store folder .*: Read-only file system"):
        EdgeRAG(disk / "new", bundle=bundle_dir)
    with pytest.raises(StoreError, match="passages.sqlite is missing and the folder is read-only here"):
        EdgeRAG(disk / "empty", bundle=bundle_dir)
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    assert sorted(p.name for p in db.iterdir()) == files
    with EdgeRAG(db, bundle=bundle_dir, create=False) as rag:
        assert rag.store.count == count


def test_an_upload_to_a_full_temporary_folder_is_507_and_leaves_nothing(disk: Path, bundle_dir: Path, sample_db: Path,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload is saved in the temporary folder before its job: with that disk full (a kiosk's /tmp on its SD card)
    it was a 500 'internal error: OSError', a traceback in the log per upload."""
    httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
    serving = pytest.importorskip("serving", reason="the serve extra is not installed: pip install 'edge-rag[serve]'")
    (disk / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(disk / "tmp"))
    shutil.copytree(sample_db, tmp_path / "db")
    rag = EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=serving.test_config())
    before = rag.store.count
    with serving.running_server(rag) as url:
        fill(disk)
        r = httpx.post(f"{url}/api/documents", files={"file": ("tours.txt", TOURS.encode())},
                       headers=serving.WRITE, timeout=120)
        assert r.status_code == 507 and r.json()["error"].startswith("the disk is full"), r.text
        assert str(disk / "tmp") in r.json()["error"] and not list((disk / "tmp").iterdir())
        (disk / "filler").unlink()
        r = httpx.post(f"{url}/api/documents", files={"file": ("tours.txt", TOURS.encode())},
                       headers=serving.WRITE, timeout=120)
        assert serving.wait_job(url, r)["state"] == "done" and rag.store.count > before


def test_a_question_log_line_the_disk_filled_up_in_is_cut_off(disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The disk filled up in the middle of a line (its file's last page had room for part of it): the part stayed, and
    the first question kept once there was space again was glued to it, both skipped by calibrate."""
    path = disk / "questions.jsonl"
    log = QuestionLog(path)
    asked = [f"Is gallery {n} open on Mondays, and how long is the tour there?" for n in range(100)]
    for question in asked[:40]:
        log.add(question)
    fill(disk)
    for question in asked[40:80]:  # the first ones fill the last page of the file, one is cut there
        log.add(question)
    (disk / "filler").unlink()
    log.add(asked[80])
    kept = [question for question, _ in question_log.lines(path)]
    assert kept == asked[:len(kept) - 1] + [asked[80]] and len(kept) > 40
    assert path.read_bytes().endswith(b"\n") and len(caplog.records) == 1  # the failure said once


def test_labels_and_a_calibration_on_a_full_disk_are_507_saying_so(disk: Path, sample_db: Path) -> None:
    """The operator page on a full disk: importing labels was a 500 (the label file's "database or disk is full"),
    and a calibration job failed 500 with a bare "OSError: [Errno 28] No space left on device"."""
    httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
    serving = pytest.importorskip("serving", reason="the serve extra is not installed: pip install 'edge-rag[serve]'")
    from admin_cases import logged_server, sample_labels

    rag, running = logged_server(sample_db, disk)
    labelled = json.dumps(sample_labels()).encode()
    with running as url:
        fill(disk)
        r = httpx.post(f"{url}/api/admin/import", content=labelled, headers=serving.WRITE, timeout=30)
        assert r.status_code == 507 and "database or disk is full" in r.json()["error"], r.text
        (disk / "filler").unlink()
        r = httpx.post(f"{url}/api/admin/import", content=labelled, headers=serving.WRITE, timeout=30)
        assert r.status_code == 200, r.text
        files = sorted(p.name for p in (disk / "db").iterdir())
        fill(disk)
        job = serving.wait_job(url, httpx.post(f"{url}/api/admin/calibrate", headers=serving.WRITE, timeout=30))
        assert job["state"] == "failed" and job["status"] == 507, job
        assert job["error"].startswith("the disk is full") and sorted(p.name for p in (disk / "db").iterdir()) == files


def test_a_full_disk_after_a_commit_of_the_same_run_says_that_commit_stays(disk: Path, bundle_dir: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An index run fills the disk after its first commits: it said "nothing was changed", and those commits were in
    the store (2,449 SQuAD passages on a 4.5 MB free disk: 1,024 kept)."""
    monkeypatch.setattr(indexing, "INDEX_BATCH_PASSAGES", 16)  # a commit every 16 passages, not 1024
    tours = TOURS.split(". ")
    docs = [make_document(". ".join(tours[n:n + 20]), f"Tours {n}") for n in range(0, 60, 20)]
    db = disk / "db"
    with EdgeRAG(db, bundle=bundle_dir) as rag:
        rag.add_documents([make_document(LOCKERS, "Lockers")])
        count, begun = rag.store.count, []

        def second_commit_fills(step: str) -> None:
            begun.append(step == "begin")
            if step == "begin" and sum(begun) == 2:
                fill(disk)
        rag.store.fault_hook = second_commit_fills
        with pytest.raises(DiskFullError, match="rolled back, what was committed before it stays") as failed:
            rag.add_documents(docs)
        assert "nothing was changed" not in str(failed.value) and rag.store.count > count
        rag.store.fault_hook = None
        (disk / "filler").unlink()
        assert rag.add_documents(docs) > 0 and all(rag.store.document(d.doc_id) is not None for d in docs)
