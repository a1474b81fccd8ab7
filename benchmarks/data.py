"""Benchmark datasets: the QA files, a seeded question sample, and one pooled index per dataset.

The index is built once per (data file, encoder, passage mode) and kept in a cache folder, so every
system of a run — and the next run — opens the same store instead of re-encoding the corpus.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_rag import Config, Document, EdgeRAG
from edge_rag.models import ROUTER_ASSET
from evaluation.datasets import QAItem, load_hotpot, load_squad

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT.parent / "shared" / "data"
FILES = {"squad": DATA_DIR / "squad2_dev_subset.json", "hotpotqa": DATA_DIR / "hotpotqa_dev_subset.jsonl"}
# The shipped router's split (convert/train_router.py): its benchmark part was never trained on.
SPLIT = ROUTER_ASSET.with_name("split.json")
PARTS = ("benchmark", "all")
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


def held_out(items: list[QAItem], split: Path = SPLIT) -> list[QAItem]:
    """The questions of the router split's benchmark part; [] when none of ``items`` is in it (a user's
    own data, which the router never saw either)."""
    ids = set(json.loads(split.read_text(encoding="utf-8"))["benchmark"]) if split.is_file() else set()
    return [q for q in items if q.id in ids]


def load(name: str, path: Path, n: int | None, seed: int, part: str = "benchmark") -> Dataset:
    """The dataset's pooled corpus (always every context of the file) and a sample of its questions,
    drawn from the router's benchmark part when ``part`` is "benchmark" and the file has one."""
    docs, items = LOADERS[name](path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    kept = held_out(items) if part == "benchmark" else []
    return Dataset(name, path, digest, docs, sample(kept or items, n, seed), "benchmark" if kept else "all")


def open_index(ds: Dataset, bundle: Path, encoder_sha: str, config: Config, cache: Path) -> tuple[Path, dict]:
    """Build (or reuse) the dataset's pooled index; returns its folder and how it was built."""
    db = cache / f"{ds.name}-{ds.sha256[:10]}-{encoder_sha[:10]}-{config.passage_mode}"
    start = time.perf_counter()
    with EdgeRAG(db, bundle=bundle, config=config) as rag:
        added = rag.add_documents(ds.documents, progress=True)
        count = rag.store.count
    return db, {"db": str(db), "documents": len(ds.documents), "passages": count, "added": added,
                "reused": added == 0, "build_s": time.perf_counter() - start}
