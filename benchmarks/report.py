"""report.md from results.json: the thesis's tables (per dataset, retrieval, stages, peer, scale, hardware)."""
from __future__ import annotations

from pathlib import Path

from . import metrics as M
from . import routing, scale_backends


def _n(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _pct(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def _ci(d: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    """'mean [lo, hi]' of a bootstrap result."""
    if not d or d.get("mean") is None:
        return "–"
    return f"{scale * d['mean']:+.{digits}f} [{scale * d['lo']:+.{digits}f}, {scale * d['hi']:+.{digits}f}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def _mix(m: dict[str, float]) -> str:
    return " / ".join(f"{_pct(m.get(r, 0.0))}" for r in ("RAG", "GPT", "REFUSE"))


def _headline(ds: dict, baseline: str) -> str:
    rows = []
    for name, s in ds["systems"].items():
        if "error" in s:
            rows.append([name, f"failed: {s['error']}"] + [""] * 11)
            continue
        vs = s.get("vs_baseline", {})
        base = name == baseline
        rows.append([
            f"**{name}**" if base else name, _n(100 * s["em"] if s["em"] is not None else None),
            _n(100 * s["f1"] if s["f1"] is not None else None),
            "baseline" if base else _ci(vs.get("f1_delta"), 100),
            _n(s["prompt_tokens"]), _n(s["completion_tokens"]),
            _n(s["latency_ms"]["p50"], 0), _n(s["latency_ms"]["p95"], 0),
            "1.00×" if base else (f"{vs['speedup']:.2f}×" if vs.get("speedup") else "–"),
            "0%" if base else _pct(vs.get("token_reduction"), 1),
            _mix(s["route_mix"]), _pct(s["refuse_answerable"]), _pct(s["refuse_unanswerable"]),
        ])
    return _table(["system", "EM", "F1", f"ΔF1 vs {baseline} [95% CI]", "tokens in", "tokens out", "p50 ms",
                   "p95 ms", "speedup", "token reduction", "RAG / GPT / REFUSE", "refuse ans.", "refuse unans."], rows)


def _decision(ds: dict) -> str:
    """Per system: answered, error among answered vs alpha, refusals by kind, reader latency."""
    rows = []
    for name, s in ds["systems"].items():
        if "error" in s:
            continue
        a, ood = s["answered"], s.get("ood", {})
        read = s["stages_ms"].get("read") or s["stages_ms"].get("extract") or {}
        ci = f"{_pct(a['error'], 1)} [{_pct(a['lo'], 1)}, {_pct(a['hi'], 1)}]" if a["n_answered"] else "–"
        rows.append([name, _n(100 * s["f1"] if s["f1"] is not None else None), _pct(s["refuse_unanswerable"]),
                     _pct(s["refuse_answerable"]), _pct(ood.get("refused")) + (f" (n={ood['n']})" if ood.get("n") else ""),
                     _n(ood.get("p50_ms"), 1), _pct(a["coverage"]), ci,
                     "–" if s.get("alpha") is None else f"{s['alpha']:g}", _n(read.get("p50"), 1),
                     _n(s["process_peak_rss_mb"], 0)])
    return _table(["system", "F1 (all answerable)", "unans. refused", "ans. wrongly refused", "OOD-test refused",
                   "OOD-test decide p50 ms", "coverage", "error among answered [95% CP]", "alpha", "read p50 ms",
                   "peak RSS MB"], rows)


def _fallback_note(ds: dict, systems: dict) -> str:
    """Routed systems without a router ran at the config's fallback tier: say so under the table."""
    hit = [n for n, s in ds["systems"].items() if systems[n]["flags"].get("router") and s.get("tier_fallback")]
    return (f"No tier router was available: {', '.join(hit)} ran at the fallback tier, so their routing is "
            "a fixed tier.\n" if hit else "")


def _detail(ds: dict) -> str:
    rows = [[name, _pct(s["context_precision"]), _pct(s["context_recall"]), _pct(s["faithfulness"]),
             _n(s["relevance"], 2), _ci(s.get("vs_baseline", {}).get("token_delta")), _n(s["context_chars"], 0),
             " / ".join(f"{t} {_pct(v)}" for t, v in s["tier_mix"].items()), _pct(s["tier_fallback"]),
             _pct(s["corrected"]), _n(s["rss_mb"], 0), str(s["cache_hits"])]
            for name, s in ds["systems"].items() if "error" not in s]
    return _table(["system", "context P", "context R", "faithfulness", "answer relevance",
                   "Δtokens in [95% CI]", "context chars", "tiers", "tier fallback", "corrected", "RSS MB",
                   "cache hits"], rows)


def _stages(ds: dict) -> str:
    systems = {k: v for k, v in ds["systems"].items() if "error" not in v}
    stages = list(dict.fromkeys(st for s in systems.values() for st in s["stages_ms"]))
    rows = []
    for name, s in systems.items():
        cells = []
        for st in stages:
            x = s["stages_ms"].get(st)
            cells.append("–" if x is None else f"{x['mean_all']:.1f} ({x['p50']:.1f} / {_n(x['p95'])})")
        rows.append([name, *cells, f"{s['latency_ms']['mean']:.0f} ({s['latency_ms']['p50']:.0f} / "
                                   f"{_n(s['latency_ms']['p95'], 0)})"])
    return _table(["system", *stages, "end to end"], rows)


def _retrieval(results: dict) -> str:
    rows = []
    for name, ds in results["datasets"].items():
        if "skipped" in ds:
            continue
        c = ds["corpus"]
        build = "reused" if c["reused"] else f"{c['build_s']:.0f} s"
        for mode, r in ds["retrieval"].get("retrievers", {"dense": ds["retrieval"]}).items():
            rows.append([name, mode, f"{c['passages']:,}", str(r["n"]), _pct(r.get("recall@1"), 1),
                         _pct(r["recall@5"], 1), _pct(r["recall@10"], 1), _pct(r.get("both@5"), 1),
                         _n(r["mrr@10"], 3), _n(r.get("search_p50_ms"), 2), build])
    return _table(["dataset", "retriever", "passages", "questions", "R@1", "R@5", "R@10", "all gold in top 5", "MRR@10",
                   "search p50 ms", "index build"], rows)


def _peer(peer: dict) -> str:
    if "skipped" in peer:
        return f"Skipped: {peer['skipped']}.\n"
    b = peer["build"]
    lines = [f"Dataset {peer['dataset']}, k = {peer['k']}, {peer['questions']} questions (first = cold start, "
             "rest = warm p50), each stack in a fresh process, index prebuilt on disk.\n"]
    if "error" in b:
        return lines[0] + f"\nPeer index build failed: {b['error']}\n"
    lines.append(f"Peer index build (sentence-transformers encode + FAISS): {b['build_s']:.1f} s for "
                 f"{b['passages']:,} passages, peak RSS {b['peak_rss_mb']:.0f} MB.\n")
    rows = []
    for name, s in peer["stacks"].items():
        if "error" in s:
            rows.append([name, f"failed: {s['error']}", "", "", "", "", "", "", ""])
            continue
        ratio = s.get("peer_over_edge", {})
        rows.append([name, f"{s['cold_start_s']:.2f} s", f"{s['peak_rss_mb']:.0f} MB", _n(s["p50_ms"], 0),
                     _n(s.get("p95_ms"), 0), _n(s["prompt_tokens"], 0), _n(s.get("completion_tokens"), 1),
                     ", ".join(f"{k} {v}" for k, v in s["routes"].items()),
                     " / ".join(f"{ratio[k]:.2f}×" if ratio.get(k) else "–"
                                for k in ("cold_start_s", "peak_rss_mb", "p50_ms")) if ratio else "–"])
    lines.append(_table(["stack", "cold start", "peak RSS", "warm p50 ms", "warm p95 ms", "tokens in", "tokens out",
                         "routes", "peer ÷ this: cold / RSS / p50"], rows))
    return "\n".join(lines)


def _scale(scale: dict) -> str:
    if "skipped" in scale:
        return f"Skipped: {scale['skipped']}.\n"
    head = (f"HNSW M={scale['M']}, ef_construction={scale['ef_construction']}, ef_search={scale['ef_search']}; "
            f"{scale['queries']} real question embeddings as queries, one at a time; recall@{scale['k']} of HNSW "
            f"against exact search. Vectors: {scale['real_vectors']:,} real passage embeddings, then synthetic "
            f"(a real embedding + Gaussian noise of norm {scale['noise_norm']}, renormalised). HNSW MB = serialised "
            "index (vectors + graph); peak RSS = the worker process building and querying it.\n")
    rows = [[f"{r['n']:,}", "real" if not r["n_synthetic"] else f"{r['n_real']:,} real + {r['n_synthetic']:,} synthetic",
             f"{r['build_s']:.1f}", _n(r["hnsw_mb"]), _n(r["exact_mb"]), _n(r["peak_rss_mb"], 0),
             f"{r['hnsw_p50_ms']:.3f}", f"{r['exact_p50_ms']:.3f}", _pct(r["recall@10"], 1)]
            for r in scale["rows"]]
    return head + "\n" + _table(["vectors", "data", "HNSW build s", "HNSW MB", "exact MB", "peak RSS MB",
                                 "HNSW p50 ms", "exact p50 ms", "recall@10"], rows) + scale_backends.report(scale.get("stores", {}))


def _hardware(hw: dict) -> str:
    v = hw["versions"]
    b = hw["bundle"]
    rows = [["CPU", hw["cpu"]], ["CPU features", hw.get("cpu_features", "")],
            ["cores (logical / physical)", f"{hw['cores_logical']} / {hw['cores_physical']}"],
            ["threads used", str(hw["threads_used"])], ["RAM", f"{hw['ram_gb']} GB"],
            ["OS / arch", f"{hw['os']} / {hw['arch']}"],
            ["load average at start", ", ".join(f"{x:.2f}" for x in hw["load_avg_at_start"] or [])],
            ["versions", ", ".join(f"{k} {x}" for k, x in v.items() if x)],
            ["bundle", f"{b['path']} (profile {b['profile']})"],
            ["encoder", f"{b['encoder']['name']} ({b['encoder']['precision']}, {b['encoder']['dim']}-d)"],
            ["generator", f"{b['generator']['name']} ({b['generator']['quantization']})"],
            ["router", "yes" if b["router"] else "none in bundle (tier fallback)"]]
    rows += [[f"{f['role']}: {f['name']}", f"{f['size']:,} B, sha256 {f['sha256'][:16]}…"] for f in b["files"]]
    return _table(["", ""], rows)


def write(results: dict, path: Path, plots: list[Path]) -> Path:
    a = results["args"]
    baseline = results["baseline"]
    parts = [
        "# edge-rag benchmark\n",
        f"{results['created']} · {'full' if a['full'] else 'quick'} run · {results['runtime_s'] / 60:.1f} min · "
        f"temperature 0 · answer cache off · every system on the same pooled corpus and questions.\n",
        "EM / F1 (SQuAD normalisation, %) over answerable questions, a refusal scoring 0; refusal on unanswerable "
        "questions is abstention (higher is better). Tokens are per question (0 when no LLM call). Latency is the "
        f"wall time of `ask`. Speedup = mean latency of {baseline} ÷ the system's; CIs: 1,000 paired bootstrap "
        f"resamples over questions. A p95 is – where it would come from fewer than {M.MIN_P95_SAMPLES} samples "
        "(questions, or those where the stage ran; warm answers of the peer comparison).\n",
    ]
    for name, ds in results["datasets"].items():
        if "skipped" in ds:
            parts.append(f"## {name}\n\nSkipped: {ds['skipped']}.\n")
            continue
        part = {"benchmark": "the test split", "val": "the val split"}.get(ds.get("part"), "the whole file")
        parts += [f"## {name} ({ds['n_questions']} questions from {part}, {ds['n_answerable']} answerable)\n",
                  _headline(ds, baseline), _fallback_note(ds, results["systems"]),
                  "### Decision layer: who is answered, and how often wrongly\n",
                  "An error is an answer with F1 < 0.5, or any answer to an unanswerable or out-of-domain question. "
                  "OOD-test: questions on articles absent from the corpus (decide only; a GPT route counts as "
                  "answered). read p50 = the read stage (neural reader or rule extractor). Peak RSS: this process's "
                  "high-water mark from the system's start (the run's llama.cpp model is dropped before a system "
                  "that never generates).\n", _decision(ds),
                  "### Context and answer quality\n", _detail(ds),
                  "### Router: tier choices against tier labels\n", routing.report(ds.get("router")),
                  "### Stage latency, ms: mean over all questions (p50 / p95 where the stage ran)\n", _stages(ds)]
    parts += ["## Retrieval (document-level gold evidence)\n", _retrieval(results),
              "## Peer comparison\n", _peer(results["peer"]), "## Scale\n", _scale(results["scale"]),
              "## Hardware\n", _hardware(results["hardware"])]
    if plots:
        parts += ["## Plots\n", "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n"]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
