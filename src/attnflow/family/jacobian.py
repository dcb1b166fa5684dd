"""The exact Jacobian of the attention field, for implicit (stiff) integrators.

For one head with queries q_i = Q x_i, keys k_j = K x_j, values v_j = V x_j, weights
W_ij = softmax_j(beta <q_i, k_j> + log a_j) over the allowed keys (tokens, then memory) and
output a_i = sum_j W_ij v_j, the derivative of a_i with respect to token x_k is the d x d block

    da_i/dx_k = W_ik V + beta W_ik (v_k - a_i) (K^T q_i)^T
                + [i = k] beta sum_j W_ij (v_j - a_i) (Q^T k_j)^T        (j over every key),

(the first two terms: x_k as a key and a value; the last: x_i as the query; memory tokens are
fixed, so they enter only through the sums). The field F_i = a_i - <x_i, a_i> x_i then has

    dF_i/dx_k = P_i da_i/dx_k - [i = k] (<x_i, a_i> I + x_i a_i^T),   P_i = I - x_i x_i^T.

Masked keys have W_ij = 0, so a causal Jacobian is block lower triangular. Everything is dense:
memory (..., n, d, n, d), meant for the implicit methods on systems of a few thousand unknowns.
"""

from __future__ import annotations

import numpy as np

from attnflow.kernels.dense import attention_weights
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.types import Memory

__all__ = ["head_jacobian", "tangent_jacobian"]


def head_jacobian(
    X: np.ndarray,
    Q: np.ndarray | None,
    K: np.ndarray | None,
    V: np.ndarray | None,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One head's output a (..., n, d) and its derivative Da (..., n, d, n, d), where
    Da[..., i, :, k, :] = da_i/dx_k. Q, K, V are (d, d) or None for the identity; memory keys
    and values are already multiplied by K and V (as `Attention._memory` gives them)."""
    n, d = X.shape[-2:]
    q = X if Q is None else X @ Q.T
    k = X if K is None else X @ K.T
    v = X if V is None else X @ V.T
    W = attention_weights(q, k, beta, mask, memory)  # (..., n, n + m)
    keys, values = k, v
    if memory is not None:
        lead = X.shape[:-2]
        keys = np.concatenate([k, np.broadcast_to(memory.k, (*lead, *memory.k.shape))], -2)
        values = np.concatenate([v, np.broadcast_to(memory.v, (*lead, *memory.v.shape))], -2)
    a = W @ values
    Wt = W[..., :n]  # weights of the tokens (the keys that move)
    KTq = q if K is None else q @ K  # rows (K^T q_i)^T
    QTk = keys if Q is None else keys @ Q  # rows (Q^T k_j)^T
    Vm = np.eye(d) if V is None else V
    diff = v[..., None, :, :] - a[..., :, None, :]  # (..., i, k, d): v_k - a_i
    Da = (Wt[..., :, None, :, None] * Vm[:, None, :]
          + beta * (Wt[..., :, :, None] * diff).swapaxes(-1, -2)[..., :, :, :, None]
          * KTq[..., :, None, None, :])
    # x_i as the query: beta (sum_j W_ij v_j (Q^T k_j)^T - a_i (sum_j W_ij Q^T k_j)^T)
    query = beta * (np.einsum("...ij,...ja,...jb->...iab", W, values, QTk)
                    - a[..., :, None] * (W @ QTk)[..., None, :])
    idx = np.arange(n)
    Da[..., idx, :, idx, :] += np.moveaxis(query, -3, 0)
    return a, Da


def tangent_jacobian(X: np.ndarray, a: np.ndarray, Da: np.ndarray) -> np.ndarray:
    """The Jacobian (..., n, d, n, d) of F(X) = P_X a(X), given a and Da = da/dX."""
    n, d = X.shape[-2:]
    xDa = np.einsum("...ic,...ickb->...ikb", X, Da)  # x_i^T da_i/dx_k
    J = Da - X[..., :, :, None, None] * xDa[..., :, None, :, :]
    diag = (np.sum(X * a, -1)[..., None, None] * np.eye(d)
            + X[..., :, :, None] * a[..., :, None, :])  # (..., i, d, d)
    idx = np.arange(n)
    J[..., idx, :, idx, :] -= np.moveaxis(diag, -3, 0)
    return J
