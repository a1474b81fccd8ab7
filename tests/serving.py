"""A real ``edge-rag serve`` app on real uvicorn, on an ephemeral 127.0.0.1 port, in a background thread."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import httpx

from edge_rag.config import Config, Tier
from edge_rag.pipeline import EdgeRAG
from edge_rag.serve import _bind
from edge_rag.serve.app import create_app
from edge_rag.serve.config import ServeConfig
from edge_rag.serve.http import server as http_server

# Short generations keep the tests' llama.cpp time bounded; the decoding rules are the same.
TEST_MAX_NEW_TOKENS = 12
# Open-ended questions on the sample corpus that the default pipeline tends to route to GPT; tests pick
# the ones ``decide`` actually routes there instead of hard-coding routes.
GPT_CANDIDATES = (
    "What can children do at the museum?",
    "Tell me about Big Mary",
    "What happens in the Energy Works gallery?",
    "Tell me about the planetarium",
    "Tell me about the history of the building",
    "What can I do in the Little Sparks area?",
    "Tell me about Margaret Hollins",
    "What facilities are there for disabled visitors?",
)
OFF_TOPIC = "How do I bake sourdough bread?"
# The form of a multi-hop question (edge_rag.decision.kind) about the sample corpus: no multi-hop answer is certified.
MULTI_HOP = ("What is the county seat of the county where the museum that holds Big Mary, the steam engine built in "
             "1889 by the company which also built the pumping station, is located?")
TOKEN = "test-write-token"  # the API token of the test servers (writes need it)
WRITE = {"authorization": f"Bearer {TOKEN}"}


def test_config() -> Config:
    """The seeds' decision (certified=False): it sends open questions to generation, which the server's lanes,
    queue and streaming tests need; the certified default generates only where generation is certified. With the
    indexing encoder the test servers' writes use planned (index_threads, as `edge-rag serve` with a token)."""
    c = Config(temperature=0.0, certified=False, index_threads=1)
    tiers = {t: replace(spec, max_new_tokens=min(spec.max_new_tokens, TEST_MAX_NEW_TOKENS))
             for t, spec in c.tiers.items()}
    assert set(tiers) == set(Tier)
    return c.with_(tiers=tiers)


def gpt_questions(rag: EdgeRAG, n: int) -> list[str]:
    found = [q for q in GPT_CANDIDATES if rag.decide(q).route.value == "GPT"]
    if len(found) < n:
        raise AssertionError(f"need {n} GPT-route questions on the sample corpus, found {found}; "
                             "extend GPT_CANDIDATES")
    return found[:n]


@contextmanager
def running_server(rag: EdgeRAG, config: ServeConfig | None = None):
    """Serve ``rag`` until the block ends; yields the base URL. The app closes ``rag`` on shutdown."""
    sock = _bind("127.0.0.1", 0)  # the socket `edge-rag serve` listens on
    # A generous per-question timeout: this box's llama.cpp speed varies with load; the timeout itself is
    # tested with the CLI server (test_cli_serve_token_timeout_and_sigterm).
    config = config or ServeConfig(port=0, question_timeout_s=900, token=TOKEN, shutdown_grace_s=5)
    server = http_server(create_app(rag, config), config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def wait_job(url: str, accepted: httpx.Response, timeout_s: float = 600) -> dict:
    """The finished state of the job a 202 response started (polled over GET /api/jobs/{id})."""
    assert accepted.status_code == 202, accepted.text
    deadline = time.monotonic() + timeout_s
    while True:
        job = httpx.get(url + accepted.headers["location"], timeout=30).json()
        if job["state"] in ("done", "failed") or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def line_holds(url: str, n: int) -> None:
    """Wait (30 s at most) until the server's generation line holds ``n`` questions, as /api/health counts them."""
    for _ in range(600):
        if httpx.get(f"{url}/api/health", timeout=30).json()["generation"]["waiting"] == n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the generation line never held {n}")


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    """All (event, data) pairs of a finished SSE response."""
    return list(iter_sse(response))


def iter_sse(response: httpx.Response):
    import json

    event, data = None, []
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and event is not None:
            yield event, json.loads("\n".join(data))
            event, data = None, []
