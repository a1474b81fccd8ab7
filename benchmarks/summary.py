"""A system's aggregates over its question rows (with paired deltas against the baseline), and retrieval alone per
retriever: the figures results.json and report.md show, from the rows ``run.ask_all`` writes."""
from __future__ import annotations

import time

import numpy as np

from edge_rag import EdgeRAG, Route
from edge_rag.retrieval import retrieve

from . import data, decision
from . import metrics as M

RETRIEVAL_K = 10


def summarise(rows: list[dict], base: list[dict] | None, seed: int) -> dict:
    """A system's aggregate over its rows, with paired deltas against the baseline's rows."""
    ans = [r for r in rows if r["answerable"]]
    unans = [r for r in rows if not r["answerable"]]
    stages = list(dict.fromkeys(s for r in rows for s in r["timings_ms"]))  # pipeline order
    out = {
        "n": len(rows), "n_answerable": len(ans), "n_unanswerable": len(unans),
        "em": M.mean([r["em"] for r in ans]), "f1": M.mean([r["f1"] for r in ans]),
        "refuse_answerable": _refused(ans), "refuse_unanswerable": _refused(unans),
        "prompt_tokens": M.mean([r["prompt_tokens"] for r in rows]),
        "completion_tokens": M.mean([r["completion_tokens"] for r in rows]),
        "latency_ms": M.percentiles([r["total_ms"] for r in rows]),
        # stage mean over all questions (0 when skipped) so means stack to the total; p50/p95 when it ran
        "stages_ms": {s: {**M.percentiles([r["timings_ms"][s] for r in rows if s in r["timings_ms"]]),
                          "mean_all": float(np.mean([r["timings_ms"].get(s, 0.0) for r in rows]))}
                      for s in stages},
        "route_mix": M.shares([r["route"] for r in rows]),
        "tier_mix": M.shares([r["tier"] for r in rows]),
        "tier_fallback": M.mean([float(bool(r["tier_fallback"])) for r in rows]),
        "corrected": M.mean([float(bool(r["corrected"])) for r in rows]),
        "cache_hits": sum(bool(r["cache_hit"]) for r in rows),
        **{k: M.mean([r.get(k) for r in rows])
           for k in ("context_precision", "context_recall", "faithfulness", "relevance", "context_chars")},
        "rss_mb": max((r["rss_mb"] for r in rows if r["rss_mb"] is not None), default=None),
        "process_peak_rss_mb": max((r["peak_rss_mb"] for r in rows if r["peak_rss_mb"] is not None), default=None),
        "answered": decision.error_among_answered(rows),
        "alpha": next((r["alpha"] for r in rows if r.get("alpha") is not None), None),
    }
    if base is not None:
        b = {r["id"]: r for r in base}
        base_ms, base_tok = M.mean([r["total_ms"] for r in base]), M.mean([r["prompt_tokens"] for r in base])
        out["vs_baseline"] = {
            "speedup": base_ms / out["latency_ms"]["mean"] if out["latency_ms"]["mean"] else None,
            "token_reduction": 1 - out["prompt_tokens"] / base_tok if base_tok else None,
            "f1_delta": M.bootstrap_ci([r["f1"] - b[r["id"]]["f1"] for r in ans], seed=seed),
            "token_delta": M.bootstrap_ci([r["prompt_tokens"] - b[r["id"]]["prompt_tokens"] for r in rows], seed=seed),
        }
    return out


def _refused(rows: list[dict]) -> float | None:
    """Share of rows routed to REFUSE: abstention accuracy on unanswerable, a miss on answerable."""
    return M.mean([float(r["route"] == Route.REFUSE.value) for r in rows])


RETRIEVERS = ("dense", "lexical", "hybrid")


def retrieval(rag: EdgeRAG, ds: data.Dataset, qvecs: np.ndarray) -> dict:
    """Per retriever (system-independent): paragraph R@1/@5/@10 (share of gold documents among the top k passages'
    documents), Precision@5, MRR@10 and both@5 (every gold document in the top 5: HotpotQA's two supporting
    paragraphs), and the search's p50 ms, on the sampled questions that have gold evidence."""
    out: dict = {}
    for mode in RETRIEVERS:
        config = rag.config.with_(retrieval=mode)
        per: dict[str, list[float]] = {k: [] for k in ("recall@1", "recall@5", "recall@10", "precision@5", "mrr@10",
                                                       "both@5", "ms")}
        for item, v in zip(ds.items, qvecs):
            if not item.gold_doc_ids:
                continue
            start = time.perf_counter()
            found = retrieve.search(rag.store, v, item.question, RETRIEVAL_K, config).passages
            per["ms"].append((time.perf_counter() - start) * 1e3)
            docs = [p.doc_id for p in found]
            for k in (1, 5, 10):
                per[f"recall@{k}"].append(M.recall_at_k(docs, item.gold_doc_ids, k))
            per["precision@5"].append(M.precision_at_k(docs, item.gold_doc_ids, 5))
            per["mrr@10"].append(M.reciprocal_rank(docs, item.gold_doc_ids))
            per["both@5"].append(float(item.gold_doc_ids <= set(docs[:5])))
        ms = per.pop("ms")
        out[mode] = {**{k: M.mean(v) for k, v in per.items()}, "search_p50_ms": M.percentiles(ms)["p50"],
                     "n": len(per["mrr@10"])}
    return {**out[rag.config.retrieval], "retrievers": out}
