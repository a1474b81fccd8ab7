"""Questions during a large upload, over real HTTP: indexing never stalls them (issue #26).

Before: uploads were indexed on the thread that answers questions, so during a 5 MB upload (25,386
passages, 111 s of indexing) a question sent 3 s in was answered after 108.5 s. Now the upload is a job
on its own thread: this test uploads ~0.25 MB of distinct sentences and asks extractive questions, each
``PAUSE_S`` after the last answer, until the job is done. Gated on invariants, not speed: questions are answered
*while* the job is running (the old server answered none), each within the server's ``--timeout``, and passages become
visible batch by batch. ``python -m pytest tests/test_serve_load.py -s`` prints the latencies.
"""
from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass, field

import pytest

httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'edge-rag[serve]'")

import serving  # noqa: E402
from serving import TOKEN, WRITE, running_server  # noqa: E402

from edge_rag.documents.indexing import INDEX_BATCH_PASSAGES  # noqa: E402
from edge_rag.pipeline import EdgeRAG  # noqa: E402
from edge_rag.serve.config import ServeConfig  # noqa: E402

TIMEOUT_S = 60.0
# Between questions once DURING have been answered while the job runs (back to back until then, so a CPU many times
# faster than this one, whose job ends sooner, still meets the floor): ~100 meet the job instead of ~400 back to back,
# which cost a third of the file's CPU; the old server answered none while indexing, however many were sent.
PAUSE_S = 0.1
DURING = 10
# ~0.25 MB: two commits of INDEX_BATCH_PASSAGES while the job runs (each store size seen by /api/health for the
# seconds the next batch encodes), then the rest at the end
SENTENCES = 2 * INDEX_BATCH_PASSAGES + 500
QUESTIONS = ("How much does an adult ticket cost?", "Who founded the Harbourlight Science Museum?",
             "When does the museum open?", "How do I bake sourdough bread?")
WORDS = ("copper", "walnut", "linen", "amber", "slate", "cedar", "pewter", "indigo", "ochre", "willow")


def upload_text(n: int) -> bytes:
    """``n`` distinct sentences, one passage each."""
    return "\n".join(f"Crate {i} in store room {i % 97} holds {WORDS[i % 10]} fittings and {WORDS[i // 10 % 10]} "
                     f"samples catalogued in {1900 + i % 120}." for i in range(n)).encode()


def test_questions_are_answered_while_a_large_upload_is_indexed(bundle_dir, sample_db, tmp_path):
    r = upload_while_asking(bundle_dir, sample_db, tmp_path, upload_text(SENTENCES), pause_s=PAUSE_S, pause_after=DURING)
    print(f"\n{r.summary()}")
    assert r.job["state"] == "done", r.job
    assert r.added >= SENTENCES and r.job["corpus_passages"] == r.before + r.added
    assert len(r.during) >= DURING, "questions waited for the indexing job"
    assert max(r.during) < TIMEOUT_S
    assert len(r.counts - {r.before, r.before + r.added}) >= 2, "passages did not become visible batch by batch"


@dataclass
class Run:
    job: dict
    before: int
    during: list[float] = field(default_factory=list)  # seconds per question answered while the job ran
    counts: set[int] = field(default_factory=set)  # corpus sizes /api/health reported meanwhile

    @property
    def added(self) -> int:
        return self.job["files"][0]["passages"] if self.job.get("files") else 0

    def summary(self) -> str:
        ms = sorted(x * 1000 for x in self.during) or [0.0]
        return (f"{len(self.during)} questions answered during indexing of {self.added} passages: p50 "
                f"{statistics.median(ms):.0f} ms, p95 {ms[min(len(ms) - 1, int(0.95 * len(ms)))]:.0f} ms, max "
                f"{ms[-1]:.0f} ms; corpus sizes seen: {len(self.counts)}; job {self.job['state']}")


def upload_while_asking(bundle_dir, sample_db, tmp_path, text: bytes, every: int = 0, pause_s: float = 0.0,
                        pause_after: int = 0) -> Run:
    """Serve a copy of the sample store, upload ``text``, ask questions one after another until the job ends:
    back to back until ``pause_after`` were answered while it ran, then ``pause_s`` apart (``every`` > 0: print the
    summary so far every that many questions)."""
    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    rag = EdgeRAG(db, bundle=bundle_dir, config=serving.test_config().with_(cache_size=0))  # every question in full
    config = ServeConfig(port=0, question_timeout_s=TIMEOUT_S, token=TOKEN)
    with running_server(rag, config) as url, httpx.Client(timeout=httpx.Timeout(TIMEOUT_S * 2, connect=10)) as c:
        run = Run({}, rag.store.count)
        r = c.post(f"{url}/api/documents", files={"file": ("crates.txt", text)}, headers=WRITE)
        assert r.status_code == 202, r.text
        job_url, n = url + r.headers["location"], 0
        while (job := c.get(job_url).json())["state"] not in ("done", "failed"):
            run.counts.add(c.get(f"{url}/api/health").json()["corpus"]["passages"])
            start = time.monotonic()
            answer = c.post(f"{url}/api/ask", json={"question": QUESTIONS[n % len(QUESTIONS)]})
            elapsed = time.monotonic() - start
            n += 1
            assert answer.status_code == 200, answer.text
            assert answer.json()["route"] in ("RAG", "REFUSE")
            run.job = c.get(job_url).json()
            if run.job["state"] == "running":  # answered while the upload was being indexed
                run.during.append(elapsed)
            if every and n % every == 0:
                print(run.summary(), f"({run.job['passages_done']} of {run.job['passages_planned']})", flush=True)
            if len(run.during) >= pause_after:
                time.sleep(pause_s)
        run.job = job
    return run


if __name__ == "__main__":  # docs/decisions/store-commit.md: python tests/test_serve_load.py --mb 19
    import argparse
    import tempfile
    from pathlib import Path

    from edge_rag.models.registry import default_bundle

    ap = argparse.ArgumentParser(description="questions during one large upload; prints their latencies")
    ap.add_argument("--mb", type=float, default=19, help="upload size (the server takes 20 MB per request)")
    args = ap.parse_args()
    line = len(upload_text(1000)) / 1000
    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / "sample"
        with EdgeRAG(sample, bundle=default_bundle("gemma")) as rag:
            rag.add_files([Path(__file__).resolve().parent.parent / "edge_rag" / "sample" / "docs"])
        result = upload_while_asking(default_bundle("gemma"), sample, Path(tmp),
                                     upload_text(int(args.mb * 2**20 / line)), every=200)
    print(result.summary())
