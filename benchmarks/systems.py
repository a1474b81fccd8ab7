"""The compared systems as Config presets: stage flags switched on one by one, as in the thesis."""
from __future__ import annotations

from edge_rag import Config

_OFF = dict(router=False, correction=False, rerank=False, compression=False, cgr=False)

SYSTEMS: dict[str, dict[str, bool]] = {
    "gpt_only": {"retrieval": False, "cgr": False},
    "fixed_k": _OFF,  # thesis baseline: k = baseline_k passages, unconditionally (LangChain-style)
    "routing": {**_OFF, "router": True},
    "routing_compression": {**_OFF, "router": True, "compression": True},
    "full": {**_OFF, "router": True, "rerank": True, "compression": True, "correction": True},
    "full_cgr": {**_OFF, "router": True, "rerank": True, "compression": True, "correction": True, "cgr": True},
}
BASELINE = "fixed_k"


def bench_config(threads: int = 0, memory_mb: int | None = None) -> Config:
    """Deterministic decoding, no answer cache (each system must do its own work), the given resources."""
    config = Config(temperature=0.0, cache_size=0, threads=threads)
    return config if memory_mb is None else config.with_(memory_budget_mb=memory_mb)


def preset(base: Config, system: str) -> Config:
    """The config for ``system``: ``base`` with that system's stage flags."""
    return base.with_(**SYSTEMS[system])
