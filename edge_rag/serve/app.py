"""The HTTP API and the kiosk page of ``edge-rag serve`` (Starlette).

    GET  /                    the kiosk page (edge_rag/static/)
    GET  /api/health          bundle, corpus size, memory plan, memory now, generation line, the decision (health.py);
                              ?deep=1 also measures search recall (doctor.py): token only, one at a time
    GET  /api/kiosk           suggested questions, page settings, and which certificate decides the answers
    POST /api/ask             {"question": "..."} → the Answer JSON (+ "sources": title and passage text)
    GET  /api/ask/stream?q=   Server-Sent Events: route, queue…, token…, answer (or failed)
    POST /api/documents       multipart files (.txt .md .json .jsonl .pdf .html): 202 + an indexing job;
                              with "Accept: text/event-stream" it streams the job's progress instead; a file
                              is known by the path the client sent, in any case (uploads.py)
    DELETE /api/documents/{id} remove one document: 202 + a job
    GET  /api/jobs/{id}       an indexing (or calibration) job's state and progress

The operator's page ``/admin`` and its ``/api/admin/…`` routes (label logged questions, calibrate, apply) are in
admin.py.

Writes, /api/admin and the deep health check need ``Authorization: Bearer <token>`` (``auth.py``; no token configured:
read-only, 403); every request needs this server's own Host, and Origin when a browser sends one (``origin.py``).
Every error is JSON ``{"error": message, "status": code}`` with that HTTP status.
"""
from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from ..documents.parse_child import Parser
from ..errors import EdgeRAGError, check_question
from ..pipeline import EdgeRAG
from ..storage.doctor import check_recall
from .admin import Admin
from .auth import require_writer
from .bodies import limited, parse_json, read_body
from .config import ServeConfig
from .errors import HANDLERS, error, status_of
from .health import decision, health_report
from .jobs import Job, Jobs, progress_of
from .lanes import Answered, Busy, Failed, Lanes
from .origin import SameOrigin
from .pages import PAGE_HEADERS, STATIC, PageFiles
from .question_log import QuestionLog
from .suggest import suggestions
from .uploads import Folders, remove_stale_folders, source_of, unstash

log = logging.getLogger("edge_rag")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def create_app(rag: EdgeRAG, config: ServeConfig) -> Starlette:
    """The ASGI app serving ``rag``; it closes ``rag`` when the server shuts down."""
    if config.token and not rag.config.index_threads:  # writes index with a second session, which must be planned
        raise EdgeRAGError("a server that accepts writes indexes with a second encoder session: open its EdgeRAG with "
                           "Config(index_threads=1) so that its memory plan holds it")
    lanes = Lanes(rag, config.question_timeout_s, config.max_queue)
    questions = QuestionLog(Path(config.question_log) if config.question_log else None)
    jobs = Jobs(rag)
    parser = Parser()  # the uploads' PDF/HTML parse children
    # Uploads are parsed one at a time on a thread of their own (one child of PARSE_MEMORY_MB at once): in asyncio's
    # default executor, 6 threads on 2 cores, parses filled it and every logged question waited for a free thread.
    parsing = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-parse")
    # The question log's appends, so too (they are one at a time anyway, under its lock): in the default executor, a
    # few /admin listings of a long log filled it and a question waited 12 s for a thread to log it.
    appending = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-log")
    remove_stale_folders()
    folders = Folders()  # the uploads' files and documents, waiting for their jobs
    deep_check = asyncio.Lock()  # one recall measurement at a time: it reads every stored vector
    admin = Admin(rag, config, jobs, STATIC, PAGE_HEADERS)  # the operator's certificate, if one was applied

    @asynccontextmanager
    async def lifespan(app: Starlette):
        try:  # the first visitor's question does not wait for a model to load
            await asyncio.to_thread(rag.warm_up)
        except EdgeRAGError as exc:  # the page and health still serve; the questions that need it fail saying why
            log.warning("a model did not load: %s", exc)
        yield
        parser.stop()  # a parse in progress does not hold the shutdown
        parsing.shutdown(wait=True, cancel_futures=True)
        appending.shutdown(wait=True)
        jobs.close()
        folders.remove_all()  # of the uploads whose jobs it dropped
        admin.close()
        lanes.close()
        rag.close()

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    async def health(request: Request) -> Response:
        if request.query_params.get("deep") != "1":
            return _health(await lanes.health(health_report, rag, lanes.waiting))  # a watchdog's: no question ahead
        require_writer(request, config.token)  # it costs seconds of CPU on a large store: not for anyone to loop on
        if deep_check.locked():
            raise HTTPException(429, "a deep health check is running; ask again when it has finished")
        async with deep_check:
            data = await lanes.health(health_report, rag, lanes.waiting)
            if data["status"] == "ok":
                data["recall"] = (await asyncio.to_thread(check_recall, rag.store)).to_dict()  # off the fast lane
        return _health(data)

    def kiosk_page() -> dict:
        """Both halves read the store under its lock (a commit step or an index reload may hold it): never on the
        event loop, which every other request needs meanwhile; on the page lane, where no question waits for it."""
        return {"title": config.title, "questions": suggestions(rag, config.suggestions), "decision": decision(rag),
                "idle_reset_s": config.idle_reset_s, "max_question_chars": config.max_question_chars,
                "question_timeout_s": config.question_timeout_s}  # past it (and a margin), the page stops waiting

    async def kiosk(request: Request) -> Response:
        return JSONResponse(await lanes.page(kiosk_page))

    async def accepted(text: str) -> str:
        """The question as the server takes it (``_question``'s checks); what was typed (as long as the page allows)
        is kept in the question log if there is one: the calibration is to see the kiosk's questions as they come."""
        question = _question(text, config)
        if questions.path is not None:  # no thread hop when nothing is kept
            await asyncio.get_running_loop().run_in_executor(appending, questions.add, text)
        return question

    async def ask(request: Request) -> Response:
        payload = parse_json(await read_body(request, config.max_body_bytes))
        if not isinstance(payload, dict) or not isinstance(payload.get("question"), str):
            raise HTTPException(400, 'send {"question": "..."}')
        question = await accepted(payload["question"])
        answering, left = asyncio.ensure_future(answer(question)), asyncio.ensure_future(_disconnect(request))
        await asyncio.wait((answering, left), return_when=asyncio.FIRST_COMPLETED)
        left.cancel()
        if not answering.done():  # the client left: its question is abandoned, as a stream's is (Lanes.ask)
            answering.cancel()
            return error(503, "the client left before its answer")
        return answering.result()

    async def answer(question: str) -> Response:
        try:
            async for event in lanes.ask(question):
                if isinstance(event, Failed):
                    return error(event.status, event.message)
                if isinstance(event, Answered):
                    return JSONResponse(event.answer)
        except Busy as exc:
            return error(503, str(exc))
        return error(500, "the question ended without an answer")

    async def ask_stream(request: Request) -> Response:
        if request.method == "HEAD":  # a safe method (curl -I, a link checker): the headers, nothing asked or logged
            return Response(media_type="text/event-stream", headers=SSE_HEADERS)
        question = await accepted(request.query_params.get("q", ""))

        async def events():
            try:
                async for event in _with_keepalive(lanes.ask(question), config.keepalive_s):
                    if event is None:
                        yield ": keepalive\n\n"  # an SSE comment: keeps idle connections open while waiting
                        continue
                    yield _sse(event.name, event.data())
            except Busy as exc:
                yield _sse("failed", {"error": str(exc), "status": 503})
            except EdgeRAGError as exc:
                yield _sse("failed", {"error": str(exc), "status": status_of(exc)})

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def upload(request: Request) -> Response:
        require_writer(request, config.token)
        length = request.headers.get("content-length")
        if length is None:
            raise HTTPException(411, "uploads need a Content-Length header")
        if not length.isdigit():
            raise HTTPException(400, f"Content-Length {length[:40]!r} is not a number of bytes")
        if int(length) > config.max_upload_bytes:
            raise HTTPException(413, f"upload of {int(length)} bytes is over the {config.max_upload_bytes} byte limit")
        form = await limited(request, config.max_upload_bytes).form(max_files=config.max_upload_files, max_fields=8)
        files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
        if not files:
            raise HTTPException(400, "send the documents as multipart form field 'file'")
        # Every file parsed before any is added, off the fast lane; the documents wait for their job on disk.
        tmp, saved = await folders.save_and_parse(files, parser, parsing)

        def work(job: Job) -> dict:
            with folders.done(tmp):
                for name, path in saved:
                    job.check()
                    docs = unstash(path)
                    added = rag.add_documents(docs, progress_of(job), source_of(name), jobs.encoder())
                    job.files.append({"file": name, "documents": len(docs), "passages": added,
                                      "ids": [d.doc_id for d in docs]})  # what DELETE /api/documents/{id} takes
                    job.changes += 1
                return {"corpus_passages": rag.store.count}

        job = jobs.submit("upload", len(saved), work)
        if "text/event-stream" in request.headers.get("accept", ""):
            return StreamingResponse(_job_events(jobs, job), media_type="text/event-stream", headers=SSE_HEADERS)
        return _accepted(job)

    async def remove(request: Request) -> Response:
        require_writer(request, config.token)
        doc_id = request.path_params["doc_id"]
        if await asyncio.to_thread(rag.store.document, doc_id) is None:
            raise HTTPException(404, f"no document with id {doc_id!r}")
        job = jobs.submit("remove", 0, lambda job: {"document": doc_id, "passages_removed": rag.remove([doc_id])})
        return _accepted(job)

    async def job_state(request: Request) -> Response:
        job = jobs.get(request.path_params["job_id"])
        if job is None:
            raise HTTPException(404, "no such job (finished jobs are kept for the last 100 writes)")
        return JSONResponse(job.to_dict())

    routes = [
        Route("/", page),
        Route("/api/health", health),
        Route("/api/kiosk", kiosk),
        Route("/api/ask", ask, methods=["POST"]),
        Route("/api/ask/stream", ask_stream),
        Route("/api/documents", upload, methods=["POST"]),
        Route("/api/documents/{doc_id:path}", remove, methods=["DELETE"]),
        Route("/api/jobs/{job_id}", job_state),
        *admin.routes(),
        Mount("/static", PageFiles(), name="static"),
    ]
    handlers = HANDLERS
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                    middleware=[Middleware(SameOrigin, allowed_hosts=config.allowed_hosts)])

    def stop() -> None:
        """Called as shutdown begins (http.Server): a running indexing job stops at its next commit, a generation
        at its next token."""
        jobs.stop()
        lanes.stop()

    app.state.stop = stop
    return app


def _health(report: dict) -> JSONResponse:  # 503: the store found damaged, what a watchdog polling it reads
    return JSONResponse(report, status_code=200 if report["status"] == "ok" else 503)


def _accepted(job: Job) -> JSONResponse:
    return JSONResponse({**job.to_dict(), "url": f"/api/jobs/{job.id}"}, status_code=202,
                        headers={"Location": f"/api/jobs/{job.id}"})


async def _job_events(jobs: Jobs, job: Job):
    """The job's progress as Server-Sent Events: ``progress``…, then ``done`` or ``failed``."""
    async for state in jobs.follow(job):
        yield _sse(state.state if state.finished else "progress", state.to_dict())


async def _with_keepalive(events, every_s: float):
    """The events, with None whenever ``every_s`` seconds pass without one (the pending step is never
    cancelled: cancelling it would abandon the question)."""
    step = None
    try:
        while True:
            step = step or asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({step}, timeout=every_s)
            if not done:
                yield None
                continue
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield event
    finally:
        if step is not None:
            step.cancel()  # the client left: the question is abandoned (see Lanes.ask)


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (its body has been read: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _question(text: str, config: ServeConfig) -> str:
    if len(text) > config.max_question_chars:
        raise HTTPException(413, f"the question is {len(text)} characters; the limit is {config.max_question_chars}")
    return check_question(text)


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"
