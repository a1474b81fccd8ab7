"""Process memory: the RSS probe, the GGUF header reader, per-component estimates and the plan.

Nothing here imports the pipeline: the pipeline asks this package for a plan before it loads anything.
The measurement harness that checks the plan against the real pipeline is ``python -m benchmarks.memory``.
"""
from .estimate import MIN_N_CTX, RUNTIME_BASE_MB, Estimate, runtime_base_estimate
from .gguf import GGUFInfo, read_gguf
from .plan import Plan, plan, stored_passages
from .rss import peak_rss_mb, rss_mb, usage_mb

__all__ = [
    "MIN_N_CTX", "RUNTIME_BASE_MB", "Estimate", "GGUFInfo", "Plan", "peak_rss_mb", "plan", "read_gguf",
    "rss_mb", "runtime_base_estimate", "stored_passages", "usage_mb",
]
