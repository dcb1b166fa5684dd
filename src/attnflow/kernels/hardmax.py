"""Hardmax attention: the beta = +-inf limit of softmax attention (docs/science.md §11.6).

At beta = +inf row i weighs only its leaders, the allowed keys with the largest score
<q_i, k_j> (at beta = -inf the smallest: argmax of -<q_i, k_j>), tied leaders sharing the
weight equally:

    w_ij = 1 / |L_i| for j in L_i = {j in mask(i) : s_ij >= max_l s_il - tol_i}, else 0,
    s_ij = sign(beta) <q_i, k_j>,  tol_i = TIE_ULPS * eps * |q_i| * max_{j in mask(i)} |k_j|

(eps: the machine epsilon of the scores' dtype). With Q^T K a positive multiple of the
identity (Q = K = I) each token of the sphere is its own leader, <x_i, x_i> = 1 >= <x_i, x_j>
(Cauchy-Schwarz), so every row returns its own value and with V = I nothing moves
(`attnflow.simulate` warns when a run stays still). The tolerance is a few ulps of the scale of
row i's scores (the Cauchy-Schwarz bound |q_i| |k_j| of every score of the row, which also
bounds a dot product's rounding error up to a factor of the head size), so that scores equal
in exact arithmetic but computed in different orders are tied, and the decision is
reproducible from the scores alone. No exponential is evaluated: O(n^2 e) per call.

A score bias, memory tokens and the other normalizations have no beta = inf limit of their
own (a finite bias is negligible against an infinite beta; unnormalised weights are
infinite), so `attnflow.kernels.options` refuses them with hardmax.
"""

from __future__ import annotations

import numpy as np

from attnflow.kernels.masks import MaskSpec, mask_matrix

__all__ = ["TIE_ULPS", "Frozen", "attend", "leader_weights", "leaders", "scores", "tie_tolerance"]

TIE_ULPS = 32  # the tie tolerance in units of eps * (the scale of a row's scores)


def scores(q: np.ndarray, k: np.ndarray, sign: float, mask: MaskSpec) -> np.ndarray:
    """The signed scores sign * <q_i, k_j> (..., n, n), -inf where the mask forbids key j."""
    n = q.shape[-2]
    s = q @ np.swapaxes(k, -1, -2)
    if sign < 0:
        s = -s
    return np.where(mask_matrix(mask, n), s, -np.inf)


def tie_tolerance(q: np.ndarray, k: np.ndarray, mask: MaskSpec) -> np.ndarray:
    """tol_i = TIE_ULPS eps |q_i| max_{j in mask(i)} |k_j| (..., n) (module docstring)."""
    n = q.shape[-2]
    key_norms = np.sqrt(np.sum(k * k, axis=-1))  # (..., n)
    allowed = np.broadcast_to(mask_matrix(mask, n), (*key_norms.shape[:-1], n, n))
    top = np.max(np.where(allowed, key_norms[..., None, :], 0.0), axis=-1)
    eps = np.finfo(np.result_type(q.dtype, k.dtype, np.float32)).eps
    return TIE_ULPS * eps * np.sqrt(np.sum(q * q, axis=-1)) * top


def leaders(s: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """The leader sets as a boolean (..., n, n): j leads row i when s_ij >= max_l s_il -
    tol_i (s: signed scores with -inf for forbidden keys; every row allows a key)."""
    top = np.max(s, axis=-1, keepdims=True)
    return s >= top - tol[..., None]


def leader_weights(q: np.ndarray, k: np.ndarray, beta: float, mask: MaskSpec) -> np.ndarray:
    """The hardmax weights (..., n, n) at beta = +-inf: 1 / |L_i| on row i's leaders."""
    lead = leaders(scores(q, k, beta, mask), tie_tolerance(q, k, mask))
    return lead / np.sum(lead, axis=-1, keepdims=True)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float, mask: MaskSpec
           ) -> np.ndarray:
    """Hardmax attention (..., n, f): each row's leaders' values, averaged."""
    w = leader_weights(q, k, beta, mask)
    return w.astype(np.result_type(v.dtype, np.float32), copy=False) @ v


class Frozen:
    """A kernel with fixed attention weights W (..., n, n): returns W v whatever the scores
    (the hardmax field while every token keeps its leaders, `attnflow.events`)."""

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float,
                 mask: MaskSpec, memory: object = None, bias: object = None,
                 normalization: object = "softmax") -> np.ndarray:
        return self.weights.astype(np.result_type(v.dtype, np.float32), copy=False) @ v
