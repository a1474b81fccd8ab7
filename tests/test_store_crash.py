"""Crash safety and one writer per store, with real processes: a crash (os._exit, no clean-up) at every
step of the commit sequence, and two `edge-rag index` processes writing into one store at once."""
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SAMPLE_DOCS

from edge_rag.config import Config
from edge_rag.documents.chunk import make_document
from edge_rag.errors import StoreError
from edge_rag.pipeline import EdgeRAG
from edge_rag.storage.fileio import atomic_path, atomic_write_text
from edge_rag.storage.store import COMMIT_STEPS, DB_FILE, Part, Store

BATCH = 20  # passages per commit in the crashing process, so the corpus below takes several commits
FOUNDER = "09-founder-margaret-hollins.md"  # the document the recovered store is asked about
FILES = 5  # the sample corpus's five files up to the founder's (72 passages: commits of 20, 20, 20, 12): each case
# embeds them once

CRASH = """
import os, sys
from edge_rag.documents import indexing
from edge_rag.pipeline import EdgeRAG
db, bundle, docs, step, commit = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
indexing.INDEX_BATCH_PASSAGES = int(sys.argv[6])
rag = EdgeRAG(db, bundle=bundle)
seen = []
def hook(name):
    seen.append(name)
    if name == step and seen.count(step) == commit:
        os._exit(70)  # power cut: no finally blocks, no SQLite close, no flush
rag.store.fault_hook = hook
rag.add_files([docs])
print("finished without crashing")
"""


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    """A folder of FILES sample documents, the founder's the last, which each process below indexes."""
    folder = tmp_path_factory.mktemp("docs")
    paths = sorted(SAMPLE_DOCS.iterdir())
    end = [p.name for p in paths].index(FOUNDER) + 1
    for path in paths[end - FILES:end]:
        shutil.copy(path, folder)
    return folder


@pytest.fixture(scope="module")
def sample_total(docs, bundle_dir, tmp_path_factory) -> int:
    """Passages of ``docs`` indexed without a crash."""
    with EdgeRAG(tmp_path_factory.mktemp("whole") / "db", bundle=bundle_dir) as rag:
        rag.add_files([docs])
        assert rag.store.count > 3 * BATCH  # commits after the crashing one
        return rag.store.count


# Every step of a later commit (an old index file exists), and the first commit's around the SQLite commit.
CASES = [(step, 2) for step in COMMIT_STEPS] + [("index_saved", 1), ("committed", 1)]


@pytest.mark.parametrize("step, commit", CASES)
def test_crash_at_every_commit_step_recovers_the_last_commit(tmp_path, bundle_dir, docs, sample_total, step, commit):
    db = tmp_path / "db"
    run = subprocess.run([sys.executable, "-c", CRASH, str(db), str(bundle_dir), str(docs), step,
                          str(commit), str(BATCH)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 70, run.stdout + run.stderr
    # What was committed before the crash: commits before this one, plus this one once SQLite committed it.
    durable = commit if COMMIT_STEPS.index(step) >= COMMIT_STEPS.index("committed") else commit - 1
    with EdgeRAG(db, bundle=bundle_dir, config=Config(temperature=0.0)) as rag:
        assert rag.store.count == min(durable * BATCH, sample_total)  # nothing committed is lost
        added = rag.add_files([docs])
        assert [p.name for p in db.glob("vectors*.hnsw")] == [rag.store.index_file]  # the writer removed orphans
        assert added == sample_total - min(durable * BATCH, sample_total)  # exactly the rest
        assert rag.store.count == sample_total
        answer = rag.decide("Who founded the Harbourlight Science Museum?")
        assert answer.passages and answer.d_min < 1.0
    reopened = Store(db, rag.encoder.dim)  # opens: the index and the passages agree after recovery
    assert reopened.count == sample_total and len(list(db.glob("vectors*.hnsw"))) == 1
    reopened.close()


def _index(db, bundle_dir, docs, *extra):
    return subprocess.Popen([sys.executable, "-m", "edge_rag", "index", str(docs), "--db", str(db),
                             "--bundle", str(bundle_dir), "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_two_index_processes_one_store(tmp_path, bundle_dir, docs, sample_total):
    """Both run at once and wait for the lock: one adds everything, the other nothing; index and
    passages agree (before the lock: both said 'added 3000' and the store was broken for good)."""
    db = tmp_path / "db"
    procs = [_index(db, bundle_dir, docs, "--wait", "600") for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    added = sorted(int(out.split("added ")[1].split()[0]) for out, _ in outs)
    assert added == [0, sample_total]
    store = Store(db, 384)
    assert store.count == sample_total and len(store.index.get_ids_list()) == sample_total
    store.close()


def test_second_writer_fails_at_once_with_a_clear_message(tmp_path, bundle_dir, docs, sample_rag):
    db = tmp_path / "db"
    writer = Store(db, sample_rag.encoder.dim)
    with writer.writing():  # another process holds the writer lock
        proc = _index(db, bundle_dir, docs)
        out, err = proc.communicate(timeout=600)
        other = Store(db, sample_rag.encoder.dim, lock_timeout=0.2)  # and a second writer in this process
        with pytest.raises(StoreError, match="being written by another store object of this process"), other.writing():
            pass
        other.close()
    writer.close()
    assert proc.returncode == 2 and "is being written by another process" in err and "Traceback" not in err


def test_lost_database_beside_an_index_is_an_error(tmp_path, sample_rag):
    db = tmp_path / "db"
    db.mkdir()
    (db / "vectors.1.abcd.hnsw").write_bytes(b"x" * 100)
    (db / DB_FILE).write_bytes(b"")
    with pytest.raises(StoreError, match="is empty but .* holds a vector index"):
        Store(db, sample_rag.encoder.dim)
    (db / DB_FILE).unlink()
    with pytest.raises(StoreError, match="is missing but .* holds a vector index"):
        Store(db, sample_rag.encoder.dim)
    with pytest.raises(StoreError, match="no passage store"):
        Store(tmp_path / "mistyped", sample_rag.encoder.dim, create=False)
    assert not (tmp_path / "mistyped").exists()


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from edge_rag.storage.store_db import connect
folder = Path(sys.argv[1])
print("ready", flush=True)
start = float(sys.stdin.readline())  # sent once every process is ready
time.sleep(max(0.0, start - time.time()))  # every process opens at the same instant
connect(folder).close()
"""


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path):
    """SQLite refuses at once (no busy wait) when two connections set up a new store together; every opener
    must still get the store (before the retry: ~1 run in 7 of two indexers failed with 'database is locked').
    The start instant is set once all four have imported, however long that took on a busy machine."""
    for trial in range(5):
        folder = tmp_path / f"db{trial}"
        folder.mkdir()
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(folder)], cwd=ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        ready = [p.stdout.readline() for p in procs]
        start = time.time() + 0.2
        for p in procs:
            p.stdin.write(f"{start}\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
        assert ready == ["ready\n"] * 4 and [p.returncode for p in procs] == [0] * 4, (ready, outs)


def _commit(store: Store, i: int) -> None:
    doc = make_document(f"Document {i} about the harbour clock.", doc_id=f"d{i}")
    store.add([Part(doc, 0, [doc.text], last=True, sha=doc.doc_id)], np.eye(8, dtype=np.float32)[i % 8:i % 8 + 1])


def test_opening_a_store_removes_no_index_file_the_next_writer_removes_orphans(tmp_path):
    """An opener cannot tell an orphan from the file another process committed since it read the store's record:
    opening removes nothing, a writer removes orphans under its lock. Before: opening swept every index file but
    the one it had read, so a commit landing meanwhile lost its index file and the store stopped opening."""
    writer = Store(tmp_path, 8)
    _commit(writer, 0)
    unknown = tmp_path / "vectors.2.0123abcd.hnsw"  # as far as an opener knows: another process's newer commit
    unknown.write_bytes((tmp_path / writer.index_file).read_bytes())
    Store(tmp_path, 8, create=False).close()
    assert unknown.exists()
    _commit(writer, 1)
    assert [p.name for p in tmp_path.glob("vectors*.hnsw")] == [writer.index_file]
    writer.close()


OPEN_AGAIN_AND_AGAIN = """
import sys
from edge_rag.storage.store import Store
print("ready", flush=True)
while True:  # an error ends it (was: a commit replaced the index file it read), which the test below sees
    Store(sys.argv[1], 8, create=False).close()
"""


def test_a_process_opening_the_store_never_fails_a_writer(tmp_path):
    """A process that only opens the store (a question asked, a kiosk restarting) takes no writer lock: 100
    commits that would not wait for one (lock_timeout 0, as `edge-rag index` without --wait) all land, each
    committed index file in place. Before: the opener's orphan sweep took the lock, and 13 of 100 commits failed
    'being written by another process'."""
    writer = Store(tmp_path, 8)
    _commit(writer, 0)
    opener = subprocess.Popen([sys.executable, "-c", OPEN_AGAIN_AND_AGAIN, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert opener.stdout.readline() == "ready\n"
        for i in range(1, 101):
            _commit(writer, i)
            assert (tmp_path / writer.index_file).is_file()
        assert opener.poll() is None, opener.communicate()  # no open failed meanwhile
    finally:
        opener.kill()
        opener.communicate()
    writer.close()


LIVE = 5  # documents in the store while the writer below commits: each commit adds one and removes the oldest
MET = 50  # commits the reader meets, and stores it opens, at least: however fast either process runs
COMMIT_AGAIN_AND_AGAIN = """
import sys
from pathlib import Path
import numpy as np
from edge_rag.documents.chunk import make_document
from edge_rag.storage.store import Part, Store
store, live, stop = Store(sys.argv[1], 8, lock_timeout=30), int(sys.argv[2]), Path(sys.argv[3])
print("ready", flush=True)
i = live
while not stop.exists():
    doc = make_document(f"Document {i} about the harbour clock.", doc_id=f"d{i}")
    store.add([Part(doc, 0, [doc.text], last=True, sha=doc.doc_id)], np.eye(8, dtype=np.float32)[i % 8:i % 8 + 1],
              remove=[f"d{i - live}"])
    i += 1
print(i - live, flush=True)
"""


def test_readers_in_another_process_load_a_whole_commit_while_a_writer_commits(tmp_path):
    """A process that opens and searches the store while another commits (adds and removals, back to back) gets the
    last commit or the one before it, never an error. Before: the store's record, the index file, the passages and
    their ids were read one statement at a time, and the writer removed the file read once its next commit landed:
    50-70 of ~400 rounds of an open and four searches failed ('... disagree; re-index', '... cannot be read')."""
    store = Store(tmp_path / "db", 8)
    for i in range(LIVE):
        _commit(store, i)
    store.close()
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", COMMIT_AGAIN_AND_AGAIN, str(tmp_path / "db"), str(LIVE),
                               str(stop)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader, errors, opens, searches = None, [], 0, 0
    try:
        assert writer.stdout.readline() == "ready\n", writer.communicate()
        reader = Store(tmp_path / "db", 8, create=False)  # open all along: follows each commit as it searches
        first, rng = reader.version, np.random.default_rng(0)
        while (opens < MET or reader.version < first + MET) and writer.poll() is None:
            try:  # opened anew: a question asked by a new process
                with contextlib.closing(Store(tmp_path / "db", 8, create=False)) as opened:
                    opens += 1
                    for searched in (opened, reader, reader, reader):
                        hits = searched.search(rng.normal(size=8).astype(np.float32), 3)
                        searches += 1  # each hit is a stored passage (read by its id), of the document it names
                        assert hits and len({p.id for p in hits}) == len(hits), hits
                        assert all(p.text == f"Document {p.doc_id[1:]} about the harbour clock." for p in hits), hits
            except Exception as exc:  # every failure counts, whatever it is
                errors.append(repr(exc))
        stop.touch()
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()
        if reader is not None:
            reader.close()
    assert writer.returncode == 0, err
    assert int(out) >= MET and opens >= MET, (out, opens)  # the reader met many commits
    assert errors == [], f"{len(errors)} errors in {opens} opens and {searches} searches: {errors[:3]}"


COMMIT_THEN_POWER_CUT = """
import os, sys
import numpy as np
from edge_rag.documents.chunk import make_document
from edge_rag.storage.store import Part, Store
store = Store(sys.argv[1], 8)
for i in range(3):  # a kiosk server: commits, and its connections stay open
    doc = make_document(f"Document {i} about the harbour clock.", doc_id=f"d{i}")
    store.add([Part(doc, 0, [doc.text], last=True, sha=doc.doc_id)], np.eye(8, dtype=np.float32)[i:i + 1])
os._exit(70)  # power cut: no SQLite close, so no checkpoint at close
"""


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_store_whose_wal_was_lost_after_a_power_cut_keeps_its_commits(tmp_path, damage):
    """Every commit stayed in passages.sqlite-wal (SQLite copies it into the database at close or at 1,000 pages, and
    a kiosk server never closes): passages.sqlite itself was one 4 KB page. Lose the -wal (a copy or backup of the
    files docs/concepts/store.md lists, a card's lost tail after a power cut) and the store opened empty, silently:
    0 of 3 passages, every question refused, its index file an orphan the next writer removed. Each commit now
    lands in passages.sqlite too."""
    db = tmp_path / "db"
    run = subprocess.run([sys.executable, "-c", COMMIT_THEN_POWER_CUT, str(db)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 70, run.stderr
    wal = db / f"{DB_FILE}-wal"
    if damage == "deleted":
        wal.unlink()
    else:
        wal.write_bytes(wal.read_bytes()[:wal.stat().st_size // 2])
    store = Store(db, 8, create=False)
    assert store.count == 3 and len(store.search(np.eye(8, dtype=np.float32)[2], 1)) == 1
    store.close()


COMMIT_THEN_KILLED_BEFORE_THE_CHECKPOINT = """
import os, sys
import numpy as np
from edge_rag.documents.chunk import make_document
from edge_rag.storage.store import Part, Store
store = Store(sys.argv[1], 8)
for i in range(2):
    store.fault_hook = lambda step: i == 1 and step == "committed" and os._exit(70)  # before the commit's checkpoint
    doc = make_document(f"Document {i} about the harbour clock.", doc_id=f"d{i}")
    store.add([Part(doc, 0, [doc.text], last=True, sha=doc.doc_id)], np.eye(8, dtype=np.float32)[i:i + 1])
"""
COUNT = "import sys; from edge_rag.storage.store import Store; print(Store(sys.argv[1], 8, create=False).count)"


def test_a_read_only_copy_whose_wal_holds_a_commit_is_refused_not_read_old(tmp_path):
    """A store whose writer was killed between a commit and its checkpoint keeps that commit in passages.sqlite-wal
    only; copied without the -shm (or its -shm removed) to a folder this process may not write, it was opened
    immutable, which reads the database alone: 1 of the 2 committed passages, silently (and a checkpoint cut short
    would read torn). It is refused, saying what brings the commit in; once its owner opened it, it is read whole."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("as root, a read-only folder needs setpriv to drop CAP_DAC_OVERRIDE")
    as_user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    db, copy = tmp_path / "db", tmp_path / "copy"
    run = subprocess.run([sys.executable, "-c", COMMIT_THEN_KILLED_BEFORE_THE_CHECKPOINT, str(db)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 70, run.stderr
    shutil.copytree(db, copy, ignore=shutil.ignore_patterns("*-shm"))
    copy.chmod(0o555)
    try:
        read = subprocess.run([*as_user, sys.executable, "-c", COUNT, str(copy)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert read.returncode != 0 and "open it once where it may be written" in read.stderr, (read.stdout,
                                                                                                 read.stderr)
        copy.chmod(0o755)
        Store(copy, 8, create=False).close()  # its owner opens it
        copy.chmod(0o555)
        read = subprocess.run([*as_user, sys.executable, "-c", COUNT, str(copy)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert read.stdout == "2\n", read.stderr
    finally:
        copy.chmod(0o755)


def test_a_database_that_goes_bad_under_a_running_kiosk_is_a_store_error(tmp_path, sample_db, bundle_dir):
    """The card fails while the kiosk runs: quick_check passed at open, and the next questions met SQLite's own
    'database disk image is malformed' (sqlite3.DatabaseError: HTTP 500 'internal error: DatabaseError' at the
    kiosk, a traceback from the command line). Now a StoreError naming the store and the fix, from ask, its stream
    and decide alike."""
    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    with EdgeRAG(db, bundle=bundle_dir, create=False) as rag:
        assert rag.ask("When does the museum open?").answer
        data = bytearray((db / DB_FILE).read_bytes())
        for at in range(2 * 4096, len(data), 4096):  # every page but the first two now reads back as garbage
            data[at:at + 4096] = bytes(range(256)) * 16
        (db / DB_FILE).write_bytes(data)
        for ask in (rag.ask, lambda q: list(rag.ask_stream(q)), rag.decide):
            with pytest.raises(StoreError, match=f"the store {db} cannot be read .*re-index into a new folder"):
                ask("Who founded the museum and when?")


KILLED_MID_WRITE = """
import os, signal, sys
from edge_rag.storage.fileio import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_text("half a certificate")
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # no finally block runs
    print("writing", flush=True)
    sys.stdin.readline()  # a live writer, mid-write until told to go on
    tmp.write_text("the live writer's")
"""


def test_temps_of_writers_killed_mid_write_do_not_pile_up(tmp_path):
    """Each writer killed inside ``atomic_path`` left its temp file for good (5 kills: 5 temps of 1 MB beside the
    operator's certificate). Each write of the same file first removes those of dead processes, and only those: a
    live writer's temp, another file's temps and files not named as they are stay."""
    target = tmp_path / "operator-calibration.json"

    def run(how: str, **kw):
        return subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(target), how], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)

    for _ in range(3):
        assert run("kill").wait(timeout=60) == -9
    assert len(list(tmp_path.glob(".operator-calibration.json.*.tmp"))) == 1  # the last one's: before, 3
    live = run("live")
    assert live.stdout.readline() == "writing\n"
    others = [tmp_path / ".labels.sqlite.1.0123abcd.tmp", tmp_path / ".operator-calibration.json.tmp",
              tmp_path / "operator-calibration.json.1.0123abcd.tmp"]
    for other in others:
        other.write_text("not a temp of this file's")
    atomic_write_text(target, "{}")
    left = sorted(p.name for p in tmp_path.glob(".operator-calibration.json.*.tmp"))
    assert left == [f".operator-calibration.json.{live.pid}.{left[0].split('.')[-2]}.tmp"], left
    assert all(other.exists() for other in others)
    live.communicate("\n", timeout=60)
    assert live.returncode == 0 and target.read_text() == "the live writer's"


def test_temps_left_by_a_killed_process_that_had_this_ones_pid_do_not_pile_up(tmp_path):
    """A container's entrypoint is pid 1 at every start: each one killed mid-write (the OOM killer, `docker kill`)
    left a temp named with the pid the next one has, alive, so they piled up all the same (5 real kills under
    `unshare -pf`: 5 temps). A temp of this process's pid that it is not writing and that was made before it started
    is removed; one another of its threads is writing stays, however old its time."""
    target = tmp_path / "operator-calibration.json"
    earlier = tmp_path / f".{target.name}.{os.getpid()}.0123abcd.tmp"  # as the killed process with this pid left it
    earlier.write_text("half a certificate")
    os.utime(earlier, (0, 0))
    inside, go = threading.Event(), threading.Event()

    def write() -> None:
        with atomic_path(target) as tmp:
            tmp.write_text("the other thread's")
            os.utime(tmp, (0, 0))
            inside.set()
            go.wait(60)

    writer = threading.Thread(target=write)
    writer.start()
    assert inside.wait(60)
    atomic_write_text(target, "{}")
    left = list(tmp_path.glob(f".{target.name}.*.tmp"))
    go.set()
    writer.join(60)
    assert not earlier.exists() and len(left) == 1 and target.read_text() == "the other thread's"


WRITING_A_WHILE = """
import sys
from edge_rag.storage.fileio import atomic_path
with atomic_path(sys.argv[1]) as tmp, open(tmp, "w") as f:  # one open file, written over a while
    f.write("half a certificate")
    print("writing", flush=True)
    sys.stdin.readline()
    f.write(", then the rest")
"""


def test_a_live_writers_temp_is_kept_by_a_writer_in_another_pid_namespace(tmp_path):
    """A writer in another pid namespace (a container sharing the folder, here `unshare -pf`) cannot see this
    machine's pids: it took a live writer's temp for a dead one's and removed it, and that writer's write failed
    with FileNotFoundError (its certificate not saved). A temp whose writer holds it is kept, whoever looks."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a pid namespace needs root and unshare")
    target = tmp_path / "operator-calibration.json"
    live = subprocess.Popen([sys.executable, "-c", WRITING_A_WHILE, str(target)], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert live.stdout.readline() == "writing\n"
    other = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-c",
                            "import sys; from edge_rag.storage.fileio import atomic_write_text; "
                            "atomic_write_text(sys.argv[1], '{}')", str(target)], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    if other.returncode != 0 and "unshare" in other.stderr:
        live.kill()
        pytest.skip(f"no pid namespace here: {other.stderr.strip()}")
    assert other.returncode == 0 and target.read_text() == "{}", other.stderr
    live.communicate("\n", timeout=60)
    assert live.returncode == 0 and target.read_text() == "half a certificate, then the rest"
