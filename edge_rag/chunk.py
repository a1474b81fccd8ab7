"""Documents in, retrieval units out.

Reads plain text, Markdown and JSON/JSONL files into Documents, and cuts Documents into passages:
single sentences tagged with their title (the thesis's ``(title, sentence)`` units, good for
extractive answers and tight context budgets) or whole paragraphs.
"""
from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .errors import InputError
from .text import split_sentences
from .types import Document

TEXT_SUFFIXES = (".txt", ".md", ".markdown")
JSON_SUFFIXES = (".json", ".jsonl")
SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES

_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_MD_MARKUP = re.compile(r"(\*\*|__|`|^\s*[-*+]\s+|^\s*\d+\.\s+|^\s*>\s?)", re.MULTILINE)
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_BLANK_LINES = re.compile(r"\n\s*\n")


def doc_id_for(title: str, text: str) -> str:
    """Content-derived id, so re-indexing the same document is a no-op."""
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


def make_document(text: str, title: str = "", doc_id: str | None = None) -> Document:
    return Document(doc_id or doc_id_for(title, text), title, text)


def iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Files to index: the paths themselves, and supported files below any folder, sorted."""
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file())
        elif path.is_file():
            yield path
        else:
            raise InputError(f"no such file or folder: {path}")


def read_paths(paths: Iterable[str | Path], strict: bool = False,
               on_skip: Callable[[Path, str], None] | None = None) -> list[Document]:
    """Documents of every file under ``paths``. A file that cannot be read (missing, unreadable,
    malformed) is reported to ``on_skip(path, reason)`` (default: a warning) and skipped, so one bad file
    does not cost a whole folder; ``strict`` raises on the first one. Raises InputError when nothing was read."""
    on_skip = on_skip or _warn_skip
    docs: list[Document] = []
    skipped = 0
    for raw in paths:
        try:
            files = list(iter_files([raw]))
            for path in files:
                try:
                    docs.extend(read_documents(path))
                except (InputError, OSError) as exc:  # OSError: permissions, I/O — this file's fault only
                    if strict:
                        raise
                    skipped += 1
                    on_skip(path, str(exc))
        except InputError as exc:  # the path itself does not exist
            if strict:
                raise
            skipped += 1
            on_skip(Path(raw), str(exc))
    if skipped and not docs:
        raise InputError(f"nothing indexed: all {skipped} file(s) were skipped (see the warnings above)")
    return docs


def _warn_skip(path: Path, reason: str) -> None:
    warnings.warn(f"skipped {path}: {reason}", stacklevel=3)


def read_documents(path: Path) -> list[Document]:
    """Documents in one file; an undecodable or malformed file raises InputError naming it."""
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); convert it first") from exc
    suffix = path.suffix.lower()
    if suffix in JSON_SUFFIXES:
        return _json_documents(path, raw)
    if suffix in (".md", ".markdown"):
        return [_markdown_document(path, raw)]
    return [make_document(raw.strip(), path.stem.replace("_", " ").replace("-", " "))]


def _markdown_document(path: Path, raw: str) -> Document:
    """Title from the first heading (else the file name); headings, emphasis and links stripped."""
    title, lines = "", []
    for line in raw.splitlines():
        heading = _MD_HEADING.match(line)
        if heading:
            title = title or heading.group(1)
            lines.append("")  # a heading ends a paragraph
        else:
            lines.append(line)
    body = _MD_MARKUP.sub("", _MD_LINK.sub(r"\1", "\n".join(lines))).strip()
    return make_document(body, title or path.stem.replace("-", " "))


def _json_documents(path: Path, raw: str) -> list[Document]:
    """JSON: a list of objects or {"documents": [...]}; JSONL: one object per line.

    Each object needs ``text`` (or ``content``); ``title`` and ``id`` are optional.
    """
    try:
        if path.suffix.lower() == ".jsonl":
            rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
        else:
            data = json.loads(raw)
            rows = data.get("documents", []) if isinstance(data, dict) else data
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from exc
    docs = []
    for n, row in enumerate(rows):
        text = row.get("text", row.get("content")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise InputError(f"{path}: record {n} has no 'text' string")
        docs.append(make_document(text.strip(), str(row.get("title", "")), row.get("id") and str(row["id"])))
    return docs


def chunk(doc: Document, mode: str = "sentence", min_chars: int = 20) -> list[str]:
    """Passage texts of a document in order: sentences (short fragments merged) or paragraphs."""
    paragraphs = [" ".join(p.split()) for p in _BLANK_LINES.split(doc.text) if p.strip()]
    if mode == "paragraph":
        return paragraphs
    if mode != "sentence":
        raise ValueError(f"passage mode must be 'sentence' or 'paragraph', not {mode!r}")
    units: list[str] = []
    for para in paragraphs:
        for sentence in split_sentences(para):
            if units and len(units[-1]) < min_chars:
                units[-1] = f"{units[-1]} {sentence}"
            else:
                units.append(sentence)
    return units
