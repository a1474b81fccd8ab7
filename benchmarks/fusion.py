"""`python -m benchmarks.fusion`: paragraph retrieval per retriever, and the hybrid fusion chosen on train/val only.

For each question of the chosen split (default: the reader-train and reader-val SQuAD articles and HotpotQA buckets,
never test or calibration) the pooled corpus is searched once densely and once by BM25 (top ``--width``), every
passage of either list with its cosine; two fusions are then replayed offline over a grid of ``fusion_k`` x
``lexical_weight``: the stores' blend (``retrieve.fuse``: cosine + weight / (k + BM25 rank)) and weighted
reciprocal-rank fusion of both ranks (the stores' fusion before; weight / (k + rank) per list). A hit counts when
its passage's document is a gold one (SQuAD: the question's paragraph; HotpotQA: its two supporting paragraphs).
The dev file's train/val split holds 6 SQuAD articles, so ``--train-articles`` more come from SQuAD 1.1 train (a
seeded sample, pooled into a corpus of their own; none of its articles is in a dev file), ``--train-questions``
of their questions asked. Printed per retriever and grid point: R@1, R@3, R@5, MRR@10, and HotpotQA's
both-supporting-paragraphs-in-top-5. The choice: the best SQuAD R@1 (dev and train questions pooled) among the
settings of both fusions whose HotpotQA both@5 is no worse than dense's.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edge_rag import EdgeRAG
from edge_rag.config import Config
from edge_rag.models.bundle import Bundle
from edge_rag.models.registry import default_bundle, home
from edge_rag.retrieval.lexical import query_terms
from edge_rag.retrieval.retrieve import fuse, with_cosines

from . import data, splits
from . import metrics as M
from .data import SQUAD11_TRAIN
from .systems import bench_config

TRAIN_SET = "squad11-train"
GRID_K = (1, 2, 5, 10, 20, 60)
GRID_WEIGHT = {"blend": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0),  # BM25's first place adds w / (k + 1)
               "rrf": (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)}  # BM25's weight beside dense's 1


def ranked_lists(rag: EdgeRAG, items: Sequence, width: int) -> list[dict]:
    """Per answerable question with gold documents: its dense and lexical id lists, each listed passage's cosine
    and document id."""
    rows = []
    asked = [q for q in items if not q.is_impossible and q.gold_doc_ids]
    vectors = rag.encoder.encode_alone([q.question for q in asked])  # as the pipeline encodes a question
    for q, v in tqdm(list(zip(asked, vectors)), desc="search", unit="q"):
        dense = rag.store.search(v, width)
        lexical = dict(rag.store.search_text(query_terms(q.question), width))
        rows.append({"dense": [p.id for p in dense], "lexical": list(lexical), "gold": sorted(q.gold_doc_ids),
                     "cos": {i: p.score for i, p in with_cosines(rag.store, v, dense, lexical).items()}})
    ids = sorted({i for r in rows for i in r["dense"] + r["lexical"]})
    doc_of = {p.id: p.doc_id for p in rag.store.passages(ids)}
    for r in rows:
        r["docs"] = {i: doc_of[i] for i in r["dense"] + r["lexical"]}
    return rows


def train_sample(n: int, seed: int, cache: Path) -> Path:
    """A SQuAD-format file of ``n`` seeded articles of SQuAD 1.1 train, written once into ``cache``."""
    path = cache / f"{TRAIN_SET}-{n}-{seed}.json"
    if not path.is_file():
        articles = json.loads(SQUAD11_TRAIN.read_text(encoding="utf-8"))["data"]
        picked = sorted(np.random.default_rng(seed).choice(len(articles), n, replace=False).tolist())
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"data": [articles[i] for i in picked]}), encoding="utf-8")
    return path


def scores(ranked: list[list[str]], golds: list[list[str]]) -> dict[str, float]:
    """R@1/3/5 (share of gold documents among the top k passages' documents), MRR@10 and both@5."""
    per = {k: [] for k in ("R@1", "R@3", "R@5", "MRR@10", "both@5")}
    for docs, gold in zip(ranked, golds):
        g = set(gold)
        for k in (1, 3, 5):
            per[f"R@{k}"].append(M.recall_at_k(docs, g, k))
        per["MRR@10"].append(M.reciprocal_rank(docs[:10], g))
        per["both@5"].append(float(g <= set(docs[:5])))
    return {k: float(np.mean(v)) for k, v in per.items()}


def docs(row: dict, ids: Sequence[int]) -> list[str]:
    return [row["docs"][i] for i in ids]


def rrf(dense: Sequence[int], lexical: Sequence[int], fusion_k: float, lexical_weight: float) -> list[int]:
    """Weighted reciprocal-rank fusion, the stores' fusion before the blend: ids by 1 / (k + dense rank) +
    weight / (k + lexical rank), best first; ties keep the dense order, then the lexical one."""
    fused: dict[int, float] = {}
    for weight, ids in ((1.0, dense), (lexical_weight, lexical)):
        for rank, pid in enumerate(ids, 1):
            fused[pid] = fused.get(pid, 0.0) + weight / (fusion_k + rank)
    return sorted(fused, key=lambda pid: -fused[pid])


def fused(row: dict, form: str, k: float, w: float) -> list[int]:
    """The row's ids fused by ``form``: "blend" (the stores' retrieve.fuse) or "rrf"."""
    if form == "rrf":
        return rrf(row["dense"], row["lexical"], k, w)
    return [i for i, _ in fuse({i: row["cos"][i] for i in row["dense"] + row["lexical"]}, row["lexical"], k, w)]


def evaluate(rows: list[dict]) -> dict:
    """scores() per retriever: dense, lexical, and each fusion setting ("blend k=.. w=..", "rrf k=.. w=..")."""
    golds = [r["gold"] for r in rows]
    out = {name: scores([docs(r, r[name]) for r in rows], golds) for name in ("dense", "lexical")}
    for form, weights in GRID_WEIGHT.items():
        for k in GRID_K:
            for w in weights:
                out[f"{form} k={k} w={w:g}"] = scores([docs(r, fused(r, form, k, w)) for r in rows], golds)
    return out


def question_sets(args: argparse.Namespace, bundle: Bundle, config: Config) -> list[tuple[str, Path, list]]:
    """(name, pooled index, questions asked) per question set: the dev file's SQuAD and HotpotQA questions of
    ``args.parts``, and a seeded sample of ``args.train_articles`` SQuAD 1.1 train articles' questions."""
    sets = [("squad", data.FILES["squad"]), ("hotpotqa", data.FILES["hotpotqa"])]
    if args.train_articles:
        sets.append((TRAIN_SET, train_sample(args.train_articles, args.seed, args.index_cache)))
    out = []
    for name, path in sets:
        db, items = data.pooled_index("squad" if name == TRAIN_SET else name, path, bundle, config, args.index_cache)
        picked = (data.sample(items, args.train_questions, args.seed) if name == TRAIN_SET
                  else [q for part in args.parts for q in splits.select(items, part)])
        out.append((name, db, picked))
    return out


def pooled_r1(result: dict, key: str) -> float:
    """SQuAD R@1 of setting ``key`` over the dev and train questions pooled."""
    squad = [d for d in result if d != "hotpotqa"]
    return sum(result[d]["n"] * result[d][key]["R@1"] for d in squad) / sum(result[d]["n"] for d in squad)


def choose(result: dict, suffix: str = "") -> str:
    """The rule: the best pooled SQuAD R@1 among the fusion settings (those whose key ends with ``suffix``) whose
    HotpotQA both@5 is no worse than dense's."""
    floor = result["hotpotqa"]["dense"]["both@5"]
    return max((k for k in result["squad"] if k.startswith(tuple(GRID_WEIGHT)) and k.endswith(suffix)
                and result["hotpotqa"][k]["both@5"] >= floor), key=lambda k: pooled_r1(result, k))


def arguments(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every train/val retrieval benchmark shares (this one and benchmarks.context_index)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--parts", type=splits.tuning_parts, default=list(splits.TUNING_PARTS),
                   help=f"splits.json parts whose questions are used, of {','.join(splits.TUNING_PARTS)}")
    p.add_argument("--width", type=int, default=20, help="passages per list (the pipeline's search width)")
    p.add_argument("--profile", default="gemma")
    p.add_argument("--index-cache", type=Path, default=home() / "bench")
    p.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    p.add_argument("--train-articles", type=int, default=20, help="SQuAD 1.1 train articles added (0: none)")
    p.add_argument("--train-questions", type=int, default=1500, help="of their questions, asked (seeded sample)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = arguments("python -m benchmarks.fusion", __doc__.splitlines()[0]).parse_args(argv)
    bundle = Bundle.load(default_bundle(args.profile))
    config = bench_config()
    result = {}
    for name, db, picked in question_sets(args, bundle, config):
        with EdgeRAG(db, bundle=bundle.root, config=config) as rag:
            rows = ranked_lists(rag, picked, args.width)
        result[name] = {"n": len(rows), **evaluate(rows)}  # n: answerable questions with gold paragraphs
    print(f"{'retriever':<24} " + " ".join(f"{d}:{m:>7}" for d in result for m in ("R@1", "R@5", "both@5")))
    for key in result["squad"]:
        if key == "n":
            continue
        print(f"{key:<24} " + " ".join(f"{result[d][key][m]:>{len(d) + 8}.3f}" for d in result
                                       for m in ("R@1", "R@5", "both@5")))
    squad = [d for d in result if d != "hotpotqa"]
    chosen = choose(result)
    print(f"chosen: {chosen} (best SQuAD R@1, {' + '.join(squad)} questions pooled: {pooled_r1(result, chosen):.3f}, "
          f"with HotpotQA both@5 >= dense's {result['hotpotqa']['dense']['both@5']:.3f}); "
          f"dense {pooled_r1(result, 'dense'):.3f}, lexical {pooled_r1(result, 'lexical'):.3f}")
    if args.out:
        args.out.write_text(json.dumps({**result, "chosen": chosen}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
