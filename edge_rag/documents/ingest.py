"""The documents a venue actually has: PDF (pypdfium2) and HTML (selectolax) into Documents.

A PDF becomes one document per page with text, titled "<title> — p. N", so every passage says which page
it came from (a sentence a page break cuts on the page where it ends, a running header or footer once). An
HTML page becomes one document per heading section, titled "<page title> — <heading>".
Both libraries are small native wheels (also for aarch64) in the ``ingest`` extra; pypdfium2 reads a
27-page PDF about 10× faster than pure-Python pypdf. A file that cannot be parsed raises InputError naming
it, so folder indexing can skip it with a warning. Readers return (title, text) sections; chunk.py makes
them Documents. Both parsers are native code a hostile file can steer (a compression bomb, HTML nested a
million deep): they run in a child process with memory and time limits (parse_child.py).
"""
from __future__ import annotations

import codecs
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError
from .text import path_text, plain, split_sentences

PDF_SUFFIXES = (".pdf",)
HTML_SUFFIXES = (".html", ".htm")
SUFFIXES = PDF_SUFFIXES + HTML_SUFFIXES

TITLE_SEPARATOR = " — "
HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
# Text elements: their text runs on inside the paragraph of the element around them. Any other element (p, li, td,
# and div, section, ... where pages write as much of their text) holds paragraphs of its own; headings start a section.
INLINE = frozenset("a abbr acronym b bdi bdo big br cite code data del dfn em font i img ins kbd label mark q rb rp rt "
                   "rtc ruby s samp small span strike strong sub sup time tt u var wbr".split())
# A table's cells run on in their row, a space apart: a row is one paragraph, one line as a browser shows it. A cell a
# paragraph, a short price ran into the next row's label ("£12.50 Child ticket"), and the reader gave it as a child's.
CELLS = frozenset(("td", "th"))
NOT_CONTENT = "script, style, noscript, template, svg, nav, head"
# A superscript link to a note of the page (Wikipedia's "[3]", a Markdown renderer's footnote) is left out: it took an
# answer's place ("Rollo [5]"), and the note itself is read where the page keeps it.
FOOTNOTE_LINK = 'sup > a[href^="#"]'
_LINE_BREAK = re.compile(r"[ \t]*\r?\n[ \t]*")
# A superscript that starts with a digit, a bracket or a reference mark is a footnote marker (or an exponent): it is
# a word of its own, not the end of the word before it ("New France<sup>2</sup>" was the word "france2", "1763<sup>1
# </sup>" the number 17631). One that starts with a letter runs on: an ordinal, "1<sup>st</sup>". (Markdown's HTML is
# matched as written: tags of a link may come first.)
FOOTNOTE_MARK = re.compile(r"\s*(?:<[^<>]*>\s*)*[\d\[(*\u2020\u2021\u00a7\u00b6]")
MAX_CARRY_CHARS = 400  # an unfinished sentence at a page's end longer than this stays on its page
EDGE_LINES = 2  # lines at the top and at the bottom of a PDF page where a running header or footer may be
_DIGITS = re.compile(r"\d+")
# A page number, its digits as "#": "Page #", "p. #", "# of #", "#/#" or a number alone ("- # -"). A line repeated
# with other numbers ("Gallery 1", "Gallery 2" atop each page) is the page's own text.
_PAGE_NUMBER = re.compile(r"\b(?:page|p\.|pg\.?|seite|pagina|página)\s*#|#\s*(?:of|/|von|de)\s*#|^\W*#\W*$", re.I)
# <meta charset="x"> or <meta http-equiv="Content-Type" content="text/html; charset=x">, bytes as the file holds them
_META_CHARSET = re.compile(rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]+)", re.I)
# lexbor's parse time grows with the square of the nesting depth (1,000,000 nested <div> never finish), so the
# depth is counted before parsing; Chromium's own HTML parser nests no deeper than 512 either.
MAX_HTML_DEPTH = 512
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# Elements whose end tag may be left out (pages rarely close them; the parser closes them itself): not counted.
_OPTIONAL_END = frozenset("html head body p li dt dd option optgroup tr td th thead tbody tfoot colgroup caption "
                          "rb rt rp".split())
# A comment, a raw-text element with its text (tags in it are not tags), or a tag: (/)(name)(/).
_HTML_TOKEN = re.compile(r"<!--.*?(?:-->|\Z)|<(script|style|textarea|title)\b.*?(?:</\1\s*>|\Z)"
                         r"|<(/?)([a-zA-Z][^\s/>]*)[^>]*?(/?)>", re.S | re.I)


Section = tuple[str, str]  # (title, text)


def read(path: Path) -> list[Section]:
    """Sections of a PDF or HTML file (dispatch by suffix)."""
    return read_pdf(path) if path.suffix.lower() in PDF_SUFFIXES else read_html(path)


def read_pdf(path: Path) -> list[Section]:
    """One section per page that has text; scanned pages without a text layer are left out."""
    pdfium = _require("pypdfium2", path)
    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        raise InputError(f"{path} is not a readable PDF: {exc}") from exc
    try:
        title = _pdf_title(pdf) or title_from_name(path)
        pages = []
        for number in range(1, len(pdf) + 1):
            page = pdf[number - 1]
            textpage = page.get_textpage()
            pages.append(textpage.get_text_range())
            textpage.close()
            page.close()
    finally:
        pdf.close()
    running, shown, heads = _running_lines(pages), set[str](), {}
    for i, text in enumerate(pages):  # in place: the text is held once
        head, body = _without_running(text, running, shown)
        pages[i] = _pdf_paragraphs(body)
        if head:
            heads[i] = head
        if i and pages[i]:
            _carry_unfinished(pages, i)
    for i, head in heads.items():  # after the sentence cut by the break before: "... visited the" then "Newcastle ..."
        pages[i] = f"{_pdf_paragraphs(head)}\n\n{pages[i]}".strip()
    return [(f"{title}{TITLE_SEPARATOR}p. {number}", text) for number, text in enumerate(pages, 1) if text]


def _carry_unfinished(pages: list[str], i: int) -> None:
    """The sentence the break before page ``i`` cuts, read whole on page i: "... Trevithick visited the" ended page 1
    and "Newcastle area later in 1804 ..." began page 2, two passages no question found well, and an answer across
    the break ("the steam | engine indicator") could be read from neither. Only a short tail that ends mid-sentence
    (a lower-case letter, "," or a hyphen) moves: one that may end a sentence or a row ("Adults 12") stays, and so does
    a page that is all one unfinished sentence."""
    text = pages[i - 1]  # its last sentence is found in its last paragraph's last 2 * MAX_CARRY_CHARS
    cut = (split_sentences(text[max(text.rfind("\n\n") + 1, len(text) - 2 * MAX_CARRY_CHARS) :]) or [""])[-1]
    kept = text[: len(text) - len(cut)].rstrip()
    if not kept or len(cut) > MAX_CARRY_CHARS or not (cut[-1:].islower() or cut[-1:] in ",-"):
        return
    pages[i - 1] = kept
    after = pages[i]
    pages[i] = f"{cut[:-1]}{after}" if cut.endswith("-") and after[:1].islower() else f"{cut} {after}"


def _edges(text: str) -> list[str]:
    """The first and last EDGE_LINES lines of a page that hold text, where running headers and footers are."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines if len(lines) <= 2 * EDGE_LINES else lines[:EDGE_LINES] + lines[-EDGE_LINES:]


def _running_lines(pages: list[str]) -> set[str]:
    """A PDF's running headers and footers: lines at the edges of at least half its pages with text (two at least), the
    same on each but for a page number. Left in, the first passage of every page began "Harbour Museum of Steam —
    Visitor Guide 2026" and the last ended "... Page 5": questions holding the guide's words were drawn to them."""
    shapes = Counter(shape for text in pages for shape in set(map(_shape, _edges(text))))
    with_text = sum(1 for text in pages if text.strip())  # a scanned page has none
    return {shape for shape, n in shapes.items() if n >= max(2, (with_text + 1) // 2)}


def _shape(line: str) -> str:
    """The line as it repeats from page to page: its numbers as "#" if it holds a page number."""
    numbered = _DIGITS.sub("#", line)
    return numbered if _PAGE_NUMBER.search(numbered) else line


def _without_running(text: str, running: set[str], shown: set[str]) -> tuple[str, str]:
    """(the running lines no earlier page ``shown``, the page's text without its running lines): the first page with
    one keeps it, as a paragraph of its own before the page's text (whose end may run on to the next page), since a
    leaflet's footer may be the only place that gives its address or opening hours."""
    edges = {line for line in _edges(text) if _shape(line) in running}
    if not edges:
        return "", text
    first, kept = [], []
    for line in text.splitlines():
        if (stripped := line.strip()) not in edges:
            kept.append(line)
        elif (shape := _shape(stripped)) not in shown:
            shown.add(shape)
            first.append(f"{stripped}\n\n")
    return "".join(first), "\n".join(kept)


def _pdf_title(pdf) -> str:
    """The PDF's Title, or "" when it has none or one that is not UTF-16 (pypdfium2 decodes it strictly): a broken
    title is no reason to refuse the pages' text."""
    try:
        return plain(pdf.get_metadata_value("Title") or "").strip()
    except UnicodeDecodeError:
        return ""


def read_html(path: Path) -> list[Section]:
    """One section per heading (text before the first heading goes under the page title)."""
    selectolax = _require("selectolax.lexbor", path)
    raw = _html_source(path)
    _check_depth(path, raw)
    tree = selectolax.LexborHTMLParser(raw)
    title_node = tree.css_first("title")
    page_title = _clean(title_node.text()) if title_node else ""
    page_title = page_title or title_from_name(path)
    root = tree.body or tree.root
    if root is None:
        raise InputError(f"{path} has no HTML body")
    for node in root.css(NOT_CONTENT):
        node.decompose()
    for node in {a.parent.mem_id: a.parent for a in root.css(FOOTNOTE_LINK) if a.parent is not None}.values():
        node.decompose()
    sections: list[tuple[str, list[str]]] = [(page_title, [])]
    for heading, text in _paragraphs(root):
        if heading:
            sections.append((text if text == page_title else f"{page_title}{TITLE_SEPARATOR}{text}", []))
        else:
            sections[-1][1].append(text)
    return [(title, "\n\n".join(paras)) for title, paras in sections if paras]


def _html_source(path: Path) -> str:
    """The page's text: UTF-8, else the charset its <meta> declares in its first 1,024 bytes, where a browser looks
    (Word's "Save as Web Page" writes windows-1252 and says so: such pages were refused). Latin-1 and ASCII labels
    read as windows-1252, as browsers do; bytes that charset lacks become U+FFFD."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        error = f"{path} is not UTF-8 HTML ({exc.reason} at byte {exc.start})"
        if (declared := _META_CHARSET.search(data[:1024])) is None:
            raise InputError(f"{error} and declares no other charset; convert it first") from exc
    label = declared.group(1).decode("ascii").lower()
    try:  # a UTF label on bytes that are not UTF-8 says nothing true; "rot13" and "base64" are codecs but no charset
        name = codecs.lookup(label).name
        if name.startswith("utf"):
            raise LookupError(label)
        return data.decode("cp1252" if name in ("latin-1", "iso8859-1", "ascii") else name, "replace")
    except LookupError:
        raise InputError(f"{error} and its charset {label!r} is none edge-rag reads; convert it to UTF-8") from None


def _check_depth(path: Path, raw: str) -> None:
    """InputError if elements nest deeper than MAX_HTML_DEPTH, counted from the tags alone (one linear scan,
    stopping at the first element too deep). An end tag closes its element and any left open inside it; one that
    matches no open element closes nothing, as in the parser (counted as closing, "<div></i>" never got deep)."""
    stack: list[str] = []
    open_names: Counter[str] = Counter()
    for m in _HTML_TOKEN.finditer(raw):
        closing, name, self_closing = m.group(2, 3, 4)
        name = (name or "").lower()
        if not name or self_closing or name in _VOID or name in _OPTIONAL_END:
            continue
        if closing:
            top = "" if open_names[name] else name
            while top != name:  # pop to its innermost open element; each element is popped once: linear
                top = stack.pop()
                open_names[top] -= 1
            continue
        stack.append(name)
        open_names[name] += 1
        if len(stack) > MAX_HTML_DEPTH:
            raise InputError(f"{path} nests HTML elements more than {MAX_HTML_DEPTH} deep (at character "
                             f"{m.start()}); refused: pages that deep take the parser minutes to hours")


def _pdf_paragraphs(text: str) -> str:
    """PDF text lines re-joined into paragraphs. PDFium already joins a word broken by a line-end hyphen and marks the
    join with U+FFFE: dropped before a lower-case letter (the typesetter's hyphen), a hyphen before any other character
    (the word's own: "Anglo-\nSaxons" was "AngloSaxons", "mid-\n18th" "mid18th"), as chunk.py joins text files."""
    if "\ufffe" in text:
        text = re.sub("\ufffe", lambda m: "" if m.string[m.end() : m.end() + 1].islower() else "-", text)
    text = plain(text.replace("\x00", ""))
    paragraphs = re.split(r"\n\s*\n", text)
    return "\n\n".join(_LINE_BREAK.sub(" ", p).strip() for p in paragraphs if p.strip())


def _paragraphs(root) -> Iterator[tuple[bool, str]]:
    """(is a heading, text) of each paragraph under ``root``, in order: the text that one element holds outside the
    elements of its own inside it (INLINE ones aside), all of a heading's text as one, a table row's cells as one
    (CELLS). Only the text of p, li, td and other such blocks was read: a page that wrote its opening hours or prices
    in a <div> had them indexed nowhere.
    One pass: each element's paragraph is known from its parent's (traverse visits a parent first). A paragraph's text
    runs on as a browser shows it, its spaces its own, a <br> a space: "<b>Mu</b>seum" was "Mu seum" and
    "cloak<wbr>room" "cloak room", words no question holds. A footnote marker (FOOTNOTE_MARK) is a word of its own."""
    owner: dict[int, tuple[int, bool]] = {}  # element -> (the element its text belongs to, is a heading)
    run: list[str] = []
    current, sup = (0, False), False  # sup: a <sup> whose first text is still to come
    for node in root.traverse(include_text=True):
        parent = node.parent
        above = owner.get(parent.mem_id, (parent.mem_id, False)) if parent is not None else (0, False)
        if node.tag != "-text":
            inherit = above[1] or node.tag in INLINE or node.tag in CELLS
            owner[node.mem_id] = above if inherit else (node.mem_id, node.tag in HEADINGS)
            if (node.tag == "br" or node.tag in CELLS) and above == current:
                run.append(" ")
            sup = sup or node.tag == "sup"
            continue
        text = node.text(deep=False)
        if above != current and text.strip():
            if paragraph := _clean("".join(run)):
                yield current[1], paragraph
            run, current = [], above
        if above == current:
            run.append(f" {text}" if sup and FOOTNOTE_MARK.match(text) else text)
        sup = sup and not text.strip()
    if paragraph := _clean("".join(run)):
        yield current[1], paragraph


def _clean(text: str) -> str:
    return " ".join(plain(text).split())


def title_from_name(path: Path) -> str:
    """The title of a file without one: its name, "_" and "-" as spaces."""
    return plain(path_text(path.stem)).replace("_", " ").replace("-", " ")


def _require(module: str, path: Path):
    """The parser module, or InputError saying which extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(f"{path}: reading {path.suffix} files needs {module.split('.')[0]}: "
                         "pip install 'edge-rag[ingest]'") from exc
