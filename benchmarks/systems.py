"""The compared systems as Config presets: stage flags switched on one by one, as in the thesis."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace

from edge_rag import Config
from edge_rag.config import Tier
from edge_rag.reading.reader import READER_ASSET

_OFF = dict(router=False, correction=False, rerank=False, compression=False, cgr=False)

SYSTEMS: dict[str, dict[str, bool | str]] = {
    "gpt_only": {"retrieval": "none", "cgr": False},
    "fixed_k": _OFF,  # thesis baseline: k = baseline_k passages, unconditionally (LangChain-style)
    "routing": {**_OFF, "router": True},
    "compression": {**_OFF, "compression": True},  # fixed k = baseline_k, compressed to the fallback tier's budget
    "routing_compression": {**_OFF, "router": True, "compression": True},
    "full": {**_OFF, "router": True, "rerank": True, "compression": True, "correction": True},
    # the seeds' decision: rule extractor, Eq. 1 tau, evidence-gate heuristic, distance ceiling
    "full_cgr": {**_OFF, "router": True, "rerank": True, "compression": True, "correction": True, "cgr": True,
                 "certified": False, "reader": "rules"},
    # certified selective answering (edge_rag/decision/certify.py) with the rule extractor, then with the trained reader
    "certified_rules": {**_OFF, "router": True, "rerank": True, "compression": True, "correction": True, "cgr": True,
                        "certified": True, "reader": "rules"},
    "certified": {**_OFF, "router": True, "rerank": True, "compression": True, "correction": True, "cgr": True,
                  "certified": True, "reader": "neural"},
}
BASELINE = "fixed_k"


def available() -> list[str]:
    """The systems this checkout can run: the neural reader's only once reader.onnx is shipped."""
    return [s for s, flags in SYSTEMS.items() if flags.get("reader") != "neural" or READER_ASSET.is_file()]


def bench_config(threads: int = 0, memory_mb: int | None = None, passage_mode: str = "sentence",
                 max_new_tokens: int | None = None, context_chars: Mapping[Tier, int] | None = None) -> Config:
    """Deterministic decoding, no answer cache (each system must do its own work), the given resources and
    passages (sentences, as the router was trained on, or whole paragraphs); ``max_new_tokens`` caps every tier's
    answer length (a quick check of the harness; not a decision input, so the readers' certificates stand, while
    the GPT route's counts do not); ``context_chars`` sets some tiers' context budgets (measuring a budget: the rule
    reader's certificate and the GPT route's counts do not hold under another, the neural reader's does)."""
    config = Config(temperature=0.0, cache_size=0, threads=threads, passage_mode=passage_mode)
    chars = context_chars or {}
    config = config.with_(tiers={t: replace(s, max_new_tokens=min(s.max_new_tokens, max_new_tokens or s.max_new_tokens),
                                            context_chars=chars.get(t, s.context_chars))
                                 for t, s in config.tiers.items()})
    return config if memory_mb is None else config.with_(memory_budget_mb=memory_mb)


def run_settings(args: argparse.Namespace) -> dict:
    """``bench_config``'s inputs from the run's options, as JSON: a worker process builds the run's Config from them
    (``settings_config``), so a stack measured apart answers with the run's passages, answer length and budgets."""
    return {"threads": args.threads, "memory_mb": args.memory_mb, "passage_mode": args.passages,
            "max_new_tokens": args.max_new_tokens, "context_chars": {t.value: n for t, n in args.context_chars}}


def settings_config(settings: Mapping) -> Config:
    """The Config of ``run_settings``'s JSON."""
    return bench_config(**{**settings, "context_chars": {Tier(t): n for t, n in settings["context_chars"].items()}})


def preset(base: Config, system: str) -> Config:
    """The config for ``system``: ``base`` with that system's stage flags."""
    return base.with_(**SYSTEMS[system])
