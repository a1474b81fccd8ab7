"""Benchmark datasets: the QA files, a seeded question sample, and one pooled index per dataset.

The index is built once per (data file, encoder, passage mode) and kept in a cache folder, so every
system of a run — and the next run — opens the same store instead of re-encoding the corpus.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_rag import Config, Document, EdgeRAG
from edge_rag.models.bundle import ROLE_ENCODER, Bundle
from evaluation.datasets import QAItem, load_hotpot, load_squad

from . import splits

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("EDGE_RAG_DATA", ROOT.parent / "shared" / "data"))  # env: for worktrees
FILES = {"squad": DATA_DIR / "squad2_dev_subset.json", "hotpotqa": DATA_DIR / "hotpotqa_dev_subset.jsonl"}
SQUAD11_TRAIN = DATA_DIR / "squad11_train.json"  # articles in no dev file: more train articles (benchmarks/fusion.py)
OOD_FILE = DATA_DIR / "squad2_unlabeled_20articles.json"  # out-of-domain questions (splits.json "ood")
PARTS = ("benchmark", "val", "all")  # the test split, the reader/router val split, the whole file
LOADERS: dict[str, Callable[[str | Path], tuple[list[Document], list[QAItem]]]] = {
    "squad": load_squad,
    "hotpotqa": load_hotpot,
}


@dataclass
class Dataset:
    name: str
    path: Path
    sha256: str
    documents: list[Document]
    items: list[QAItem]  # the sampled questions, in file order
    part: str  # "benchmark" (held out from router training) or "all"


def sample(items: list[QAItem], n: int | None, seed: int) -> list[QAItem]:
    """``n`` questions (all when None), half of them unanswerable when the file has both kinds
    (SQuAD 2.0: refusal is measured on both), in file order so runs are comparable."""
    if n is None or n >= len(items):
        return list(items)
    rng = np.random.default_rng(seed)
    groups = [[i for i, q in enumerate(items) if q.is_impossible == flag] for flag in (False, True)]
    groups = [g for g in groups if g]
    picked: list[int] = []
    for g, want in zip(groups, _split(n, [len(g) for g in groups])):
        picked += rng.choice(g, size=want, replace=False).tolist()
    return [items[i] for i in sorted(picked)]


def _split(n: int, sizes: list[int]) -> list[int]:
    """Split n evenly over groups, moving what a small group cannot take to the others."""
    want = [min(n // len(sizes), s) for s in sizes]
    for i, s in enumerate(sizes):
        extra = min(n - sum(want), s - want[i])
        want[i] += extra
    return want


def held_out(items: list[QAItem]) -> list[QAItem]:
    """The questions of the test split (edge_rag/assets/splits.json; the router's benchmark part too);
    [] when none of ``items`` is in it (a user's own data, which nothing was tuned on either)."""
    return splits.select(items, "test")


def load(name: str, path: Path, n: int | None, seed: int, part: str = "benchmark",
         answerable: bool = False) -> Dataset:
    """The dataset's pooled corpus (always every context of the file) and a sample of its questions,
    drawn from the test split when ``part`` is "benchmark", from reader_val when "val" (choices made
    before a test run), and from the whole file when "all" or when the file has no such split.
    ``answerable``: answerable questions only (F1 is measured on them alone, so comparing systems that
    always generate spends nothing on the others)."""
    docs, items = LOADERS[name](path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    kept = held_out(items) if part == "benchmark" else splits.select(items, "reader_val") if part == "val" else []
    pool = [q for q in kept or items if not (answerable and q.is_impossible)]
    return Dataset(name, path, digest, docs, sample(pool, n, seed), part if kept else "all")


def pooled_index(name: str, path: Path, bundle: Bundle, config: Config, cache: Path) -> tuple[Path, list[QAItem]]:
    """The pooled index of every context of ``path`` (built once, then reused) and all of the file's questions:
    the corpus the calibration and the reader sweep run over."""
    ds = load(name, path, None, 0, "all")
    encoder_sha = bundle.sha256(ROLE_ENCODER)
    return open_index(ds, bundle.root, encoder_sha, config, cache)[0], ds.items


def open_index(ds: Dataset, bundle: Path | Bundle, encoder_sha: str, config: Config, cache: Path) -> tuple[Path, dict]:
    """Build (or reuse) the dataset's pooled index; returns its folder and how it was built."""
    db = cache / f"{ds.name}-{ds.sha256[:10]}-{encoder_sha[:10]}-{config.passage_mode}"
    start = time.perf_counter()
    with EdgeRAG(db, bundle=bundle, config=config) as rag:
        added = rag.add_documents(ds.documents, progress=True)
        count = rag.store.count
    return db, {"db": str(db), "documents": len(ds.documents), "passages": count, "added": added,
                "reused": added == 0, "build_s": time.perf_counter() - start}
