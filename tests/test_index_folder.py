"""Indexing a folder skips what it cannot read (one warning per file, name + reason) and indexes the rest;
``--strict`` stops at the first such file."""
from __future__ import annotations

from pathlib import Path

import pytest

from edge_rag.chunk import read_paths
from edge_rag.cli import main
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


def test_nothing_readable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(InputError, match="nothing indexed: all 1 file"):
        read_paths([tmp_path], on_skip=lambda p, why: None)
