"""Documents in, retrieval units out.

Reads plain text, Markdown and JSON/JSONL files into Documents, and cuts Documents into passages:
single sentences tagged with their title (the thesis's ``(title, sentence)`` units, good for
extractive answers and tight context budgets) or whole paragraphs.
"""
from __future__ import annotations

import hashlib
import html
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError, check_str
from ..types import Document
from . import ingest
from .jsonfile import json_type, records
from .parse_child import PARSE_TEXT_MB, Parser
from .text import path_text, plain, split_sentences

TEXT_SUFFIXES = (".txt", ".md", ".markdown")
JSON_SUFFIXES = (".json", ".jsonl")
SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + (".pdf", ".html", ".htm")  # PDF and HTML: edge_rag/documents/ingest.py

# Linear-time patterns: no two adjacent repeats can match the same characters (``^\s*`` spans lines, a lazy
# title before ``\s*#*\s*$`` is cubic), and link text and target stop at the next "[", so no character is
# scanned by more than one attempt (a 40 KB file of newlines or of "[" took 14-51 s, a 3 KB heading 63 s).
_MD_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*)")  # closing #s are stripped after the match
# A footnote's reference or label ("[^1]", "[^1]:") is markup, shown as a number: left in, "Puritanism.[^4] It" was one
# sentence (the one after a footnote was found by its words only with the one before).
_MD_MARKUP = re.compile(r"(\*\*|__|`|^[ \t]*[-*+][ \t]+|^[ \t]*\d+\.[ \t]+|^[ \t]*>[ \t]?|\[\^[^\[\]\s]*\]:?)",
                        re.MULTILINE)
_MD_LINK = re.compile(r"!?\[([^\[\]]*)\]\([^\[)]*\)")
# An HTML tag in Markdown (linear: the name ends where the lookahead says, and no attempt scans past the next "<" or
# ">"); only HTML's own elements are markup, so an autolink "<https://...>", "<a@b.org>" or "x<y and z>" stays text.
# Text elements run on; the others part words.
_MD_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)(?=[\s/>])[^<>]*>")
_MD_BLOCKS = frozenset("blockquote center dd details div dl dt figcaption figure hr li ol p pre section summary table "
                       "tbody td th thead tr ul".split())
_BLANK_LINES = re.compile(r"\n\s*\n")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # C0 controls but tab/newline/CR, and DEL
# Those a passage drops; the others (vertical tab, form feed, \x1c-\x1f) are white space, as to str.split and to a
# question (errors.check_question): a slide's or Word's line break ("\v") or a page break ("\f") parted two words, and
# "hours\vMonday" was the word "hoursmonday".
_DROPPED = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]")
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")  # LRE RLE PDF LRO RLO, LRI RLI FSI PDI
# Typesetting in a word that no question writes: a soft hyphen, and the Latin ligatures U+FB00-FB06 (their NFKC).
_TYPESET = str.maketrans({"\u00ad": "", "\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                          "\ufb05": "st", "\ufb06": "st"})
# Characters whose spelling in passages (_clean) changed since stores were first written: a document holding one is
# cut again when indexed under a newer spelling (content_sha). Add what a change to _clean respells, and bump.
_RESPELT = re.compile("[\u00ad\ufb00-\ufb06\x0b\x0c\x1c-\x1f]|[^\\W\\d_]-[ \t]*\r?\n")
UNITS_VERSION = 3  # 3: a sentence or paragraph is cut to MAX_UNIT_CHARS, so a document with a longer paragraph too
# A word hyphenated at a line's end (text copied from a PDF, a hard-wrapped file): "centr-\nifugal" was the words "centr"
# and "ifugal". Before a lower-case letter the hyphen was the typesetter's and goes; before any other letter it is the
# word's own ("Yarrow-Schlick-\nTweedy") and stays; either way the word is whole.
_LINE_END_HYPHEN = re.compile(r"(?<=[^\W\d_])-[ \t]*\r?\n[ \t]*(?=[^\W\d_])")
_READABLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]")  # any character that is not white space or a control
# A paragraph longer than this is cut (at a sentence end if there is one) before it is split, so a
# huge file without blank lines is processed in bounded pieces instead of as one giant string list.
PARAGRAPH_WINDOW_CHARS = 1 << 16
# The longest sentence or paragraph kept whole: a text without sentence ends (a table run, minified text) was one
# 64 KB passage, of which the encoder saw the first tokens and the reader (read.READ_MAX_CHARS) the first 8 KB. Above
# every paragraph of SQuAD (4,063 characters) and HotpotQA (8,237), so their passages are as calibrated.
MAX_UNIT_CHARS = 1 << 14
_HASH_SLICE_CHARS = 1 << 20
# A title is stored with each of its passages and in their full-text entries (PostgreSQL's tsvector holds 1 MB at most:
# a 1.35 MB title failed the whole commit it was in): a document's title is cut to this, its text kept whole.
MAX_TITLE_CHARS = 1000
# A text, Markdown or JSON file is read whole: no larger than the text a PDF or HTML file may yield (parse_child.py),
# and above the server's default upload limit (20 MB).
MAX_TEXT_FILE_BYTES = PARSE_TEXT_MB << 20
PARSER = Parser()  # the PDF/HTML parse children of this process (a server has its own, stopped at shutdown)

log = logging.getLogger("edge_rag")


def doc_id_for(title: str, text: str) -> str:
    """Content-derived id (sha1 of title, newline, text), so re-indexing the same document is a no-op.
    Hashed in slices: a 500 MB document is never copied whole into bytes."""
    digest = hashlib.sha1(f"{title}\n".encode())
    for i in range(0, len(text), _HASH_SLICE_CHARS):
        digest.update(text[i : i + _HASH_SLICE_CHARS].encode())
    return digest.hexdigest()[:16]


def content_sha(doc: Document) -> str:
    """The content hash a store keeps of a document: ``doc_id_for`` of its title and text, and the passages' version
    if _clean respells some of its text or a paragraph may be cut since. An unchanged file indexed before the spelling
    changed kept its old passages at every re-index ("\ufb01rst \ufb02oor" was no word of "first floor"); now they are
    replaced."""
    sha = doc_id_for(doc.title, doc.text)
    return f"{sha}.{UNITS_VERSION}" if _RESPELT.search(doc.text) or _long_paragraph(doc.text) else sha


def _long_paragraph(text: str) -> bool:
    """Whether a paragraph of ``text`` is nearly MAX_UNIT_CHARS long: only such a document holds a unit cut since
    version 3 (a sentence takes in the fragments before it, under min_sentence_chars: 20 by default)."""
    start = 0
    for end, nxt in _blank_spans(text):
        if end - start > MAX_UNIT_CHARS - 1024:
            return True
        start = nxt
    return False


def make_document(text: str, title: str = "", doc_id: str | None = None, source: str = "") -> Document:
    """A Document; control characters are dropped from the title (bidi embedding/override/isolate controls only
    serve to make a source shown on the kiosk read as something else; PostgreSQL text cannot hold a NUL), and it is
    cut to MAX_TITLE_CHARS."""
    title = _CONTROL.sub("", _BIDI_CONTROLS.sub("", title))[:MAX_TITLE_CHARS]
    return Document(doc_id or doc_id_for(title, text), title, text, source)


def readable(text: str) -> bool:
    """False for text with nothing to read: only white space, NULs and other control characters."""
    return _READABLE.search(text) is not None


def read_documents(path: Path, parser: Parser = PARSER) -> list[Document]:
    """Documents in one file, each recording the file as its source; an undecodable or malformed file
    raises InputError naming it, and a document with nothing readable (NULs, controls) is skipped with a
    warning. PDF and HTML are parsed by ``parser``'s child processes, inside its limits (parse_child.py)."""
    suffix = path.suffix.lower()
    source = path_text(path.resolve())
    if suffix in ingest.SUFFIXES:
        return [make_document(text, title, source=source) for title, text in parser.read(path)
                if readable(text)]
    raw = _read_text(path)
    if suffix in JSON_SUFFIXES:
        docs = _json_documents(path, raw, source)
    elif suffix in (".md", ".markdown"):
        docs = [_markdown_document(path, plain(raw), source)]
    else:
        docs = [make_document(plain(raw).strip(), ingest.title_from_name(path), source=source)]
    kept = [d for d in docs if readable(d.text)]
    if len(kept) < len(docs):
        log.warning("%s: skipped %d document(s) with no readable text (empty, NULs or control characters)",
                    path, len(docs) - len(kept))
    return kept


def _read_text(path: Path) -> str:
    """The file as UTF-8 text (a leading BOM dropped) with universal newlines; over MAX_TEXT_FILE_BYTES it is an
    InputError, judged by its size and by reading at most one byte more, so a huge (or growing) file never fills
    the memory."""
    with path.open("rb") as f:
        data = f.read(MAX_TEXT_FILE_BYTES + 1) if os.fstat(f.fileno()).st_size <= MAX_TEXT_FILE_BYTES else None
    if data is None or len(data) > MAX_TEXT_FILE_BYTES:
        raise InputError(f"{path} is over the {MAX_TEXT_FILE_BYTES >> 20} MB limit for a text file; split it")
    try:
        text = data.decode("utf-8-sig")  # a byte order mark (Windows editors) is no text
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); convert it first") from exc
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _markdown_document(path: Path, raw: str, source: str) -> Document:
    """Title from the first heading (else the file name); headings, emphasis and links stripped. Line by line a block
    of about PARAGRAPH_WINDOW_CHARS at a time: a 6 MB file of list items held a str and a match per line at once (peak
    RSS +190 MB), where the memory plan prices the document's text once."""
    title, blocks = "", []
    for block in _line_blocks(raw, PARAGRAPH_WINDOW_CHARS):
        lines = []
        for line in block.splitlines():
            heading = _MD_HEADING.match(line)
            if heading:
                title = title or heading.group(1).rstrip().rstrip("#").rstrip()
                lines.append("")  # a heading ends a paragraph
            else:
                lines.append(line)
        blocks.append(_html_text(_MD_MARKUP.sub("", _MD_LINK.sub(r"\1", "\n".join(lines)))))
    body = "\n".join(blocks).strip()
    return make_document(body, _html_text(title) or plain(path_text(path.stem)).replace("-", " "), source=source)


def _html_text(text: str) -> str:
    """Markdown's HTML tags and entities as a browser shows them: "<b>Mu</b>seum" was the words "b", "mu", "b",
    "seum", and "infor&shy;mation" held "shy"."""
    def tag(m: re.Match[str]) -> str:
        name = m.group(1).lower()
        if name == "sup" and m.group()[1] != "/" and ingest.FOOTNOTE_MARK.match(text, m.end()):
            return " "  # a footnote marker is a word of its own, as in a web page (ingest.FOOTNOTE_MARK)
        return m.group() if name not in ingest.INLINE | _MD_BLOCKS else "" if name in ingest.INLINE - {"br"} else " "
    return plain(html.unescape(_MD_TAG.sub(tag, text)))


def _line_blocks(text: str, size: int) -> Iterator[str]:
    """``text`` in whole lines, each piece ending after its last newline: at a blank line within ``size`` characters if
    there is one (a link never spans a paragraph), else at the last line end within them, else at the next."""
    start = 0
    while start < len(text):
        end = start + size
        blank, line, after = text.rfind("\n\n", start, end), text.rfind("\n", start, end), text.find("\n", end)
        cut = (len(text) if end >= len(text) else blank + 2 if blank >= 0 else line + 1 if line >= 0
               else after + 1 if after >= 0 else len(text))
        yield text[start:cut]
        start = cut


def _json_documents(path: Path, raw: str, source: str) -> list[Document]:
    """JSON: a list of objects or {"documents": [...]}; JSONL: one object per line.

    Each object needs ``text`` (or ``content``); ``title`` and ``id`` are optional. A file of another
    shape, or two records with one id and different texts, is an InputError naming the file.
    """
    docs: dict[str, Document] = {}
    for n, row in enumerate(records(path, raw)):  # each dropped once read: only the documents stay
        text = row.get("text", row.get("content")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            what = "has no 'text' string" if isinstance(row, dict) else f"is {json_type(row)}, not an object"
            raise InputError(f"{path}: record {n} {what}")
        doc_id = str(row["id"]) if row.get("id") not in (None, "") else None
        title = str(row.get("title") or "")
        for field, value in (("text", text), ("title", title), ("id", doc_id or "")):
            check_str(value, f"{path}: record {n}'s {field}")  # "\ud800" is valid JSON but no text
        doc = make_document(plain(text).strip(), plain(title), doc_id, source)
        other = docs.get(doc.doc_id)
        if other is not None and (other.title, other.text) != (doc.title, doc.text):
            raise InputError(f"{path}: record {n} reuses id {doc.doc_id!r} with a different text")
        docs.setdefault(doc.doc_id, doc)
    return list(docs.values())


def chunk(doc: Document, mode: str = "sentence", min_chars: int = 20) -> list[str]:
    """Passage texts of a document in order: sentences (short fragments merged) or paragraphs."""
    return list(iter_units(doc, mode, min_chars))


def iter_units(doc: Document, mode: str = "sentence", min_chars: int = 20) -> Iterator[str]:
    """``chunk`` one unit at a time: memory stays bounded by a paragraph window however long the document."""
    if mode not in ("sentence", "paragraph"):
        raise ValueError(f"passage mode must be 'sentence' or 'paragraph', not {mode!r}")
    pending: str | None = None  # the last sentence, held back: a short next fragment merges into it
    for para in _paragraphs(doc.text):
        if mode == "paragraph":
            yield from _capped(para)
            continue
        for sentence in split_sentences(para):
            if pending is not None and len(pending) < min_chars:
                pending = f"{pending} {sentence}"
                continue
            if pending is not None:
                yield from _capped(pending)
            pending = sentence
    if pending is not None:
        yield from _capped(pending)


def _paragraphs(text: str) -> Iterator[str]:
    """Non-empty paragraphs, white space collapsed, controls removed; long ones cut into windows."""
    start = 0
    for end, nxt in _blank_spans(text):
        while end - start > PARAGRAPH_WINDOW_CHARS:
            cut = _cut(text, start, start + PARAGRAPH_WINDOW_CHARS)
            if para := _clean(text[start:cut]):
                yield para
            start = cut
        if para := _clean(text[start:end]):
            yield para
        start = nxt


def _blank_spans(text: str) -> Iterator[tuple[int, int]]:
    """(end of paragraph, start of the next) for each blank-line gap, then (len, len) for the last."""
    for m in _BLANK_LINES.finditer(text):
        yield m.start(), m.end()
    yield len(text), len(text)


def _capped(unit: str) -> Iterator[str]:
    """``unit`` in pieces of at most MAX_UNIT_CHARS, each cut where _cut cuts (a sentence end, else a space)."""
    start = 0
    while len(unit) - start > MAX_UNIT_CHARS:
        cut = _cut(unit, start, start + MAX_UNIT_CHARS)
        yield unit[start:cut].strip()
        start = cut
    yield unit[start:].strip() if start else unit


def _cut(text: str, lo: int, hi: int) -> int:
    """Where to cut text[lo:hi]: after the last sentence end, else the last space, else at hi."""
    for sep in (". ", " "):
        i = text.rfind(sep, lo + 1, hi)
        if i > lo:
            return i + 1
    return hi


def _clean(piece: str) -> str:
    """White space collapsed (with the controls that are white space), other controls and soft hyphens dropped,
    ligatures spelled out, a word hyphenated at a line's end joined: the full-text index cut "infor\u00admation" (text
    copied from a web page or PDF) in two, and held "\ufb01nance" as no word a visitor types.
    Zero-width spaces stay: the calibration's SQuAD passages hold them. A change here that respells some text goes
    into _RESPELT, so stores written before cut it again."""
    piece = _LINE_END_HYPHEN.sub(lambda m: "" if m.string[m.end()].islower() else "-", piece) if "-" in piece else piece
    return " ".join(_DROPPED.sub("", piece).translate(_TYPESET).split())
