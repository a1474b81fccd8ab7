"""An indexing run writes a small multiple of the store it leaves (issue #43: every 1,024-passage commit rewrote and
hashed the whole index file, so a 19 MB upload wrote ~40 GB onto the kiosk's SD card). Commits now grow with the store
(``indexing.commit_step``). Gated on a count, ``/proc/self/io`` write_bytes over the folder's size, not on time: the
batch is scaled down to 64 passages so a 0.15 MB file (2,485 passages) takes ~40 batches, as a 20 MB upload takes ~200.

``python -m pytest tests/test_store_writes.py -s`` on a 0.25 MB file (4,145 passages): before 270 MiB written for a
14.3 MiB store (18.9x); now 34 MiB for 12.6 MiB (2.7x). Each batch its own commit rewrote the whole index, so the
bytes written grow with the square of the batches: on the 0.15 MB file here that way (``Store.commit_growth = 0``) 102 MiB
were written for a 10.1 MiB store (10.1x, over the gate); now 15.8 MiB for 7.9 MiB (2.0x)."""
import numpy as np
import pytest

from benchmarks.write_amplification import MAX_RATIO, write_text, written_bytes
from edge_rag.config import Config
from edge_rag.documents import indexing
from edge_rag.documents.chunk import read_documents
from edge_rag.storage.store import Store
from edge_rag.storage.store_db import contexts

BATCH = 64
UPLOAD_MB = 0.15  # 2,485 passages: 39 batches (an upload of ~40 commits' worth before issue #43's fix)


@pytest.fixture
def upload(tmp_path, monkeypatch):
    monkeypatch.setattr(indexing, "INDEX_BATCH_PASSAGES", BATCH)
    path = tmp_path / "upload.txt"
    write_text(path, UPLOAD_MB)
    return read_documents(path)


def _index(store, encoder, docs, progress=None):
    config = Config()
    with store.writing():
        todo, remove = indexing.plan_changes(store, docs, config)
        return indexing.index(store, encoder, config, todo, remove, progress)


def test_an_indexing_run_writes_a_bounded_multiple_of_the_store(tmp_path, encoder, upload):
    store = Store(tmp_path / "db", encoder.dim)
    before = written_bytes()
    added = _index(store, encoder, upload)
    written = written_bytes() - before
    size = sum(f.stat().st_size for f in store.folder.iterdir() if f.is_file())
    print(f"\n{added} passages: {written / 2**20:.1f} MiB written, store {size / 2**20:.1f} MiB, "
          f"{written / size:.1f}x")
    assert added == store.count > 30 * BATCH
    assert written <= MAX_RATIO * size
    # Contexts joined across the batches of one commit are those of the document passages in one piece.
    rows = store.db.execute("SELECT id, doc_id, position, text, context FROM passages ORDER BY doc_id, position")
    rows = rows.fetchall()
    expected = contexts([(r[0], r[2], r[3]) for r in rows if r[1] == rows[0][1]])
    assert {r[0]: r[4] for r in rows if r[1] == rows[0][1]} == expected
    store.close()


def test_a_cancel_commits_what_was_encoded(tmp_path, encoder, upload):
    """Progress follows every encoded batch; when it raises, the batches encoded but not yet committed (the store has
    grown past one batch per commit by then) are committed before the cancel goes on."""
    store = Store(tmp_path / "db", encoder.dim)
    calls = []

    class Cancel(Exception):
        pass

    def progress(done, planned):
        calls.append(done)
        if len(calls) == 9:
            raise Cancel

    with pytest.raises(Cancel):
        _index(store, encoder, upload, progress)
    assert calls == [BATCH * (i + 1) for i in range(9)] and store.count == 9 * BATCH
    ids = [r[0] for r in store.db.execute("SELECT id FROM passages")]
    assert sorted(store.index.get_ids_list()) == sorted(ids)
    found = store.search(np.asarray(store.index.get_items([ids[-1]])[0], np.float32), 1)
    assert found[0].id == ids[-1]
    store.close()
