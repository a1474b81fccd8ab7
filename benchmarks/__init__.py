"""edge-rag benchmarks (`python -m benchmarks`, `make bench`): quality, latency, tokens, routes, memory.

Kept free of imports so that `python -m benchmarks.peer` workers start with nothing but what they measure.
"""
