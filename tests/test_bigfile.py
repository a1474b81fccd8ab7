"""A 10 MB single-document text file: indexing memory stays bounded (passages are cut, encoded and
committed 1,024 at a time inside the document) and progress moves from the first batch.

Bounded in time by cancelling from the progress callback after a few batches; the process is a fresh
subprocess so its peak RSS (VmHWM) is this indexing run's alone. Before: one document was one batch;
a 50 MB file peaked at 2,418 MB and showed 0% after 10 minutes."""
import json
import subprocess
import sys

from conftest import ROOT

from benchmarks.write_amplification import write_text
from edge_rag.errors import BudgetError
from edge_rag.pipeline import EdgeRAG

BUDGET_MB = 2048  # the default: it plans the certified path's reader (~355 MB) beside the index
FILE_MB = 10
BATCHES = 2  # progress batch by batch, a commit per batch and bounded growth show from two

RUN = """
import json, sys, time
from edge_rag.memory import peak_rss_mb, rss_mb
from edge_rag.errors import BudgetError
from edge_rag.config import Config
from edge_rag.pipeline import EdgeRAG
db, bundle, path, budget, batches = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rag = EdgeRAG(db, bundle=bundle, config=Config(memory_budget_mb=budget))
before, start = rss_mb(), time.perf_counter()
calls, refused = [], None
class Cancel(Exception):
    pass
def progress(done, planned):
    calls.append((done, planned, round(time.perf_counter() - start, 1)))
    if len(calls) == batches:
        raise Cancel
try:
    rag.add_files([path], progress=progress)
except Cancel:
    pass
except BudgetError as exc:
    refused = str(exc)
print(json.dumps({"calls": calls, "count": rag.store.count, "before": before, "peak": peak_rss_mb(),
                  "seconds": round(time.perf_counter() - start, 1), "refused": refused}))
"""


def test_big_file_indexing_is_bounded_and_moves(tmp_path, bundle_dir):
    path = tmp_path / "big.txt"
    write_text(path, FILE_MB)
    run = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "db"), str(bundle_dir), str(path),
                          str(BUDGET_MB), str(BATCHES)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["refused"] is None, out
    done = [d for d, _, _ in out["calls"]]
    planned = {p for _, p, _ in out["calls"]}
    assert done == [1024 * (i + 1) for i in range(BATCHES)]  # progress moves, batch by batch
    assert len(planned) == 1 and planned.pop() > 50_000  # the whole file was planned, not held
    assert out["count"] == 1024 * BATCHES  # each batch committed on its own (a cancel loses only the rest)
    assert out["peak"] <= BUDGET_MB
    # Growth while indexing: the file's text (held once) plus one batch, not the file's passages at once.
    assert out["peak"] - out["before"] <= 3 * FILE_MB + 200, out


def test_a_file_too_big_for_the_budget_is_refused_before_encoding(tmp_path, bundle_dir):
    path = tmp_path / "big.txt"
    write_text(path, 8)
    from edge_rag.config import Config

    with EdgeRAG(tmp_path / "db", bundle=bundle_dir, config=Config(memory_budget_mb=600)) as rag:
        try:
            rag.add_files([path])
        except BudgetError as exc:
            assert "passages" in str(exc)
        else:
            raise AssertionError("an 8 MB file indexed inside 600 MB: pick a smaller budget for this test")
        assert rag.store.count == 0


if __name__ == "__main__":  # big files by hand: python tests/test_bigfile.py --mb 500
    import argparse
    import tempfile
    from pathlib import Path

    from edge_rag.models.registry import default_bundle

    ap = argparse.ArgumentParser(description="index one big generated text file; print progress and peak RSS")
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--batches", type=int, default=10, help="stop after this many committed batches")
    ap.add_argument("--file", help="index this file instead of generating one of --mb MB")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.file) if args.file else Path(tmp) / "big.txt"
        if not args.file:
            write_text(path, args.mb)
        run = subprocess.run([sys.executable, "-c", RUN, str(Path(tmp) / "db"), str(default_bundle()), str(path),
                              str(args.budget), str(args.batches)], capture_output=True, text=True, cwd=ROOT)
        print(run.stdout or run.stderr)
