"""Four lanes between the HTTP server and one EdgeRAG: fast work, the kiosk page's, health, one generation at a time.

- The **fast lane** (one thread) runs the question path up to the route: the cache, encode → route →
  retrieve → gate → extract (milliseconds), and the answer's JSON when no generation follows, in one job per
  question. Writes run on their own thread (``jobs.py``);
  the store's own locks keep the two apart (a question waits for one commit at most).
- The **health lane** (one thread) makes ``/api/health``'s report: a kiosk's watchdog polls it with a timeout of a
  second or two, and on the fast lane it waited behind every question in line (one question held up: none within
  5 s), so a busy kiosk was restarted as hung.
- The **page lane** (one thread) makes the kiosk page's suggested questions: a ``decide`` per candidate, up to 60,
  seconds each time the documents or the certificate change; on the fast lane every question waited behind them.
- The **generation lane** (one thread) runs llama.cpp, first come first served. A question whose route
  is GPT is queued there and learns its place in line (``Queued`` events); RAG and REFUSE answers never
  wait for it, so extractive answers keep being served while a generation runs.

A queued or running generation is a ``Job`` that no client owns: a client that disconnects leaves the
running generation to finish and its Answer lands in the answer cache (asking again returns it at
once); a job that has not started when its client leaves is dropped from the line at once (those behind it move up). Each question has a deadline
(``ServeConfig.question_timeout_s``) counted from its arrival, waiting included. When the server stops, a running
generation ends at its next token and the waiting ones are not started (their clients hear 503), so shutdown never
waits for a long answer.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..events import Event, EventStream, Final, RouteDecided
from ..pipeline import EdgeRAG
from ..types import Answer, Route


@dataclass(frozen=True)
class Queued:
    """Place in the generation line: 0 = generating now, n = n generations ahead."""

    position: int
    name = "queue"

    def data(self) -> dict:
        return {"position": self.position}


@dataclass(frozen=True)
class Failed:
    """The question could not be answered: an HTTP status and a message a person can read."""

    status: int
    message: str
    name = "failed"

    def data(self) -> dict:
        return {"error": self.message, "status": self.status}


@dataclass(frozen=True)
class Answered:
    """The final Answer as the client is sent it: its JSON plus the text of the passages it used (``answer_json``)."""

    answer: dict
    name = "answer"

    def data(self) -> dict:
        return self.answer


ServerEvent = Event | Queued | Failed | Answered


class Busy(Exception):
    """The generation line is full."""


@dataclass
class Job:
    """One GPT-route question waiting for or running on the generation lane."""

    stream: EventStream
    deadline: float
    push: Callable[[ServerEvent | None], object]  # what it returns is not used
    abandoned: bool = False
    started: bool = field(default=False)


class Lanes:
    """The fast lane and the generation lane of one EdgeRAG (see the module docstring)."""

    def __init__(self, rag: EdgeRAG, question_timeout_s: float, max_queue: int) -> None:
        self.rag = rag
        self.timeout_s = question_timeout_s
        self.max_queue = max_queue
        self._fast = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-fast")
        self._generate = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-generate")
        self._page = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-page")
        self._health = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-health")
        self._line: list[Job] = []  # submitted generation jobs in order; [0] is running or next
        self._starting = threading.Lock()  # a job starts, or is abandoned before it starts, never both
        self._stopping = False

    async def fast(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the fast lane."""
        return await asyncio.get_running_loop().run_in_executor(self._fast, fn, *args)

    async def page(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the page lane."""
        return await asyncio.get_running_loop().run_in_executor(self._page, fn, *args)

    async def health(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the health lane."""
        return await asyncio.get_running_loop().run_in_executor(self._health, fn, *args)

    @property
    def waiting(self) -> int:
        """Generations in line; read on the event loop, the one thread that changes the line."""
        return len(self._line)

    async def ask(self, question: str) -> AsyncIterator[ServerEvent]:
        """Events of one question: route, then (GPT) queue places and tokens, then the answer or an error."""
        deadline = time.monotonic() + self.timeout_s
        stream = self.rag.ask_stream(question)
        first, final = await self.fast(self._decided, stream)
        yield first
        if final is not None:
            yield final
            return
        if len(self._line) > self.max_queue:
            stream.close()
            raise Busy(f"{len(self._line)} generations are waiting; try again shortly")
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[ServerEvent | None] = asyncio.Queue()
        job = Job(stream, deadline, lambda ev: loop.call_soon_threadsafe(inbox.put_nowait, ev))
        self._line.append(job)
        future = loop.run_in_executor(self._generate, self._run, job)
        future.add_done_callback(lambda f: self._leave(job, f.cancelled()))
        if len(self._line) > 1:
            yield Queued(len(self._line) - 1)
        try:
            while True:
                event = await inbox.get()
                if event is None:
                    return
                yield event
        finally:
            with self._starting:  # a job not started yet is dropped; a running one finishes and is cached
                job.abandoned = True
                dropped = not job.started
            if dropped:
                self._leave(job, cancelled=False)

    def _decided(self, stream: EventStream) -> tuple[ServerEvent, ServerEvent | None]:
        """Fast-lane thread: the route, and the answer too when no generation follows, in one job: a job per step
        queued each step behind every question that arrived meanwhile, so a crowd's first answer waited for the
        last one's route (20 questions at once: all 20 answers at 4.2 s, the first decided at 1.7 s)."""
        first = next(stream)
        if isinstance(first, RouteDecided) and first.route is Route.GPT and not first.cache_hit:
            return first, None
        return first, self._answered(next(stream))

    def _answered(self, event: ServerEvent) -> ServerEvent:
        """A Final as it is sent (``answer_json``), on the thread that has it; any other event as it is."""
        return Answered(answer_json(self.rag, event.answer)) if isinstance(event, Final) else event

    def _run(self, job: Job) -> None:
        """Generation-lane thread: drive the rest of the question's stream, then mark the end (None)."""
        try:
            with self._starting:
                if job.abandoned:
                    return
                job.started = True
            if self._stopping:  # its turn came after the server began to stop: nothing is generated for it
                job.push(Failed(503, "the server is shutting down"))
                return
            if time.monotonic() > job.deadline:
                job.push(Failed(504, f"timed out after {self.timeout_s:.0f} s waiting for the generator"))
                return
            job.push(Queued(0))
            for event in job.stream:
                job.push(self._answered(event))
                if self._stopping and not isinstance(event, Final):
                    job.push(Failed(503, "the server is shutting down"))
                    return
                if time.monotonic() > job.deadline and not isinstance(event, Final):
                    job.push(Failed(504, f"no answer within {self.timeout_s:.0f} s"))
                    return
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500, the lane goes on
            job.push(Failed(500, f"generation failed: {type(exc).__name__}: {exc}"))
        finally:
            job.stream.close()
            job.push(None)

    def _leave(self, job: Job, cancelled: bool) -> None:
        """A job ended, was abandoned before it started, or was cancelled at shutdown (event-loop thread): everyone
        behind it moves up one place and is told; the next one hears "0" from the generation thread when it starts."""
        if job not in self._line:  # abandoned before it started: it left the line then
            return
        self._line.remove(job)
        if cancelled:
            job.push(Failed(503, "the server is shutting down"))
            job.push(None)
        for position, waiting in enumerate(self._line):
            if position and not waiting.started:
                waiting.push(Queued(position))

    def stop(self) -> None:
        """End a running generation at its next token (the server is stopping)."""
        self._stopping = True

    def close(self) -> None:
        """End a running generation at its next token, drop the queued ones, stop the threads."""
        self.stop()
        for job in self._line:
            job.abandoned = True
        self._generate.shutdown(wait=True, cancel_futures=True)
        self._fast.shutdown(wait=True, cancel_futures=True)
        self._page.shutdown(wait=True, cancel_futures=True)
        self._health.shutdown(wait=True, cancel_futures=True)


def answer_json(rag: EdgeRAG, answer: Answer) -> dict:
    """The Answer's JSON plus the text of the passages it used (for the page's tappable sources)."""
    data = answer.to_dict()
    texts = {p.id: p.text for p in rag.store.passages([p.id for p in answer.passages])}
    data["sources"] = [{"id": p.id, "title": p.title, "text": texts.get(p.id, "")} for p in answer.passages]
    return data
