"""The operator's labels of the kiosk's logged questions, kept on the device (the /admin page; ``edge-rag calibrate``).

A certificate covers questions drawn like its calibration questions, and the kiosk's visitors are that draw. Each
distinct question (compared as ``check_question`` normalises it, ignoring case) gets one label: the answer text the
documents give (one or more acceptable wordings), "the documents do not say", or "off-topic". ``edge-rag
calibrate`` reads both refusals alike, as ``"answer": null`` (the documents hold no answer: the question should be
refused); the kind is kept beside it as ``"label"``, which calibrate ignores. Each label records the store's stamp
when it was made, its identity and version (``PassageStore.stamp``): a label made before the documents changed may no
longer be true, nor one made on another store at this place (dropped and made again, its versions from 1 again); one
from before identities were kept has none (''): stale on a store that has one, to be checked and saved again.

Labels live in SQLite (``labels.sqlite`` beside the store), a change one WAL transaction with ``synchronous=FULL``: a
crash or power cut keeps every label whose save was answered; writers wait for each other (a lock, SQLite's).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DiskFullError, EdgeRAGError, InputError, check_question, check_str, disk_full
from ..storage.wal import wal_mode
from .askings import visits
from .calibrate import LabelledQuestion, load_questions

log = logging.getLogger("edge_rag")
FILE = "labels.sqlite"
KINDS = ("answer", "not-in-documents", "off-topic")
MAX_ANSWERS = 20  # acceptable wordings of one answer
MAX_ANSWER_CHARS = 1000
BUSY_S = 30.0  # how long a writer waits for another process's transaction
SCHEMA = """CREATE TABLE IF NOT EXISTS labels (
    key TEXT PRIMARY KEY, question TEXT NOT NULL, kind TEXT NOT NULL, answers TEXT NOT NULL,
    labelled TEXT NOT NULL, store_version INTEGER NOT NULL, occurrences INTEGER NOT NULL DEFAULT 0,
    store_id TEXT NOT NULL DEFAULT '')"""
STORE_ID = "ALTER TABLE labels ADD COLUMN store_id TEXT NOT NULL DEFAULT ''"  # a file from before it: its labels ''
ASKINGS = """CREATE TABLE IF NOT EXISTS askings (key TEXT NOT NULL, asked TEXT NOT NULL, PRIMARY KEY (key, asked))
    WITHOUT ROWID"""  # visits that imported files held and this question log does not: each another draw


def key_of(question: str) -> str:
    """What makes two questions the same one: the text ``ask`` would take, ignoring case."""
    return check_question(question).casefold()


@dataclass(frozen=True)
class Label:
    """One question's label; ``occurrences``: how often an imported file held it untimed or asked here (0:
    labelled on the page); ``elsewhere``: when the visits imported files held that this log does not were."""

    question: str
    kind: str
    answers: tuple[str, ...]
    labelled: str  # UTC, ISO 8601
    store: tuple[str, int]  # the store's stamp when it was saved: its identity and version
    occurrences: int = 0
    elsewhere: tuple[str, ...] = ()

    @property
    def answer(self) -> list[str] | None:
        """The questions file's "answer": the acceptable texts, or null (the documents hold none)."""
        return list(self.answers) if self.kind == "answer" else None

    def to_dict(self) -> dict:
        return {"question": self.question, "label": self.kind, "answer": self.answer, "labelled": self.labelled,
                "store_version": self.store[1]}


def checked(kind: object, answers: object) -> tuple[str, tuple[str, ...]]:
    """(kind, answers) if they make a label, else InputError: an answer label needs 1..MAX_ANSWERS non-empty texts,
    the two refusals none."""
    if kind not in KINDS:
        raise InputError(f"the label must be one of {', '.join(KINDS)}, not {str(kind)[:40]!r}")
    texts = [answers] if isinstance(answers, str) else answers if isinstance(answers, list) else None
    if texts is None or not all(isinstance(a, str) for a in texts):
        raise InputError("the answers must be a text or a list of texts")
    texts = [" ".join(check_str(a, "an answer").split()) for a in texts]
    texts = [a for a in texts if a]
    if kind != "answer":
        return kind, ()
    if not texts or len(texts) > MAX_ANSWERS or any(len(a) > MAX_ANSWER_CHARS for a in texts):
        raise InputError(f"an answer label needs 1 to {MAX_ANSWERS} answer texts of at most {MAX_ANSWER_CHARS} "
                         "characters each")
    return kind, tuple(texts)


class Labels:
    """The label file at ``path`` (created on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # one connection, many request threads
        try:
            # what visitors typed, as the question log: readable by the server's user alone (its journal follows)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            self.db = sqlite3.connect(self.path, timeout=BUSY_S, check_same_thread=False, isolation_level=None)
            wal_mode(self.db, BUSY_S)
            self.db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before the save is answered
            self.db.execute(SCHEMA)
            self.db.execute(ASKINGS)
            with self._transaction() as db:  # a file from before identities (another process may add it too)
                if "store_id" not in {r[1] for r in db.execute("PRAGMA table_info(labels)")}:
                    db.execute(STORE_ID)
        except (OSError, sqlite3.Error) as exc:
            raise self._error(exc)(f"cannot open the label file {self.path}: {exc}") from exc

    def set(self, question: str, kind: object, answers: object, store: tuple[str, int]) -> Label:
        """Label ``question`` (replacing its label), as of the store's stamp ``store``."""
        kind, texts = checked(kind, answers)
        label = Label(check_question(question), kind, texts, _now(), store)
        self._write([label])
        return label

    def remove(self, question: str) -> bool:
        """Forget ``question``'s label; False if it had none."""
        with self._transaction() as db:
            db.execute("DELETE FROM askings WHERE key = ?", (key_of(question),))
            return db.execute("DELETE FROM labels WHERE key = ?", (key_of(question),)).rowcount > 0

    def all(self) -> dict[str, Label]:
        """Every label by ``key_of`` its question. A row whose kind or answers a bad card damaged is left out, with a
        warning, so its question shows unlabelled and is labelled again; before, every listing, export and
        calibration failed with a bare JSONDecodeError (HTTP 500) until the file, every label in it, was deleted."""
        with self._lock:
            rows = self.db.execute("SELECT key, question, kind, answers, labelled, store_id, store_version, "
                                   "occurrences FROM labels").fetchall()
            elsewhere: dict[str, list[str]] = {}
            for key, asked in self.db.execute("SELECT key, asked FROM askings"):
                elsewhere.setdefault(key, []).append(asked)
        out = {}
        for key, question, kind, answers, labelled, identity, version, occurrences in rows:
            try:
                out[key] = Label(question, *checked(kind, json.loads(answers)), labelled, (identity, version),
                                 occurrences, tuple(elsewhere.get(key, ())))
            except (ValueError, RecursionError) as exc:  # InputError is a ValueError
                log.warning("the label of %r in %s is damaged (%s): label it again", str(question)[:80], self.path,
                            str(exc)[:80])
        return out

    def import_file(self, path: Path, store: tuple[str, int], logged: Iterable[tuple[str, str]] = ()) -> int:
        """Take every label of a questions file (``edge-rag calibrate``'s format, as ``export`` writes it), all or
        none; a question's last entry wins. Returns the questions labelled. A label keeps the stamp the file records
        for it on this store (``store``'s identity): exported before the documents changed, it is stale here as it
        was there; one of another store (another kiosk's, the operator vouching for its documents) or of none is
        stamped ``store``. A visit the file holds with its time is another draw unless ``logged`` (this question log)
        holds it: another kiosk's visitors add to this one's, this kiosk's own export imported back adds none; the
        others (untimed: perhaps this log's) count as before, with this log's askings, the larger of the two."""
        return self.take(load_questions(path), store, logged)

    def take(self, questions: Sequence[LabelledQuestion], store: tuple[str, int],
             logged: Iterable[tuple[str, str]] = ()) -> int:
        """``import_file`` of questions already read."""
        # an export lists visits, repeats left out at their kiosk: each counts (collapsed, two kiosks' were one)
        held = [(key_of(q.question), q.question, q.asked) for q in questions if q.store is not None]
        held += visits(((q.question, q.asked) for q in questions if q.store is None), _key,
                       {key_of(q.question) for q in questions})
        timed = {(k, asked) for k, _, asked in held if asked}
        here = {(k, asked) for q, asked in logged if (k := _key(q)) is not None and (k, asked) in timed}
        counts = Counter(k for k, _, asked in held if not asked or (k, asked) in here)
        made: dict[str, Label] = {}
        for q in questions:
            kind = q.label or ("answer" if q.answers else "not-in-documents")
            if (kind == "answer") != bool(q.answers):
                raise InputError(f"{q.question[:60]!r}: label {kind!r} does not fit answer {list(q.answers)}")
            kind, texts = checked(kind, list(q.answers))
            made_on = q.store if q.store is not None and q.store[0] == store[0] else store
            made[key_of(q.question)] = Label(q.question, kind, texts, _now(), made_on, counts[key_of(q.question)])
        self._write(made.values(), timed - here)
        return len(made)

    def _error(self, exc: OSError | sqlite3.Error) -> type[EdgeRAGError]:
        return DiskFullError if disk_full(exc, self.path.parent) else EdgeRAGError  # 507, not 500

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def _write(self, labels: Iterable[Label], askings: Iterable[tuple[str, str]] = ()) -> None:
        with self._transaction() as db:
            db.executemany("INSERT OR IGNORE INTO askings VALUES (?, ?)", askings)
            db.executemany("INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(key_of(x.question), x.question, x.kind, json.dumps(x.answers), x.labelled,
                             x.store[1], x.occurrences, x.store[0]) for x in labels])

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (a busy writer elsewhere is waited for) … ``COMMIT``; rolled back on any error."""
        with self._lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    yield self.db
                except BaseException:
                    self.db.execute("ROLLBACK")
                    raise
                self.db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise self._error(exc)(f"cannot write the label file {self.path}: {exc}") from exc


def export(labels: dict[str, Label], logged: Iterable[tuple[str, str]]) -> list[dict]:
    """The labelled questions as ``edge-rag calibrate`` reads them: one entry per visit that asked a labelled
    question (``logged``: (question as typed, when), the question log's order; askings.visits), then the visits
    imported files held elsewhere, then their untimed occurrences the log does not hold (asked nowhere: once)."""
    return list(exported(labels, logged))


def exported(labels: dict[str, Label], logged: Iterable[tuple[str, str]]) -> Iterator[dict]:
    """``export`` an entry at a time, reading ``logged`` as it goes: it holds the labels and a count per label,
    never the log (read whole, a full log's export rose the server's RSS by ~65 MB)."""
    seen: Counter[str] = Counter()
    for key, question, asked in visits(logged, _key, labels):
        seen[key] += 1
        yield {**_entry(labels[key]), "question": question, "asked": asked}
    for key, label in labels.items():
        yield from ({**_entry(label), "asked": asked} for asked in label.elsewhere)
        for _ in range(max(label.occurrences, 1 if not seen[key] and not label.elsewhere else 0) - seen[key]):
            yield _entry(label)


def _entry(label: Label) -> dict:
    """``label`` as the labelled questions file holds it, with the stamp it was made under (``import_file``)."""
    return {"question": label.question, "answer": label.answer, "label": label.kind, "store_id": label.store[0],
            "store_version": label.store[1]}


def groups(labels: dict[str, Label], newest: Iterable[tuple[str, str]], store: tuple[str, int], offset: int = 0,
           limit: int | None = None) -> tuple[list[dict], bool]:
    """The questions to label, the most recently asked first: each distinct question once, as last typed, with how
    often and when last it was asked, its label, and whether the store (its stamp ``store``) changed since
    (``stale``); then labelled questions never asked here (imported). Only those from ``offset`` (``limit`` of them;
    None: all), and whether more follow. ``newest`` (the log, newest first) is read once: to the page, then on,
    counting the page's questions and finding the labelled ones asked. The keys newer than the page are kept in a
    temporary SQLite file, not in memory: what is held grows with the page, never with the log or the offset (a page
    at offset 240,000 of a full log rose the server's RSS by 28-43 MB, and the log was read twice)."""
    end = None if limit is None else offset + limit
    picked: dict[str, dict] = {}
    asked_here: set[str] = set()  # labelled questions the log holds
    count, more = 0, False  # distinct questions newer than the page's end (all of them if it ends the log)
    with _distinct() as new:
        for question, asked in newest:
            if (key := _key(question)) is None:
                continue
            if key in labels:
                asked_here.add(key)
            if key in picked:
                picked[key]["times"] += 1
            elif not more and new(key):
                if end is not None and count == end:
                    more = True
                    continue
                if count >= offset:
                    picked[key] = {"key": key, "question": check_question(question), "asked": asked, "times": 1}
                count += 1
    out = list(picked.values())
    if not more:  # the log's questions end on this page: the imported ones follow
        imported = [{"key": k, "question": x.question, "asked": None, "times": 0}
                    for k, x in labels.items() if k not in asked_here]
        start = max(offset - count, 0)
        stop = None if end is None else end - count
        out += imported[start:stop]
        more = stop is not None and len(imported) > stop
    for group in out:
        label = labels.get(group["key"])
        group["label"] = label.to_dict() if label else None
        group["stale"] = label is not None and label.store != store
    return out, more


@contextlib.contextmanager
def _distinct() -> Iterator[Callable[[str], bool]]:
    """``new(key)``: True the first time it sees ``key``. The keys are kept in a temporary SQLite database, which
    spills to a file past SQLite's page cache (~2 MB), so a deep page of the listing holds no key in memory."""
    db = sqlite3.connect("")
    try:
        db.execute("CREATE TABLE seen (key TEXT PRIMARY KEY) WITHOUT ROWID")
        yield lambda key: db.execute("INSERT OR IGNORE INTO seen VALUES (?)", (key,)).rowcount == 1
    finally:
        db.close()


def _key(question: str) -> str | None:
    try:
        return key_of(question)
    except InputError:
        return None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
