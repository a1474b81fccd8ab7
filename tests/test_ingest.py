"""PDF and HTML ingestion (edge_rag/ingest.py) on files the tests write themselves."""
from __future__ import annotations

import pytest

pytest.importorskip("pypdfium2", reason="the ingest extra is not installed: pip install 'edge-rag[ingest]'")
pytest.importorskip("selectolax", reason="the ingest extra is not installed: pip install 'edge-rag[ingest]'")

from docmaker import HTML_PAGE, pdf_bytes  # noqa: E402

from edge_rag.chunk import iter_files, read_documents  # noqa: E402
from edge_rag.errors import InputError  # noqa: E402


def test_pdf_one_document_per_page_titled_with_page_number(tmp_path):
    path = tmp_path / "visitor-guide.pdf"
    path.write_bytes(pdf_bytes([["The planetarium opened in 1971.", "It seats 120 people (under one dome)."],
                                [],  # a page without text is left out
                                ["Guided tours start at 11:00."]], title="Visitor Guide"))
    docs = read_documents(path)
    assert [d.title for d in docs] == ["Visitor Guide — p. 1", "Visitor Guide — p. 3"]
    assert docs[0].text == "The planetarium opened in 1971. It seats 120 people (under one dome)."
    assert docs[1].text == "Guided tours start at 11:00."
    untitled = tmp_path / "opening_hours.pdf"
    untitled.write_bytes(pdf_bytes([["Open daily from 10:00."]]))
    assert [d.title for d in read_documents(untitled)] == ["opening hours — p. 1"]


def test_html_sections_titled_by_headings_without_scripts_or_navigation(tmp_path):
    path = tmp_path / "aquarium.html"
    path.write_text(HTML_PAGE, encoding="utf-8")
    docs = read_documents(path)
    assert [d.title for d in docs] == ["Harbour Aquarium", "Harbour Aquarium — Feeding times",
                                       "Harbour Aquarium — Shark tunnel"]
    feeding = docs[1].text
    assert "fed at 11:30 and again" in feeding  # inline markup joined into its paragraph
    assert feeding.count("Rays are fed on Sundays only.") == 1  # nested blocks are not repeated
    text = " ".join(d.text for d in docs)
    assert "script text" not in text and "Visit" not in text and "color" not in text


def test_unparsable_files_raise_input_error_naming_them(tmp_path):
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nnot really a pdf")
    with pytest.raises(InputError, match="broken.pdf"):
        read_documents(broken)
    latin1 = tmp_path / "old.html"
    latin1.write_bytes("<p>Caf\xe9 opening hours</p>".encode("latin-1"))
    with pytest.raises(InputError, match="old.html.*UTF-8"):
        read_documents(latin1)


def test_folders_pick_up_pdf_and_html(tmp_path):
    (tmp_path / "a.pdf").write_bytes(pdf_bytes([["A page."]]))
    (tmp_path / "b.htm").write_text("<h1>B</h1><p>Some text.</p>", encoding="utf-8")
    (tmp_path / "c.png").write_bytes(b"\x89PNG")
    assert [p.name for p in iter_files([tmp_path])] == ["a.pdf", "b.htm"]
