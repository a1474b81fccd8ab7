"""Router (thesis §4.3): which budget tier a question needs, from its embedding alone.

``router.onnx`` is the MLP 384 → 256 → ReLU → Dropout → 64 → ReLU → 3 exported by
``python -m convert router``; its logits are in ``config.TIERS`` order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import TIERS, Config, Tier, TierSpec
from .encode import load_session


class Router:
    def __init__(self, onnx_path: str | Path, threads: int = 1) -> None:
        self.session = load_session(Path(onnx_path), threads)
        self.input = self.session.get_inputs()[0].name

    def logits(self, vectors: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: np.atleast_2d(vectors).astype(np.float32)})[0]

    def __call__(self, vector: np.ndarray) -> Tier:
        return TIERS[int(np.argmax(self.logits(vector)[0]))]


def choose_tier(vector: np.ndarray, router: Router | None, config: Config) -> tuple[Tier, TierSpec, bool]:
    """The tier, its budget, and whether it is a fallback. The router decides unless it is switched off
    (the fixed-k baseline: k = baseline_k, other limits as the fallback tier, no rerank), a tier is
    forced (tier_override), or the bundle has no router (the config's fallback tier, recorded as such)."""
    c = config
    if not c.router:
        base = c.tier(c.fallback_tier)
        return c.fallback_tier, TierSpec(c.baseline_k, base.context_chars, base.max_new_tokens, False), False
    if c.tier_override is not None:
        return c.tier_override, c.tier(c.tier_override), False
    if router is None:
        return c.fallback_tier, c.tier(c.fallback_tier), True
    tier = router(vector)
    return tier, c.tier(tier), False
