"""The article splits of edge_rag/assets/splits.json, the one place they are written down.

test: reported only. calibration: the certified threshold (Learn-then-Test). reader_val: combiner fitting,
model selection, rule re-tuning. reader_train: training. OOD articles are asked against a corpus without them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from functools import cache
from pathlib import Path

from evaluation.datasets import QAItem, load_squad

SPLITS_FILE = Path(__file__).resolve().parent.parent / "edge_rag" / "assets" / "splits.json"
PARTS = ("test", "calibration", "reader_val", "reader_train")
TUNING_PARTS = ("reader_train", "reader_val")  # the parts a tool may choose a setting on: never test or calibration


@cache
def _splits() -> dict:
    """The file, read once per process: ``select`` asks it for every question (it was read 15,000 times in a
    benchmark run)."""
    return json.loads(SPLITS_FILE.read_text(encoding="utf-8"))


def _title(name: str) -> str:
    return name.replace("_", " ")  # datasets.load_squad keeps titles with spaces in QAItem.group


@cache
def _titles(part: str) -> frozenset[str]:
    """The SQuAD article titles of ``part``, as QAItem.group spells them."""
    return frozenset(_title(t) for t in _splits()["squad"][part])


def hotpot_bucket(question_id: str) -> int:
    return int(hashlib.sha256(question_id.encode()).hexdigest(), 16) % 5


def part_of(item: QAItem) -> str | None:
    """The split a dev-file question belongs to (None: an article no split names)."""
    bucket = hotpot_bucket(item.id) if item.dataset == "hotpotqa" else None
    for part in PARTS:
        if bucket is not None and bucket in _splits()["hotpotqa"][part]:
            return part
        if item.dataset == "squad" and item.group in _titles(part):
            return part
    return None


def select(items: list[QAItem], part: str) -> list[QAItem]:
    """The questions of ``items`` in ``part``, in file order."""
    if part not in PARTS:
        raise ValueError(f"unknown split {part!r}; choose from {', '.join(PARTS)}")
    return [q for q in items if part_of(q) == part]


def tuning_parts(text: str) -> list[str]:
    """An argparse type: comma-separated parts of TUNING_PARTS. A setting chosen on the test split is tuned on what
    is reported, one chosen on the calibration split spends what the certificate is counted on."""
    parts = [p for p in text.split(",") if p]
    if not parts or not set(parts) <= set(TUNING_PARTS):
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(TUNING_PARTS)} (never test or calibration)")
    return parts


def ood_questions(part: str, path: Path) -> list[QAItem]:
    """Out-of-domain questions of ``part`` ("calibration" or "test"): every answer to them is wrong."""
    titles = {_title(t) for t in _splits()["ood"][part]}
    _, items = load_squad(path)
    return [QAItem(q.id, q.question, [], "ood", group=q.group, is_impossible=True) for q in items if q.group in titles]
