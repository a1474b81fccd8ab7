"""Indexing a folder skips what it cannot read (one warning per file, name + reason) and indexes the rest;
``--strict`` stops at the first such file."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edge_rag.cli.commands import main
from edge_rag.documents.chunk import MAX_TEXT_FILE_BYTES
from edge_rag.documents.files import read_paths
from edge_rag.errors import InputError

SAMPLE = Path(__file__).resolve().parent.parent / "edge_rag" / "sample"


def test_cli_indexes_the_sample_folder_and_warns_about_questions_json(bundle_dir: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    args = ["index", str(SAMPLE), "--db", str(tmp_path / "db"), "--bundle", str(bundle_dir), "--quiet"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("edge-rag: warning: skipped")]
    assert len(warnings) == 1 and "questions.json" in warnings[0] and "record 0 has no 'text'" in warnings[0]
    added = int(out.split("added ")[1].split()[0])
    assert added > 100  # the 29 sample documents
    assert main([*args, "--strict"]) == 2
    assert "questions.json" in capsys.readouterr().err


def test_unreadable_and_missing_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "good.md").write_text("# Title\n\nThe good file has text in it.", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    skipped: list[tuple[str, str]] = []
    docs = read_paths([tmp_path, tmp_path / "absent.txt"], on_skip=lambda p, why: skipped.append((p.name, why)))
    assert [d.title for d in docs] == ["Title"]
    reasons = dict(skipped)
    assert set(reasons) == {"latin1.txt", "broken.json", "absent.txt"}
    assert "not UTF-8" in reasons["latin1.txt"] and "not valid JSON" in reasons["broken.json"]
    assert "no such file" in reasons["absent.txt"]
    with pytest.raises(InputError, match="broken.json"):
        read_paths([tmp_path], strict=True)


def test_a_pipe_or_a_device_given_by_name_is_named_as_such(tmp_path: Path) -> None:
    """A FIFO or a link to /dev/zero named on the command line was skipped as "no such file or folder", though
    `ls` shows it: it is skipped unread (reading either never ends), saying what it is."""
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "zero.txt").symlink_to("/dev/zero")
    (tmp_path / "good.txt").write_text("The good file has text in it.", encoding="utf-8")
    skipped: list[tuple[str, str]] = []
    named = [tmp_path / "pipe.txt", tmp_path / "zero.txt", tmp_path / "good.txt"]
    assert len(read_paths(named, on_skip=lambda p, why: skipped.append((p.name, why)))) == 1
    assert [name for name, _ in skipped] == ["pipe.txt", "zero.txt"]
    assert all("not a regular file" in why and "no such" not in why for _, why in skipped), skipped


def test_a_name_longer_than_the_file_system_takes_is_an_error_line(tmp_path: Path, bundle_dir: Path, sample_db: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A path with a name over 255 bytes (pasted text) ended `edge-rag index`, `ask --db`, `ask --calibration` and
    `calibrate --out` on OSError's traceback (File name too long): index skips it as it skips a missing file, and
    each other command stops with one line naming it."""
    long = tmp_path / ("x" * 300)
    (tmp_path / "good.txt").write_text("The good file has text in it.", encoding="utf-8")
    skipped: list[tuple[str, str]] = []
    assert len(read_paths([long, tmp_path / "good.txt"], on_skip=lambda p, why: skipped.append((p.name, why)))) == 1
    assert [name for name, _ in skipped] == [long.name] and "too long" in skipped[0][1]
    for argv in (["ask", "hi", "--db", str(long)], ["ask", "hi", "--db", str(sample_db), "--calibration", str(long)]):
        assert main([*argv, "--bundle", str(bundle_dir)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("edge-rag: error:") and "too long" in err and err.count("\n") == 1, err


def test_a_text_file_over_the_size_limit_is_skipped_unread(tmp_path: Path) -> None:
    """A 1 GiB text file took 2.1 GB of memory to read (and a MemoryError cost the whole folder): now a file over
    the limit is skipped by its size, and the rest of the folder is read."""
    (tmp_path / "good.md").write_text("# Lockers\n\nCoin lockers are next to the cloakroom.", encoding="utf-8")
    with open(tmp_path / "huge.txt", "wb") as f:
        f.truncate(MAX_TEXT_FILE_BYTES + 1)  # sparse: no disk used
    skipped: list[tuple[str, str]] = []
    docs = read_paths([tmp_path], on_skip=lambda p, why: skipped.append((p.name, why)))
    assert [d.title for d in docs] == ["Lockers"]
    assert [name for name, _ in skipped] == ["huge.txt"] and f"{MAX_TEXT_FILE_BYTES >> 20} MB limit" in skipped[0][1]


def test_a_folder_entry_out_of_reach_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Folders nested past the longest path the system takes raised OSError while the folder was searched, and
    nothing of it was indexed. Now that entry is skipped with its reason and the rest is read."""
    (tmp_path / "good.md").write_text("# Lockers\n\nCoin lockers are next to the cloakroom.", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for _ in range(25):  # 25 x 200 characters: over PATH_MAX (4096), made one relative step at a time
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    skipped: list[tuple[str, str]] = []
    docs = read_paths([tmp_path], on_skip=lambda p, why: skipped.append((p.name, why)))
    assert [d.title for d in docs] == ["Lockers"]
    assert len(skipped) == 1 and "File name too long" in skipped[0][1]
    with pytest.raises(OSError, match="File name too long"):
        read_paths([tmp_path], strict=True)


def test_nothing_readable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(InputError, match="nothing indexed: all 1 file"):
        read_paths([tmp_path], on_skip=lambda p, why: None)


def test_files_of_a_type_not_read_are_named_not_passed_over_in_silence(tmp_path: Path) -> None:
    """A folder of Word documents said "added 0 passages" (status 0) as if it were empty."""
    words = tmp_path / "words"
    words.mkdir()
    for name in ("leaflet.docx", "prices.DOCX", "notes.rtf"):
        (words / name).write_bytes(b"PK\x03\x04")
    with pytest.raises(InputError, match="nothing indexed: all 3 file"), pytest.warns(UserWarning) as said:
        read_paths([words])
    assert [str(w.message) for w in said] == [
        f"skipped {words}: 3 file(s) of a type not read (.docx, .rtf); edge-rag reads .txt .md .markdown .json "
        ".jsonl .pdf .html .htm"]
    mixed = tmp_path / "mixed"
    (mixed / "img").mkdir(parents=True)
    (mixed / "page.md").write_text("# Page\n\nThe page has text in it.", encoding="utf-8")
    (mixed / "img" / "photo.jpg").write_bytes(b"\xff\xd8")
    (mixed / ".DS_Store").write_bytes(b"\0")  # hidden files are the system's, not the operator's
    skipped: list[tuple[Path, str]] = []
    docs = read_paths([mixed], on_skip=lambda p, why: skipped.append((p, why)))
    assert [d.title for d in docs] == ["Page"]
    assert [(p, why.split(";")[0]) for p, why in skipped] == [(mixed, "1 file(s) of a type not read (.jpg)")]


def test_lone_surrogates_in_json_skip_that_file_only(bundle_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Issue #43: "\\ud800" is valid JSON but no text; it crashed `edge-rag index` with a traceback (exit 1) and
    cost the whole folder. Now each such file is skipped with a warning naming its record and field."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.md").write_text("# Lockers\n\nCoin lockers are next to the cloakroom.", encoding="utf-8")
    (folder / "title.json").write_text('[{"title": "Prices \\ud800", "text": "Adults pay 8 pounds."}]')
    (folder / "text.jsonl").write_text('{"text": "Children pay \\udfff 4 pounds."}\n')
    (folder / "id.json").write_text('[{"id": "x\\ud800", "text": "Parking costs 5 pounds."}]')
    args = ["index", str(folder), "--db", str(tmp_path / "db"), "--bundle", str(bundle_dir), "--quiet"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    skipped = sorted(line for line in err.splitlines() if line.startswith("edge-rag: warning: skipped"))
    assert len(skipped) == 3, err
    for line, (name, field) in zip(skipped, [("id.json", "id"), ("text.jsonl", "text"), ("title.json", "title")]):
        assert name in line and f"record 0's {field} is not valid Unicode text (lone surrogate" in line
    assert "Traceback" not in err and "added 1 passages" in out
    assert main(["index", str(folder / "title.json"), "--db", str(tmp_path / "db"), "--bundle", str(bundle_dir),
                 "--quiet"]) == 2  # the only file given: skipped, so nothing indexed, a one-line error
    err = capsys.readouterr().err
    assert "edge-rag: error: nothing indexed" in err and "Traceback" not in err


def test_bidi_controls_are_dropped_from_titles(tmp_path: Path) -> None:
    """Issue #43: a right-to-left override in a title makes the source the kiosk shows read as something else."""
    (tmp_path / "a.json").write_text(json.dumps([{"title": "Prices \u202egpj.exe", "text": "Adults pay 8 pounds."}]))
    (tmp_path / "b.md").write_text("# Opening \u2066hours\u2069\n\nOpen daily from 10:00.", encoding="utf-8")
    assert [d.title for d in read_paths([tmp_path])] == ["Prices gpj.exe", "Opening hours"]
