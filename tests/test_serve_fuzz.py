"""2,040 malformed requests against a real server: every one gets a 4xx JSON error, none a 500, and the
connection stays open (issue #26: HTTP 500, plain text and a closed connection for a body of 16,000 ``[``,
3,000 nested objects, a 5,000-digit integer, a 300-character file name, a JSON file of 100,000 ``[``; issue #43:
a lone surrogate in an uploaded JSON text or title, HTML nested too deep, file names with folders).

Seeded and bounded: one server on 127.0.0.1, one keep-alive client, no request that is valid (nothing is
indexed, no question reaches the models).
"""
from __future__ import annotations

import json
import random
import shutil

import pytest

httpx = pytest.importorskip("httpx", reason="httpx is in the dev extra: pip install 'edge-rag[dev,serve]'")
pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'edge-rag[serve]'")

import serving  # noqa: E402
from serving import WRITE, running_server  # noqa: E402

from edge_rag.pipeline import EdgeRAG  # noqa: E402

ROUNDS = 170  # × 12 kinds of request = 2,040


def _nested(rnd: random.Random) -> bytes:
    depth = rnd.randint(1100, 3000)
    return rnd.choice([b"[" * depth * 5, b'{"":' * depth + b"1" + b"}" * depth, b"[" * depth + b"]" * depth])


def _bad_json(rnd: random.Random) -> bytes:
    return rnd.choice([
        b"9" * rnd.randint(4301, 15000),
        b'{"question": ' + b"9" * rnd.randint(4301, 15000) + b"}",
        bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 300))) + b"\xff",
        b'{"question": "\\ud800"}', b'{"question": ""}', b'{"question": 1}', b'{"question": null}', b"null",
        b'{"question": ["a"]}', b'{"question": "' + b"a" * 600 + b'"}', b"", b"{", b'{"question": "a"',
        json.dumps({"question": "\u0000\u0001 "}).encode(), b"\xef\xbb\xbf{}", b"NaN", b"[" * 16000,
    ])


def _bad_file(rnd: random.Random) -> tuple[str, bytes]:
    name = rnd.choice(["a" * rnd.randint(256, 400) + ".txt", "evil\x00.txt", "tool.exe", "..", "", "noext",
                       "x.json", "x.jsonl", "x.pdf", "x.txt", "x.md", "x.html", "é" * 130 + ".md", "a/../b/x.json",
                       "..\\..\\x.html", "/etc/x.txt", "d/" * 600 + "x.md"])
    body = {".json": rnd.choice([b"[" * 100000, b"9" * 5000, b"{}", b"[1, 2]", b'[{"title": "no text"}]', b"\xff",
                                 b'[{"text": "\\ud800"}]', b'[{"title": "\\udc00", "text": "x"}]']),
            ".jsonl": rnd.choice([b"{\n", b"[" * 5000 + b"\n", b'{"text": 1}\n', b'{"text": "a\\udfffb"}\n']),
            ".pdf": b"%PDF-1.4 truncated " + bytes(rnd.randrange(256) for _ in range(50)),
            ".txt": b"\xff\xfe" + bytes(rnd.randrange(128, 256) for _ in range(40)),
            ".md": b"\xc3\x28 not utf-8",
            ".html": rnd.choice([b"<p>\xff\xfe broken</p>", b"<div>" * rnd.randint(513, 20000)])}
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    return name, body.get(suffix, b"whatever")


def _cases(rnd: random.Random):
    """(method, path, httpx keyword arguments) of 12 kinds, each malformed."""
    doc_id = "".join(rnd.choice("abcdef0123456789/%._-") for _ in range(rnd.randint(1, 40)))
    yield "POST", "/api/ask", {"content": _nested(rnd)}
    yield "POST", "/api/ask", {"content": _bad_json(rnd), "headers": {"content-type": "application/json"}}
    yield "POST", "/api/documents", {"files": {"file": _bad_file(rnd)}, "headers": WRITE}
    yield "POST", "/api/documents", {"files": {"file": ("x.txt", b"fine text")},
                                     "headers": rnd.choice([{}, {"authorization": "Bearer x"},
                                                            {"authorization": serving.TOKEN},
                                                            {"authorization": "Basic " + serving.TOKEN}])}
    boundary = "".join(rnd.choice("abc-") for _ in range(rnd.randint(0, 80)))
    yield "POST", "/api/documents", {"content": bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 400))),
                                     "headers": {**WRITE, "content-type": f"multipart/form-data; boundary={boundary}"}}
    yield "POST", "/api/documents", {"content": b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a."
                                     + rnd.choice([b"txt", b"json", b"x"]) + b"\"\r\n\r\nunterminated",
                                     "headers": {**WRITE, "content-type": "multipart/form-data; boundary=b"}}
    yield "DELETE", f"/api/documents/{doc_id}", {"headers": rnd.choice([WRITE, {}, {"authorization": "Bearer no"}])}
    yield "GET", f"/api/jobs/{doc_id.replace('/', '')}x", {}
    yield rnd.choice(["PUT", "PATCH", "DELETE"]), rnd.choice(["/api/ask", "/api/health", "/api/kiosk", "/"]), {}
    yield "POST", "/api/ask", {"json": {"question": "When does the museum open?"},
                               "headers": rnd.choice([{"origin": "http://evil.example"}, {"host": "evil.example"},
                                                      {"origin": "null"}, {"host": "127.0.0.1:1"}])}
    yield "GET", "/api/ask/stream", {"params": {"q": rnd.choice(["", " \t", "\x00", "why " * 200])}}
    yield "GET", rnd.choice(["/api/nothing", "/static/../../etc/passwd", "/api/ask"]), {}


def test_2040_malformed_requests_get_4xx_json_on_a_kept_connection(bundle_dir, sample_db, tmp_path):
    db = tmp_path / "db"
    shutil.copytree(sample_db, db)
    rag = EdgeRAG(db, bundle=bundle_dir, config=serving.test_config())
    before = rag.store.version
    rnd = random.Random(26)
    statuses: dict[int, int] = {}
    with running_server(rag) as url, httpx.Client(base_url=url, timeout=httpx.Timeout(120, connect=10)) as client:
        for _ in range(ROUNDS):
            for method, path, kwargs in _cases(rnd):
                r = client.request(method, path, **kwargs)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text[:300])
                assert r.headers.get("connection") != "close", (method, path, r.status_code)
                body = r.json()
                assert body["status"] == r.status_code and body["error"], (method, path, body)
        assert client.post("/api/ask", json={"question": "How much does an adult ticket cost?"}).status_code == 200
        assert rag.store.version == before  # nothing was written
    assert sum(statuses.values()) == 12 * ROUNDS
    print(f"\n{sum(statuses.values())} malformed requests: {dict(sorted(statuses.items()))}")
