"""Bytes an indexing run writes against the size of the store it leaves: ``python -m benchmarks.write_amplification``.

A kiosk's store lives on an SD card, which is slow to write and wears out: indexing an upload must write a small
multiple of what it stores, not the square of it (issue #43: a 19 MB upload wrote ~40 GB when every 1,024-passage
commit rewrote the whole index file). Indexes one generated text file (``write_text``, the big-file test's prose)
into a fresh store in a fresh process and reports ``write_bytes`` of ``/proc/self/io`` (what the process sent
towards the disk) over the folder's size.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import json, sys
from pathlib import Path
from benchmarks.write_amplification import written_bytes
from edge_rag.config import Config
from edge_rag.pipeline import EdgeRAG
db, bundle, path, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=budget)) as rag:
    before = written_bytes()
    added = rag.add_files([path])
    written = written_bytes() - before
size = sum(f.stat().st_size for f in Path(db).iterdir() if f.is_file())
print(json.dumps({"passages": added, "written_bytes": written, "store_bytes": size, "ratio": round(written / size, 2)}))
"""


MAX_RATIO = 5.0  # bytes an indexing run may write per byte of the store it leaves (issue #43's target)


def written_bytes() -> int:
    """Bytes this process has caused to be written to storage (Linux ``/proc/self/io``: counted when a page is
    dirtied, so a page written twice before it reaches the disk counts once)."""
    with open("/proc/self/io", encoding="ascii") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["write_bytes"])


def write_text(path: str | Path, mb: float, seed: int = 0) -> None:
    """Prose-like sentences; most paragraphs end in a blank line, some run on for a long time."""
    rng = random.Random(seed)
    words = ("museum harbour light ship engine crew ticket gallery planet star lens tower steam pump visitor "
             "child adult price hour open close floor lift stair cafe shop map guide").split()
    with open(path, "w", encoding="utf-8") as f:
        n = 0
        while n < mb * 1_000_000:
            para = " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + "."
                            for _ in range(rng.randint(3, 8)))
            para += "\n\n" if rng.random() < 0.7 else " "
            f.write(para)
            n += len(para)


def measure(mb: float, budget: int = 2048, bundle: str | None = None) -> dict:
    """Index a generated ``mb`` MB text file into a fresh store; passages, bytes written, store bytes, ratio."""
    from edge_rag.models.registry import default_bundle

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upload.txt"
        write_text(path, mb)
        run = subprocess.run([sys.executable, "-c", RUN, str(Path(tmp) / "db"), bundle or str(default_bundle()),
                              str(path), str(budget)], capture_output=True, text=True, cwd=root, check=False)
        if run.returncode != 0:
            raise RuntimeError(run.stderr)
        return json.loads(run.stdout)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=20.0, help="size of the generated text file")
    ap.add_argument("--budget", type=int, default=2048, help="memory budget (MB) of the indexing process")
    args = ap.parse_args()
    print(json.dumps(measure(args.mb, args.budget)))
