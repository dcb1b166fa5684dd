"""Diagnostics of tokens through depth: one battery for simulated trajectories and for the
hidden states of real models (pure functions, arrays in, arrays out: numpy, or torch tensors
on their device and in their autograd graph; the counts on a host copy, refused with grad).

Tokens are arrays X of shape (..., n, d): any leading axes (layers, times, runs) are
independent configurations, n tokens in arrival order (token 1 is index 0), in R^d. They need
not be unit vectors (a residual stream); the measures of direction use theta = x / |x|, and
refuse tokens with |x| = 0. Attention weights are arrays A of shape (..., H, n, n), query i
in row i, key j in column j.

* mean_pairwise_cosine : the mean of cos(x_k, x_l) over pairs k < l (Ethayarajh's anisotropy).
* mean_direction, order_parameter : the mean (1/n) sum theta_k of the directions and its
  length |mean theta| in [0, 1] (the order parameter: 1 for one direction).
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

`battery` (`attnflow.analysis.metrics`) evaluates the registry's quantities that need at most
tol and delta, and the ones above, along the first axis of a stack of configurations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._array import check_tokens, is_tensor, namespace
from attnflow._checks import describe, fail, finite_array, number
from attnflow.analysis._input import host, tokens, unit_directions
from attnflow.analysis.clusters import cluster_count
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers

__all__ = ["SINK_EPS", "angular_distance", "attention_to_first", "cluster_count_at",
           "cosine_to_first", "effective_rank", "massive_activation", "mean_direction",
           "mean_pairwise_cosine", "norm_spread", "order_parameter", "renyi_center_count",
           "sink_rate", "strong_renyi_center_count"]

SINK_EPS = 0.3  # Gu et al. (ICLR 2025): a head is a sink head when alpha_1 > 0.3


def _directions(name: str, X: Any, min_n: int = 1) -> Any:
    """theta = x / |x| of tokens (..., n, d) (numpy, or a tensor in its graph), always
    divided by the norms; a token with |x| = 0 has no direction."""
    return unit_directions(name, X, min_n, as_they_are=False)


def check_attention(A: Any) -> Any:
    A = check_tokens("A", A, min_ndim=3) if is_tensor(A) else \
        finite_array("A", A, min_ndim=3, dtype=float)
    if A.shape[-1] != A.shape[-2] or A.shape[-1] < 1:
        raise fail("A", "attention weights of shape (..., H, n, n)", describe(A))
    return A


def _dot(x: Any, y: Any) -> Any:
    """<x, y> over the last axis: numpy's einsum (today's rounding), a tensor's sum."""
    if is_tensor(x):
        return namespace(x).sum(x * y, axis=-1)
    return np.einsum("...d,...d->...", x, y)


def mean_direction(X: Any) -> Any:
    """(..., d) the mean (1/n) sum_k theta_k of the directions of tokens (..., n, d) (on the
    circle its complex form is the first Fourier moment of the angles)."""
    theta = unit_directions("X", X)
    return namespace(theta).mean(theta, axis=-2)


def order_parameter(X: Any) -> Any:
    """(...) |(1/n) sum_k theta_k|, the length of the mean direction of tokens (..., n, d):
    1 when all directions agree, about n^{-1/2} for independent uniform ones, in [0, 1]."""
    m = mean_direction(X)
    if is_tensor(m):
        return namespace(m).linalg.vector_norm(m, axis=-1)
    return np.linalg.norm(m, axis=-1)


def mean_pairwise_cosine(X: Any) -> Any:
    """(...) the mean of cos(x_k, x_l) over the n(n-1)/2 pairs k < l of tokens (..., n, d)."""
    theta = _directions("X", X, min_n=2)
    n = theta.shape[-2]
    s = namespace(theta).sum(theta, axis=-2)
    # sum_{k != l} cos = |sum theta|^2 - n
    return (_dot(s, s) - n) / (n * (n - 1))


def cosine_to_first(X: Any) -> Any:
    """(..., n - 1) cos(x_k, x_1) for tokens k = 2 .. n of X (..., n, d)."""
    theta = _directions("X", X, min_n=2)
    if is_tensor(theta):
        return _dot(theta[..., 1:, :], theta[..., :1, :])
    return np.einsum("...kd,...d->...k", theta[..., 1:, :], theta[..., 0, :])


def attention_to_first(A: Any) -> Any:
    """(..., H) per head, the mean over all queries i of the weight A[..., i, 0] on token 1
    (Gu et al.'s alpha_1; with causal attention query 1 gives it weight 1)."""
    A = check_attention(A)
    return namespace(A).mean(A[..., :, 0], axis=-1)


def sink_rate(A: Any, eps: float = SINK_EPS) -> np.ndarray:
    """(...) the fraction of the H heads of A (..., H, n, n) whose `attention_to_first`
    exceeds eps. Averaged over layers of equal H it is Gu et al.'s sink rate. A count over
    a threshold (not differentiable): a tensor is read on a host copy, one that requires grad
    is refused (attention_to_first is differentiable)."""
    eps = number("eps", eps, 0.0, 1.0, expected="a threshold in [0, 1]")
    A = host("A", A, "sink_rate (a fraction of heads over a threshold)", "attention_to_first")
    return (attention_to_first(A) > eps).mean(axis=-1)


def effective_rank(X: Any) -> Any:
    """(...) exp(-sum p log p), p = s / sum(s) the normalised singular values of the
    directions (..., n, d): between 1 and min(n, d)."""
    theta = _directions("X", X)
    if is_tensor(theta):
        xp = namespace(theta)
        s = xp.linalg.svdvals(theta)
        p = s / xp.sum(s, axis=-1, keepdims=True)
        positive = p > 0  # 0 log 0 = 0, with a finite gradient
        plogp = xp.where(positive, p * xp.log(xp.where(positive, p, xp.ones_like(p))), 0.0)
        return xp.exp(-xp.sum(plogp, axis=-1))
    s = np.linalg.svd(theta, compute_uv=False)
    p = s / s.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(p), 0.0)
    return np.exp(-plogp.sum(axis=-1))


def angular_distance(X: Any) -> Any:
    """(T - 1, ...) for configurations X (T, ..., n, d) (T >= 2, e.g. the residual stream
    after each layer): the mean over tokens of arccos(cos(x_k^t, x_k^{t+1})) / pi."""
    theta = _directions("X", X)
    if theta.ndim < 3 or theta.shape[0] < 2:
        raise fail("X", "configurations of shape (T, ..., n, d) with T >= 2", describe(theta))
    if is_tensor(theta):
        xp = namespace(theta)
        cos = xp.clip(_dot(theta[:-1], theta[1:]), -1.0, 1.0)
        return xp.mean(xp.acos(cos) / np.pi, axis=-1)
    cos = np.clip(np.einsum("t...d,t...d->t...", theta[:-1], theta[1:]), -1.0, 1.0)
    return (np.arccos(cos) / np.pi).mean(axis=-1)


def cluster_count_at(X: Any, tol: float, min_size: int = 1) -> np.ndarray:
    """(...) int, single-linkage clusters of at least min_size tokens of the directions of X
    (..., n, d) at geodesic tolerance tol (radians), `attnflow.analysis.clusters.cluster_count` (on
    a
    host copy of a tensor; refused for one that requires grad)."""
    theta = _directions("X", host("X", X, "cluster_count_at (a count)"))
    if theta.shape[-1] < 2:
        raise fail("X", "tokens in R^d with d >= 2", describe(theta))
    return cluster_count(theta, tol, min_size)


def _center_count(centers: Any, X: Any, delta: float) -> np.ndarray:
    theta = _directions("X", host("X", X, f"the number of {centers.__name__} (a count)"))
    if theta.shape[-1] < 2:
        raise fail("X", "tokens in R^d with d >= 2", describe(theta))
    flat = theta.reshape(-1, *theta.shape[-2:])
    counts = np.array([len(centers(x, delta)) for x in flat], dtype=np.intp)
    return counts.reshape(theta.shape[:-2])


def renyi_center_count(X: Any, delta: float) -> np.ndarray:
    """(...) int, the number of Rényi centers of the directions of X (..., n, d) at radius
    delta (radians), `attnflow.analysis.renyi.renyi_centers` (host copy of a tensor without
    grad)."""
    return _center_count(renyi_centers, X, delta)


def strong_renyi_center_count(X: Any, delta: float) -> np.ndarray:
    """(...) int, the number of strong Rényi centers of the directions of X (..., n, d) at
    radius delta (radians), `attnflow.analysis.renyi.strong_renyi_centers` (host copy of a tensor
    without grad)."""
    return _center_count(strong_renyi_centers, X, delta)


def massive_activation(X: Any) -> Any:
    """(...) max |x_{k,c}| / median |x_{k,c}| over all tokens k and coordinates c of
    X (..., n, d); inf when the median is 0 and the maximum is not; 1 when both are 0."""
    X = tokens("X", X)
    if is_tensor(X):
        xp = namespace(X)
        a = xp.sort(xp.reshape(xp.abs(X), (*X.shape[:-2], -1)), axis=-1)
        m = a.shape[-1]
        top, mid = a[..., -1], (a[..., (m - 1) // 2] + a[..., m // 2]) / 2
        return xp.where(top == 0, 1.0, top / xp.where(top == 0, 1.0, mid))
    a = np.abs(X).reshape(X.shape[:-2] + (-1,))
    top, mid = a.max(axis=-1), np.median(a, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(top == 0, 1.0, top / mid)


def norm_spread(X: Any) -> Any:
    """(...) std(|x_k|) / mean(|x_k|) over the tokens of X (..., n, d) (the coefficient of
    variation of the token norms; 0 when they are equal)."""
    X = tokens("X", X)
    if is_tensor(X):
        xp = namespace(X)
        norms = xp.linalg.vector_norm(X, axis=-1)
        mean, spread = xp.mean(norms, axis=-1), xp.std(norms, axis=-1)
    else:
        norms = np.linalg.norm(X, axis=-1)
        mean, spread = norms.mean(axis=-1), norms.std(axis=-1)
    if bool((mean == 0).any()):
        raise fail("X", "configurations with a nonzero token", "all tokens zero")
    return spread / mean
