import json
import math
import shutil
import sqlite3
import subprocess
import sys
import threading

import onnxruntime
import pytest

from edge_rag.config import Config, Tier
from edge_rag.errors import StoreError
from edge_rag.events import Final
from edge_rag.models import bundle as B
from edge_rag.models import verify
from edge_rag.pipeline import EdgeRAG
from edge_rag.storage.cache import MAX_ANSWER_BYTES, AnswerCache, answer_from_dict, cache_key
from edge_rag.types import Answer, Document, PassageRef, Route

V1, V2 = "corpus-v1", "corpus-v2"


def _answer(question: str, text: str | None = "1889") -> Answer:
    return Answer(
        question=question,
        answer=text,
        route=Route.RAG,
        tier=Tier.MEDIUM,
        confidence=0.8,
        lower_bound=0.41,
        d_min=0.7,  # threshold stays NaN
        passages=[PassageRef(3, "Eiffel Tower", 0.75)],
        timings_ms={"encode": 4.0, "retrieve": 0.5},
    )


def _small(size: int = 2) -> Config:
    return Config().with_(cache_size=size)


def test_answer_dict_round_trip():
    a = _answer("When was it built?")
    b = answer_from_dict(a.to_dict())
    assert b.to_dict() == a.to_dict()
    assert b.route is Route.RAG and b.tier is Tier.MEDIUM
    assert b.passages == [PassageRef(3, "Eiffel Tower", 0.75)]
    assert math.isnan(b.threshold) and b.lower_bound == 0.41
    assert answer_from_dict({**a.to_dict(), "from_a_newer_version": 1}).to_dict() == a.to_dict()


def test_key_ignores_only_spacing():
    assert cache_key("  When was the Eiffel Tower   BUILT? ") == "When was the Eiffel Tower BUILT?"
    cache = AnswerCache(_small())
    cache.put("When was it built?", _answer("When was it built?"), V1)
    hit = cache.get("When  was it built? ", V1)
    assert hit is not None and hit.cache_hit and hit.answer == "1889"
    assert cache.get("when was it built", V1) is None and cache.get("When was it opened?", V1) is None


def test_a_question_the_reader_reads_otherwise_is_never_served_the_others_answer(tmp_path, bundle_dir):
    """The cased reader certifies "Where is the US office?" ("Boston") and refuses it lower-cased without its "?".
    Before: the cache keyed both on "where is the us office", and whichever was asked second got the other's."""
    office = Document("us", "US office", "The US office is in Boston. Us staff work from nine.")
    with EdgeRAG(tmp_path, bundle=bundle_dir) as rag:
        rag.add_documents([office])
        for question in ("Where is the US office?", "where is the us office"):
            live, served = rag.decide(question), rag.ask(question)
            assert not served.cache_hit and (served.route, served.answer) == (live.route, live.answer)
            assert rag.ask(question).cache_hit


def test_lru_evicts_least_recently_used():
    cache = AnswerCache(_small(2))
    for q in ("a?", "b?"):
        cache.put(q, _answer(q, q), V1)
    assert cache.get("a?", V1) is not None  # a is now the most recent
    cache.put("c?", _answer("c?", "c"), V1)
    assert len(cache) == 2 and cache.get("b?", V1) is None
    assert cache.get("a?", V1).answer == "a?" and cache.get("c?", V1).answer == "c"
    off = AnswerCache(_small(0))  # size 0: caching off
    off.put("a?", _answer("a?", "a"), V1)
    assert off.get("a?", V1) is None and len(off) == 0


def test_hits_are_copies():
    cache = AnswerCache(_small())
    cache.put("q", _answer("q"), V1)
    cache.get("q", V1).timings_ms["cache"] = 0.1
    assert cache.get("q", V1).timings_ms == {"encode": 4.0, "retrieve": 0.5}


def test_other_corpus_version_is_a_miss():
    cache = AnswerCache(_small())
    cache.put("q", _answer("q", "old"), V1)
    assert cache.get("q", V2) is None
    cache.put("q", _answer("q", "new"), V2)
    assert cache.get("q", V2).answer == "new" and cache.get("q", V1) is None
    assert cache.get("never asked", "") is None  # an empty version is a version like any other


def test_persists_across_instances_and_stays_bounded(tmp_path):
    path = tmp_path / "answers.sqlite"
    cache = AnswerCache(_small(2), path)
    for q in ("a", "b", "c"):
        cache.put(q, _answer(q, q.upper()), V1)
    cache.get("b", V1)  # b more recent than c, a evicted from memory and file
    cache.close()

    reopened = AnswerCache(_small(2), path)
    assert len(reopened) == 0  # memory starts empty, the file answers
    assert reopened.get("a", V1) is None and reopened.get("b", V1).answer == "B"
    assert reopened.get("c", V2) is None and reopened.get("c", V1).answer == "C"
    reopened.put("d", _answer("d", "D"), V1)  # evicts b (least recently used in the file: b, c, d)
    keys = sqlite3.connect(path).execute("SELECT key FROM answers ORDER BY key").fetchall()
    assert keys == [("c",), ("d",)]

    reopened.clear()
    assert reopened.get("c", V1) is None
    reopened.close()
    assert AnswerCache(_small(2), path).get("d", V1) is None


def test_a_cache_turned_off_never_writes_its_file(tmp_path):
    """cache_size 0 with persistent_cache on: each answer was written to the file and deleted again, a needless
    write per question on an SD card (20 questions: 40 row writes, 330 KB through its WAL). Now the file is neither
    written nor read."""
    path = tmp_path / "answers.sqlite"
    kept = AnswerCache(_small(2), path)  # a file of a run with the cache on
    kept.put("a", _answer("a"), V1)
    kept.close()
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    off = AnswerCache(Config(cache_size=0, persistent_cache=True), path)
    for q in ("b", "c", "a"):
        off.put(q, _answer(q), V1)
        assert off.get(q, V1) is None
    off.close()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


@pytest.mark.parametrize(("column", "old", "new"), [("answer", "1889", "1888"), ("corpus_version", V1, "corpus-v0")])
def test_a_stored_answer_that_rotted_is_a_miss_never_served(tmp_path, column, old, new):
    """Bit rot on the card ('9' -> '8', one bit) in a persisted answer was served as it read, with its route and
    certificate: the kiosk said 1888; one in its version made an answer of another corpus current. Now a miss."""
    path = tmp_path / "answers.sqlite"
    cache = AnswerCache(_small(), path)
    cache.put("when", _answer("when"), V1)
    cache.close()
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE answers SET {column} = replace({column}, ?, ?)", (old, new))
    db.close()
    reopened = AnswerCache(_small(), path)
    assert reopened.get("when", new if column == "corpus_version" else V1) is None
    reopened.put("when", _answer("when"), V1)  # answered again, stored whole
    assert AnswerCache(_small(), path).get("when", V1).answer == "1889"


def test_a_cache_file_from_before_the_checksum_opens_and_its_entries_are_misses(tmp_path):
    """An entry without a CRC cannot be told from a rotted one: answered again (once), never served unchecked."""
    path = tmp_path / "answers.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE answers (key TEXT PRIMARY KEY, corpus_version TEXT NOT NULL, answer TEXT NOT NULL, "
                   "used INTEGER NOT NULL)")
        db.execute("INSERT INTO answers VALUES ('when', ?, ?, 1)", (V1, json.dumps(_answer("when", "1888").to_dict())))
    db.close()
    cache = AnswerCache(_small(), path)
    assert cache.get("when", V1) is None
    cache.put("when", _answer("when"), V1)
    assert AnswerCache(_small(), path).get("when", V1).answer == "1889"


def test_processes_opening_a_new_cache_at_once_all_open_it(tmp_path):
    """A kiosk server and an `edge-rag ask` opening one new answers.sqlite at once: SQLite failed one of them at once
    while both switched it to WAL ('database is locked', past its busy handler), and the message said to delete the
    cache. 4 of 400 opens failed (4 threads at once, 100 new files); none now (storage/wal.py)."""
    errors: list[Exception] = []

    def open_cache(path, gate: threading.Barrier) -> None:
        gate.wait()
        try:
            AnswerCache(Config(), path)
        except StoreError as exc:
            errors.append(exc)

    for i in range(100):
        gate = threading.Barrier(4)
        threads = [threading.Thread(target=open_cache, args=(tmp_path / f"{i}.sqlite", gate)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]


CLOSE_BESIDE_GETS = """
import sys, threading, time
from edge_rag.config import Config
from edge_rag.storage.cache import AnswerCache
for trial in range(50):
    cache, stop = AnswerCache(Config(), sys.argv[1]), threading.Event()
    def ask():
        while not stop.is_set() and cache.get("Where is the lift?", "1") is None:
            pass
    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.002 * (trial % 10))
    cache.close()
    stop.set()
    for t in threads:
        t.join()
print("closed 50 times")
"""


def test_closing_a_cache_while_other_threads_read_it_never_crashes(tmp_path):
    """EdgeRAG.close() (a kiosk shutting down) beside questions on other threads closed the persistent cache's SQLite
    connection under a statement another thread was running: sqlite3 then read its closed handle and the process died
    of a segmentation fault (6 runs of 6, at the first or second close). The cache closes under its lock."""
    run = subprocess.run([sys.executable, "-c", CLOSE_BESIDE_GETS, str(tmp_path / "answers.sqlite")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "closed 50 times" in run.stdout, (run.returncode, run.stderr[-500:])


def test_a_damaged_cache_file_is_started_afresh_and_never_stops_the_kiosk(tmp_path, bundle_dir, caplog):
    """A torn write or bit rot damages the file (its header, or a page read later): the cache starts afresh, the
    store starts and answers. Before: EdgeRAG raised StoreError ("file is not a database ... delete it") at start,
    and a page damaged after opening failed every question that read it ("database disk image is malformed")."""
    question, config = "How much do the coin lockers cost?", Config(persistent_cache=True)
    with EdgeRAG(tmp_path, bundle=bundle_dir, config=config) as rag:
        rag.add_documents([_lockers(3)])
        first = rag.ask(question)
    (tmp_path / "answers.sqlite").write_bytes(b"this is not a database" * 100)
    with EdgeRAG(tmp_path, bundle=bundle_dir, config=config) as rag:
        again = rag.ask(question)
        assert not again.cache_hit and again.answer == first.answer and rag.ask(question).cache_hit
    assert "is damaged (file is not a database)" in caplog.text

    path = tmp_path / "pages.sqlite"
    cache = AnswerCache(_small(50), path)
    for i in range(50):
        cache.put(f"q{i}", _answer(f"q{i}", "x" * 3000), V1)
    cache.close()
    sqlite3.connect(path).execute("PRAGMA wal_checkpoint(TRUNCATE)").connection.close()
    damaged = bytearray(path.read_bytes())
    for offset in range(2 * 4096, len(damaged), 997):
        damaged[offset] ^= 0xFF
    path.write_bytes(damaged)
    cache = AnswerCache(_small(50), path)  # its first pages are sound: opened
    assert cache.get("q7", V1) is None  # a damaged page: a miss, the file made again
    cache.put("q7", _answer("q7"), V1)
    assert cache.get("q7", V1).answer == "1889" and AnswerCache(_small(50), path).get("q7", V1).answer == "1889"


def test_a_cache_file_of_another_table_or_in_no_folder_is_a_clear_store_error(tmp_path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE answers (key TEXT, value TEXT)").connection.commit()
    with pytest.raises(StoreError, match="other.sqlite.*columns"):
        AnswerCache(Config(), other)

    with pytest.raises(StoreError, match="missing"):
        AnswerCache(Config(), tmp_path / "missing" / "cache.sqlite")


ASK_ON_A_FULL_DISK = """
import resource, sys
from edge_rag.config import Config
from edge_rag.pipeline import EdgeRAG
from edge_rag.types import Document
rooms = [Document(f"room{i}", f"Room {i}", f"Room {i} of the museum opens at {i % 12 + 1} o'clock.") for i in range(20)]
with EdgeRAG(sys.argv[1], bundle=sys.argv[2], config=Config(persistent_cache=True)) as rag:
    rag.add_documents(rooms)
    resource.setrlimit(resource.RLIMIT_FSIZE, (32_768, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))  # the disk full
    answers = [rag.ask(f"When does room {i} open?") for i in range(20)]
    print(sum(a.answer is not None for a in answers), "answered;", rag.ask("When does room 3 open?").cache_hit)
"""


def test_a_cache_file_that_cannot_grow_never_fails_a_question(tmp_path, bundle_dir):
    """A full disk (here: a 32 KB file size limit) refuses the cache file's writes; the questions are answered all the
    same, and kept in memory. Before: a question past the first few raised StoreError ("disk I/O error ... delete it")."""
    run = subprocess.run([sys.executable, "-c", ASK_ON_A_FULL_DISK, str(tmp_path / "db"), str(bundle_dir)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-800:]
    assert run.stdout.split()[1:] == ["answered;", "True"] and int(run.stdout.split()[0]) > 0, run.stdout
    assert "cannot keep answers" in run.stderr and run.stderr.count("answer cache") == 1


def _lockers(pounds: int) -> Document:
    return Document("lockers", "Cloakroom lockers", f"The coin lockers next to the cloakroom cost {pounds} pounds per day.")


def test_an_answer_computed_before_an_edit_commits_is_not_served_after_it(tmp_path, bundle_dir):
    """A question asked while an edit commits (here: from the commit's own fault hook, once its index file is
    saved) is answered from the corpus before the edit and finishes after it: cached under that corpus's version,
    the question asked again after the edit is answered afresh from the edited document. Before: its cache entry
    was keyed on the version read when it finished, the edit's, and every later ask got the removed passage."""
    question = "How much do the coin lockers cost?"
    with EdgeRAG(tmp_path, bundle=bundle_dir) as rag:
        rag.add_documents([_lockers(3)])
        during = []
        rag.store.fault_hook = lambda step: during.append(next(stream)) if step == "index_saved" else None
        stream = rag.ask_stream(question)
        rag.add_documents([_lockers(5)])  # the edit: the 3-pound passage is removed
        rag.store.fault_hook = None
        first = [e for e in stream if isinstance(e, Final)][0].answer
        assert not during[0].cache_hit and [p.id for p in first.passages] == [0]  # decided before the edit landed
        again = rag.ask(question)
        assert not again.cache_hit and 0 not in [p.id for p in again.passages]
        assert all(rag.store.passages([p.id]) for p in again.passages)


def _installed(bundle_dir, at, router: bool) -> None:
    """A bundle at ``at`` of ``bundle_dir``'s files (linked), without its router unless ``router``."""
    shutil.rmtree(at, ignore_errors=True)
    at.mkdir()
    manifest = json.loads((bundle_dir / B.MANIFEST).read_text())
    manifest["files"] = [f for f in manifest["files"] if router or f["role"] != B.ROLE_ROUTER]
    for f in manifest["files"]:
        (at / f["name"]).symlink_to(bundle_dir / f["name"])
    (at / B.MANIFEST).write_text(json.dumps(manifest))


def test_a_bundle_installed_in_the_others_place_is_not_served_the_others_answers(tmp_path, bundle_dir):
    """Another bundle at the same path (here: one without a router, so every question reads the fallback tier's
    context) answers otherwise. Before: the persistent cache kept the first bundle's answers across the restart
    (tier EASY, 80 context characters, where the new bundle answers MEDIUM)."""
    question, at, config = "How much do the coin lockers cost?", tmp_path / "bundle", Config(persistent_cache=True)
    _installed(bundle_dir, at, router=True)
    with EdgeRAG(tmp_path / "db", bundle=at, config=config) as rag:
        rag.add_documents([_lockers(3)])
        assert rag.ask(question).tier is Tier.EASY and rag.ask(question).cache_hit
    _installed(bundle_dir, at, router=False)
    with EdgeRAG(tmp_path / "db", bundle=at, config=config) as rag:
        live, served = rag.decide(question), rag.ask(question)
        assert not served.cache_hit and (served.tier, served.context) == (live.tier, live.context)
        assert live.tier is config.fallback_tier is not Tier.EASY


def test_an_answer_kept_under_another_onnxruntime_is_not_served(tmp_path, bundle_dir, monkeypatch):
    """onnxruntime's kernels round otherwise from version to version: with 1.22.1's a kiosk refused "What is Big
    Mary?", with 1.32.0's it answers "Mary Penhale", and after the upgrade the persistent cache served the refusal.
    The version is in the key (here an upgrade is the version it reports)."""
    question, config = "How much do the coin lockers cost?", Config(persistent_cache=True)
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=config) as rag:
        rag.add_documents([_lockers(3)])
        assert not rag.ask(question).cache_hit and rag.ask(question).cache_hit
    monkeypatch.setattr(onnxruntime, "__version__", f"{onnxruntime.__version__}.upgraded")
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=config) as rag:
        assert not rag.ask(question).cache_hit and rag.ask(question).cache_hit


def test_an_answer_kept_on_another_cpus_kernels_is_not_served(tmp_path, bundle_dir, monkeypatch):
    """A store carries its persistent cache (an SD card moved from an AVX-512 VNNI box to an AVX2-only one or a Pi):
    onnxruntime picks its kernels by the CPU's features, and each path rounds the reader's floats otherwise (x86
    against an Arm A72: margins up to 0.70 logits apart, 1 decision in 60 another; docs/decisions/reader-kernels.md),
    yet answers decided there were served here. The CPU's features are in the key (the move: the features reported)."""
    question, config = "How much do the coin lockers cost?", Config(persistent_cache=True)
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=config) as rag:
        rag.add_documents([_lockers(3)])
        assert not rag.ask(question).cache_hit and rag.ask(question).cache_hit
    moved = f"{verify.cpu_features()},ANOTHER_KERNEL_PATH"
    monkeypatch.setattr(verify, "cpu_features", lambda: moved)
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=config) as rag:
        assert not rag.ask(question).cache_hit and rag.ask(question).cache_hit


def test_a_huge_answer_is_answered_again_never_kept(tmp_path, bundle_dir):
    """With compression off an answer's context is whole passages, and a document without a sentence break is passages
    of MAX_UNIT_CHARS (chunk.py): its answers are not kept (answered again each time), so cache_size of them cannot
    hold hundreds of MB. Before: each 100 KB answer was kept, in memory and in the file. (The seeds' extractor: the
    neural reader takes seconds over passages this long.)"""
    prices = " ".join(f"locker{i} costs {i % 9} pounds" for i in range(4_000))  # ~100 KB, no sentence break
    config = Config(compression=False, certified=False, persistent_cache=True)
    with EdgeRAG(tmp_path, bundle=bundle_dir, config=config) as rag:
        rag.add_documents([Document("prices", "Locker prices", prices)])
        huge = rag.ask("How much does locker17 cost?")
        assert len(json.dumps(huge.to_dict())) > MAX_ANSWER_BYTES and not rag.ask("How much does locker17 cost?").cache_hit
        assert len(rag.cache) == 0 and (tmp_path / "answers.sqlite").stat().st_size < MAX_ANSWER_BYTES
