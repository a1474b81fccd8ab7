"""`python -m benchmarks.context_index`: does BM25 over each sentence *with its neighbours* retrieve better?

A sentence holds few of a question's words; the sentences around it often hold the rest. This builds, in memory, an
SQLite FTS5 index of every pooled passage of benchmarks.fusion's question sets with a third column, ``context``: the
text of the passages of the same document within ``c`` positions of it, weighted ``wc`` in ``bm25()`` (title and
text weighted as in the stores). Its lexical lists (searched exactly, no postings budget) are fused with the store's
dense list over the fusion grids and judged by benchmarks.fusion's rule on the same train/val questions, never test
or calibration. ``c`` = 0 (no context) is the stores' index before the context column; ``c`` =
store_db.CONTEXT_NEIGHBOURS at ``wc`` = CONTEXT_WEIGHT is the one they keep now, chosen by this run.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path

from tqdm import tqdm

from edge_rag import EdgeRAG
from edge_rag.models.bundle import Bundle
from edge_rag.models.registry import default_bundle
from edge_rag.retrieval.lexical import fts5_query, query_terms
from edge_rag.retrieval.retrieve import with_cosines
from edge_rag.storage.store_db import DB_FILE, TITLE_WEIGHT

from .fusion import arguments, choose, evaluate, pooled_r1, question_sets
from .systems import bench_config

NEIGHBOURS = (1, 2, 3, 5)  # c: positions either side whose text is a passage's context
CONTEXT_WEIGHTS = (0.1, 0.25, 0.5)  # wc: the context column's bm25() weight (text: 1)


def context_index(store: Path, c: int) -> tuple[sqlite3.Connection, dict[int, str]]:
    """An in-memory FTS5 index (title, text, context) of the store's passages, and each passage's document."""
    db = sqlite3.connect(store / DB_FILE)
    rows = db.execute("SELECT id, doc_id, title, text FROM passages ORDER BY doc_id, position").fetchall()
    db.close()
    index = sqlite3.connect(":memory:")
    index.execute("CREATE VIRTUAL TABLE f USING fts5(title, text, context, tokenize='porter unicode61')")
    for _, group in groupby(rows, key=lambda r: r[1]):
        doc = list(group)
        for i, (pid, _, title, text) in enumerate(doc):
            context = " ".join(r[3] for j, r in enumerate(doc) if j != i and abs(j - i) <= c)
            index.execute("INSERT INTO f(rowid, title, text, context) VALUES (?, ?, ?, ?)", (pid, title, text, context))
    return index, {r[0]: r[1] for r in rows}


def search(index: sqlite3.Connection, terms: Sequence[str], wc: float, width: int) -> list[int]:
    if not terms:
        return []
    return [i for (i,) in index.execute(
        f"SELECT rowid FROM f WHERE f MATCH ? ORDER BY bm25(f, {TITLE_WEIGHT}, 1.0, {wc}), rowid LIMIT ?",
        (fts5_query(list(terms)), width))]


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m benchmarks.context_index", __doc__.splitlines()[0]).parse_args(argv)
    bundle = Bundle.load(default_bundle(args.profile))
    config = bench_config()
    settings = [(0, 0.0)] + [(c, wc) for c in NEIGHBOURS for wc in CONTEXT_WEIGHTS]
    result: dict[str, dict] = {}
    for name, db, picked in question_sets(args, bundle, config):
        asked = [q for q in picked if not q.is_impossible and q.gold_doc_ids]
        terms = [query_terms(q.question) for q in asked]
        result[name] = {"n": len(asked)}
        with EdgeRAG(db, bundle=bundle.root, config=config) as rag:
            vectors = rag.encoder.encode_alone([q.question for q in asked])  # as the pipeline encodes a question
            dense = [rag.store.search(v, args.width) for v in vectors]
            for c in (0, *NEIGHBOURS):
                index, doc_of = context_index(db, c)
                for wc in [w for cc, w in settings if cc == c]:
                    rows = []
                    for d, v, t, q in tqdm(list(zip(dense, vectors, terms, asked)), desc=f"{name} c={c} wc={wc:g}",
                                           unit="q"):
                        lexical = search(index, t, wc, args.width)
                        cos = with_cosines(rag.store, v, d, dict.fromkeys(lexical, 0.0))
                        rows.append({"dense": [p.id for p in d], "lexical": lexical, "gold": sorted(q.gold_doc_ids),
                                     "cos": {i: p.score for i, p in cos.items()},
                                     "docs": {i: doc_of[i] for i in [p.id for p in d] + lexical}})
                    for key, value in evaluate(rows).items():
                        result[name][key if key == "dense" else f"{key} c={c} wc={wc:g}"] = value
                index.close()
    print("| setting | pooled SQuAD R@1 | SQuAD dev R@1 | SQuAD 1.1 train R@1 | train R@5 | HotpotQA both@5 |")
    print("|---|---|---|---|---|---|")
    best = [choose(result, f" c={c} wc={wc:g}") for c, wc in settings]  # the rule within each index
    for key in ["dense", "lexical c=0 wc=0"] + best:
        print(f"| {key} | {pooled_r1(result, key):.3f} | " + " | ".join(
            f"{result[d][key][m]:.3f}" for d, m in (("squad", "R@1"), ("squad11-train", "R@1"),
                                                    ("squad11-train", "R@5"), ("hotpotqa", "both@5")) if d in result)
              + " |")
    chosen = choose(result)
    print(f"the rule's choice: {chosen} (pooled R@1 {pooled_r1(result, chosen):.3f}, HotpotQA both@5 "
          f"{result['hotpotqa'][chosen]['both@5']:.3f}, dense's {result['hotpotqa']['dense']['both@5']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
