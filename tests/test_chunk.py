import json
import time
import unicodedata

import pytest

from edge_rag.documents.chunk import chunk, content_sha, doc_id_for, make_document, read_documents
from edge_rag.documents.files import iter_files
from edge_rag.documents.text import split_sentences, whole_sentences
from edge_rag.errors import InputError


def test_split_sentences_keeps_abbreviations():
    text = "Dr. Smith arrived at 9 a.m. on Monday. He left at noon! Was it late? Yes."
    assert split_sentences(text) == ["Dr. Smith arrived at 9 a.m. on Monday.", "He left at noon!", "Was it late?", "Yes."]


def test_a_text_without_sentence_ends_is_cut_into_bounded_passages_at_word_ends():
    """A table run, minified text or a PDF without full stops was one 64 KB passage (a paragraph window), of which the
    encoder saw the first tokens. No sentence or paragraph is longer than MAX_UNIT_CHARS: cut at a sentence end, else
    at a space, and no word is lost or split."""
    from edge_rag.documents.chunk import MAX_UNIT_CHARS

    run = ", ".join(f"room{k} holds exhibit{k} from hall{k % 7}" for k in range(6000))  # ~190 KB, no "."
    prose = " ".join(f"Room {k} holds exhibit {k}." for k in range(9000))  # one ~200 KB paragraph of sentences
    for text, mode in ((run, "sentence"), (run, "paragraph"), (prose, "paragraph")):
        units = chunk(make_document(text, "Rooms"), mode)
        assert max(map(len, units)) <= MAX_UNIT_CHARS < 2 * max(map(len, units)), mode
        assert " ".join(units) == text
    assert all(u.endswith(".") for u in chunk(make_document(prose, "Rooms"), "paragraph"))


def test_whole_sentences_drops_the_unfinished_one():
    """What a generated answer may show: its whole sentences, by the rule split_sentences uses."""
    text = 'Dr. Smith measured 3.5 m on Monday. He said "Go." It is located'
    assert whole_sentences(text) == whole_sentences(text, finished=True) == 'Dr. Smith measured 3.5 m on Monday. He said "Go."'
    growing = "The museum opened in 1889. It is located in Harbourlight."
    assert whole_sentences(growing) == "The museum opened in 1889."  # the last one may go on: "... Harbourlight. St"
    assert whole_sentences(growing, finished=True) == growing  # cut just after its full stop: whole
    for cut in ("It is 3.", "It was built by Dr.", "It is in the U.S.", "It is located", "Dr. Smith", "It is in..."):
        assert whole_sentences(cut, finished=True) == ""  # a decimal point, an abbreviation, an ellipsis or no end
    assert whole_sentences("It opened. It is located in...", finished=True) == "It opened."
    assert whole_sentences("Was it late? (Yes!)", finished=True) == "Was it late? (Yes!)"
    for cut in ("J. R", "J. R.", "It was built by John F.", "Mt. Everest is", "It lies below Mt."):
        assert whole_sentences(cut) == whole_sentences(cut, finished=True) == ""  # an initial or a title before a name
    assert whole_sentences("He met John F. Kennedy in 1960. He") == "He met John F. Kennedy in 1960."
    chinese = "埃菲尔铁塔于1889年建成。它位于「巴黎。」它"
    assert whole_sentences(chinese) == whole_sentences(chinese, finished=True) == "埃菲尔铁塔于1889年建成。它位于「巴黎。」"
    assert whole_sentences("它高330米。") == "" and whole_sentences("它高330米。", finished=True) == "它高330米。"


def test_sentence_mode_merges_short_fragments_and_keeps_order():
    doc = make_document("The hall opened in 1887. Ok. It was rebuilt later.\n\nA second paragraph is here.", "Hall")
    assert chunk(doc, "sentence", min_chars=10) == [
        "The hall opened in 1887.", "Ok. It was rebuilt later.", "A second paragraph is here.",
    ]
    assert chunk(doc, "paragraph") == ["The hall opened in 1887. Ok. It was rebuilt later.", "A second paragraph is here."]
    with pytest.raises(ValueError, match="passage mode"):
        chunk(doc, "page")


def test_markdown_title_and_markup(tmp_path):
    path = tmp_path / "guide.md"
    path.write_text("# Opening hours\n\nWe open at **10:00**. See [the map](map.html).\n\n- Closed on Mondays.\n")
    [doc] = read_documents(path)
    assert doc.title == "Opening hours"
    assert "**" not in doc.text and "the map" in doc.text and "map.html" not in doc.text
    assert "Closed on Mondays." in doc.text


def test_html_in_markdown_is_read_as_a_browser_shows_it(tmp_path):
    """Markdown may hold HTML tags and entities: "<b>Mu</b>seum" was indexed as the words "b", "mu", "b", "seum" and
    "infor&shy;mation" held "shy", so "museum" and "information" found nothing. Only HTML's own elements are tags: an
    autolink, an address or a comparison stays text."""
    path = tmp_path / "visit.md"
    path.write_text("# The <b>Mu</b>seum &amp; Caf&eacute;\n\nThe <b>Mu</b>seum<br>opens at <kbd>10</kbd>. Ask the "
                    "infor&shy;mation desk.\n\nSee <https://example.org> or <desk@example.org>; x<y and z>w, 3 < 4.\n\n"
                    "<div align=center><p>Fish &amp; chips</p></div>")
    [doc] = read_documents(path)
    assert doc.title == "The Museum & Café"
    assert chunk(doc) == ["The Museum opens at 10.", "Ask the information desk.",
                          "See <https://example.org> or <desk@example.org>; x<y and z>w, 3 < 4.", "Fish & chips"]


def test_a_markdown_footnote_reference_is_markup(tmp_path):
    """A footnote's reference ("[^4]") after a full stop joined two sentences into one passage, which the question of
    either found less well (a Markdown page of SQuAD's Harvard article: "After what higher learning model was the
    school designed?" ranked 7th in the hybrid list, 2nd as plain text), and its definition's label was text."""
    path = tmp_path / "notes.md"
    path.write_text("# Harvard\n\nIt followed the English university model.[^4] It was never affiliated with any "
                    "denomination[^note].\n\n[^4]: Morison, Three Centuries of Harvard.\n"
                    "[^note]: See the charter of 1650.\n")
    assert chunk(read_documents(path)[0]) == [
        "It followed the English university model.", "It was never affiliated with any denomination.",
        "Morison, Three Centuries of Harvard.", "See the charter of 1650."]


@pytest.mark.parametrize("text, title", [
    ("# Notes\n\n" + "[^" * 40000, "Notes"),  # a footnote label scanning to the end: 5 s (quadratic)
    ("# Notes\n\nSee below." + "\n" * 40000 + "End.", "Notes"),  # ^\s* across lines: 51 s before (quadratic)
    ("# a" + " " * 3000 + "b #\n\nBody.", "a" + " " * 999),  # a lazy title before \s*#*\s*$: 63 s (cubic); cut
    ("# Links\n\n" + "[" * 40000 + "[a](" * 10000, "Links"),  # each "[" scanning to the end: 14 s
    ("# Tags\n\n<a" + "a" * 40000 + " <b" * 10000, "Tags"),  # a tag name giving back letters: 8 s (quadratic)
])
def test_markdown_patterns_take_linear_time(tmp_path, text, title):
    """A hostile or odd Markdown file is read in milliseconds: the patterns cannot backtrack over a whole file."""
    path = tmp_path / "odd.md"
    path.write_text(text)
    start = time.process_time()
    [doc] = read_documents(path)
    assert time.process_time() - start < 2, "a Markdown pattern backtracks"
    assert doc.title == title


def test_json_and_jsonl(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"documents": [{"title": "T", "text": "Alpha text.", "id": "x1"}]}))
    (tmp_path / "b.jsonl").write_text('{"text": "Beta text."}\n\n{"content": "Gamma text.", "title": "G"}\n')
    docs = [d for p in iter_files([tmp_path]) for d in read_documents(p)]
    assert [(d.title, d.text) for d in docs] == [("T", "Alpha text."), ("", "Beta text."), ("G", "Gamma text.")]
    assert docs[0].doc_id == "x1"


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path):
    """JSON Lines end lines at \\n only: U+2028, U+2029 and U+0085 may sit raw in a string (``json.dumps(...,
    ensure_ascii=False)`` writes them so). They were taken for line ends and a valid file was refused."""
    texts = ["Open daily\u2028from 10:00.", "Adults \u00a316\u2029children free.", "Caf\u0085e on floor 2."]
    (tmp_path / "a.jsonl").write_text("\r\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in texts))
    assert [d.text for d in read_documents(tmp_path / "a.jsonl")] == texts


def test_a_byte_order_mark_is_not_text(tmp_path):
    """A UTF-8 BOM (as Windows editors write) hid a Markdown file's heading and made JSON files invalid."""
    bom = "\ufeff"
    (tmp_path / "a.md").write_text(f"{bom}# Cafe\n\nThe cafe sells scones.")
    (tmp_path / "b.json").write_text(bom + json.dumps([{"text": "The shop sells maps."}]))
    (tmp_path / "c.jsonl").write_text(bom + json.dumps({"text": "The lift is by the stairs."}))
    (tmp_path / "d.txt").write_text(f"{bom}Lockers are on level two.")
    docs = [d for p in iter_files([tmp_path]) for d in read_documents(p)]
    assert [(d.title, d.text) for d in docs] == [("Cafe", "The cafe sells scones."), ("", "The shop sells maps."),
                                                 ("", "The lift is by the stairs."), ("d", "Lockers are on level two.")]


def test_a_soft_hyphen_does_not_cut_a_word_of_a_passage(tmp_path):
    """Text copied from a web page or PDF keeps its soft hyphens: "infor\u00admation" was the words "infor" and "mation"
    in the full-text index, and no question found the passage by "information"."""
    (tmp_path / "desk.txt").write_text("Ask the infor\u00admation desk.\n\nThe plan\u00adetarium opens at noon.")
    (tmp_path / "desk.jsonl").write_text(json.dumps({"text": "The cloak\u00adroom is by the door."}))
    units = [u for f in ("desk.txt", "desk.jsonl") for d in read_documents(tmp_path / f) for u in chunk(d)]
    assert units == ["Ask the information desk.", "The planetarium opens at noon.", "The cloakroom is by the door."]


def test_files_are_indexed_in_nfc_without_invisible_marks(tmp_path):
    """A text file exported by macOS writes "Café" as "Cafe" and a combining accent (NFD), which PostgreSQL's index
    held apart from the "café" a visitor types; a zero-width space or word joiner inside a word cut "cloakroom" in two
    for both indexes. Text, Markdown and JSON files are read in NFC without them, titles from file names too."""
    nfd = unicodedata.normalize("NFD", "Café Lumière")
    (tmp_path / f"{nfd}.txt").write_text(f"The {nfd} is by the cloak\u200broom.")
    (tmp_path / "shop.md").write_text(f"# Gift\u200bshop\n\nPosters at the {nfd}.")
    (tmp_path / "shop.json").write_text(json.dumps([{"title": nfd, "text": "The plane\u2060tarium opens at noon."}]))
    docs = [d for f in (f"{nfd}.txt", "shop.md", "shop.json") for d in read_documents(tmp_path / f)]
    assert [(d.title, d.text) for d in docs] == [
        ("Café Lumière", "The Café Lumière is by the cloakroom."), ("Giftshop", "Posters at the Café Lumière."),
        ("Café Lumière", "The planetarium opens at noon.")]
    assert all(unicodedata.is_normalized("NFC", d.title + d.text) for d in docs)


def test_typographic_ligatures_are_spelled_out_in_passages(tmp_path):
    """Text copied from a PDF holds its ligatures: "\ufb01nance o\ufb03ce" was no word a visitor types, and "finance
    office" found the passage by neither BM25 nor (in its top 5) the encoder."""
    (tmp_path / "office.txt").write_text("The \ufb01nance o\ufb03ce is on the \ufb01rst \ufb02oor. Sta\ufb00 wear \ufb06ars.")
    assert chunk(read_documents(tmp_path / "office.txt")[0]) == ["The finance office is on the first floor.",
                                                                 "Staff wear stars."]


def test_a_line_or_page_break_written_as_a_control_parts_words(tmp_path):
    """Text from slides or Word writes a line break as a vertical tab and a page break as a form feed: both were
    dropped, so "hours\vMonday" was the word "hoursmonday", two sentences one passage, and the reader answered
    "Maria de laQueillerie". They are white space, as in a question; a document holding one is cut again once."""
    (tmp_path / "hours.txt").write_text("Opening hours\vMonday to Friday\v10:00 to 17:00\n\nThe cafe is on level 2.\f"
                                        "The shop is\x1fon level 1.")
    doc = read_documents(tmp_path / "hours.txt")[0]
    assert chunk(doc) == ["Opening hours Monday to Friday 10:00 to 17:00", "The cafe is on level 2.",
                          "The shop is on level 1."]
    assert content_sha(doc) != doc_id_for(doc.title, doc.text)


def test_a_word_hyphenated_at_a_line_end_is_whole(tmp_path):
    """Text copied from a PDF or wrapped by hand breaks words at a line's end: "centr-\\nifugal" was the words "centr"
    and "ifugal", and the reader answered "multi-stage centr- ifugal". A typesetter's hyphen (a lower-case letter
    follows) goes, a word's own stays; a dash between words and a number are left as they are."""
    (tmp_path / "pumps.txt").write_text("Boilers use multi-stage centr-\nifugal pumps, as the Yarrow-Schlick-\n"
                                        "Tweedy engines did - \nthe plan of the mid-\n1990s.")
    doc = read_documents(tmp_path / "pumps.txt")[0]
    assert chunk(doc) == ["Boilers use multi-stage centrifugal pumps, as the Yarrow-Schlick-Tweedy engines did - the "
                          "plan of the mid- 1990s."]
    assert content_sha(doc) != doc_id_for(doc.title, doc.text)  # a store that holds it cuts it again


def test_bad_files_give_clear_errors(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(InputError, match="latin1.txt is not UTF-8"):
        read_documents(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("[{]")
    with pytest.raises(InputError, match="broken.json is not valid JSON"):
        read_documents(broken)
    (tmp_path / "notext.jsonl").write_text('{"title": "x"}\n')
    with pytest.raises(InputError, match="record 0 has no 'text'"):
        read_documents(tmp_path / "notext.jsonl")
    with pytest.raises(InputError, match="no such file"):
        list(iter_files([tmp_path / "missing"]))
