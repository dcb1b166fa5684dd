"""Diagnostics of tokens through depth: one battery for simulated trajectories and for the
hidden states of real models (pure functions, arrays in, numbers out).

Tokens are arrays X of shape (..., n, d): any leading axes (layers, times, runs) are
independent configurations, n tokens in arrival order (token 1 is index 0), in R^d. They need
not be unit vectors (a residual stream); the measures of direction use theta = x / |x|, and
refuse tokens with |x| = 0. Attention weights are arrays A of shape (..., H, n, n), query i
in row i, key j in column j.

* mean_pairwise_cosine : the mean of cos(x_k, x_l) over pairs k < l (Ethayarajh's anisotropy).
* cosine_to_first : cos(x_k, x_1) for every token k >= 2 (Theorem 4.1: all tokens go to x_1).
* attention_to_first : per head, the mean over queries i = 1 .. n of the weight A_{i,1} on
  token 1 (Gu et al., ICLR 2025: alpha_1 = (1/T) sum_i A_{i,1}).
* sink_rate : the fraction of heads whose attention_to_first exceeds eps (0.3, Gu et al.).
* effective_rank : exp of the entropy of the normalised singular values s / sum(s) of the
  directions (Roy and Vetterli 2007): 1 for one direction, n for orthonormal tokens.
* angular_distance : between consecutive configurations (layers) along the first axis, the
  mean over tokens of arccos(cos(x_k^t, x_k^{t+1})) / pi, in [0, 1].
* cluster_count_at : single-linkage clusters of the directions at geodesic tolerance tol
  (`attnflow.analysis.clusters`).
* renyi_center_count, strong_renyi_center_count : the numbers of Rényi and strong Rényi centers
  of the directions at radius delta (`attnflow.analysis.renyi`).
* massive_activation : max |x_{k,c}| over the median |x_{k,c}|, over all tokens and coordinates
  (Sun et al. 2024 call activations massive near 1000 times the median).
* norm_spread : std(|x_k|) / mean(|x_k|) over tokens, 0 when all tokens have one norm.

`battery` evaluates them all along the first axis of a stack of configurations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, number
from attnflow.analysis._input import run_states
from attnflow.analysis.clusters import cluster_count
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers

__all__ = ["SINK_EPS", "angular_distance", "attention_to_first", "battery",
           "cluster_count_at", "cosine_to_first", "effective_rank", "massive_activation",
           "mean_pairwise_cosine", "norm_spread", "renyi_center_count", "sink_rate",
           "strong_renyi_center_count"]

SINK_EPS = 0.3  # Gu et al. (ICLR 2025): a head is a sink head when alpha_1 > 0.3


def _tokens(name: str, X: Any, min_n: int = 1) -> np.ndarray:
    """A finite float array (..., n, d), n >= min_n, d >= 1; a Trajectory counts as its
    states (T, ..., n, d)."""
    X = finite_array(name, run_states(name, X, directions=False), min_ndim=2, dtype=float)
    if X.shape[-2] < min_n or X.shape[-1] < 1:
        raise fail(name, f"tokens of shape (..., n, d) with n >= {min_n} and d >= 1",
                   describe(X))
    return X


def _directions(name: str, X: Any, min_n: int = 1) -> np.ndarray:
    """theta = x / |x| of tokens (..., n, d); a token with |x| = 0 has no direction."""
    X = _tokens(name, X, min_n)
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    if np.any(norms == 0):
        raise fail(name, "tokens with nonzero norm (their directions are measured)",
                   f"{int(np.count_nonzero(norms == 0))} zero tokens")
    return X / norms


def _attention(A: Any) -> np.ndarray:
    A = finite_array("A", A, min_ndim=3, dtype=float)
    if A.shape[-1] != A.shape[-2] or A.shape[-1] < 1:
        raise fail("A", "attention weights of shape (..., H, n, n)", describe(A))
    return A


def mean_pairwise_cosine(X: Any) -> np.ndarray:
    """(...) the mean of cos(x_k, x_l) over the n(n-1)/2 pairs k < l of tokens (..., n, d)."""
    theta = _directions("X", X, min_n=2)
    n = theta.shape[-2]
    s = theta.sum(axis=-2)
    # sum_{k != l} cos = |sum theta|^2 - n
    return (np.einsum("...d,...d->...", s, s) - n) / (n * (n - 1))


def cosine_to_first(X: Any) -> np.ndarray:
    """(..., n - 1) cos(x_k, x_1) for tokens k = 2 .. n of X (..., n, d)."""
    theta = _directions("X", X, min_n=2)
    return np.einsum("...kd,...d->...k", theta[..., 1:, :], theta[..., 0, :])


def attention_to_first(A: Any) -> np.ndarray:
    """(..., H) per head, the mean over all queries i of the weight A[..., i, 0] on token 1
    (Gu et al.'s alpha_1; with causal attention query 1 gives it weight 1)."""
    return _attention(A)[..., :, 0].mean(axis=-1)


def sink_rate(A: Any, eps: float = SINK_EPS) -> np.ndarray:
    """(...) the fraction of the H heads of A (..., H, n, n) whose `attention_to_first`
    exceeds eps. Averaged over layers of equal H it is Gu et al.'s sink rate."""
    eps = number("eps", eps, 0.0, 1.0, expected="a threshold in [0, 1]")
    return (attention_to_first(A) > eps).mean(axis=-1)


def effective_rank(X: Any) -> np.ndarray:
    """(...) exp(-sum p log p), p = s / sum(s) the normalised singular values of the
    directions (..., n, d): between 1 and min(n, d)."""
    s = np.linalg.svd(_directions("X", X), compute_uv=False)
    p = s / s.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(p), 0.0)
    return np.exp(-plogp.sum(axis=-1))


def angular_distance(X: Any) -> np.ndarray:
    """(T - 1, ...) for configurations X (T, ..., n, d) (T >= 2, e.g. the residual stream
    after each layer): the mean over tokens of arccos(cos(x_k^t, x_k^{t+1})) / pi."""
    theta = _directions("X", X)
    if theta.ndim < 3 or theta.shape[0] < 2:
        raise fail("X", "configurations of shape (T, ..., n, d) with T >= 2", describe(theta))
    cos = np.clip(np.einsum("t...d,t...d->t...", theta[:-1], theta[1:]), -1.0, 1.0)
    return (np.arccos(cos) / np.pi).mean(axis=-1)


def cluster_count_at(X: Any, tol: float, min_size: int = 1) -> np.ndarray:
    """(...) int, single-linkage clusters of at least min_size tokens of the directions of X
    (..., n, d) at geodesic tolerance tol (radians), `attnflow.analysis.clusters.cluster_count`."""
    theta = _directions("X", X)
    if theta.shape[-1] < 2:
        raise fail("X", "tokens in R^d with d >= 2", describe(theta))
    return cluster_count(theta, tol, min_size)


def _center_count(centers: Any, X: Any, delta: float) -> np.ndarray:
    theta = _directions("X", X)
    if theta.shape[-1] < 2:
        raise fail("X", "tokens in R^d with d >= 2", describe(theta))
    flat = theta.reshape(-1, *theta.shape[-2:])
    counts = np.array([len(centers(x, delta)) for x in flat], dtype=np.intp)
    return counts.reshape(theta.shape[:-2])


def renyi_center_count(X: Any, delta: float) -> np.ndarray:
    """(...) int, the number of Rényi centers of the directions of X (..., n, d) at radius
    delta (radians), `attnflow.analysis.renyi.renyi_centers`."""
    return _center_count(renyi_centers, X, delta)


def strong_renyi_center_count(X: Any, delta: float) -> np.ndarray:
    """(...) int, the number of strong Rényi centers of the directions of X (..., n, d) at
    radius delta (radians), `attnflow.analysis.renyi.strong_renyi_centers`."""
    return _center_count(strong_renyi_centers, X, delta)


def massive_activation(X: Any) -> np.ndarray:
    """(...) max |x_{k,c}| / median |x_{k,c}| over all tokens k and coordinates c of
    X (..., n, d); inf when the median is 0 and the maximum is not."""
    X = _tokens("X", X)
    a = np.abs(X).reshape(X.shape[:-2] + (-1,))
    top, mid = a.max(axis=-1), np.median(a, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(top == 0, 1.0, top / mid)


def norm_spread(X: Any) -> np.ndarray:
    """(...) std(|x_k|) / mean(|x_k|) over the tokens of X (..., n, d) (the coefficient of
    variation of the token norms; 0 when they are equal)."""
    norms = np.linalg.norm(_tokens("X", X), axis=-1)
    mean = norms.mean(axis=-1)
    if np.any(mean == 0):
        raise fail("X", "configurations with a nonzero token", "all tokens zero")
    return norms.std(axis=-1) / mean


def battery(states: Any, attention: Any = None, *, tol: float, delta: float,
            eps: float = SINK_EPS) -> dict[str, np.ndarray]:
    """Every diagnostic of this module along the first axis of states (T, n, d) (e.g. the
    residual stream entering layer 0, then after each layer), with tol (cluster tolerance,
    radians), delta (Rényi radius, radians) and eps (sink threshold) stated by the caller.

    Returns arrays of length T: "mean_pairwise_cosine", "mean_cosine_to_first",
    "min_cosine_to_first", "effective_rank", "cluster_count", "renyi_centers",
    "strong_renyi_centers", "massive_activation", "norm_spread"; of length T - 1 (when
    T >= 2): "angular_distance"; with attention (L, H, n, n): "attention_to_first" (L, H) and
    "sink_rate" (L,).
    """
    X = _tokens("states", states, min_n=2)
    if X.ndim != 3:
        raise fail("states", "configurations of shape (T, n, d)", describe(X))
    cos1 = cosine_to_first(X)
    out = {"mean_pairwise_cosine": mean_pairwise_cosine(X),
           "mean_cosine_to_first": cos1.mean(axis=-1),
           "min_cosine_to_first": cos1.min(axis=-1),
           "effective_rank": effective_rank(X),
           "cluster_count": cluster_count_at(X, tol),
           "renyi_centers": renyi_center_count(X, delta),
           "strong_renyi_centers": strong_renyi_center_count(X, delta),
           "massive_activation": massive_activation(X),
           "norm_spread": norm_spread(X)}
    if X.shape[0] >= 2:
        out["angular_distance"] = angular_distance(X)
    if attention is not None:
        A = _attention(attention)
        if A.ndim != 4 or A.shape[-1] != X.shape[1]:
            raise fail("attention", f"weights of shape (L, H, {X.shape[1]}, {X.shape[1]})",
                       describe(A))
        out["attention_to_first"] = attention_to_first(A)
        out["sink_rate"] = sink_rate(A, eps)
    return out
