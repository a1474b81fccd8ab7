"""Router (thesis §4.3): which budget tier a question needs, from its embedding alone.

``router.onnx`` is the MLP 384 → 256 → ReLU → Dropout → 64 → ReLU → 3 exported by
``python -m convert router``; its logits are in ``config.TIERS`` order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import TIERS, Tier
from .encode import load_session


class Router:
    def __init__(self, onnx_path: str | Path, threads: int = 1) -> None:
        self.session = load_session(Path(onnx_path), threads)
        self.input = self.session.get_inputs()[0].name

    def logits(self, vectors: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: np.atleast_2d(vectors).astype(np.float32)})[0]

    def __call__(self, vector: np.ndarray) -> Tier:
        return TIERS[int(np.argmax(self.logits(vector)[0]))]
