"""Certify the answer/refuse decision on your own questions (``edge-rag calibrate``).

The shipped calibration certifies the error among answered questions on SQuAD-2 dev questions, half of them
unanswerables written against the very paragraph the search finds: the strictest kind of question there is, and
not what a kiosk's visitors ask. The certificate covers only questions drawn like its calibration questions
(certify.py), so a device whose questions differ should be certified on questions of its own kind: real questions
about the store's documents, each with its answer, or null where the documents hold none (off-topic questions
included, as often as visitors ask them).

Only the risk table is counted anew, on those questions: the score (the shipped combiner), the grid of
thresholds it is tested at and the out-of-domain floor stay the shipped ones, fixed before these questions were
seen, so fixed-sequence testing keeps its level delta. Generated answers are not measured here, so a calibration
made this way never certifies the GPT route. The questions must be a sample of what the device will be asked,
not questions picked or edited until they pass: the certificate is only as good as that draw.
"""
from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BundleError, EdgeRAGError, InputError, check_question, check_str
from ..pipeline import EdgeRAG
from ..storage.fileio import atomic_write_text, sha256_file
from .calibrated_config import backend, encoder_identity
from .certified import reader_sha256
from .certify import F1_CORRECT, Calibration, RiskTable, answer_score
from .kind import Kind
from .squad_f1 import best_f1

MAX_FILE_BYTES = 64_000_000  # a questions file is read whole: ~300,000 questions, far more than calibration needs
REPORT_ALPHAS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)  # what `edge-rag calibrate` prints the certificate for


@dataclass(frozen=True)
class LabelledQuestion:
    """A question and its acceptable answers; none: the documents do not answer it (it should be refused).
    ``label``: what the /admin page called it ("answer", "not-in-documents", "off-topic"; labels.py), if given:
    calibration reads only the answers, the page keeps the kind of refusal apart. ``store``: the store's stamp the
    label was made under, if the file records one (the page's export does); ``asked``: when, if it says."""

    question: str
    answers: tuple[str, ...]
    label: str | None = None
    store: tuple[str, int] | None = None
    asked: str = ""


@dataclass(frozen=True)
class Measured:
    """What the decision made of one question: the calibrated score (NaN: never answered — no candidate, or
    beyond the out-of-domain floor) and whether answering it would be an error."""

    score: float
    wrong: bool


def wrong(candidate: str | None, answers: Sequence[str]) -> bool:
    """An answer is an error if the question has none, or if it matches no gold answer at F1 >= F1_CORRECT."""
    return bool(candidate) and (not answers or best_f1(candidate, list(answers)) < F1_CORRECT)


def load_questions(path: str | Path) -> list[LabelledQuestion]:
    """A JSON list of {"question": str, "answer": str | [str, ...] | null}, or such objects one per line (a
    ``.jsonl`` file: the kiosk's question log, labelled); InputError naming the first bad entry."""
    out = []
    for where, item in _entries(Path(path)):
        if not isinstance(item, dict) or "question" not in item or "answer" not in item:
            raise InputError(f"{where}: need an object with \"question\" and \"answer\" (null: no answer)")
        answer = item["answer"]
        answers = [] if answer is None else [answer] if isinstance(answer, str) else answer
        if not isinstance(answers, list) or not all(isinstance(a, str) and a.strip() for a in answers):
            raise InputError(f"{where}: \"answer\" must be a non-empty string, a list of them, or null")
        try:
            question = check_question(item["question"])  # what `ask` would refuse, refused here, before any is run
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        label = item.get("label")
        out.append(LabelledQuestion(question, tuple(check_str(a, f"{where}: an answer") for a in answers),
                                    label if isinstance(label, str) else None, _stamp(item, where),
                                    item["asked"] if isinstance(item.get("asked"), str) else ""))
    if not out:
        raise InputError(f"{path} holds no questions (a few hundred certify a useful error rate)")
    return out


def _stamp(item: dict, where: str) -> tuple[str, int] | None:
    """The store's stamp (identity, version) an entry records, if any; InputError for one that is not a stamp."""
    if "store_id" not in item and "store_version" not in item:
        return None
    identity, version = item.get("store_id"), item.get("store_version")
    if not isinstance(identity, str) or not isinstance(version, int) or isinstance(version, bool):
        raise InputError(f"{where}: \"store_id\" and \"store_version\" must be a text and a whole number")
    return identity, version


def _entries(path: Path) -> list[tuple[str, object]]:
    """(where, parsed entry) of a JSON list file or a JSON-lines file (blank lines skipped)."""
    try:
        size = path.stat().st_size
        if size <= MAX_FILE_BYTES:
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read questions from {path}: {exc}") from None
    if size > MAX_FILE_BYTES:
        raise InputError(f"{path} is {size / 1e6:.0f} MB; a questions file may hold {MAX_FILE_BYTES / 1e6:.0f} MB")
    if path.suffix == ".jsonl":
        entries = []
        for n, line in enumerate(text.split("\n"), 1):  # JSON Lines: U+2028 and U+0085 may sit in a string
            if line.strip():
                try:
                    entries.append((f"{path}, line {n}", json.loads(line)))
                except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than json reads
                    raise InputError(f"cannot read questions from {path}, line {n}: {exc}") from None
        return entries
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"cannot read questions from {path}: {exc}") from None
    if not isinstance(raw, list):
        raise InputError(f"{path} must hold a JSON list of {{\"question\": ..., \"answer\": ...}} objects "
                         "(or one per line, as a .jsonl file)")
    return [(f"{path}, entry {i}", item) for i, item in enumerate(raw)]


def measure(rag: EdgeRAG, questions: Sequence[LabelledQuestion], progress: Callable = iter,
            base: Path | None = None) -> list[Measured]:
    """Each question through the device's own decision (``EdgeRAG.decide``, no generation), scored as the
    calibration ``base`` (default: the one deciding now, as ``edge-rag calibrate`` opens the shipped one) scores it."""
    path = base or rag.certified.calibration_path
    if not path.is_file():
        raise BundleError(f"no calibration at {path} to take the score and floor from")
    rc = Calibration.load(path).reader(rag.config.reader)
    out: list[Measured] = []
    seen: dict[tuple[str, tuple[str, ...]], Measured] = {}  # a question asked again is decided as before
    for q in progress(questions):
        if (q.question, q.answers) not in seen:
            a = rag.decide(q.question)
            seen[q.question, q.answers] = Measured(answer_score(rc.combiner, rc.ood_distance, a.candidate,
                                                                a.features, a.d_min), wrong(a.candidate, q.answers))
        out.append(seen[q.question, q.answers])
    return out


def risk_table(measured: Sequence[Measured], thresholds: Sequence[float]) -> RiskTable:
    """Questions answered and errors among them at each threshold."""
    return RiskTable.count(np.array([m.score for m in measured]), np.array([m.wrong for m in measured]),
                           np.array(thresholds))


def calibration(base: Path, reader: str, model_sha256: str | None, measured: Sequence[Measured],
                source: dict) -> dict:
    """The calibration file's content: ``base``'s combiner, grid and floor for ``reader``, its risk table counted
    on ``measured`` (made with the reader model ``model_sha256``), and no GPT-route measurement (so generation
    is never certified by it)."""
    raw = json.loads(Path(base).read_text(encoding="utf-8"))
    entry = dict(raw["readers"][reader])
    table = risk_table(measured, entry["table"]["thresholds"])
    entry["table"] = table.to_json()
    entry["gpt"] = {"n": 0, "errors": 0}
    entry["model_sha256"] = model_sha256
    entry.pop("floor_refuses", None)  # measured on the shipped calibration's questions, not these
    entry.pop("kinds", None)  # these questions are the device's own kind: every one is counted in the one table
    return {"readers": {reader: entry}, "source": {**source, "base_calibration_sha256": sha256_file(base)}}


def run(rag: EdgeRAG, questions: Sequence[LabelledQuestion], questions_file: Path, out: Path,
        progress: Callable = iter, base: Path | None = None, made_by: str = "edge-rag calibrate") -> Calibration:
    """Measure ``questions`` (read from ``questions_file``) on ``rag`` with ``base``'s score (``measure``) and write
    the calibration file ``out`` (atomically: a crash leaves the old file or the new one)."""
    base = base or rag.certified.calibration_path
    stamp = rag.store.stamp  # the documents measured (a commit meanwhile: reported as changed since, /api/health)
    measured = measure(rag, questions, progress, base)
    source = {"command": made_by, "questions": str(questions_file), "store_id": stamp[0], "store_version": stamp[1],
              "questions_sha256": sha256_file(questions_file), "n_questions": len(questions),
              "n_without_answer": sum(not q.answers for q in questions), "store": str(rag.store.location),
              "backend": backend(rag.certified.remote), "reader": rag.config.reader, "config": repr(rag.config),
              "encoder": encoder_identity(rag.bundle),
              **({"passages": sorted(kinds)} if (kinds := rag.store.passage_kinds) else {}),
              "made": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    model = reader_sha256(rag.bundle) if rag.config.reader == "neural" else None
    content = calibration(base, rag.config.reader, model, measured, source)
    try:
        atomic_write_text(out, json.dumps(content, indent=1) + "\n")
    except OSError as exc:
        raise EdgeRAGError(f"cannot write the calibration file {out}: {exc.strerror or exc}") from exc
    return Calibration.load(out)


def check_out(out: Path) -> None:
    """Refuse a calibration file that could not be written before any question is run, not after them all: a
    folder, or a place under a folder this process may not write (a read-only file system, its permissions)."""
    if out.is_dir():
        raise InputError(f"{out} is a folder: name the calibration file to write in it")
    try:
        folder = next(p for p in (out.absolute().parent, *out.absolute().parents) if p.exists())  # the rest is made
    except OSError as exc:  # run from a folder since removed: a relative name has no place
        raise InputError(f"cannot write the calibration file {out}: {exc.strerror}") from None
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise InputError(f"cannot write the calibration file {out}: {folder} is not a writable folder")


def rows(cal: Calibration, reader: str, delta: float) -> list[dict]:
    """What a calibration certifies, per alpha of REPORT_ALPHAS: the threshold (None: nothing certified), the share
    of its questions answered, the error among them and its upper bound at level 1 - delta."""
    out = []
    for alpha in REPORT_ALPHAS:
        c = cal.reader(reader).certificate(Kind.SINGLE_HOP, alpha, delta)  # as the path it certifies chooses
        out.append({"alpha": alpha, "threshold": c.threshold if c.n_answered else None, "answered": c.coverage,
                    "error": c.error, "upper": c.upper, "n_answered": c.n_answered})
    return out


def summary(cal: Calibration, reader: str, delta: float) -> str:
    """``rows`` as the text `edge-rag calibrate` prints."""
    lines = [f"{cal.reader(reader).table.n_cal} questions ({cal.source.get('n_without_answer', '?')} without an "
             "answer)", "", f"{'alpha':>6} {'threshold':>9} {'answered':>9} {'error':>7} {'upper bound':>11}   "
             f"(delta {delta:g})"]
    for r in rows(cal, reader, delta):
        lines.append(f"{r['alpha']:>6g} {r['threshold']:>9.3f} {r['answered']:>9.1%} {r['error']:>7.1%} "
                     f"{r['upper']:>11.3f}" if r["n_answered"] else f"{r['alpha']:>6g} {'-':>9} {'0':>9}   "
                     "nothing certified")
    return "\n".join(lines) + "\n"
