"""`edge-rag calibrate`: the decision certified on the device's own questions, end to end on the real bundle."""
import json
import random
from dataclasses import replace

import pytest
from conftest import SAMPLE_DOCS

from benchmarks import splits
from edge_rag.cli.commands import SAMPLE_DIR, main
from edge_rag.config import DEFAULT_TIERS, Config, Tiers
from edge_rag.decision import calibrate
from edge_rag.decision.certify import CALIBRATION_ASSET, Calibration
from edge_rag.errors import BundleError, EdgeRAGError, InputError
from edge_rag.pipeline import EdgeRAG
from edge_rag.reading.read import Candidate
from edge_rag.types import Route
from evaluation.metrics import best_f1

ALPHAS = (0.3, 0.4)


@pytest.fixture(scope="module")
def own(squad_default_rag, tmp_path_factory):
    """A calibration made by `calibrate.run` on 160 answerable calibration-split questions and 40 SQuAD-2
    unanswerables (a kiosk-like mix); the questions file and the calibration file."""
    rag, items = squad_default_rag
    part = splits.select(items, "calibration")
    rng = random.Random(0)
    picked = (rng.sample([q for q in part if not q.is_impossible], 160)
              + rng.sample([q for q in part if q.is_impossible], 40))
    folder = tmp_path_factory.mktemp("own-calibration")
    questions = folder / "questions.json"
    questions.write_text(json.dumps([{"question": q.question, "answer": None if q.is_impossible else q.answers}
                                     for q in picked]), encoding="utf-8")
    out = folder / "calibration.json"
    calibrate.run(rag, calibrate.load_questions(questions), questions, out)
    return picked, out


def test_the_file_keeps_the_shipped_score_and_counts_only_the_new_questions(own):
    picked, out = own
    mine, shipped = Calibration.load(out).reader("neural"), Calibration.load(CALIBRATION_ASSET).reader("neural")
    assert mine.combiner == shipped.combiner and mine.ood_distance == shipped.ood_distance
    assert mine.table.thresholds == shipped.table.thresholds and mine.model_sha256 == shipped.model_sha256
    assert mine.table.n_cal == len(picked) and mine.table.n_answered != shipped.table.n_answered
    assert (mine.gpt_n, mine.gpt_errors) == (0, 0)
    assert Calibration.load(out).source["encoder"] == Calibration.load(CALIBRATION_ASSET).source["encoder"]
    assert Calibration.load(out).source["passages"] == ["sentence:20"]  # the store it measured on
    assert Calibration.load(out).source["backend"] == "embedded"  # and its kind: a PostgreSQL store's is refused


@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_device_answers_what_the_calibration_counted(squad_default_rag, own, alpha):
    """Opened with the file, the device answers exactly as many of the calibration questions as the certificate
    says, with as many errors (judged here by F1 against the gold answers), and the bound holds alpha."""
    rag, _ = squad_default_rag
    picked, out = own
    with EdgeRAG(rag.store.folder, bundle=rag.bundle.root, config=Config(temperature=0.0, max_error_rate=alpha),
                 calibration=out) as mine:
        cert = mine.certified.certificate
        answers = [mine.decide(q.question) for q in picked]
    answered = [(a, q) for a, q in zip(answers, picked) if a.route is Route.RAG]
    errors = sum(q.is_impossible or best_f1(a.answer, q.answers) < 0.5 for a, q in answered)
    assert cert.n_answered > 0 and cert.upper <= alpha
    assert (len(answered), errors) == (cert.n_answered, cert.n_errors)
    assert all(a.score_threshold == cert.threshold and a.n_cal == len(picked) for a in answers if a.route is Route.RAG)


def test_generation_is_never_certified_by_an_own_calibration(sample_rag, own):
    """The questions are not generated for, so the file certifies no GPT-route answer even at alpha 0.99 (where
    the shipped calibration does)."""
    from edge_rag.decision.certified import CertifiedPath

    _, out = own
    question, nothing = "Why is the museum called Harbourlight?", Candidate(None, None, 0.0, 0.0, 0.0)
    path = CertifiedPath(sample_rag.bundle, Config(temperature=0.0, max_error_rate=0.99), out)
    assert path.gpt_allowed is False and path.decide(question, 0.0, nothing, []).route is Route.REFUSE


def test_an_empty_generation_is_no_answer_in_the_gpt_route_s_counts(bundle_dir, tmp_path):
    """On the device an empty generation (here: cut before its first sentence ended) is a refusal, so the GPT
    route's calibration counts must not take it for an answer; counted as one that was not wrong, it lowered the
    error rate the route's certificate reads (3 of the 40 samples of `make calibrate`)."""
    from convert.calibrate import measure_gpt
    from evaluation.datasets import QAItem

    question = "Describe Big Mary and what she did."
    tiers = Tiers({t: replace(s, max_new_tokens=4) for t, s in DEFAULT_TIERS.items()})
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(temperature=0.0, cgr=False, tiers=tiers)) as rag:
        rag.add_files([SAMPLE_DOCS / "10-engine-hall-big-mary.md"])
        context = rag.decide(question).context
        row = {"id": "q", "generative": True, "d_min": 0.0, "tier": "EASY", "context": context}
        item = QAItem("q", question, ["a steam engine"], "squad")
        assert rag.generator.generate(question, context, 4, 0.0).text == ""  # what the sample generates
        assert measure_gpt(rag, [row], {"q": item}, [{"d_min": 1.0}], [], 1) == (0, 0)


def test_an_own_calibration_certifies_only_the_config_it_was_measured_with(sample_rag, own, tmp_path):
    """The file records the Config it measured with: a decision input changed since (how the search ranks, what
    the reader reads, the reader itself) certifies nothing and every question is refused naming the change; another
    alpha, temperature or thread count keeps the certificate. A file that records no Config is taken unchecked."""
    from edge_rag.decision.certified import CertifiedPath

    _, out = own
    recorded = Calibration.load(out).source["config"]
    assert "retrieval='hybrid'" in recorded and f"reader_window={Config().reader_window}" in recorded
    question, fields = "Who founded the Harbourlight Science Museum?", ("retrieval", "reader_window", "reader")
    for changes, field in zip(({"retrieval": "dense"}, {"reader_window": 1}, {"reader": "rules"}), fields):
        with EdgeRAG(sample_rag.store.folder, bundle=sample_rag.bundle.root,
                     config=Config(temperature=0.0, **changes), calibration=out) as rag:
            a = rag.decide(question)
        assert rag.certified.certificate is None and a.route is Route.REFUSE and a.candidate
        assert a.refusal_reason == rag.certified.uncertified and field in a.refusal_reason
        assert "calibrate again with this Config" in a.refusal_reason
    kept = CertifiedPath(sample_rag.bundle, Config(temperature=0.7, max_error_rate=0.3, threads=1), out)
    assert kept.uncertified is None and kept.certificate.n_answered > 0
    unrecorded = tmp_path / "old.json"
    raw = json.loads(out.read_text(encoding="utf-8"))
    del raw["source"]["config"]
    unrecorded.write_text(json.dumps(raw), encoding="utf-8")
    stripped = CertifiedPath(sample_rag.bundle, Config(retrieval="dense"), unrecorded)  # any Config: it cannot say
    assert stripped.certificate is None and "records no Config" in stripped.uncertified


def test_the_command_writes_a_file_ask_uses(sample_db, tmp_path, capsys):
    db = tmp_path / "db"
    import shutil

    shutil.copytree(sample_db, db)
    out = tmp_path / "kiosk.json"
    questions = SAMPLE_DIR / "questions.json"
    assert main(["calibrate", "--db", str(db), "--questions", str(questions), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{len(json.loads(questions.read_text()))} questions" in printed and "--calibration" in printed
    assert Calibration.load(out).source["questions_sha256"]
    # 24 questions certify nothing from the strict end of the grid: the device says so instead of answering
    assert main(["ask", "--db", str(db), "--calibration", str(out), "--max-error-rate", "0.2", "--delta", "0.1",
                 "Who founded the Harbourlight Science Museum?"]) == 0
    assert "no score threshold keeps the error among answered <= 0.2 at confidence 0.9" in capsys.readouterr().out
    for flag, value, allowed in (("--delta", "1", "delta=1.0: allowed values are a number > 0.0 and < 1.0"),
                                 ("--delta", "x", "not a number: 'x'"), ("--max-error-rate", "0", "max_error_rate=0.0")):
        with pytest.raises(SystemExit) as stop:
            main(["ask", "--db", str(db), flag, value, "Who?"])
        assert stop.value.code == 2 and f"argument {flag}: {allowed}" in capsys.readouterr().err


def test_a_command_s_calibration_says_when_the_documents_changed_since(sample_db, tmp_path):
    """The operator's certificate says when the documents changed since it was measured (/api/health, the kiosk
    footer); one of `edge-rag calibrate` recorded no store version, so after an upload it said nothing (a real
    calibration of the sample store, a document added: documents_changed None). It records the store's stamp now;
    used on another store (another kiosk's, perhaps with the same documents) it is not known."""
    import shutil

    from edge_rag.serve import health

    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    out = tmp_path / "kiosk.json"
    assert main(["calibrate", "--db", str(db), "--questions", str(SAMPLE_DIR / "questions.json"), "--out",
                 str(out)]) == 0
    with EdgeRAG(db, calibration=out) as rag:
        assert health.decision(rag)["certificate"]["documents_changed"] is False
        rag.add_documents(["From November the museum opens at 11:00 on Mondays."])
        changed = health.decision(rag)
        assert changed["certificate"]["documents_changed"] is True
        assert "measured before the documents last changed" in changed["summary"]
    with EdgeRAG(tmp_path / "other", calibration=out) as rag:  # another store (a copied folder is the same one)
        rag.add_documents(["From November the museum opens at 11:00 on Mondays."])
        assert health.decision(rag)["certificate"]["documents_changed"] is None


@pytest.mark.parametrize("content,why", [
    (b"{\"question\": \"a\", \"answer\": null}", "JSON list"),
    (b"[{\"question\": \"Who?\"}]", "\"answer\""),
    (b"[{\"question\": \"Who?\", \"answer\": 3}]", "non-empty string"),
    (b"[{\"question\": \"Who?\", \"answer\": [\"\"]}]", "non-empty string"),
    (b"[{\"question\": 7, \"answer\": \"x\"}]", "must be a str"),
    (b"[{\"question\": \" \", \"answer\": \"x\"}]", "entry 0: the question is empty"),
    (b"[]", "no questions"),
    (b"[{\"question\": ", "cannot read"),
    (b"\xff\xfe[", "cannot read"),
    (b"[" * 200_000 + b"]" * 200_000, "cannot read"),  # a bare RecursionError traceback before
])
def test_a_bad_questions_file_is_refused_and_the_old_calibration_kept(sample_db, tmp_path, capsys, content, why):
    questions, out = tmp_path / "q.json", tmp_path / "kiosk.json"
    questions.write_bytes(content)
    out.write_text("previous calibration")
    with pytest.raises(InputError, match=why):
        calibrate.load_questions(questions)
    assert main(["calibrate", "--db", str(sample_db), "--questions", str(questions), "--out", str(out)]) == 2
    assert why in capsys.readouterr().err and out.read_text() == "previous calibration"


def test_a_calibration_file_that_cannot_be_written_is_refused_before_any_question(sample_db, sample_rag, tmp_path,
                                                                                    capsys, monkeypatch):
    """--out a folder, under a file, or relative to a working folder since removed: one line before any question is
    run (a traceback once all had run)."""
    (tmp_path / "a-file").write_text("x")
    (gone := tmp_path / "gone").mkdir()
    questions = SAMPLE_DIR / "questions.json"
    for out in (tmp_path, tmp_path / "a-file" / "kiosk.json", "kiosk.json"):
        if out == "kiosk.json":
            monkeypatch.chdir(gone)
            gone.rmdir()
        assert main(["calibrate", "--db", str(sample_db), "--questions", str(questions), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("edge-rag: error:") and err.count("\n") == 1  # no question's progress shown
    with pytest.raises(EdgeRAGError, match="cannot write the calibration file"):  # a write failing after them all
        calibrate.run(sample_rag, calibrate.load_questions(questions)[:2], questions, tmp_path / "a-file" / "k.json")


def test_a_labelled_log_whose_questions_hold_unicode_line_separators_is_read(tmp_path):
    """The question log is JSON Lines: a question with a raw U+2028 is one line of it, not two broken ones."""
    questions = tmp_path / "labelled.jsonl"
    questions.write_text(json.dumps({"question": "Opening\u2028hours?", "answer": None}, ensure_ascii=False) + "\n")
    assert [q.question for q in calibrate.load_questions(questions)] == ["Opening hours?"]


def test_a_huge_questions_file_is_refused_unread(tmp_path):
    huge = tmp_path / "q.json"
    with open(huge, "wb") as f:
        f.truncate(calibrate.MAX_FILE_BYTES + 1)  # sparse: nothing written
    with pytest.raises(InputError, match="may hold"):
        calibrate.load_questions(huge)


def test_a_missing_calibration_file_is_a_clear_error(sample_db, tmp_path):
    with pytest.raises(BundleError, match="nope.json does not exist .*edge-rag calibrate"):
        EdgeRAG(sample_db, calibration=tmp_path / "nope.json")
    with pytest.raises(BundleError, match="is not a file"):  # a folder was said not to exist
        EdgeRAG(sample_db, calibration=tmp_path)


def test_cached_answers_are_not_served_under_another_calibration(sample_db, own, tmp_path):
    import shutil

    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    config, question = Config(temperature=0.0, persistent_cache=True), "Who founded the Harbourlight Science Museum?"
    with EdgeRAG(db, config=config) as rag:
        rag.ask(question)
        assert rag.ask(question).cache_hit
    with EdgeRAG(db, config=config, calibration=own[1]) as rag:
        assert not rag.ask(question).cache_hit


def test_the_kiosk_server_says_which_calibration_it_decides_by(sample_db, own, tmp_path):
    serving = pytest.importorskip("serving", reason="the serve extra (starlette, uvicorn, httpx) is not installed")
    import shutil

    import httpx

    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    rag = EdgeRAG(db, config=Config(temperature=0.0, max_error_rate=0.4, index_threads=1), calibration=own[1])
    with serving.running_server(rag) as url:  # the app closes rag
        decision = httpx.get(f"{url}/api/health", timeout=60).json()["decision"]
    assert decision["calibration"] == str(own[1]) and decision["calibration_questions"] == len(own[0])
    assert decision["certified"] and decision["reason"] is None and decision["max_error_rate"] == 0.4
    assert decision["summary"] == (f"Answers certified: error ≤ 40% among answered (δ 0.05), measured on "
                                   f"{len(own[0])} questions of an own calibration ({own[1].name})")
    assert decision["threshold"] == Calibration.load(own[1]).reader("neural").table.choose(0.4, 0.05).threshold


def test_the_kiosk_keeps_its_questions_to_label_and_calibrate_on(sample_db, tmp_path):
    """`serve --question-log`: every accepted question (plain and streamed) is one JSON line, without an answer;
    once labelled the file is what `edge-rag calibrate` reads; a line cut by a crash is reported by number."""
    serving = pytest.importorskip("serving", reason="the serve extra (starlette, uvicorn, httpx) is not installed")
    import shutil

    import httpx

    from edge_rag.serve.config import ServeConfig

    db, kept = tmp_path / "db", tmp_path / "questions.jsonl"
    shutil.copytree(sample_db, db)
    asked = ["Who founded the Harbourlight Science Museum?", "How old is Taylor Swift?", "Wie teuer ist ein Ticket?"]
    config = ServeConfig(port=0, question_timeout_s=900, question_log=str(kept))
    with serving.running_server(EdgeRAG(db, config=Config(temperature=0.0)), config) as url:
        for q in asked[:2]:
            assert httpx.post(f"{url}/api/ask", json={"question": q}, timeout=120).status_code == 200
        with httpx.stream("GET", f"{url}/api/ask/stream", params={"q": asked[2]}, timeout=120) as r:
            assert "event: answer" in r.read().decode()
        assert httpx.post(f"{url}/api/ask", json={"question": "x" * 600}, timeout=60).status_code == 413
    lines = [json.loads(line) for line in kept.read_text(encoding="utf-8").splitlines()]
    assert [line["question"] for line in lines] == asked and all(set(line) == {"question", "asked"} for line in lines)
    with pytest.raises(InputError, match="line 1: need an object with"):
        calibrate.load_questions(kept)  # not labelled yet
    labels = ["Margaret Hollins", None, None]
    kept.write_text("".join(json.dumps({**line, "answer": a}) + "\n" for line, a in zip(lines, labels)))
    assert [(q.question, q.answers) for q in calibrate.load_questions(kept)] == [
        (asked[0], ("Margaret Hollins",)), (asked[1], ()), (asked[2], ())]
    with open(kept, "a") as f:
        f.write('{"question": "Where is the caf')
    with pytest.raises(InputError, match="line 4"):
        calibrate.load_questions(kept)


def test_questions_logged_from_many_threads_stay_whole_lines(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from edge_rag.serve.question_log import QuestionLog

    kept = QuestionLog(tmp_path / "q.jsonl")
    questions = [f"question {i} " + "é" * (i % 50) for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(kept.add, questions))
    lines = (tmp_path / "q.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(json.loads(line)["question"] for line in lines) == sorted(questions)


def test_the_question_log_stops_growing_at_its_limit(tmp_path, monkeypatch, caplog):
    from edge_rag.serve import question_log

    monkeypatch.setattr(question_log, "MAX_BYTES", 2_000)
    kept = question_log.QuestionLog(tmp_path / "q.jsonl")
    for i in range(100):
        kept.add(f"question number {i}?")  # never raises: the question is answered all the same
    size = (tmp_path / "q.jsonl").stat().st_size
    lines = (tmp_path / "q.jsonl").read_text(encoding="utf-8").splitlines()
    assert 1_900 < size <= 2_000 and all(json.loads(line)["question"] for line in lines)
    assert sum("no longer kept" in r.getMessage() for r in caplog.records) == 1



def test_make_calibrates_row_cache_cut_short_by_a_failed_write_is_made_again(bundle_dir, tmp_path):
    """`python -m convert calibrate --rows-cache`: hours of per-question rows are kept for re-fits. A write the disk
    cut short (here the file-size limit: EFBIG part-way, as ENOSPC would) leaves no half file that every later run
    reads back and dies on (JSONDecodeError before the fix); the rows are made again."""
    import subprocess
    import sys

    from convert.calibrate import cached_rows
    from edge_rag.models.bundle import Bundle

    rows = {"calibration": [{"id": str(i), "candidate": "x" * 40} for i in range(5000)]}  # ~300 kB of JSON
    made, cache = tmp_path / "made.json", tmp_path / "cache"
    made.write_text(json.dumps(rows))
    code = ("import json, resource, sys\nfrom pathlib import Path\nfrom convert.calibrate import cached_rows\n"
            "from edge_rag.models.bundle import Bundle\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
            "cached_rows(Path(sys.argv[1]), 'rules', Bundle.load(sys.argv[2]), lambda: json.loads(Path(sys.argv[3]).read_text()))\n")
    failed = subprocess.run([sys.executable, "-c", code, str(cache), str(bundle_dir), str(made)],
                            capture_output=True, text=True)
    assert failed.returncode != 0 and "File too large" in failed.stderr, failed.stderr[-300:]
    assert cached_rows(cache, "rules", Bundle.load(bundle_dir), lambda: rows) == rows
    assert [p.suffix for p in cache.iterdir()] == [".json"]


@pytest.mark.parametrize("argv", [["--readers", "neurall"], ["--readers", ","], ["--ood-sample", "-1"],
                                  ["--ood-sample", "0"], ["--gpt-sample", "-3"], ["--squad", "no-such-file.json"]])
def test_make_calibrate_refuses_nonsense_arguments_when_parsed(argv, capsys):
    """`python -m convert calibrate`: a reader name it does not know was a ConfigError only after its three stores
    were built (minutes), --ood-sample -1 kept all but one OOD question (a [:-1] slice) and --gpt-sample -3 generated
    for all but three; each is now a usage error before anything is read."""
    import argparse

    from convert import calibrate as C

    parser = argparse.ArgumentParser()
    C.register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["calibrate", *argv])
    assert exc.value.code == 2 and argv[0] in capsys.readouterr().err
