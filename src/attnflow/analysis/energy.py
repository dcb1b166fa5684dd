"""The interaction energy of a token configuration (docs/science.md §6).

For tokens x_1..x_n in R^d and query/key matrices Q, K (acting on column vectors, shape (e, d);
None is the identity),

    E_beta(X) = (1 / (2 beta n^2)) sum_{i,j} exp(beta <Q x_i, K x_j>),   beta > 0.

Full attention with Q^T K = V = I increases E_beta along trajectories: unnormalised attention
is its gradient ascent on the sphere, softmax attention its gradient ascent in another metric.
Causal attention has no such structure, and E_beta may decrease along causal trajectories.

E_beta overflows float64 once beta <Q x_i, K x_j> exceeds about 709 (beta in the hundreds for
unit tokens), so `log_energy` computes log E_beta by a shifted log-sum-exp and `energy` is its
exponential (inf only where E_beta itself exceeds the float64 range).

beta = 0 is excluded: E_beta = 1/(2 beta) + (1/(2 n^2)) sum_{i,j} <Q x_i, K x_j> + O(beta)
diverges as beta -> 0. The finite part, the energy whose gradient gives the beta = 0
dynamics, differs from E_beta by a constant; use it directly where beta = 0 is needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import logsumexp

from attnflow._checks import describe, fail, finite_array, positive
from attnflow.analysis._input import run_states

__all__ = ["energy", "log_energy"]


def log_energy(X: Any, beta: float, Q: Any = None, K: Any = None) -> np.ndarray:
    """log E_beta(X), computed stably (log-sum-exp of the scores).

    X : (..., n, d) tokens (rows); leading axes are independent configurations (a
        Trajectory: its token directions (T, ..., n, d)).
    beta : inverse temperature, > 0 (module docstring for beta = 0).
    Q, K : (e, d) query and key matrices, None for the identity (e = d).
    Returns an array of shape (...) (0-d for one configuration).
    """
    X = finite_array("X", run_states("X", X), min_ndim=2, dtype=float)
    if X.shape[-1] < 1 or X.shape[-2] < 1:
        raise fail("X", "an array of shape (..., n, d) with n >= 1 and d >= 1", describe(X))
    beta = positive("beta", beta)
    q = X if Q is None else X @ _matrix("Q", Q, X.shape[-1]).T
    k = X if K is None else X @ _matrix("K", K, X.shape[-1]).T
    if q.shape[-1] != k.shape[-1]:
        raise fail("Q, K", "one head size e for Q (e, d) and K (e, d)",
                   f"sizes {q.shape[-1]} and {k.shape[-1]}")
    scores = beta * (q @ np.swapaxes(k, -1, -2))  # (..., n, n)
    n = X.shape[-2]
    return logsumexp(scores, axis=(-2, -1)) - np.log(2.0 * beta * n * n)


def energy(X: Any, beta: float, Q: Any = None, K: Any = None) -> np.ndarray:
    """E_beta(X) = (1 / (2 beta n^2)) sum_{i,j} exp(beta <Q x_i, K x_j>): exp of `log_energy`
    (same arguments; shape (...)). inf where E_beta exceeds float64; use `log_energy` there."""
    with np.errstate(over="ignore"):
        return np.exp(log_energy(X, beta, Q, K))


def _matrix(name: str, M: Any, d: int) -> np.ndarray:
    M = finite_array(name, M, ndim=2, dtype=float)
    if M.shape[1] != d or M.shape[0] < 1:
        raise fail(name, f"an (e, {d}) matrix with e >= 1", describe(M))
    return M
