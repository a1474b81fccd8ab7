"""Readers for the QA formats we evaluate on: SQuAD-2 JSON and HotpotQA JSONL (distractor setting).

Both return the open retrieval corpus (every context of the file, deduplicated) and the questions
with their gold answers and gold document ids, so a user can point benchmarks at their own data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from edge_rag.documents.chunk import make_document
from edge_rag.types import Document


@dataclass(frozen=True)
class QAItem:
    """One question with what counts as right: gold answers and the documents holding the evidence."""

    id: str
    question: str
    answers: list[str]
    dataset: str  # "squad" | "hotpotqa"
    gold_doc_ids: frozenset[str] = field(default_factory=frozenset)
    group: str = ""  # SQuAD article title (splits keep whole articles together); HotpotQA question id
    is_impossible: bool = False


def load_squad(path: str | Path) -> tuple[list[Document], list[QAItem]]:
    """SQuAD (1.1 or 2.0) JSON: each paragraph is a document; answerable and unanswerable questions."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    docs: dict[str, Document] = {}
    items: list[QAItem] = []
    for article in data:
        title = article["title"].replace("_", " ")
        for para in article["paragraphs"]:
            doc = make_document(para["context"], title)
            docs.setdefault(doc.doc_id, doc)
            for qa in para["qas"]:
                answers = list(dict.fromkeys(a["text"] for a in qa.get("answers", [])))
                items.append(
                    QAItem(
                        id=qa["id"],
                        question=qa["question"].strip(),
                        answers=answers,
                        dataset="squad",
                        gold_doc_ids=frozenset({doc.doc_id}),
                        group=title,
                        is_impossible=bool(qa.get("is_impossible", not answers)),
                    )
                )
    return list(docs.values()), items


def load_hotpot(path: str | Path) -> tuple[list[Document], list[QAItem]]:
    """HotpotQA JSONL as in ../shared/data: 10 contexts per question, 2 of them supporting."""
    docs: dict[str, Document] = {}
    items: list[QAItem] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        gold: set[str] = set()
        for ctx in row["contexts"]:
            doc = make_document(ctx["paragraph_text"], ctx["title"])
            docs.setdefault(doc.doc_id, doc)
            if ctx.get("is_supporting"):
                gold.add(doc.doc_id)
        answers = [s for obj in row.get("answers_objects", [])[:1] for s in obj.get("spans", [])]
        items.append(
            QAItem(
                id=row["question_id"],
                question=row["question_text"].strip(),
                answers=answers,
                dataset="hotpotqa",
                gold_doc_ids=frozenset(gold),
                group=row["question_id"],
            )
        )
    return list(docs.values()), items
