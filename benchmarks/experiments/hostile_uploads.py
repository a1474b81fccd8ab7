"""Issue #43's hostile uploads against a real ``edge-rag serve``: a 0.6 MB PDF whose content stream inflates to
420 MB, 1,000,000 nested <div>, and SIGTERM while a slow (legitimate) HTML page is being parsed.

    python -m benchmarks.experiments.hostile_uploads --db STORE [--bundle DIR]

Prints, per upload, the HTTP status, the seconds to the answer and the server's peak RSS (VmHWM) after it; then
the seconds from SIGTERM to the server's exit. The store is only read (the uploads are refused or never indexed).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from docmaker import nested_html, pdf_bomb_bytes  # noqa: E402

TOKEN = "hostile-uploads-benchmark"  # 16 characters or more: a shorter one is warned of


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(db: str, bundle: str | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "edge_rag", "serve", "--db", db, "--port", "0", "--token", TOKEN]
    server = subprocess.Popen(cmd + (["--bundle", bundle] if bundle else []), stdout=subprocess.PIPE, text=True)
    for line in server.stdout:
        if "serving" in line:
            return server, line.rsplit(" on ", 1)[1].strip().rstrip("/")
    raise RuntimeError("the server did not start")


def upload(url: str, name: str, body: bytes) -> dict:
    t = time.perf_counter()
    r = httpx.post(f"{url}/api/documents", files={"file": (name, body)},
                   headers={"authorization": f"Bearer {TOKEN}"}, timeout=600)
    error = r.json().get("error", "") if r.headers.get("content-type") == "application/json" else r.text
    return {"file": name, "mb": round(len(body) / 2**20, 2), "status": r.status_code,
            "seconds": round(time.perf_counter() - t, 2), "error": error[:160]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--bundle")
    args = ap.parse_args()
    server, url = start(args.db, args.bundle)
    try:
        print(json.dumps({"start_peak_rss_mb": round(peak_rss_mb(server.pid))}))
        for name, body in (("bomb.pdf", pdf_bomb_bytes(420)), ("deep.html", nested_html(1_000_000).encode())):
            print(json.dumps({**upload(url, name, body), "peak_rss_mb": round(peak_rss_mb(server.pid))}))
        # a legitimate page that takes seconds to parse: 15 MB of 400-deep sections
        slow = ("<div>" * 400 + "<p>Deep section.</p>" + "</div>" * 400) * (15 * 2**20 // 4820)
        threading.Thread(target=lambda: print(json.dumps(upload(url, "slow.html", slow.encode()))), daemon=True).start()
        time.sleep(3)
        t = time.perf_counter()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
        print(json.dumps({"sigterm_to_exit_s": round(time.perf_counter() - t, 2), "exit": server.returncode,
                          "parse_children_left": _parse_children()}))
    finally:
        if server.poll() is None:
            server.kill()


def _parse_children() -> int:
    """Parse children still running anywhere on this machine (none should outlive the server)."""
    return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _is_parse_child(p))


def _is_parse_child(proc: Path) -> bool:
    try:
        return b"edge_rag.documents.parse_child" in (proc / "cmdline").read_bytes()
    except OSError:
        return False


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
