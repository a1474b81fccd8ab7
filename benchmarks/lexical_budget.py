"""How many passages one lexical search may score (``lexical.POSTINGS_BUDGET``): its speed against exact BM25.

An embedded store of N passages (the sentence passages of the SQuAD and HotpotQA corpora, repeated up to N as
``benchmarks/scale.py`` does; random vectors, since only the full-text index is searched) and the questions of the
val split (the budget is chosen on them, never on the test split). Per budget: p50 / p95 of ``Store.search_text``
and how often its top k agrees with the exact search's (every posting scored): the same best score, the same k-th
score. Scores, not ids, are compared: repeated passages tie.

``python -m benchmarks.lexical_budget --sizes 10k,100k``

Repeats make every word's postings longer than real text of that size has them, and agreement is not R@1. So
``--real`` measures on real text what the budget costs where it matters: every SQuAD 1.1 train article indexed by
the shipped encoder (92,182 sentence passages with their context column; built once into ``--index-cache``),
searched with up to 2,000 questions of the SQuAD 1.1 train articles ``benchmarks.fusion`` tunes on (train/val).
Per budget: R@1 (the top passage's paragraph holds the answer) and p50 / p95 of the lexical search and of the
pipeline's hybrid search (``retrieve.search`` with ``Config(lexical_budget=...)``).

``python -m benchmarks.lexical_budget --real``
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_rag import Config, EdgeRAG
from edge_rag.documents.chunk import chunk
from edge_rag.models.bundle import Bundle
from edge_rag.models.registry import default_bundle, home
from edge_rag.retrieval import retrieve
from edge_rag.retrieval.lexical import POSTINGS_BUDGET, query_terms
from edge_rag.retrieval.route import search_width
from edge_rag.storage.store import Store
from evaluation.datasets import QAItem, load_squad

from . import data
from .fusion import train_sample
from .scale import corpus, corpus_sizes, documents

BUDGETS = (500, 1_000, 2_000, 4_000, 8_000)
EXACT = 10**12
REAL_QUESTIONS = 2_000
TUNED_ARTICLES = 20  # benchmarks.fusion's --train-articles default
K = 10
DIM = 8


def passages(seed: int) -> tuple[list[tuple[str, str]], list[str]]:
    """Every (title, sentence passage) of both corpora, and the val split's questions."""
    texts, questions = [], []
    for name, path in data.FILES.items():
        ds = data.load(name, path, None, seed, part="val")
        texts += [(d.title, t) for d in ds.documents for t in chunk(d, "sentence")]
        questions += [q.question for q in ds.items]
    return texts, questions


def build(folder: Path, texts: list[tuple[str, str]], n: int, seed: int) -> Store:
    """An embedded store of ``n`` passages: ``texts`` (seeded sample), topped up with seeded repeats of them, as
    ``scale.corpus`` makes the scale benchmark's (its vectors are random here: only the full-text index is searched)."""
    real = np.random.default_rng(seed).standard_normal((len(texts), DIM)).astype(np.float32)
    vectors, source = corpus(real / np.linalg.norm(real, axis=1, keepdims=True), n, seed)
    store = Store(folder, DIM, "lexical-budget")
    store.add(documents([texts[j] for j in source.tolist()]), vectors)
    return store


def measure(folder: Path, questions: list[str], budget: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """Milliseconds and top-k of every question's search at ``budget``, on the store in ``folder`` freshly opened:
    it has counted no word's postings yet, as for questions never asked (the OS page cache stays warm)."""
    store = Store(folder, DIM, "lexical-budget")
    ms, tops = [], []
    for q in questions:
        terms = query_terms(q)
        t = time.perf_counter()
        tops.append(store.search_text(terms, K, budget))
        ms.append((time.perf_counter() - t) * 1e3)
    store.close()
    return ms, tops


def agreement(tops: list[list[tuple[int, float]]], exact: list[list[tuple[int, float]]], at: int) -> float:
    """Share of questions whose ``at``-th best score equals the exact search's (or both have fewer hits)."""
    def score(top: list[tuple[int, float]]) -> float | None:
        return round(top[at][1], 9) if len(top) > at else None
    return float(np.mean([score(a) == score(b) for a, b in zip(tops, exact)]))


def real_questions(items: list[QAItem], cache: Path, seed: int, n: int) -> list[QAItem]:
    """A seeded sample of the answerable questions of the SQuAD 1.1 train articles benchmarks.fusion tunes on."""
    _, tuned = load_squad(train_sample(TUNED_ARTICLES, seed, cache))
    titles = {q.group for q in tuned}
    pool = [q for q in items if q.group in titles and not q.is_impossible]
    return [pool[i] for i in sorted(np.random.default_rng(seed).permutation(len(pool))[:n].tolist())]


def real(cache: Path, seed: int, profile: str) -> None:
    """The ``--real`` table: R@1 and latency per budget on the indexed SQuAD 1.1 train corpus."""
    config = Config(cache_size=0)
    bundle = Bundle.load(default_bundle(profile))
    db, items = data.pooled_index("squad", data.SQUAD11_TRAIN, bundle, config, cache)
    questions = real_questions(items, cache, seed, REAL_QUESTIONS)
    k = search_width(config)
    print("| passages | budget | lexical R@1 | lexical p50 / p95 ms | hybrid R@1 | hybrid p50 / p95 ms |\n"
          "|---|---|---|---|---|---|")
    with EdgeRAG(db, bundle=bundle.root, config=config, create=False) as rag:
        vectors = [rag.encoder.encode_one(q.question) for q in questions]
        for budget in (*BUDGETS, EXACT):
            c = config.with_(lexical_budget=budget)
            for q, v in zip(questions[:50], vectors[:50]):  # each word's postings counted before timing
                retrieve.search(rag.store, v, q.question, k, c)
            row = {"lexical": ([], []), "hybrid": ([], [])}
            for q, v in zip(questions, vectors):
                t = time.perf_counter()
                lexical = rag.store.search_text(query_terms(q.question), k, budget)
                t1 = time.perf_counter()
                hybrid = retrieve.search(rag.store, v, q.question, k, c).passages
                t2 = time.perf_counter()
                top = rag.store.passages([lexical[0][0]]) if lexical else []
                for name, hits, ms in (("lexical", top, t1 - t), ("hybrid", hybrid, t2 - t1)):
                    row[name][0].append(bool(hits) and hits[0].doc_id in q.gold_doc_ids)
                    row[name][1].append(ms * 1e3)
            cells = " | ".join(f"{np.mean(hit):.3f} | {np.median(ms):.2f} / {np.percentile(ms, 95):.2f}"
                               for hit, ms in row.values())
            print(f"| {rag.store.count:,} | {'all' if budget == EXACT else f'{budget:,}'} | {cells} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lexical_budget", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=corpus_sizes, default=[10_000, 100_000])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--real", action="store_true", help="R@1 and latency per budget on real text (SQuAD 1.1 train)")
    p.add_argument("--index-cache", type=Path, default=home() / "bench")
    p.add_argument("--profile", default="gemma", help="the bundle whose encoder indexes and searches (--real)")
    args = p.parse_args()
    if args.real:
        return real(args.index_cache, args.seed, args.profile)
    texts, questions = passages(args.seed)
    print(f"{len(texts):,} distinct passages, {len(questions)} val questions, top-{K}; shipped budget "
          f"{POSTINGS_BUDGET:,}\n\n| passages | budget | p50 ms | p95 ms | same best score | same {K}th score |\n"
          "|---|---|---|---|---|---|")
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as work:
            folder = Path(work) / "store"
            build(folder, texts, n, args.seed).close()
            measure(folder, questions, EXACT)  # warm the page cache
            exact_ms, exact = measure(folder, questions, EXACT)
            for budget in (*BUDGETS, EXACT):
                ms, tops = (exact_ms, exact) if budget == EXACT else measure(folder, questions, budget)
                print(f"| {n:,} | {'all' if budget == EXACT else f'{budget:,}'} | {np.median(ms):.2f} | "
                      f"{np.percentile(ms, 95):.2f} | {agreement(tops, exact, 0):.3f} | "
                      f"{agreement(tops, exact, K - 1):.3f} |")


if __name__ == "__main__":
    main()
