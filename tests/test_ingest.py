"""PDF and HTML ingestion (edge_rag/documents/ingest.py) on files the tests write themselves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("pypdfium2", reason="the ingest extra is not installed: pip install 'edge-rag[ingest]'")
pytest.importorskip("selectolax", reason="the ingest extra is not installed: pip install 'edge-rag[ingest]'")

from conftest import ROOT  # noqa: E402
from docmaker import HTML_PAGE, nested_html, pdf_bomb_bytes, pdf_bytes  # noqa: E402

from edge_rag.documents.chunk import chunk, read_documents  # noqa: E402
from edge_rag.documents.files import iter_files  # noqa: E402
from edge_rag.documents.ingest import MAX_HTML_DEPTH  # noqa: E402
from edge_rag.documents.parse_child import PARSE_MEMORY_MB, Parser  # noqa: E402
from edge_rag.documents.text import split_sentences, words  # noqa: E402
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


def test_a_pdf_s_running_header_and_footer_are_read_once(tmp_path):
    """A leaflet repeats its title atop each page and its address and page number below: they ran into the first and
    last sentence of every page ("Harbour Museum — Guide 2026 Steam engines are ..."), drawing questions that hold
    their words to those. Read once, before the first page's text, as paragraphs of their own; a line that repeats
    with another number ("Gallery 1", "Gallery 2") is the page's own text, and a PDF of one page keeps every line."""
    pages = [["Harbour Museum - Guide 2026", f"Gallery {n}", f"The hall holds engine number {n}.",
              f"Quay Street 4, open daily. Page {n} of 3"] for n in (1, 2, 3)]
    (tmp_path / "guide.pdf").write_bytes(pdf_bytes(pages))
    assert [d.text for d in read_documents(tmp_path / "guide.pdf")] == [
        "Harbour Museum - Guide 2026\n\nQuay Street 4, open daily. Page 1 of 3\n\n"
        "Gallery 1 The hall holds engine number 1.",
        "Gallery 2 The hall holds engine number 2.", "Gallery 3 The hall holds engine number 3."]
    (tmp_path / "scanned.pdf").write_bytes(pdf_bytes([[]] * 4 + pages))  # half of its pages with text, not of all
    assert [d.text for d in read_documents(tmp_path / "scanned.pdf")] == [
        d.text for d in read_documents(tmp_path / "guide.pdf")]
    (tmp_path / "one.pdf").write_bytes(pdf_bytes(pages[:1]))
    assert read_documents(tmp_path / "one.pdf")[0].text == " ".join(pages[0])


def test_a_compound_broken_at_its_hyphen_keeps_it(tmp_path):
    """PDFium joins a word broken at a line-end hyphen and drops the hyphen, also a word's own: "Anglo-" then "Saxons"
    was "AngloSaxons" (the reader's answer to "Who was the ruling class ahead of the Normans?"), "mid-" then "18th"
    "mid18th". Before a lower-case letter the hyphen is the typesetter's and goes."""
    (tmp_path / "hist.pdf").write_bytes(pdf_bytes([["The infor-", "mation desk: the Anglo-", "Saxons of the mid-",
                                                     "18th century."]]))
    text = read_documents(tmp_path / "hist.pdf")[0].text
    assert text == "The information desk: the Anglo-Saxons of the mid-18th century."


def test_a_sentence_a_page_break_cuts_is_read_whole(tmp_path):
    """"... Trevithick visited the" ended a page and "Newcastle area in 1804." began the next: two passages that no
    question found well, and an answer across the break could be read from neither. The cut sentence is read on the
    page where it ends (a word hyphenated across the break joined); a page's end that may end a sentence or a row
    ("Adults 12") stays, and so does a page that is all one unfinished sentence."""
    pages = [["The hall opened in 1887.", "Trevithick visited the"], ["Newcastle area in 1804. The engine ran smooth-"],
             ["er than any before. Adults 12"], ["Children go free. A page of one unfinished"], ["Sentence."]]
    (tmp_path / "guide.pdf").write_bytes(pdf_bytes(pages))
    assert [d.text for d in read_documents(tmp_path / "guide.pdf")] == [
        "The hall opened in 1887.", "Trevithick visited the Newcastle area in 1804.",
        "The engine ran smoother than any before. Adults 12", "Children go free.", "A page of one unfinished Sentence."]
    cover = [["The hall opened in 1887.", "Trevithick visited the"]]  # a first page without the running header
    (tmp_path / "cover.pdf").write_bytes(pdf_bytes(cover + [["Visitor Guide", f"Newcastle in 180{n}."] for n in (4, 5)]))
    assert [d.text for d in read_documents(tmp_path / "cover.pdf")] == [
        "The hall opened in 1887.", "Visitor Guide\n\nTrevithick visited the Newcastle in 1804.", "Newcastle in 1805."]


READ_PEAK = """
import contextlib, json, sys
from pathlib import Path
from edge_rag.documents.chunk import read_documents
from edge_rag.documents.indexing import held_bytes
from edge_rag.memory import peak_rss_mb, rss_mb
with contextlib.suppress(OSError):
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on (Linux)
before = rss_mb()
docs = read_documents(Path(sys.argv[1]))
print(json.dumps({"rise": peak_rss_mb() - before, "held": sum(map(held_bytes, docs)) / 2**20, "pages": len(docs)}))
"""


def test_a_long_pdf_is_read_back_from_its_parse_child_a_page_at_a_time(tmp_path):
    """A 1,000-page PDF: its pages' text came back from the parse child as one JSON document, read whole, bytes and
    text, beside the pages' documents: peak RSS rose 2.4x what the documents hold, which is what the memory plan prices
    for them (+9.7 MB for 4.1 MB; 2,000 pages: +30.5 MB for 10.8 MB). A JSON line a page, read one at a time: +3.1 MB
    (2,000 pages: +10.4 MB)."""
    vocab = "museum harbour light ship engine crew ticket gallery planet star lens tower steam pump visitor".split()
    pages = [[" ".join(vocab[(p + i + j) % 15] for j in range(14)).capitalize() + "." for i in range(40)]
             for p in range(1000)]
    path = tmp_path / "guide.pdf"
    path.write_bytes(pdf_bytes(pages, title="Guide"))
    run = subprocess.run([sys.executable, "-c", READ_PEAK, str(path)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["pages"] == 1000 and out["rise"] < 2 * out["held"], out


def test_a_pdf_title_that_is_not_utf16_gives_way_to_the_file_name(tmp_path):
    """A /Title holding a lone surrogate made pypdfium2 raise UnicodeDecodeError, and the whole PDF was refused."""
    path = tmp_path / "cloakroom.pdf"
    good = pdf_bytes([["The cloakroom is on level two."]], title="XXTITLEXX")
    path.write_bytes(good.replace(b"(XXTITLEXX)", b"<FEFFD800004100420043>"))  # same length: the xref holds
    assert [(d.title, d.text) for d in read_documents(path)] == [("cloakroom — p. 1", "The cloakroom is on level two.")]


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


def test_html_text_written_in_divs_is_read_once_in_its_section(tmp_path):
    """Only the text of p, li, td and such was read: a page that wrote its hours or prices in a <div> beside a <p>
    had them indexed nowhere, and no question found them."""
    path = tmp_path / "museum.html"
    path.write_text("<title>City Museum</title><main><h1>Visit</h1><p>The museum is in the old town.</p>"
                    "<div class='hours'>Open <b>10:00</b> to 17:00.<div>Closed on Mondays.</div> Late on Fridays.</div>"
                    "<section><h2><span>Tickets</span> and prices</h2><div>Adults pay 12 euros.</div>"
                    "<a href='#'><div>Children enter free.</div></a><ul><li>Groups <p>get a discount.</p></li></ul>"
                    "</section></main>", encoding="utf-8")
    assert [(d.title, d.text) for d in read_documents(path)] == [
        ("City Museum — Visit", "The museum is in the old town.\n\nOpen 10:00 to 17:00.\n\nClosed on Mondays.\n\n"
                                "Late on Fridays."),
        ("City Museum — Tickets and prices", "Adults pay 12 euros.\n\nChildren enter free.\n\nGroups\n\nget a discount.")]


def test_a_wbr_inside_a_word_does_not_cut_it(tmp_path):
    """<wbr> allows a line break inside a word: "cloak<wbr>room" was read as "cloak room", and no question's
    "cloakroom" found it by its words."""
    path = tmp_path / "help.html"
    path.write_text("<title>Help</title><p>Lockers: cloak<wbr>room, <b>level<wbr/></b>two. Ask<wbr> staff.</p>",
                    encoding="utf-8")
    assert read_documents(path)[0].text == "Lockers: cloakroom, leveltwo. Ask staff."


def test_inline_markup_inside_a_word_does_not_cut_it(tmp_path):
    """A page's inline elements run on as a browser shows them: "<b>Mu</b>seum" was indexed as "Mu seum" and
    "<span>Har</span><span>bour</span>" as "Har bour", found by neither "museum" nor "harbour". Spaces the page writes
    stay, a <br> and block elements still part words."""
    path = tmp_path / "visit.html"
    path.write_text("<title>Visit</title><p>The <b>Mu</b>seum of <span>Har</span><span>bour</span> Life.</p>"
                    "<p>a</p><p>b</p><div><b>Open</b> <i>daily</i>\n<em>now</em><br>Closed<br/>Mondays</div>"
                    "<table><tr><td>Adults</td><td>12</td></tr></table>", encoding="utf-8")
    assert read_documents(path)[0].text == ("The Museum of Harbour Life.\n\na\n\nb\n\nOpen daily now Closed Mondays"
                                            "\n\nAdults 12")


def test_a_table_row_is_one_paragraph(tmp_path):
    """Each cell was a paragraph, and a short one (a price) ran into the next passage: "£12.50 Child ticket (5 to 16
    years)", so "How much is a child ticket?" retrieved the adult's price first. A row's cells run on, a space apart,
    as a browser shows them on one line; a cell's own blocks are still paragraphs of their own."""
    path = tmp_path / "tickets.html"
    path.write_text("<title>Tickets</title><table><tr><th>Ticket</th><th>Price</th></tr><tr><td>Adult ticket (over 16 "
                    "years)</td><td>£12.50</td></tr><tr><td>Child ticket (5 to 16 years)</td><td><b>£6</b>.00</td></tr>"
                    "<tr><td><p>Family ticket.</p><p>Two adults.</p></td><td>£30.00</td></tr></table>", encoding="utf-8")
    doc = read_documents(path)[0]
    assert doc.text == ("Ticket Price\n\nAdult ticket (over 16 years) £12.50\n\nChild ticket (5 to 16 years) £6.00\n\n"
                        "Family ticket.\n\nTwo adults.\n\n£30.00")
    assert chunk(doc)[1:3] == ["Child ticket (5 to 16 years) £6.00", "Family ticket. Two adults."]


def test_a_footnote_marker_is_a_word_of_its_own(tmp_path):
    """A superscript footnote marker ran into the word before it: "1763<sup>1</sup>" was the number 17631 and
    "Pitt<sup>2</sup>" the word "pitt2", so the reader answered "17551" and "William Pitt1" and no question found the
    word. In a web page and in Markdown's HTML alike; an ordinal ("1<sup>st</sup>") and a subscript still run on."""
    body = ("The war ended in 1763<sup>1</sup>; William Pitt<sup>2</sup> came to power.<sup><a href='#n3'>[3]</a>"
            "</sup> The 1<sup>st</sup> Earl of H<sub>2</sub>O<sup> 4</sup>.")
    (tmp_path / "war.html").write_text(f"<title>War</title><p>{body}</p>", encoding="utf-8")
    (tmp_path / "war.md").write_text(f"# War\n\n{body}\n", encoding="utf-8")
    for doc in read_documents(tmp_path / "war.html") + read_documents(tmp_path / "war.md"):
        assert {"1763", "pitt", "1st", "h2o", "4"} <= set(words(doc.text)), doc.text
        assert split_sentences(doc.text)[0].endswith("came to power."), doc.text


def test_a_link_to_a_note_of_the_page_is_left_out(tmp_path):
    """Wikipedia's citations ("Rollo<sup><a href="#cite_note-5">[5]</a></sup>") stood in the passage after the words
    they cite, and the reader, reading "Rollo [5]", answered nothing. A superscript link to a note of the page is left
    out; the note is read where the page keeps it, and a superscript without such a link stays (a word of its own)."""
    path = tmp_path / "normans.html"
    path.write_text("<title>Normans</title><p>Their leader was Rollo<sup class='reference'><a href='#cite_note-5'>[5]"
                    "</a></sup>.<sup><a href='#n1'>1</a>,<a href='#n2'>2</a></sup> He ruled 10<sup>6</sup> acres<sup>"
                    "<a href='https://example.org'>[web]</a></sup>.</p><ol><li id='cite_note-5'>Dudo, 1015.</li></ol>",
                    encoding="utf-8")
    assert read_documents(path)[0].text == "Their leader was Rollo. He ruled 10 6 acres [web].\n\nDudo, 1015."


def test_invisible_marks_inside_words_do_not_hide_them_from_the_full_text_index(tmp_path):
    """A soft hyphen, zero-width space, word joiner or zero-width no-break space inside a word (web pages, and PDFs
    whose fonts map glyphs to them) cut it in two for the full-text index: "information" did not find the passage."""
    page = tmp_path / "desk.html"
    page.write_text("<title>Infor&shy;mation</title><p>Ask the infor&shy;mation desk, by the cloak&#8203;room, "
                    "plane&#8288;tarium and gal&#65279;leries.</p>", encoding="utf-8")
    pdf = tmp_path / "desk.pdf"
    pdf.write_bytes(pdf_bytes([["Ask the infor\x01mation desk, by the cloak\x02room, plane\x03tarium and gal\x04leries."]],
                              to_unicode={"\x01": "\u00ad", "\x02": "\u200b", "\x03": "\u2060", "\x04": "\ufeff"}))
    wanted = {"information", "cloakroom", "planetarium", "galleries"}
    for doc in read_documents(page) + read_documents(pdf):
        assert wanted <= set(words(doc.text)), doc.text
    assert read_documents(page)[0].title == "Information"


def test_unparsable_files_raise_input_error_naming_them(tmp_path):
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nnot really a pdf")
    with pytest.raises(InputError, match="broken.pdf"):
        read_documents(broken)
    latin1 = tmp_path / "old.html"
    latin1.write_bytes("<p>Caf\xe9 opening hours</p>".encode("latin-1"))
    with pytest.raises(InputError, match="old.html.*UTF-8"):
        read_documents(latin1)


@pytest.mark.parametrize("meta", ['<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">',
                                  "<META CHARSET=iso-8859-1>"])
def test_a_page_in_the_charset_it_declares_is_read(tmp_path, meta):
    """Word's "Save as Web Page" writes windows-1252 and declares it: such a page was refused as not UTF-8."""
    page = tmp_path / "prices.htm"
    page.write_bytes(f"<html><head>{meta}<title>Prices</title></head><body><p>Caf\u00e9 \u2013 adult \u00a316, "
                     "\u201cfree\u201d for members.</p></body></html>".encode("cp1252"))
    assert [(d.title, d.text) for d in read_documents(page)] == [
        ("Prices", "Caf\u00e9 \u2013 adult \u00a316, \u201cfree\u201d for members.")]
    for charset in ("utf-8", "rot13", "x-unknown"):  # none read as declared: the file is refused, saying so
        page.write_bytes(f'<meta charset="{charset}"><p>Caf\u00e9</p>'.encode("cp1252"))
        with pytest.raises(InputError, match=f"prices.htm is not UTF-8 HTML .* its charset '{charset}' is none"):
            read_documents(page)


def test_folders_pick_up_pdf_and_html(tmp_path):
    (tmp_path / "a.pdf").write_bytes(pdf_bytes([["A page."]]))
    (tmp_path / "b.htm").write_text("<h1>B</h1><p>Some text.</p>", encoding="utf-8")
    (tmp_path / "c.png").write_bytes(b"\x89PNG")
    assert [p.name for p in iter_files([tmp_path])] == ["a.pdf", "b.htm"]


def test_a_decompression_bomb_is_refused_by_the_parse_child(tmp_path):
    """Issue #43: a 0.6 MB PDF whose content stream inflates to 420 MB took the server past 6 GB. This one is
    31 kB and inflates to 20 MB of text operations (~1.7 GB to parse in-process); the child dies at its limit."""
    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(pdf_bomb_bytes(20))
    with pytest.raises(InputError, match=rf"bomb.pdf needs more than {PARSE_MEMORY_MB} MB of memory"):
        Parser().read(bomb, cpu_s=60)  # memory runs out after ~1.5 s of CPU: time plays no part, however busy


def test_html_nested_too_deep_is_refused_before_parsing(tmp_path):
    """Issue #43: 1,000,000 nested <div> never finished parsing (lexbor's time grows with depth squared;
    100,000 take it ~30 s). Counted from the tags first: refused at once; a page at the limit still reads."""
    deep = tmp_path / "deep.html"
    deep.write_text(nested_html(100_000), encoding="utf-8")
    with pytest.raises(InputError, match=f"deep.html nests HTML elements more than {MAX_HTML_DEPTH} deep"):
        read_documents(deep)
    ok = tmp_path / "ok.html"
    # at the limit, plus elements that are not counted: void, self-closing, optional end tags, raw text
    ok.write_text(nested_html(MAX_HTML_DEPTH).replace("<p>", "<br><img src=x><svg/><li><p>" + "<p>x" * 600
                                                      + "<script>" + "'<div>'" * 600 + "</script><!--"
                                                      + "<div>" * 600 + "-->"), encoding="utf-8")
    assert "Deep inside." in read_documents(ok)[0].text


def test_end_tags_of_elements_never_opened_do_not_hide_the_depth(tmp_path):
    """"<div></i>" repeated: each stray </i> was counted as closing, so 60,000 nested <div> passed the check (the
    parser ignores a stray end tag). Now only an end tag matching an open element closes it."""
    path = tmp_path / "stray.html"
    path.write_text("<body>" + "<div></i>" * (MAX_HTML_DEPTH + 1) + "<p>Deep inside.</p>", encoding="utf-8")
    with pytest.raises(InputError, match=f"nests HTML elements more than {MAX_HTML_DEPTH} deep"):
        read_documents(path)
    path.write_text("<body>" + "<div><b></div>" * MAX_HTML_DEPTH + "<p>Deep inside.</p>", encoding="utf-8")
    assert read_documents(path)[0].text == "Deep inside."  # </div> closes the <b> left open inside it


def test_a_parse_past_its_time_is_killed_and_stop_kills_running_parses(tmp_path):
    """The time limit, and a server's shutdown (``Parser.stop``), end a parse that would never finish: a
    FIFO that this test holds open but never writes to blocks the child's read for good."""
    fifo = tmp_path / "stuck.html"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer that never writes: the child's read waits forever
    try:
        with pytest.raises(InputError, match="stuck.html was still being parsed after 3 s"):
            Parser().read(fifo, cpu_s=1)  # killed after WALL_FACTOR (3) times its CPU limit
        parser, outcome = Parser(), []

        def parse() -> None:
            try:
                parser.read(fifo, cpu_s=600)
            except InputError as exc:
                outcome.append(str(exc))

        thread = threading.Thread(target=parse)
        thread.start()
        parser.stop()  # before or after the child started: either way it ends
        thread.join(timeout=60)
        assert not thread.is_alive() and "parsing was stopped" in outcome[0]
        with pytest.raises(InputError, match="parsing was stopped"):
            parser.read(fifo)  # a stopped parser starts nothing that would outlive it
    finally:
        os.close(held)


def test_a_parse_past_its_cpu_time_is_refused(tmp_path):
    """A legitimate-looking page (500 deep, under the depth limit) that takes seconds of CPU: refused at the CPU
    limit, or at the wall-clock one when this machine is too busy to give the child its second first."""
    slow = tmp_path / "slow.html"
    slow.write_text(nested_html(500) * 2000, encoding="utf-8")
    with pytest.raises(InputError, match="slow.html (took more than 1 s of CPU time|was still being parsed after 3 s)"):
        Parser().read(slow, cpu_s=1)
