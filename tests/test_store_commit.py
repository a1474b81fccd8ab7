"""Questions never wait for a commit's file (issue #26): a search while a commit saves, fsyncs and hashes the
index returns at once, sees exactly the committed passages, and a removal takes effect at its commit.

Before: ``Store._commit`` held the search lock for the whole commit, so every search waited for the save of the
whole index (seconds at 100k passages, once per 1,024 indexed). Gated on the order of events, not on speed: the
save is held open until the search has returned (the join timeouts only keep the old code from hanging)."""
import json
import subprocess
import sys
import threading

import numpy as np

from edge_rag.documents.chunk import make_document
from edge_rag.storage import hnsw
from edge_rag.storage.fair_lock import FairLock
from edge_rag.storage.store import Part, Store

DIM = 8
GUARD_S = 20  # deadlock guard: how long the old code's search is given before the save is let go


def _vectors(rng, n):
    v = rng.normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _doc_parts(name, n):
    doc = make_document(f"{name} text", name)
    return [Part(doc, 0, [f"{name} {i}" for i in range(n)], last=True, sha=doc.doc_id)], doc.doc_id


class HeldSave:
    """``hnsw.save`` that waits, once it has started, until the test lets it go; records the order of events."""

    def __init__(self, monkeypatch):
        self.saving, self.go, self.order, self._save = threading.Event(), threading.Event(), [], hnsw.save
        monkeypatch.setattr(hnsw, "save", self)

    def __call__(self, index, path):
        self.saving.set()
        self.go.wait(GUARD_S * 3)
        self.order.append("saved")
        return self._save(index, path)

    def while_saving(self, write, read):
        """Run ``write`` in a thread; once its save has started, ``read`` in another; returns read's result."""
        writer = threading.Thread(target=write)
        writer.start()
        assert self.saving.wait(GUARD_S * 3), "the commit never reached its save"
        out = []
        reader = threading.Thread(target=lambda: (out.append(read()), self.order.append("searched")))
        reader.start()
        reader.join(GUARD_S)
        self.go.set()
        writer.join()
        reader.join()
        return out[0]


def test_a_search_during_a_commit_returns_before_its_save_and_skips_its_passages(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    store = Store(tmp_path, DIM)
    parts, _ = _doc_parts("old", 300)
    store.add(parts, _vectors(rng, 300))
    query = _vectors(rng, 1)[0]
    new_parts, _ = _doc_parts("new", 200)
    held = HeldSave(monkeypatch)
    hits = held.while_saving(lambda: store.add(new_parts, np.repeat(query[None], 200, axis=0)),  # nearest of all
                             lambda: store.search(query, 5))
    assert held.order == ["searched", "saved"], "the search waited for the commit's save"
    assert len(hits) == 5 and all(h.id < 300 for h in hits)  # in the index already, but not committed: not found
    assert store.search(query, 5)[0].id >= 300 and store.count == 500  # committed: found
    store.close()



def test_a_search_during_a_commit_s_transaction_returns_before_it_commits(tmp_path):
    rng = np.random.default_rng(3)
    store = Store(tmp_path, DIM)
    old, _ = _doc_parts("old", 300)
    store.add(old, _vectors(rng, 300))
    query = _vectors(rng, 1)[0]
    seen = []

    def in_transaction(step):
        if step == "rows_written":  # inside the SQLite transaction, not yet committed
            reader = threading.Thread(target=lambda: seen.append(store.search(query, 5)))
            reader.start()
            reader.join(GUARD_S)
            seen.append(reader.is_alive())

    store.fault_hook = in_transaction
    new, _ = _doc_parts("new", 100)
    store.add(new, np.repeat(query[None], 100, axis=0))
    hits, waiting = seen[0], seen[1]
    assert waiting is False, "the search waited for the commit's transaction"
    assert len(hits) == 5 and all(h.id < 300 for h in hits)
    store.close()

def test_a_removal_takes_effect_at_its_commit_and_after_reopening(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    store = Store(tmp_path, DIM)
    keep, _ = _doc_parts("keep", 300)
    query = _vectors(rng, 1)[0]
    store.add(keep, _vectors(rng, 300))
    gone, gone_id = _doc_parts("gone", 50)
    store.add(gone, np.repeat(query[None], 50, axis=0))
    follower = Store(tmp_path, DIM)  # as a second process would: it reloads the index when a commit lands
    held = HeldSave(monkeypatch)
    hits, scored = held.while_saving(lambda: store.remove([gone_id]),
                                     lambda: (store.search(query, 5), store.scored(query, [300])))
    assert held.order == ["searched", "saved"]
    assert [h.doc_id for h in hits] == [gone_id] * 5  # still committed while it saves
    assert [p.id for p in scored] == [300] and scored[0].score > 0.99
    after = store.search(query, 5)
    assert len(after) == 5 and gone_id not in {h.doc_id for h in after}
    assert [h.id for h in follower.search(query, 5)] == [h.id for h in after]
    store.close()
    follower.close()
    reopened = Store(tmp_path, DIM)  # the saved file predates the removal's marks: opening applies them
    again = reopened.search(query, 5)
    assert [h.id for h in again] == [h.id for h in after] and reopened.count == 300
    reopened.close()


def test_the_search_lock_goes_to_a_waiting_search_before_the_next_chunk_of_a_commit():
    """With threading.RLock the commit's thread took the lock again at once, chunk after chunk, while the woken
    search waited: in this sequence the search went first in 0 of 50 tries (FairLock: 50 of 50)."""
    lock, order = FairLock(), []

    def search():
        with lock:
            order.append("search")

    with lock:  # a chunk of inserts
        reader = threading.Thread(target=search)
        reader.start()
        while not lock._queue:  # the search is waiting for the lock
            threading.Event().wait(0.001)
    with lock:  # the next chunk, asked for at once
        order.append("chunk")
    reader.join()
    with lock, lock:  # reentrant
        pass
    assert order == ["search", "chunk"]


def test_scored_leaves_out_what_a_commit_removed_since_it_was_found(tmp_path):
    """A lexical hit found just before a removal commits: it is left out of the scored passages (before: the
    question failed with hnswlib's 'Label not found')."""
    rng = np.random.default_rng(2)
    store = Store(tmp_path, DIM)
    keep, _ = _doc_parts("keep", 10)
    gone, gone_id = _doc_parts("gone", 10)
    store.add(keep + gone, _vectors(rng, 20))
    store.remove([gone_id])
    query = _vectors(rng, 1)[0]
    assert [p.id for p in store.scored(query, [3, 15])] == [3] and [p.id for p in store.passages([3, 15])] == [3]
    store.close()


FOLLOW = """
import json, subprocess, sys
import numpy as np
from edge_rag.memory import usage_mb
from edge_rag.storage.store import Store
folder, dim, commit = sys.argv[1], int(sys.argv[2]), sys.argv[3]
follower = Store(folder, dim, m=16, ef_construction=32)
query = np.eye(1, dim, dtype=np.float32)[0]
follower.search(query, 1)
rss, peak = usage_mb()
subprocess.run([sys.executable, "-c", commit, folder, str(dim)], check=True, timeout=120)
found = follower.search(query, 1)
print(json.dumps({"before": max(rss, peak), "peak": usage_mb()[1], "count": follower.count, "top": found[0].doc_id}))
"""
COMMIT_ONE = """
import sys
import numpy as np
from edge_rag.documents.chunk import make_document
from edge_rag.storage.store import Part, Store
folder, dim = sys.argv[1], int(sys.argv[2])
doc = make_document("one more", "more")
Store(folder, dim, m=16, ef_construction=32).add([Part(doc, 0, ["more"], last=True, sha=doc.doc_id)],
                                                 np.eye(1, dim, dtype=np.float32))
"""


def test_a_reload_after_another_process_s_commit_holds_one_index_in_memory(tmp_path):
    """A store that reloads after another process's commit (a kiosk server while `edge-rag index` runs) held its
    stale index until the new one was read: two in memory, +57 MB of peak RSS at 30k passages, past the plan, which
    prices one. The stale one goes first: the reader's peak (a fresh process) rises by less than half the index."""
    dim, n = 2048, 2000  # a 16 MB index, built in a few seconds
    rng = np.random.default_rng(3)
    parts, _ = _doc_parts("big", n)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    Store(tmp_path, dim, m=16, ef_construction=32).add(parts, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    index_mb = sum(f.stat().st_size for f in tmp_path.glob("*.hnsw")) / 2**20
    run = subprocess.run([sys.executable, "-c", FOLLOW, str(tmp_path), str(dim), COMMIT_ONE], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["count"] == n + 1 and out["top"] == make_document("one more", "more").doc_id, out  # reloaded
    assert out["peak"] - out["before"] < index_mb / 2, (out, index_mb)



FAIL = """
import json, resource, signal, sys
from pathlib import Path
import numpy as np
from edge_rag.documents.chunk import make_document
from edge_rag.errors import StoreError
from edge_rag.memory import usage_mb
from edge_rag.storage.store import Part, Store
folder, dim, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = Store(folder, dim, m=16, ef_construction=32)
query = np.eye(1, dim, dtype=np.float32)[0]
doc = make_document("one more", "more")
def fail(step):
    if step == "rows_written":
        raise StoreError("a bad document")
out = []
for how in ("full disk", "failed transaction"):
    store.search(query, 1)
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on (Linux)
    before = usage_mb()[0]
    if how == "full disk":  # a real short write of the index file: the file-size limit stands in for a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    else:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        store.fault_hook = fail
    try:
        store.add([Part(doc, 0, ["more"], last=True, sha=doc.doc_id)], np.eye(1, dim, dtype=np.float32))
        error = ""
    except (OSError, StoreError) as exc:
        error = type(exc).__name__
    out.append({"how": how, "rise": usage_mb()[1] - before, "error": error, "count": store.count,
                "found": store.search(query, 1)[0].doc_id})
print(json.dumps(out))
"""


def test_a_failed_commit_holds_one_index_in_memory(tmp_path):
    """A commit that fails (a full disk while the index is saved, a StoreError in its transaction) reloaded the
    committed index while the one the add had grown was still held (by the store; on a full disk also by the
    exception's frames): two in memory, +64 MB of peak RSS at 30k passages (a 48 MB index), past the plan, which
    prices one. The grown one goes first: the peak rises by less than half the index."""
    dim, n = 512, 10000  # a 22 MB index, built in a few seconds
    rng = np.random.default_rng(3)
    parts, doc_id = _doc_parts("big", n)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    Store(tmp_path, dim, m=16, ef_construction=32).add(parts, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    index_bytes = sum(f.stat().st_size for f in tmp_path.glob("*.hnsw"))
    run = subprocess.run([sys.executable, "-c", FAIL, str(tmp_path), str(dim), str(index_bytes // 2)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    for out in json.loads(run.stdout.strip().splitlines()[-1]):
        assert out["error"] and out["count"] == n and out["found"] == doc_id, out  # failed; the committed store answers
        assert out["rise"] < index_bytes / 2**20 / 2, (out, index_bytes / 2**20)


CLOSE_UNDER_COMMITS = """
import sys, threading, time
import numpy as np
from edge_rag.documents.chunk import make_document
from edge_rag.storage.store import Part, Store
rng, counts = np.random.default_rng(0), []
for trial in range(10):
    store, doc = Store(f"{sys.argv[1]}/{trial}", 8), make_document(f"doc {trial}", f"d{trial}")
    def close_soon(step, store=store, wait=0.001 * (trial % 5)):
        if step == "index_saved":  # the transaction follows: closed at some point of it
            threading.Thread(target=lambda: (time.sleep(wait), store.close())).start()
    store.fault_hook = close_soon
    store.add([Part(doc, 0, [f"passage {trial} {i}" for i in range(2000)], last=True, sha=doc.doc_id)],
              rng.normal(size=(2000, 8)).astype(np.float32))
    time.sleep(0.05)
    counts.append(Store(f"{sys.argv[1]}/{trial}", 8).count)
print(*counts)
"""


def test_a_store_closed_by_another_thread_during_a_commit_s_transaction_never_crashes(tmp_path):
    """EdgeRAG.close() beside an indexing run closed the writer's own SQLite connection under the commit's transaction,
    and sqlite3 then read the closed handle: the process died of a segmentation fault (3 runs of 3 here; an EdgeRAG
    adding 400 documents, closed 0-4 ms into the commit: 1 run of 1). The writing thread closes it as its run ends; the
    commit in flight lands whole (it holds the writer lock to its end) and the store reopens with every commit."""
    run = subprocess.run([sys.executable, "-c", CLOSE_UNDER_COMMITS, str(tmp_path / "db")], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-500:])
    assert run.stdout.split() == ["2000"] * 10
