"""The field's baseline for W1, as published code writes it (benchmarks/RESULTS.md).

One explicit Euler step of causal self-attention with Q = K = V = I followed by
renormalisation, dense (n, n) scores with -inf above the diagonal and a softmax: the
textbook step of the paper's notebook and of most published simulators. Two forms:
`textbook_step` per run (X of shape (n, d)) and `batched_step` for all runs at once as one
(B, n, n) tensor. Neither uses attnflow.
"""

from __future__ import annotations

import numpy as np


def textbook_step(X: np.ndarray, beta: float, dt: float) -> np.ndarray:
    """One Euler step of one run, X (n, d) -> (n, d)."""
    n = X.shape[0]
    scores = beta * X @ X.T
    scores[np.triu_indices(n, 1)] = -np.inf
    A = np.exp(scores - scores.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    Y = X + dt * (A @ X)
    return Y / np.linalg.norm(Y, axis=1, keepdims=True)


def batched_step(X: np.ndarray, beta: float, dt: float) -> np.ndarray:
    """One Euler step of all runs, X (B, n, d) -> (B, n, d), through (B, n, n) scores."""
    n = X.shape[-2]
    scores = beta * X @ np.swapaxes(X, -1, -2)
    scores = np.where(np.tri(n, dtype=bool), scores, -np.inf)
    A = np.exp(scores - scores.max(axis=-1, keepdims=True))
    A /= A.sum(axis=-1, keepdims=True)
    Y = X + dt * (A @ X)
    return Y / np.linalg.norm(Y, axis=-1, keepdims=True)
