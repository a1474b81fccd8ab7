"""Indexing: documents in, committed passages out, in bounded batches under the store's writer lock.

Memory stays flat however large a document is: passages are cut from it one paragraph window at a
time and encoded ``INDEX_BATCH_PASSAGES`` at a time (a long document spans many batches), so tokenizer
output never exists for more than one batch; they are committed in steps that grow with the store
(``commit_step``: the embedded store rewrites its index file at each commit), so the vectors of at most
one step are held; a batch, and a commit, also ends at the memory plan's ``commit_bytes`` of passage text (a
commit holds its passages and their contexts), which the plan prices with the documents' own sizes (held_bytes).
A document committed in part (a crash, a cancel) is marked incomplete; indexing it again adds exactly the passages
it lacks.

Documents that change: a document whose id is stored with another text replaces it, and documents once
read from a file that no longer holds them (nor does any other file indexed with it) are removed, in the same
commit as the first new passages — so re-indexing an edited file never keeps both versions.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import InputError, check_str
from ..retrieval.encode import Encoder
from ..storage.store_db import Part
from ..storage.stores import PassageStore
from ..types import Document
from .chunk import MAX_TITLE_CHARS, content_sha, iter_units, make_document
from .files import warn_skip
from .text import path_text

INDEX_BATCH_PASSAGES = 1024  # passages encoded and committed together while indexing
DOCUMENT_OVERHEAD_BYTES = 512  # held per document to index beside its text (held_bytes)
log = logging.getLogger("edge_rag")

# Called after every committed batch with (passages done, passages planned); may raise to cancel.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Todo:
    """A document to (finish) indexing: its units from ``start`` on; ``sha`` is its content hash."""

    doc: Document
    start: int
    sha: str
    units: int  # passages still to add


def plan_changes(store: PassageStore, docs: Iterable[Document], config: Config, source: str = "",
                 room: int | None = None) -> tuple[list[Todo], list[str]]:
    """What to add and which stored documents to remove, for ``docs`` (all of ``source``'s, if given)."""
    plan = Plan(store, config, room)
    plan.add(docs)
    return plan.todo, plan.remove + plan.stale([source] if source else [])


def plan_files(store: PassageStore, files: Iterable[tuple[Path, list[Document]]], config: Config, room: int,
               strict: bool = False, on_skip: Callable[[Path, str], None] | None = None,
               text_room: int | None = None) -> tuple[list[Todo], list[str]]:
    """``plan_changes`` for the files ``read_files`` yields, as one run: a document in two of them (a folder and a
    file in it, two copies) is indexed once, and one stored from a file is stale only if no file holds it now (a
    record moved to another file stays). A file reusing an id with another text is skipped like an unreadable one
    (``on_skip``, or raised if ``strict``): indexing one or the other on alternate runs is no answer. Reading stops
    once the documents to index pass ``room`` passages or ``text_room`` bytes (held_bytes), what the budget holds."""
    plan = Plan(store, config, room)
    sources: list[str] = []
    for path, docs in files:
        try:
            plan.add(docs)
        except InputError as exc:
            if strict:
                raise
            (on_skip or warn_skip)(path, str(exc))
            continue
        sources.append(path_text(path.resolve()))
        if plan.counted > room or (text_room is not None and plan.text_bytes > text_room):
            break  # the caller refuses with the plan's numbers
    return plan.todo, plan.remove + plan.stale(sources)


class Plan:
    """Documents to add and remove, each document once however often it is given (by id and content hash).

    Passages are counted without being kept; counting stops once more than ``room`` (what the memory budget can
    still index) are found, so a 500 MB file is refused in seconds, not after a full pass."""

    def __init__(self, store: PassageStore, config: Config, room: int | None = None) -> None:
        self.store, self.config, self.room = store, config, room
        self.todo: list[Todo] = []
        self.remove: list[str] = []  # stored documents that changed
        self.seen: dict[str, tuple[str, str]] = {}  # doc_id -> (content hash, source it was first given with)
        self.counted = 0
        self.text_bytes = 0  # held_bytes of the documents in todo

    def add(self, docs: Iterable[Document]) -> None:
        """Plan the documents not given before; InputError, planning none of ``docs``, if one of them reuses the id
        of a document given before with another text."""
        fresh: dict[str, tuple[Document, str]] = {}
        for doc in docs:
            check_document(doc)
            sha = content_sha(doc)
            known = self.seen.get(doc.doc_id)
            if known is None and doc.doc_id in fresh:
                known = (fresh[doc.doc_id][1], doc.source)
            if known is None:
                fresh[doc.doc_id] = (doc, sha)
            elif known[0] != sha:
                where = f"; the first is in {known[1]}" if known[1] != doc.source else ""
                raise InputError(f"two documents share the id {doc.doc_id!r} with different texts ({doc.title!r}{where})")
        self.seen.update((doc_id, (sha, doc.source)) for doc_id, (doc, sha) in fresh.items())
        for doc, sha in fresh.values():
            if self.room is not None and self.counted > self.room:
                return  # over budget already: the caller refuses with the numbers
            self._plan(doc, sha)

    def _plan(self, doc: Document, sha: str) -> None:
        state = self.store.document(doc.doc_id)
        start = 0
        if state is not None and state.sha not in (None, sha):
            log.warning("document %r (%s) changed: replacing its %d stored passages", doc.doc_id, doc.title,
                        state.passages)
            self.remove.append(doc.doc_id)
        elif state is not None and state.complete:
            return
        elif state is not None:
            start = state.passages  # committed in part before: add the rest
        limit = None if self.room is None else self.room - self.counted + start + 1
        units = iter_units(doc, self.config.passage_mode, self.config.min_sentence_chars)
        n = max(sum(1 for _ in islice(units, limit)) - start, 0)
        self.todo.append(Todo(doc, start, sha, n))
        self.counted += n
        self.text_bytes += held_bytes(doc)

    def stale(self, sources: Iterable[str]) -> list[str]:
        """Documents stored from ``sources`` that no document given now has the id of: removed."""
        stale: list[str] = []
        for source in dict.fromkeys(sources):
            gone = [d for d in self.store.documents_from(source) if d not in self.seen]
            if gone:
                log.warning("%s changed: replacing the %d document(s) indexed from it before", source, len(gone))
            stale += gone
        return stale


def index(store: PassageStore, encoder: Encoder, config: Config, todo: Sequence[Todo], remove: Sequence[str],
          progress: Progress | None = None, commit_bytes: int | None = None) -> int:
    """Encode ``todo`` batch by batch and commit in steps that grow with the store (``commit_step``), removing
    ``remove`` with the first commit; passages added. A batch, and a commit, ends once its passages hold
    ``commit_bytes`` (the memory plan's: long passages and their contexts are held until their commit). ``progress``
    follows every encoded batch; when it raises (a cancel), what is encoded is committed first."""
    total = sum(t.units for t in todo)
    growth = store.commit_growth
    stored, added, encoded = store.count, 0, 0
    pending = Pending(list(remove), encoder.dim)
    cap = commit_bytes or sys.maxsize
    for parts in _batches(todo, config, INDEX_BATCH_PASSAGES, cap):
        texts = [text for part in parts for text in part.texts]
        pending.extend(parts, encoder.encode(texts))
        encoded += len(texts)
        if pending.count >= commit_step(stored + added, growth) or pending.bytes >= cap:
            added += pending.commit(store)
        if progress is not None:
            try:
                progress(encoded, total)
            except BaseException:
                pending.commit(store)
                raise
    return added + pending.commit(store)


def commit_step(count: int, growth: float) -> int:
    """Passages to commit together into a store of ``count``: INDEX_BATCH_PASSAGES, or ``growth`` × ``count`` once
    that is more. The embedded store rewrites its whole index file at every commit; commits growing with it keep the
    bytes written a bounded multiple of the final store (SD-card wear), not its square over the batch size."""
    return max(INDEX_BATCH_PASSAGES, int(growth * count))


class Pending:
    """Encoded parts waiting for their commit (consecutive parts of one document joined) and the removals to commit with
    the first of them."""

    def __init__(self, remove: list[str], dim: int) -> None:
        self.parts: list[Part] = []
        self.dim = dim
        self.vectors: list[np.ndarray] = []
        self.remove = remove
        self.bytes = 0  # held_bytes of the pending passage texts

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.vectors)

    def extend(self, parts: Sequence[Part], vectors: np.ndarray) -> None:
        for part in parts:
            self.bytes += sum(map(sys.getsizeof, part.texts))
            last = self.parts[-1] if self.parts else None
            if last is not None and last.doc.doc_id == part.doc.doc_id and last.start + len(last.texts) == part.start:
                self.parts[-1] = replace(last, texts=last.texts + part.texts, last=part.last)
            else:
                self.parts.append(part)
        self.vectors.append(vectors)

    def commit(self, store: PassageStore) -> int:
        """Commit what is pending (the removals alone, if nothing else); the passages added."""
        if not self.parts and not self.remove:
            return 0
        vectors = np.concatenate(self.vectors) if self.vectors else np.zeros((0, self.dim), np.float32)
        added = store.add(self.parts, vectors, remove=self.remove)
        self.parts, self.vectors, self.remove, self.bytes = [], [], [], 0
        return added


def as_document(item: object) -> Document:
    """A Document as given, or a plain string as an untitled one; anything else is an InputError."""
    if isinstance(item, Document):
        return item
    if isinstance(item, str):
        check_document(Document("", "", item))
        return make_document(item)
    raise InputError(f"a document must be a str or a Document, not {type(item).__name__}")


def check_document(doc: Document) -> None:
    """A document both stores and the tokenizers can hold, refused before anything is encoded (a PostgreSQL store
    failed the whole commit it was in): text, title, id and source are str without lone surrogates; the id, title and
    source hold no NUL (PostgreSQL text cannot; the text's are dropped with the other controls when it is cut); the
    title is at most MAX_TITLE_CHARS (make_document cuts it)."""
    for field, value in (("text", doc.text), ("title", doc.title), ("id", doc.doc_id), ("source", doc.source)):
        what = f"the {field} of document {doc.doc_id!r} ({doc.source or 'no file'})"
        if "\x00" in check_str(value, what) and field != "text":
            raise InputError(f"{what} holds a NUL character, which a PostgreSQL store cannot hold")
    if len(doc.title) > MAX_TITLE_CHARS:
        raise InputError(f"the title of document {doc.doc_id!r} ({doc.source or 'no file'}) is {len(doc.title)} "
                         f"characters; the limit is {MAX_TITLE_CHARS}")


def held_bytes(doc: Document) -> int:
    """What Python holds of a document to index: its text and title (1, 2 or 4 bytes a character), and the
    Document, its id and what planning keeps of it (Plan.seen, its Todo: ~180 B, at most ~370 B while planned)."""
    return sys.getsizeof(doc.text) + sys.getsizeof(doc.title) + DOCUMENT_OVERHEAD_BYTES


def _batches(todo: Sequence[Todo], config: Config, size: int, max_bytes: int) -> Iterator[list[Part]]:
    """Parts of documents grouped until ``size`` passages or ``max_bytes`` of their text; a long document is split
    across batches."""
    batch: list[Part] = []
    n = held = 0
    for t in todo:
        position, texts = t.start, []
        for text in islice(iter_units(t.doc, config.passage_mode, config.min_sentence_chars), t.start, None):
            texts.append(text)
            n, held = n + 1, held + sys.getsizeof(text)
            if n >= size or held >= max_bytes:
                batch.append(Part(t.doc, position, texts, last=False, sha=t.sha))
                yield batch
                position += len(texts)
                batch, texts, n, held = [], [], 0, 0
        if texts or position > 0:  # the document ends in this batch (an empty part: it ended with the last one)
            batch.append(Part(t.doc, position, texts, last=True, sha=t.sha))
    if batch:
        yield batch
