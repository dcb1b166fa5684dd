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

Both compute with the array they are given: numpy (scipy's logsumexp), or a torch tensor on
its device (torch's logsumexp), differentiable in X, Q, K and a tensor beta.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import logsumexp

from attnflow._array import check_parameter, is_tensor, like, namespace, tensor_scalar
from attnflow._checks import describe, fail, finite_array, positive
from attnflow.analysis._input import tokens

__all__ = ["energy", "log_energy"]


def log_energy(X: Any, beta: Any, Q: Any = None, K: Any = None) -> Any:
    """log E_beta(X), computed stably (log-sum-exp of the scores).

    X : (..., n, d) tokens (rows); leading axes are independent configurations (a
        Trajectory: its token directions (T, ..., n, d)). A numpy array, or a torch tensor
        (the result is then a tensor on its device, in its autograd graph).
    beta : inverse temperature, > 0 (module docstring for beta = 0); a 0-d tensor for
        tensor tokens keeps its gradient.
    Q, K : (e, d) query and key matrices, None for the identity (e = d); tensors keep their
        gradients, numpy matrices meet tensor tokens on their device (`attnflow._array.like`).
    Returns an array of shape (...) (0-d for one configuration), in X's library.
    """
    X = tokens("X", X, of_run="directions")
    d = X.shape[-1]
    if is_tensor(X):
        xp = namespace(X)
        beta = tensor_scalar("beta", beta, 0.0, True, "a number > 0") if is_tensor(beta) \
            else positive("beta", beta)
        q = X if Q is None else X @ xp.matrix_transpose(_matrix("Q", Q, d, X))
        k = X if K is None else X @ xp.matrix_transpose(_matrix("K", K, d, X))
    else:
        xp = np
        beta = positive("beta", beta)
        q = X if Q is None else X @ _matrix("Q", Q, d).T
        k = X if K is None else X @ _matrix("K", K, d).T
    if q.shape[-1] != k.shape[-1]:
        raise fail("Q, K", "one head size e for Q (e, d) and K (e, d)",
                   f"sizes {q.shape[-1]} and {k.shape[-1]}")
    n = X.shape[-2]
    if xp is np:
        scores = beta * (q @ np.swapaxes(k, -1, -2))  # (..., n, n)
        return logsumexp(scores, axis=(-2, -1)) - np.log(2.0 * beta * n * n)
    scores = beta * (q @ xp.matrix_transpose(k))
    scale = 2.0 * beta * n * n
    return xp.logsumexp(scores, dim=(-2, -1)) - (xp.log(scale) if is_tensor(scale)
                                                  else math.log(scale))


def energy(X: Any, beta: Any, Q: Any = None, K: Any = None) -> Any:
    """E_beta(X) = (1 / (2 beta n^2)) sum_{i,j} exp(beta <Q x_i, K x_j>): exp of `log_energy`
    (same arguments; shape (...), in X's library). inf where E_beta exceeds the dtype's
    range; use `log_energy` there."""
    out = log_energy(X, beta, Q, K)
    if is_tensor(out):
        return namespace(out).exp(out)
    with np.errstate(over="ignore"):
        return np.exp(out)


def _matrix(name: str, M: Any, d: int, X: Any = None) -> Any:
    """An (e, d) matrix: float64 numpy, or for tensor tokens X a tensor of X's dtype and
    device (a tensor M keeps its graph)."""
    if X is not None:
        M = like(check_parameter(name, M, ndim=2), X)
    else:
        M = finite_array(name, M, ndim=2, dtype=float)
    if M.shape[1] != d or M.shape[0] < 1:
        raise fail(name, f"an (e, {d}) matrix with e >= 1", describe(M))
    return M
