"""Same answers from both passage stores? ``python -m benchmarks.backend_parity [--n N]``

Indexes the sample corpus and the SQuAD benchmark part's pooled corpus into the embedded store and
into PostgreSQL + pgvector (a throw-away server, or ``$EDGE_RAG_PG_URL``), asks every question on both
with the benchmark config (temperature 0, no answer cache) and compares route and answer text (and the
context handed to the generator). A difference is put down to retrieval when the two stores' searches
returned different passage lists for the question — their dense top k (HNSW recall: the two graphs are built
differently), or only the fused list, whose full-text half ranks by BM25 in SQLite and by ``ts_rank_cd`` in
PostgreSQL (by design); any other difference is a bug. ``--decide-only`` stops before generation
(``rag.decide``): GPT-route answers are then compared by their context, which at temperature 0 fixes the
generated text. Prints one JSON summary per corpus.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tqdm import tqdm

from edge_rag import EdgeRAG
from edge_rag.documents.chunk import read_documents
from edge_rag.documents.files import iter_files
from edge_rag.models.registry import default_bundle
from edge_rag.retrieval import retrieve
from edge_rag.retrieval.route import search_width

from . import data
from .pgserver import admin_url
from .scale_backends import fresh_database
from .systems import bench_config

SAMPLE = Path(__file__).resolve().parent.parent / "edge_rag" / "sample"


def compare(db_a: str, db_b: str, docs: list, questions: list[str], bundle: Path, label: str,
            generate: bool = True) -> dict:
    """Index ``docs`` into both stores, ask every question on both, count what differs and why."""
    answers, hits, fused = {}, {}, {}
    for name, db in (("embedded", db_a), ("pgvector", db_b)):
        with EdgeRAG(db, bundle=bundle, config=bench_config()) as rag:
            rag.add_documents(docs)
            ask = rag.ask if generate else rag.decide
            answers[name] = [ask(q) for q in tqdm(questions, desc=f"{label}/{name}", unit="q")]
            n = search_width(rag.config)  # the list the stages after retrieval read
            vectors = [rag.encoder.encode_one(q) for q in questions]
            hits[name] = [[p.id for p in rag.store.search(v, n)] for v in vectors]
            fused[name] = [[p.id for p in retrieve.search(rag.store, v, q, n, rag.config).passages]
                           for q, v in zip(questions, vectors)]
    same = dense_differs = fused_differs = unexplained = 0
    examples = []
    for i, q in enumerate(questions):
        a, b = answers["embedded"][i], answers["pgvector"][i]
        if (a.route, a.answer, a.context) == (b.route, b.answer, b.context):
            same += 1
        elif hits["embedded"][i] != hits["pgvector"][i]:
            dense_differs += 1
        elif fused["embedded"][i] != fused["pgvector"][i]:
            fused_differs += 1
        else:
            unexplained += 1
            examples.append({"question": q, "embedded": [a.route.value, a.answer, a.lower_bound, a.confidence],
                             "pgvector": [b.route.value, b.answer, b.lower_bound, b.confidence],
                             "features": [a.features, b.features]})
    routes = {name: {r: sum(a.route.value == r for a in got) for r in ("RAG", "GPT", "REFUSE")}
              for name, got in answers.items()}
    ids_differ = sum(x != y for x, y in zip(hits["embedded"], hits["pgvector"]))
    fused_ids_differ = sum(x != y for x, y in zip(fused["embedded"], fused["pgvector"]))
    return {"corpus": label, "questions": len(questions), "generated": generate, "routes": routes,
            "same_route_and_answer": same, "differ_hnsw_recall": dense_differs,
            "differ_full_text_ranking": fused_differs, "differ_unexplained": unexplained,
            "dense_lists_differ": ids_differ,
            "fused_lists_differ": fused_ids_differ, "examples": examples[:5]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.backend_parity", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="SQuAD questions (default: the whole benchmark part)")
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--decide-only", action="store_true", help="compare up to the route, without generating")
    args = ap.parse_args(argv)
    bundle = args.bundle or default_bundle("gemma")
    with admin_url() as admin, tempfile.TemporaryDirectory() as tmp:
        sample_docs = [d for p in iter_files([SAMPLE / "docs"]) for d in read_documents(p)]
        sample_qs = [q["question"] for q in json.loads((SAMPLE / "questions.json").read_text())]
        print(json.dumps(compare(f"{tmp}/sample", fresh_database(admin, "edge_rag_parity_sample"), sample_docs,
                                 sample_qs, bundle, "sample", not args.decide_only)))
        ds = data.load("squad", data.FILES["squad"], args.n, seed=0, part="benchmark")
        print(json.dumps(compare(f"{tmp}/squad", fresh_database(admin, "edge_rag_parity_squad"), ds.documents,
                                 [q.question for q in ds.items], bundle, f"squad-{ds.part}",
                                 not args.decide_only)))


if __name__ == "__main__":
    main()
