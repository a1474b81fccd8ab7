"""Writes run as jobs on one indexing thread, outside the request path: questions never wait for them.

An upload or a removal answers 202 with a job id at once; ``GET /api/jobs/{id}`` (or the upload's own
event stream) follows its progress; passages become visible to questions batch by batch, as each
commit lands (a commit takes the store's search lock for 32 inserts at a time and to switch to the new
commit, never while it saves the index file or writes its transaction: ``Store._commit``).
One indexing thread: writes happen one at a time, in the order they were accepted. Indexing encodes
with its own encoder session (EdgeRAG.indexing_encoder, of Config.index_threads threads: the server with writes
opens its EdgeRAG with serve.INDEX_THREADS, so the memory plan holds that session), so the question path's session
keeps its threads; it is made at the first job that encodes (an upload), not for removals or calibration.
When the server stops, a running job stops at its next commit (every commit is whole: the store
stays consistent, and its documents are marked incomplete, so uploading the file again adds what is missing);
queued jobs are dropped.
"""
from __future__ import annotations

import asyncio
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..errors import BudgetError, DiskFullError, EdgeRAGError, InputError
from ..pipeline import EdgeRAG
from ..retrieval.encode import Encoder
from .errors import disk_full_message, status_of

KEEP_JOBS = 100  # finished jobs remembered for GET /api/jobs/{id}
POLL_S = 0.2  # how often a progress stream looks at its job


@dataclass
class Job:
    """One write: its state (queued → running → done | failed), progress and result."""

    id: str
    kind: str
    total_files: int
    state: str = "queued"
    files: list[dict] = field(default_factory=list)
    passages_done: int = 0
    passages_planned: int = 0
    result: dict = field(default_factory=dict)
    error: dict | None = None
    changes: int = 0  # bumped on every update: streams send an event when it moves
    stopping: bool = False  # the server is stopping: the job ends at its next commit

    def check(self) -> None:
        """Raise Stopped if the server is stopping (called at commit boundaries)."""
        if self.stopping:
            raise Stopped(f"the server stopped; {self.passages_done} passages of this job were committed: send it "
                          "again to add the rest")

    def to_dict(self) -> dict:
        data = {"id": self.id, "kind": self.kind, "state": self.state, "files_total": self.total_files,
                "files": list(self.files), "passages_done": self.passages_done,
                "passages_planned": self.passages_planned, **self.result}
        return data | ({"error": self.error["error"], "status": self.error["status"]} if self.error else {})

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


Work = Callable[[Job], dict]


class Stopped(EdgeRAGError):
    """The server stopped while the job ran."""


class Jobs:
    """The indexing thread of one EdgeRAG and the jobs it has run."""

    def __init__(self, rag: EdgeRAG) -> None:
        self.rag = rag
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edge-rag-index")
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._encoder: Encoder | None = None
        self._stopping = False

    def submit(self, kind: str, total_files: int, work: Work) -> Job:
        """Queue ``work(job)``; it returns the job's result fields (work that encodes takes ``encoder()``)."""
        job = Job(secrets.token_hex(8), kind, total_files, stopping=self._stopping)
        with self._lock:
            self._jobs[job.id] = job
            while len(self._jobs) > KEEP_JOBS and next(iter(self._jobs.values())).finished:
                self._jobs.popitem(last=False)
        self._pool.submit(self._run, job, work)
        return job

    def encoder(self) -> Encoder:
        """The indexing encoder session, made on first use (on the indexing thread, by a job that encodes)."""
        if self._encoder is None:
            self._encoder = self.rag.indexing_encoder()
        return self._encoder

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    async def follow(self, job: Job) -> AsyncIterator[Job]:
        """The job each time it changes, until it has finished."""
        seen = -1
        while True:
            if job.changes != seen:
                seen = job.changes
                yield job
                if job.finished:
                    return
            await asyncio.sleep(POLL_S)

    def stop(self) -> None:
        """Have every job stop at its next commit, or sooner: the batch being encoded is aborted (it never reached
        a commit); no new job starts (the server is stopping)."""
        self._stopping = True
        with self._lock:
            for job in self._jobs.values():
                job.stopping = True
        if self._encoder is not None:
            self._encoder.stop()

    def close(self) -> None:
        """Stop the running job at its next commit (its committed batches stay), drop the queued ones."""
        self.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, job: Job, work: Work) -> None:
        job.state, job.changes = "running", job.changes + 1
        try:
            job.check()
            job.result = work(job)
            job.state = "done"
        except Exception as exc:  # noqa: BLE001 - reported in the job; the indexing thread goes on
            job.error, job.state = _failure(job, exc), "failed"
        job.changes += 1


def _failure(job: Job, exc: Exception) -> dict:
    """The job's error and HTTP status for ``exc`` (whatever it is once the server is stopping: Stopped's)."""
    try:
        job.check()
    except Stopped as stopped:
        exc = stopped
    if isinstance(exc, Stopped):
        return {"error": str(exc), "status": 503}
    if isinstance(exc, EdgeRAGError):
        status = 422 if isinstance(exc, InputError) else 507 if isinstance(exc, BudgetError | DiskFullError) else \
            status_of(exc)  # 507: memory or disk; 503: the store unreachable
        return {"error": str(exc), "status": status}
    if (message := disk_full_message(exc)) is not None:
        return {"error": message, "status": 507}
    return {"error": f"{type(exc).__name__}: {exc}", "status": 500}


def progress_of(job: Job) -> Callable[[int, int], None]:
    """An indexing progress callback that records passages done / planned of the file in hand."""
    base = job.passages_done

    def report(done: int, planned: int) -> None:
        job.passages_done, job.passages_planned = base + done, max(job.passages_planned, base + planned)
        job.changes += 1
        job.check()  # after a commit: stopping here keeps the store whole

    return report
