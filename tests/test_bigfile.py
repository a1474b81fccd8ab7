"""A 10 MB single-document text file: indexing memory stays bounded (passages are cut, encoded and
committed 1,024 at a time inside the document) and progress moves from the first batch.

Bounded in time by cancelling from the progress callback after a few batches; the process is a fresh
subprocess so its peak RSS (VmHWM) is this indexing run's alone. Before: one document was one batch;
a 50 MB file peaked at 2,418 MB and showed 0% after 10 minutes."""
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from benchmarks.write_amplification import write_text
from edge_rag.config import Config
from edge_rag.documents.chunk import chunk, make_document
from edge_rag.errors import BudgetError
from edge_rag.memory import plan
from edge_rag.models import bundle as B
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


WORDS = "museum harbour light ship engine crew ticket gallery planet star lens tower steam pump visitor".split()


def write_long_paragraphs(path: Path, mb: float, seed: int = 0) -> None:
    """Paragraphs of 60,000 characters without a sentence end: each cut into passages of at most MAX_UNIT_CHARS (chunk.py)
    at a space, in either mode."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(int(mb * 1_000_000) // 60_002 + 1):
            f.write(" ".join(rng.choice(WORDS) for _ in range(11_000))[:60_000] + "\n\n")


RUN_LONG = """
import json, math, sys
from edge_rag.config import Config
from edge_rag.errors import BudgetError
from edge_rag.memory import peak_rss_mb, plan, rss_mb
from edge_rag.models.bundle import Bundle
from edge_rag.models.verify import select_encoder
from edge_rag.pipeline import EdgeRAG
db, bundle, room, batches, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
config = Config(memory_budget_mb=100_000, encode_batch_tokens=256)
opened = Bundle.load(bundle)  # the smallest plan priced as EdgeRAG prices it, from this process's own runtime base
smallest = plan(opened, config, generator=False, encoder=select_encoder(opened, config.threads))
budget = math.ceil(smallest.total_mb) + room
rag = EdgeRAG(db, bundle=bundle, config=config.with_(memory_budget_mb=budget))
rag.warm_up()  # the reader the plan holds is loaded: the process holds what the plan prices
before, calls, refused = rss_mb(), [], None
class Cancel(Exception):
    pass
def progress(done, planned):
    calls.append((done, rag.store.count))
    if len(calls) == batches:
        raise Cancel
try:
    rag.add_files(paths, progress=progress)
except Cancel:
    pass
except BudgetError as exc:
    refused = str(exc)
index, encoder = rag.plan.component("index"), rag.plan.component("encoder")
print(json.dumps({"before": before, "peak": peak_rss_mb(), "refused": refused, "calls": calls, "plan": str(rag.plan),
                  "budget": budget,
                  "index": index.mb, "activations": encoder.parts["activations"], "total": rag.plan.total_mb,
                  "commit_bytes": getattr(rag.plan, "commit_bytes", None)}))
"""


def test_long_paragraphs_are_planned_from_their_length(tmp_path: Path, bundle: B.Bundle, bundle_dir: Path) -> None:
    """Two 8 MB files of 60k-character paragraphs, in a budget 40 MB above the smallest plan (priced from the
    indexing process's own runtime base: the constant one left this CPU's process 12 MB less). The texts held while
    indexing were priced at 200 characters a passage: 16 MB of documents planned 13 MB of index and texts, and
    indexing them raised peak RSS by 116 MB (the documents, their passages and each passage's context, 4 neighbours'
    text, for all 268 at once: a commit). Priced from their length, the plan commits a few MB of text at a time, and
    the rise stays inside what it prices for indexing (the index part and the encoder's activations: it errs high by
    the store's fixed part, held before). Cancelled after 3 commits, each of at most commit_bytes + one passage."""
    paths = [tmp_path / f"long{i}.txt" for i in range(2)]
    for i, path in enumerate(paths):
        write_long_paragraphs(path, 8, seed=i)
    run = subprocess.run([sys.executable, "-c", RUN_LONG, str(tmp_path / "db"), str(bundle_dir), "40", "3",
                          *map(str, paths)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["refused"] is None, out
    assert out["peak"] - out["before"] <= out["index"] + out["activations"], out
    assert out["peak"] <= out["total"] <= out["budget"], out
    shortest = min(map(len, chunk(make_document(paths[0].read_text(encoding="utf-8").split("\n\n")[0]))))
    per_commit = out["commit_bytes"] // shortest + 1
    assert out["commit_bytes"] < 16_000_000 and len(out["calls"]) == 3, out  # the plan took smaller commits
    done = [0] + [d for d, _ in out["calls"]]
    assert all(0 < b - a <= per_commit for a, b in zip(done, done[1:])), out
    assert all(d == count for d, count in out["calls"]), out  # each batch held the commit's bytes: committed


def test_a_markdown_list_is_read_in_the_memory_its_text_takes(tmp_path: Path, bundle_dir: Path) -> None:
    """A 6 MB Markdown file of 1.2M short list items (55 passages of a paragraph window each) in a budget 40 MB above
    the smallest plan: reading it held a str per line and a match per list marker at once, where the plan prices the
    document's text once: peak RSS rose 190 MB, past the plan's total (the plan prices 102 MB for indexing: the index
    part and the encoder's activations). Read a block of lines at a time it rose 61 MB, as for a text file."""
    path = tmp_path / "list.md"
    path.write_text("# Shop\n\n" + "- ab\n" * 1_200_000, encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", RUN_LONG, str(tmp_path / "db"), str(bundle_dir), "40", "3", str(path)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["refused"] is None, out
    assert out["peak"] - out["before"] <= out["index"] + out["activations"], out
    assert out["peak"] <= out["total"] <= out["budget"], out


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.json"])
def test_json_records_that_make_no_document_are_not_all_held_at_once(tmp_path: Path, bundle_dir: Path,
                                                                    name: str) -> None:
    """An 8 MB JSON or JSON Lines file of 650,000 records with an empty text (and one that makes a document) in a budget
    40 MB above the smallest plan: every record was parsed into a dict and all were held at once, though none makes a
    document the plan prices: peak RSS rose 217 MB (JSONL: 380 MB in a 363 MB budget) and 133 MB (JSON), past the 76 MB
    the plan prices for indexing (the index part and the encoder's activations). Read record by record: 15 MB."""
    records = ['{"text": ""}'] * 650_000 + ['{"text": "The museum opens at ten."}']
    path = tmp_path / name
    path.write_text("\n".join(records) if name.endswith(".jsonl") else "[" + ", ".join(records) + "]", encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", RUN_LONG, str(tmp_path / "db"), str(bundle_dir), "40", "3", str(path)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["refused"] is None and out["calls"] == [[1, 0]], out
    assert out["peak"] - out["before"] <= out["index"] + out["activations"], out


def test_files_too_long_for_the_budget_are_refused_before_all_are_read(tmp_path: Path, bundle: B.Bundle,
                                                                        bundle_dir: Path) -> None:
    """Three 4 MB files of 60k-character paragraphs (200 passages, priced 0.1 MB of texts before) in a budget that
    holds the models and a few MB more: refused before encoding, naming the documents' size, after reading what
    already did not fit (the rest is not read: the message says "at least"). Before, all 200 passages were encoded."""
    paths = [tmp_path / f"long{i}.txt" for i in range(3)]
    for i, path in enumerate(paths):
        write_long_paragraphs(path, 4, seed=i)
    config = Config(encode_batch_tokens=256)
    opened = plan(bundle, config.with_(memory_budget_mb=100_000), generator=False)
    with EdgeRAG(tmp_path / "db", bundle=bundle_dir,
                 config=config.with_(memory_budget_mb=math.ceil(opened.total_mb) + 12)) as rag:
        with pytest.raises(BudgetError) as err:
            rag.add_files(paths)
        assert rag.store.count == 0
    msg = str(err.value)
    assert msg.startswith("index needs ~") and "MB of documents to index held in memory" in msg, msg
    read = re.search(r"at least: (\d+) new passages", msg)
    per_file = len(chunk(make_document(paths[0].read_text(encoding="utf-8"))))
    assert read is not None and int(read.group(1)) < 3 * per_file, msg  # the third file was never read


if __name__ == "__main__":  # big files by hand: python tests/test_bigfile.py --mb 500
    import argparse
    import tempfile

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
