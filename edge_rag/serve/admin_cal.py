"""Calibrate from the /admin page: ``edge-rag calibrate``'s procedure on the operator's labels, as a job; applying
its certificate to the running server, and keeping it across restarts.

The job runs on the indexing thread (jobs.py): it waits for uploads and removals and they wait for it, so the store
cannot change while the labels are measured; questions go on meanwhile (``EdgeRAG.decide`` is thread-safe). It
writes the labelled questions file (labels.export) and calls ``calibrate.run`` on it with the shipped score and
floor, exactly as the command does, so the table is the one `edge-rag calibrate --questions` that file prints.
Applying writes the calibration, with the alpha chosen, atomically beside the labels, then swaps the pipeline's
reference to it (``EdgeRAG.use_calibration``): questions in flight finish under the old certificate.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..decision.calibrate import load_questions, rows, run
from ..decision.certify import Calibration
from ..decision.labels import FILE as LABELS_FILE
from ..decision.labels import Label, export
from ..errors import ConfigError, EdgeRAGError, InputError, StoreError, StoreUnavailable
from ..pipeline import EdgeRAG
from ..storage.fileio import atomic_path, atomic_write_text
from .errors import NotReady
from .jobs import Job

log = logging.getLogger("edge_rag")
MADE_BY = "edge-rag serve (/admin)"


@dataclass(frozen=True)
class Files:
    """Where one store's labels, labelled questions file and operator certificate live."""

    folder: Path
    prefix: str = ""

    @property
    def labels(self) -> Path:
        return self.folder / f"{self.prefix}{LABELS_FILE}"

    @property
    def questions(self) -> Path:
        return self.folder / f"{self.prefix}labelled-questions.jsonl"

    @property
    def certificate(self) -> Path:
        return self.folder / f"{self.prefix}operator-calibration.json"


def files_of(rag: EdgeRAG, question_log: str | None) -> Files | None:
    """Beside the store's folder; for a PostgreSQL store beside the question log (``LOG.labels.sqlite`` …); None
    when there is neither."""
    folder = getattr(rag.store, "folder", None)
    if folder is not None:
        return Files(Path(folder))
    return Files(Path(question_log).parent, Path(question_log).stem + ".") if question_log else None


def ready(labels: dict[str, Label], logged: Iterable[tuple[str, str]], store: tuple[str, int],
          least: int) -> tuple[list[dict], str]:
    """The labelled questions file's entries and when the last of their labels was saved, or NotReady saying
    plainly why not (a label saved at another stamp than the store's ``store``: its documents changed since, or the
    store was made again). ``logged`` (the question log) is read a line at a time: only labelled askings are held."""
    stale = sum(x.store != store for x in labels.values())
    if stale:
        raise NotReady(f"{stale} label(s) were saved before the documents last changed (or on a store made again "
                       "since): check them and save them again (a label may no longer be true); the certificate in "
                       "force stays")
    entries = export(labels, logged)
    if len(entries) < least:
        raise NotReady(f"{len(entries)} labelled question(s); calibrating needs at least {least} (a few hundred "
                       "give a useful certificate); the certificate in force stays")
    return entries, max(x.labelled for x in labels.values())


def calibrate(rag: EdgeRAG, files: Files, entries: list[dict], labelled: str, job: Job,
              checked: tuple[str, int]) -> tuple[dict, dict]:
    """Measure ``entries`` (written to the labelled questions file) as ``edge-rag calibrate`` does: (the
    calibration file's content, the job's result: the table per alpha, the risk–coverage curve, what it was
    measured on). NotReady unless the store is still at ``checked``, the stamp ``ready`` found the labels saved at:
    a job queued behind an upload runs after its commit."""
    stamp = rag.store.stamp
    if stamp != checked:
        raise NotReady("the labels were saved before the documents last changed (an upload or removal ran before "
                       "this calibration): check them and save them again; the certificate in force stays")
    with atomic_path(files.questions) as tmp:  # what visitors typed: readable by the server's user alone
        tmp.chmod(0o600)
        tmp.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries), encoding="utf-8")
    questions = load_questions(files.questions)
    job.passages_planned = len(questions)

    def progress(items):
        for n, q in enumerate(items):
            job.check()  # the server is stopping: the certificate in force stays
            job.passages_done, job.changes = n, job.changes + 1
            yield q

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "calibration.json"
        cal = run(rag, questions, files.questions, out, progress, base=rag.certified.shipped, made_by=MADE_BY)
        content = json.loads(out.read_text(encoding="utf-8"))
    if rag.store.stamp != stamp:
        raise NotReady("the documents changed while calibrating; calibrate again")
    reader, delta = rag.config.reader, rag.config.delta
    table = cal.reader(reader).table
    result = {"questions": table.n_cal, "without_answer": cal.source["n_without_answer"], "delta": delta,
              "store_id": stamp[0], "store_version": stamp[1], "labelled": labelled,
              "table": rows(cal, reader, delta),
              "curve": [{"threshold": t, "answered": a, "error": e}
                        for t, (a, e) in zip(table.thresholds, table.curve())]}
    content["source"]["operator"] = {"labelled": result["labelled"], "store_id": stamp[0], "store_version": stamp[1]}
    return content, result


def apply(rag: EdgeRAG, files: Files, content: dict, measured: tuple[str, int], alpha: object) -> None:
    """Put the calibration ``content`` in force at ``alpha``: refused (InputError) for an alpha Config refuses,
    NotReady when the documents changed since it was measured (the store's stamp is no longer ``measured``: a commit,
    or a store made again at this place, its versions from 1 again); else written atomically (a restart keeps it),
    then swapped in."""
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise InputError("send the chosen alpha as \"max_error_rate\": a number")
    try:
        Config(max_error_rate=float(alpha))
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    with contextlib.ExitStack() as held:
        try:  # no commit between the check and the swap; none waited for (its commits would move the version anyway)
            held.enter_context(rag.store.writing(wait=False))
        except StoreUnavailable:  # the database unreachable: 503, not "being changed"
            raise
        except StoreError as exc:
            raise NotReady(f"the documents are being changed ({exc}): apply when that is done; the certificate in "
                           "force stays") from None
        if rag.store.stamp != measured:
            raise NotReady("the documents changed since this calibration was measured: calibrate again; the "
                           "certificate in force stays")
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        content = {**content, "source": {**content["source"], "operator": {
            **content["source"]["operator"], "max_error_rate": float(alpha), "applied": now}}}
        atomic_write_text(files.certificate, json.dumps(content, indent=1) + "\n")
        rag.use_calibration(files.certificate, float(alpha))


def restore(rag: EdgeRAG, files: Files | None) -> None:
    """At start: put the operator's certificate back in force, unless ``--calibration`` named another. One that
    cannot be read is reported and the shipped one decides (``/api/health`` says which)."""
    if files is None or rag.certified.own or not files.certificate.is_file():
        return
    try:
        alpha = Calibration.load(files.certificate).source["operator"]["max_error_rate"]
        rag.use_calibration(files.certificate, float(alpha))
    except (EdgeRAGError, KeyError, TypeError, ValueError) as exc:
        log.warning("the operator's calibration %s is not used (%s); the shipped one decides", files.certificate,
                    exc)
