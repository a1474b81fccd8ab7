"""The logistic fits of the calibration: the answer-score combiner and the question-kind model (numpy, Newton's
method: a few thousand rows, no solver library needed)."""
from __future__ import annotations

import numpy as np

from edge_rag.decision.certify import FEATURES, Combiner

L2 = 1.0  # ridge on the standardised weights


def fit_combiner(x: np.ndarray, y: np.ndarray, l2: float = L2, steps: int = 50,
                 features: tuple[str, ...] = FEATURES, weights: np.ndarray | None = None) -> Combiner:
    """Logistic regression by Newton's method on standardised features (numpy; a few thousand rows); the
    columns of ``x`` are ``features``; ``weights``: per row (default 1)."""
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    v = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=float)
    ridge = np.diag([l2] * (z.shape[1] - 1) + [0.0])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-z @ w))
        grad = z.T @ (v * (p - y)) + ridge @ w
        hess = z.T @ (z * (v * p * (1 - p))[:, None]) + ridge
        w -= np.linalg.solve(hess, grad)
    return Combiner(tuple(map(float, w[:-1])), float(w[-1]), tuple(map(float, mean)), tuple(map(float, scale)), features)
