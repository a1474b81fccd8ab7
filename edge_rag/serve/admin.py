"""The operator page ``/admin`` and its JSON API: label the kiosk's logged questions, calibrate on them, apply.

    GET  /admin                       the page (edge_rag/static/admin.*): a shell that holds no data; it asks for
                                      the API token and sends it with every /api/admin call
    GET  /api/admin/questions         logged questions, newest first, same ones grouped, each with its label: a
                                      page at a time (?offset=0&limit=100, at most 1000; "more": true if more)
    POST /api/admin/labels            {"question", "label": answer|not-in-documents|off-topic|null, "answers"}
    GET  /api/admin/search?q=         the store's passages for some words (the lexical search): to find an answer
                                      in the documents; the device's own answer is never shown (a label copied
                                      from it would certify the device by its own word)
    GET  /api/admin/export            the labelled questions as the file `edge-rag calibrate --questions` reads
    POST /api/admin/import            such a file (JSON list or JSON lines): its labels, all or none
    POST /api/admin/calibrate         202 + a job (GET /api/jobs/{id}): the table per alpha and the risk curve
    POST /api/admin/apply             {"calibration": job id, "max_error_rate": alpha}: the certificate in force

Every /api/admin call needs the write token and passes the same Host/Origin checks as writes (origin.py).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..decision.labels import Labels, exported, groups
from ..errors import InputError, ascii_width
from ..pipeline import EdgeRAG
from ..retrieval.lexical import query_terms
from . import question_log
from .admin_cal import Files, apply, calibrate, files_of, ready, restore
from .auth import require_writer
from .bodies import parse_json, read_body
from .config import ServeConfig
from .health import decision
from .jobs import Job, Jobs

SEARCH_K = 8  # passages a search shows
KEEP_CANDIDATES = 5  # calibrations measured and not yet applied, kept for "Apply"
CHUNK = 1 << 16  # bytes of the export sent at a time: the log is read as it is sent (a thread's hop per chunk)
PAGE, MAX_PAGE = 100, 1000  # questions a listing shows by default, at most: a full log is ~150,000


class Admin:
    """The operator's routes over one EdgeRAG; the labels open on first use."""

    def __init__(self, rag: EdgeRAG, config: ServeConfig, jobs: Jobs, static: Path, headers: dict) -> None:
        self.rag, self.config, self.jobs, self.static, self.headers = rag, config, jobs, static, headers
        self.files: Files | None = files_of(rag, config.question_log)
        self._labels: Labels | None = None
        self._candidates: dict[str, tuple[dict, tuple[str, int]]] = {}  # job id → (calibration content, store stamp)
        self._applying = asyncio.Lock()
        restore(rag, self.files)

    def routes(self) -> list[Route]:
        return [Route("/admin", self.page), Route("/api/admin/questions", self.questions),
                Route("/api/admin/labels", self.label, methods=["POST"]), Route("/api/admin/search", self.search),
                Route("/api/admin/export", self.export), Route("/api/admin/import", self.import_, methods=["POST"]),
                Route("/api/admin/calibrate", self.calibrate, methods=["POST"]),
                Route("/api/admin/apply", self.apply, methods=["POST"])]

    def close(self) -> None:
        if self._labels is not None:
            self._labels.close()

    async def page(self, request: Request) -> Response:
        return FileResponse(self.static / "admin.html", headers=self.headers)

    def labels(self, request: Request) -> Labels:
        """The label file, for a request carrying the token (401/403 otherwise; 409 with nowhere to keep it)."""
        require_writer(request, self.config.token)
        if self.files is None:
            raise HTTPException(409, "labels are kept beside the store or the question log: start the server with "
                                     "--question-log FILE.jsonl")
        if self._labels is None:
            self._labels = Labels(self.files.labels)
        return self._labels

    async def questions(self, request: Request) -> Response:
        labels = self.labels(request)
        offset, limit = _count(request, "offset", 0, None), _count(request, "limit", PAGE, MAX_PAGE)

        def listing() -> dict:
            held, stamp = labels.all(), self.rag.store.stamp
            shown, more = groups(held, question_log.newest(self._log), stamp, offset, limit)
            return {"questions": shown, "question_log": self.config.question_log is not None,
                    "labelled": len(held), "stale": sum(x.store != stamp for x in held.values()),
                    "least": self.config.min_labels, "offset": offset, "limit": limit, "more": more}

        return JSONResponse(await asyncio.to_thread(listing))

    async def label(self, request: Request) -> Response:
        labels = self.labels(request)
        body = parse_json(await read_body(request, self.config.max_body_bytes))
        if not isinstance(body, dict) or not isinstance(body.get("question"), str):
            raise HTTPException(400, 'send {"question": "...", "label": "answer", "answers": ["..."]}')
        if body.get("label") is None:
            return JSONResponse({"removed": await asyncio.to_thread(labels.remove, body["question"])})
        # the store's stamp too off the event loop: it waits for the store's lock, as long as a commit step holds it
        saved = await asyncio.to_thread(lambda: labels.set(body["question"], body["label"], body.get("answers", []),
                                                           self.rag.store.stamp))
        return JSONResponse(saved.to_dict())

    async def search(self, request: Request) -> Response:
        self.labels(request)
        terms = query_terms(ascii_width(request.query_params.get("q", "")[: self.config.max_question_chars]))

        def found() -> list[dict]:
            hits = [pid for pid, _ in self.rag.store.search_text(terms, SEARCH_K)] if terms else []
            return [{"title": p.title, "text": p.text} for p in self.rag.store.passages(hits)]

        return JSONResponse({"passages": await asyncio.to_thread(found)})

    async def export(self, request: Request) -> Response:
        labels = self.labels(request)
        held = await asyncio.to_thread(labels.all)
        body = _chunks(json.dumps(e, ensure_ascii=False) + "\n" for e in exported(held, question_log.lines(self._log)))
        first = await asyncio.to_thread(next, body)  # a log that cannot be read is refused, not cut off mid-file
        return StreamingResponse(itertools.chain([first], body), media_type="application/x-ndjson",
                                 headers={"Content-Disposition": 'attachment; filename="labelled-questions.jsonl"'})

    async def import_(self, request: Request) -> Response:
        labels = self.labels(request)
        data = await read_body(request, self.config.max_upload_bytes)
        suffix = ".json" if data.lstrip()[:1] == b"[" else ".jsonl"  # the two forms `edge-rag calibrate` reads

        def take() -> int:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"labels{suffix}"
                path.write_bytes(data)
                try:
                    return labels.import_file(path, self.rag.store.stamp, question_log.lines(self._log))
                except InputError as exc:  # it names the temporary file: name the upload instead
                    raise InputError(str(exc).replace(str(path), "the file")) from None

        return JSONResponse({"labelled": await asyncio.to_thread(take)})

    async def calibrate(self, request: Request) -> Response:
        labels = self.labels(request)
        stamp = await asyncio.to_thread(lambda: self.rag.store.stamp)  # it waits for the store's lock
        entries, labelled = await asyncio.to_thread(
            lambda: ready(labels.all(), question_log.lines(self._log), stamp, self.config.min_labels))
        files = self.files
        assert files is not None  # self.labels() made sure

        def work(job: Job) -> dict:
            content, result = calibrate(self.rag, files, entries, labelled, job, stamp)
            self._candidates[job.id] = (content, (result["store_id"], result["store_version"]))
            while len(self._candidates) > KEEP_CANDIDATES:
                self._candidates.pop(next(iter(self._candidates)))
            return result

        job = self.jobs.submit("calibrate", 0, work)
        return JSONResponse({**job.to_dict(), "url": f"/api/jobs/{job.id}"}, status_code=202,
                            headers={"Location": f"/api/jobs/{job.id}"})

    async def apply(self, request: Request) -> Response:
        self.labels(request)
        body = parse_json(await read_body(request, self.config.max_body_bytes))
        if not isinstance(body, dict) or not isinstance(body.get("calibration"), str):
            raise HTTPException(400, 'send {"calibration": "<the id a calibration job gave>"}')
        found = self._candidates.get(body["calibration"])  # one look: a calibration job's thread may evict it
        if found is None:
            raise HTTPException(404, "no such calibration: calibrate first (the last few are kept until applied)")
        content, version = found
        files = self.files
        assert files is not None
        async with self._applying:  # one swap at a time; the file written is the one in force
            await asyncio.to_thread(apply, self.rag, files, content, version, body.get("max_error_rate"))
        return JSONResponse({"decision": await asyncio.to_thread(decision, self.rag)})

    @property
    def _log(self) -> Path | None:
        return Path(self.config.question_log) if self.config.question_log else None


def _count(request: Request, name: str, default: int, most: int | None) -> int:
    """The query's whole number ``name`` (``default`` if absent): 400 unless 0 ≤ it ≤ ``most``."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or (most is not None and int(text) > most):
        raise HTTPException(400, f"{name} is a whole number" + (f" from 0 to {most}" if most is not None else ""))
    return int(text)


def _chunks(lines: Iterable[str]) -> Iterator[bytes]:
    """``lines`` joined into pieces of about CHUNK bytes (Starlette iterates them in a thread, off the event loop)."""
    held: list[bytes] = []
    size = 0
    for line in lines:
        held.append(line.encode())
        size += len(held[-1])
        if size >= CHUNK:
            yield b"".join(held)
            held, size = [], 0
    yield b"".join(held)
