"""The operator's labels (edge_rag/decision/labels.py): kept in SQLite beside the store, exported and imported as the
questions file `edge-rag calibrate` reads, whole across a crash and across writers in several processes."""
from __future__ import annotations

import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edge_rag.decision import calibrate
from edge_rag.decision.askings import REPEAT_S
from edge_rag.decision.labels import Labels, export, groups
from edge_rag.errors import InputError
from edge_rag.serve import question_log

ROOT = Path(__file__).resolve().parent.parent
LOGGED = [("When does the museum open?", "2026-01-01T10:00:00+00:00"),
          ("How do I bake sourdough bread?", "2026-01-01T10:01:00+00:00"),
          ("when does the   museum OPEN?", "2026-01-01T10:12:00+00:00"),
          ("Who designed the lighthouse lens?", "2026-01-01T10:13:00+00:00")]


def write_jsonl(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def test_the_three_kinds_export_as_the_file_calibrate_reads(tmp_path):
    """An answer label exports its texts, "not in documents" and "off-topic" both export null (calibrate: the
    question should be refused); one entry per time the question was asked; calibrate reads the file as is."""
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set("When does the museum open?", "answer", ["10:00", " 10 am "], ("a", 3))
    labels.set("How do I bake sourdough bread?", "off-topic", [], ("a", 3))
    labels.set("Who designed the lighthouse lens?", "not-in-documents", ["ignored"], ("a", 3))
    entries = export(labels.all(), LOGGED)
    assert [(e["question"], e["answer"], e["label"]) for e in entries] == [
        ("When does the museum open?", ["10:00", "10 am"], "answer"),
        ("How do I bake sourdough bread?", None, "off-topic"),
        ("when does the   museum OPEN?", ["10:00", "10 am"], "answer"),
        ("Who designed the lighthouse lens?", None, "not-in-documents")]
    assert (tmp_path / "labels.sqlite").stat().st_mode & 0o077 == 0  # what visitors typed: the server's user's only
    read = calibrate.load_questions(write_jsonl(tmp_path / "labelled.jsonl", entries))
    assert [(q.answers, q.label) for q in read] == [(("10:00", "10 am"), "answer"), ((), "off-topic"),
                                                     (("10:00", "10 am"), "answer"), ((), "not-in-documents")]


def test_a_visitor_asking_again_at_once_is_counted_once(tmp_path):
    """The bound takes each exported entry for an independent draw of what visitors ask. A visitor's double tap or
    retry after a refusal is not another draw: counted each, 3 askings a visit held alpha in 78-84% of Monte-Carlo
    draws at n 100-1000 where 95% was promised. An asking within REPEAT_S of the same question's previous one is
    counted once; the same question asked later (another visitor) counts again, and so does an asking whose time
    the log does not give."""
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set("When does the museum open?", "answer", "10:00", ("a", 1))
    labels.set("Where is the cafe?", "answer", "Floor 2", ("a", 1))
    t = "2026-01-01T10:{:02d}:{:02d}+00:00".format
    logged = [("When does the museum open?", t(0, 0)), ("when does the museum open?", t(0, 1)),  # a double tap
              ("Where is the cafe?", t(0, 30)), ("When does the museum open?", t(1, 50)),  # a retry, 109 s on
              ("When does the museum open?", t(9, 0)),  # 7 min later: another visitor
              ("Where is the cafe?", "not a time"), ("Where is the cafe?", "")]
    assert [e["asked"] for e in export(labels.all(), logged)] == [t(0, 0), t(0, 30), t(9, 0), "not a time", ""]


def test_a_question_asked_again_and_again_by_visitors_is_no_single_chain(tmp_path):
    """Measured from the previous asking, a question asked every 90 s (the kiosk's top suggestion, one visitor after
    another) made one chain: 40 visits in an hour were one draw. Within REPEAT_S of the last counted asking is the
    same visitor's; past it, another visitor's: one draw every REPEAT_S at least."""
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set("Where is the cafe?", "answer", "Floor 2", ("a", 1))
    start = datetime.datetime(2026, 1, 1, 10, tzinfo=datetime.timezone.utc)
    logged = [("Where is the cafe?", (start + datetime.timedelta(seconds=90 * i)).isoformat()) for i in range(40)]
    counted = [datetime.datetime.fromisoformat(e["asked"]) for e in export(labels.all(), logged)]
    assert len(counted) > 1 and all((b - a).total_seconds() > REPEAT_S for a, b in zip(counted, counted[1:]))
    for _, asked in logged:  # and each asking not counted is within REPEAT_S of the last counted one
        when = datetime.datetime.fromisoformat(asked)
        assert (when - max(c for c in counted if c <= when)).total_seconds() <= REPEAT_S or when in counted


def test_groups_are_newest_first_same_questions_together_and_stale_after_the_store_moved(tmp_path):
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set("when does the museum open?", "answer", "10:00", ("a", 3))
    shown, _ = groups(labels.all(), LOGGED[::-1], ("a", 4))
    assert [(g["question"], g["times"]) for g in shown] == [
        ("Who designed the lighthouse lens?", 1), ("when does the museum OPEN?", 2),
        ("How do I bake sourdough bread?", 1)]
    assert shown[1]["label"]["answer"] == ["10:00"] and shown[1]["stale"] and shown[0]["label"] is None
    labels.set("When does the museum open?", "answer", "10:00", ("a", 4))  # saved again after the change: current
    assert not groups(labels.all(), LOGGED[::-1], ("a", 4))[0][1]["stale"]


def test_a_label_file_from_before_store_identities_is_read_and_its_labels_are_stale(tmp_path):
    """Labels keyed on the store's version alone counted as current on another store made at the same place (its
    versions from 1 again: test_serve_pg's label of a store made again). They record the store's identity too; a
    file written before has none: it opens, its labels are kept, shown stale (on which store they were made is not
    known) until saved again."""
    old = sqlite3.connect(tmp_path / "labels.sqlite")
    old.execute("""CREATE TABLE labels (key TEXT PRIMARY KEY, question TEXT NOT NULL, kind TEXT NOT NULL,
        answers TEXT NOT NULL, labelled TEXT NOT NULL, store_version INTEGER NOT NULL,
        occurrences INTEGER NOT NULL DEFAULT 0)""")
    old.execute("INSERT INTO labels VALUES (?, ?, 'answer', '[\"10:00\"]', '2026-01-01T10:00:00+00:00', 1, 0)",
                ("when does the museum open?", "When does the museum open?"))
    old.commit()
    old.close()
    labels = Labels(tmp_path / "labels.sqlite")
    assert [(x.answers, x.store) for x in labels.all().values()] == [(("10:00",), ("", 1))]
    assert groups(labels.all(), LOGGED[::-1], ("a", 1))[0][1]["stale"]
    labels.set("When does the museum open?", "answer", "10:00", ("a", 1))
    assert not groups(labels.all(), LOGGED[::-1], ("a", 1))[0][1]["stale"]
    assert groups(labels.all(), LOGGED[::-1], ("b", 1))[0][1]["stale"]  # another store, at the same version


def test_import_takes_an_exported_file_back_whole(tmp_path):
    """Exported, imported into an empty label file on another device (no question log there): the same labels,
    and its export holds the same questions as often."""
    labels = Labels(tmp_path / "a.sqlite")
    labels.set("When does the museum open?", "answer", ["10:00"], ("a", 1))
    labels.set("How do I bake sourdough bread?", "off-topic", [], ("a", 1))
    first = export(labels.all(), LOGGED)
    other = Labels(tmp_path / "b.sqlite")
    assert other.import_file(write_jsonl(tmp_path / "x.jsonl", first), ("b", 7)) == 2
    again = export(other.all(), [])
    assert sorted((e["question"].casefold().split(), e["answer"], e["label"]) for e in again) == \
        sorted((e["question"].casefold().split(), e["answer"], e["label"]) for e in first)
    assert {x.store for x in other.all().values()} == {("b", 7)}


def test_an_export_imported_after_the_documents_changed_keeps_its_labels_stale(tmp_path):
    """An export made before a document edit, imported after it, was stamped with the store's stamp at import: its
    labels counted as current and Calibrate certified them (a real /admin over the sample store: labelled at version
    1, exported, a document added, imported back: stale before the import, current after it). The export records
    each label's stamp and the import keeps it on the same store; another store's labels (another kiosk's) and a
    file without stamps are the operator's, stamped as imported."""
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set("When does the museum open?", "answer", ["10:00"], ("a", 1))
    labels.set("How do I bake sourdough bread?", "off-topic", [], ("a", 2))
    made = write_jsonl(tmp_path / "x.jsonl", export(labels.all(), LOGGED))
    for store, kept in ((("a", 3), {("a", 1), ("a", 2)}), (("b", 3), {("b", 3)})):
        other = Labels(tmp_path / f"{store[0]}.sqlite")
        other.import_file(made, store)
        assert {x.store for x in other.all().values()} == kept
        shown = [g["stale"] for g in groups(other.all(), LOGGED[::-1], store)[0] if g["label"]]
        assert shown == [store[0] == "a"] * 2
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"question": "Where is the cafe?", "answer": "Floor 2"}])
    assert labels.import_file(bare, ("a", 3)) == 1 and labels.all()["where is the cafe?"].store == ("a", 3)
    for stamp in ({"store_id": "a"}, {"store_id": "a", "store_version": "1"}, {"store_id": 1, "store_version": 1}):
        bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Is it open?", "answer": None, **stamp}])
        with pytest.raises(InputError, match="store_version"):
            labels.import_file(bad, ("a", 3))


def test_an_import_adds_another_kiosk_s_visits_and_not_this_one_s_again(tmp_path):
    """The bound takes each entry for another visitor's question. An import counted a question as often as the file
    held it, and the export took the larger of that and this log's askings: kiosk A's 3 visitors and this kiosk's 2
    exported 3 entries, not 5. A file's askings this log holds (this kiosk's own export imported back) are not counted
    again, nor are a visitor's repeats; a label file from before keeps its count, this log's askings among it."""
    question = "When does the museum open?"
    a_log = [(question, f"2026-11-0{d}T10:00:00+00:00") for d in (1, 2, 3)] + [(question, "2026-11-03T10:00:30+00:00")]
    here = [(question, f"2026-11-0{d}T15:00:00+00:00") for d in (4, 5)]
    a = Labels(tmp_path / "a.sqlite")
    a.set(question, "answer", "10:00", ("s", 1))
    a_file = write_jsonl(tmp_path / "a.jsonl", export(a.all(), a_log))
    labels = Labels(tmp_path / "labels.sqlite")
    assert len(export(labels.all(), here)) == 0
    labels.import_file(a_file, ("s", 1), here)
    mine = export(labels.all(), here)
    assert len(mine) == 3 + 2
    for again in (a_file, write_jsonl(tmp_path / "mine.jsonl", mine)):  # imported again, or this kiosk's own back
        labels.import_file(again, ("s", 1), here)
        assert len(export(labels.all(), here)) == 5
    labels.db.execute("DELETE FROM askings")  # a label imported before: the 3 the file held, these 2 among them
    labels.db.execute("UPDATE labels SET occurrences = 3")
    assert len(export(labels.all(), here)) == 3 and len(export(labels.all(), here[:1])) == 3


def test_an_export_holding_two_kiosks_visitors_minutes_apart_imports_both(tmp_path):
    """Kiosk A imported kiosk B's visit at 10:02 beside its own at 10:00 and exported both; kiosk C importing that
    export collapsed them as one log's asking again (REPEAT_S) and counted 1 visit of 2. The page's export lists
    visits (its entries carry a store stamp): each counts; a question log labelled by hand still has its repeats
    collapsed."""
    question = "When does the museum open?"
    a_log, b_log = [(question, "2026-11-30T10:00:00+00:00")], [(question, "2026-11-30T10:02:00+00:00")]
    made = []
    for name, log, imported in (("b", b_log, None), ("a", a_log, "b"), ("c", [], "a")):
        kiosk = Labels(tmp_path / f"{name}.sqlite")
        kiosk.set(question, "answer", "10:00", ("s", 1))
        if imported:
            kiosk.import_file(tmp_path / f"{imported}.jsonl", ("s", 1), log)
        made.append(export(kiosk.all(), log))
        write_jsonl(tmp_path / f"{name}.jsonl", made[-1])
    assert [len(x) for x in made] == [1, 2, 2]
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"question": q, "answer": "10:00", "asked": t} for q, t in a_log + b_log])
    by_hand = Labels(tmp_path / "by_hand.sqlite")
    by_hand.import_file(raw, ("s", 1))
    assert len(export(by_hand.all(), [])) == 1


def test_bad_labels_and_bad_files_are_refused_and_change_nothing(tmp_path):
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set("When does the museum open?", "answer", "10:00", ("a", 1))
    for kind, answers in (("maybe", "x"), ("answer", ""), ("answer", ["  "]), ("answer", 5), ("answer", [1])):
        with pytest.raises(InputError):
            labels.set("When does the museum open?", kind, answers, ("a", 1))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Where is the cafe?", "answer": "Floor 2"},
                                               {"question": "Is it open?", "answer": None, "label": "perhaps"}])
    with pytest.raises(InputError, match="perhaps"):
        labels.import_file(bad, ("a", 1))
    with pytest.raises(InputError, match="line 2"):
        labels.import_file(write_jsonl(tmp_path / "worse.jsonl", [{"question": "Q?", "answer": None}, {}]), ("a", 1))
    assert [(x.question, x.answers) for x in labels.all().values()] == [("When does the museum open?", ("10:00",))]


WRITER = """
import sys
from edge_rag.decision.labels import Labels
labels = Labels(sys.argv[1])
for i in range(int(sys.argv[3])):
    labels.set(f"{sys.argv[2]} question {i}?", "answer", f"answer {i}", ("a", 1))
    print(i, flush=True)  # printed once the save returned: committed
"""


def writer(path: Path, name: str, n: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(n)], stdout=subprocess.PIPE,
                            text=True, env=env)


@pytest.mark.parametrize(("column", "value"), [("answers", '{"1889"]'), ("kind", "answes")])
def test_a_damaged_label_is_left_out_to_label_again_and_the_others_stay(tmp_path, caplog, column, value):
    """A flipped bit in one row (its answers no longer JSON, its kind no kind): every listing, export and calibration
    raised a bare JSONDecodeError (/admin: HTTP 500), or exported a label no one gave, until the file was deleted
    with every label in it. Now that question is unlabelled, with a warning naming it; the others stay."""
    labels = Labels(tmp_path / "labels.sqlite")
    labels.set(LOGGED[0][0], "answer", ["10:00"], ("a", 1))
    labels.set(LOGGED[3][0], "answer", ["Fresnel"], ("a", 1))
    labels.db.execute(f"UPDATE labels SET {column} = ? WHERE question = ?", (value, LOGGED[0][0]))
    assert [x.question for x in labels.all().values()] == [LOGGED[3][0]]
    assert "When does the museum open?" in caplog.text and "label it again" in caplog.text
    labels.set(LOGGED[0][0], "answer", ["10:00"], ("a", 1))
    assert sorted(x.question for x in labels.all().values()) == sorted([LOGGED[0][0], LOGGED[3][0]])


def test_a_crash_mid_labelling_loses_no_saved_label(tmp_path):
    """A labelling process killed (SIGKILL) while it saves: every label it had been told was saved is there, and
    the file is whole."""
    path = tmp_path / "labels.sqlite"
    proc = writer(path, "crash", 100_000)
    saved = [int(proc.stdout.readline()) for _ in range(30)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = Labels(path).all()
    assert all(f"crash question {i}?" in kept for i in saved)
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_writers_in_two_processes_wait_for_each_other(tmp_path):
    path = tmp_path / "labels.sqlite"
    procs = [writer(path, name, 40) for name in ("first", "second")]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0 and len(out.split()) == 40
    assert len(Labels(path).all()) == 80


LOG_PEAK = """
import contextlib, json, sys
from pathlib import Path
from edge_rag.memory import peak_rss_mb, rss_mb
from edge_rag.serve import question_log
with contextlib.suppress(OSError):
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on (Linux)
before = rss_mb()
entries = list(question_log.lines(Path(sys.argv[1])))
print(json.dumps({"entries": len(entries), "peak": peak_rss_mb() - before, "held": rss_mb() - before}))
"""


def test_a_full_question_log_is_read_a_line_at_a_time(tmp_path):
    """Every /admin listing, export and calibration reads the whole question log (up to MAX_BYTES, 32 MB). It was read
    whole, decoded and split, beside the entries it returns: a full log rose peak RSS by 160 MB for 83 MB of entries.
    A line at a time, the peak is what it returns (80 MB for 80). Here 8 MB: +40 MB for 22 before, +20 for 20 after."""
    path = tmp_path / "q.jsonl"
    line = '{{"question": "When does the museum open on day {}?", "asked": "2026-11-29T23:00:00+00:00"}}\n'
    path.write_text("".join(line.format(i) for i in range(85_000)), encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", LOG_PEAK, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["entries"] == 85_000 and out["peak"] <= 1.25 * out["held"], out


def test_the_question_log_is_read_back_skipping_a_line_cut_by_a_crash(tmp_path):
    log = question_log.QuestionLog(tmp_path / "q.jsonl")
    log.add("When does the museum open?")
    with open(tmp_path / "q.jsonl", "a", encoding="utf-8") as f:
        f.write('{"question": "cut')
    log.add("Where is the café?")
    assert [q for q, _ in question_log.lines(tmp_path / "q.jsonl")] == ["When does the museum open?"]
    assert list(question_log.lines(tmp_path / "none.jsonl")) == []


def test_the_question_log_read_back_from_its_end_holds_the_same_questions_newest_first(tmp_path):
    """The operator's listing reads the log back from its end in blocks: lines across blocks, a line cut by a crash
    and one longer than any question the server wrote (dropped, never held whole) as the forward read sees them."""
    path = tmp_path / "q.jsonl"
    log = question_log.QuestionLog(path)
    for n in range(3000):  # ~80 bytes a line: lines cross block boundaries
        log.add(f"When does the museum open on day {n}?")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"question": "x" * (3 * question_log.MAX_LINE)}) + "\n" + '{"question": "cut')
    log = question_log.QuestionLog(path)  # ends the cut line
    log.add("Where is the café?")
    forward = list(question_log.lines(path))
    assert list(question_log.newest(path)) == [e for e in forward[::-1] if len(e[0]) < question_log.MAX_LINE]
    assert len(forward) == 3002 and list(question_log.newest(tmp_path / "none.jsonl")) == []
