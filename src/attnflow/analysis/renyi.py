"""Rényi centers, strong Rényi centers and the fraction of tokens they consume.

Definitions (docs/science.md §4). Tokens in index order are the arrival order.

* **Rényi centers(delta):** the greedy subsequence: token i is a center when
  dist(x_i, c) > delta for every earlier center c.
* **Strong Rényi centers(delta):** token i is a strong center when dist(x_i, x_j) > delta
  for every earlier token j < i. Every strong center is a center.

The distance is geodesic, dist(x, y) = arccos<x, y>, unless Q or K is given. Then it is the
distance *induced by the score <Q x, K y>*, defined here as the angle between the query of
the later token and the key of the earlier one:

    dist_QK(x_i, x_j) = arccos( <Q x_i, K x_j> / (|Q x_i| |K x_j|) ),   j < i,

the direction in which causal attention looks. It is the geodesic distance when
Q = K = I (or Q = K = any orthogonal matrix), does not change when Q or K is scaled (so
beta, which can be absorbed into Q, plays no role), and is in general not symmetric. Q and K
must map every token to a nonzero vector.

Comparisons are made on cosines, dist <= delta iff cos >= cos(delta), so a distance within
about 1e-8 rad of delta (the square root of float64 rounding) may fall on either side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, square_matrix
from attnflow.analysis._input import radius, sphere_points
from attnflow.analysis.clusters import length_scale
from attnflow.sphere import pairwise_geodesic

__all__ = ["renyi_centers", "strong_renyi_centers", "consumed_fraction"]

# Rows per block of the strong-center scan (a (block, n) score matrix at a time); the
# ordinary-center chunks grow to 8 blocks.
_BLOCK = 1024


def _queries_keys(X: Any, Q: Any, K: Any) -> tuple[np.ndarray, np.ndarray]:
    """Unit queries and keys (n, d) of one configuration: the rows of X when Q = K = None."""
    X = sphere_points("X", X, ndim=2, quantity="Rényi centers (a set of tokens)")
    d = X.shape[1]
    out = []
    for name, M in (("Q", Q), ("K", K)):
        if M is None:
            out.append(X)
            continue
        Y = X @ square_matrix(name, M, d).T
        norms = np.linalg.norm(Y, axis=1, keepdims=True)
        if np.any(norms <= 1e-12 * max(1.0, np.linalg.norm(M, 2))):
            raise fail(name, "a matrix mapping every token to a nonzero vector",
                       f"{name} x_i = 0 for token {int(np.argmin(norms))}")
        out.append(Y / norms)
    return out[0], out[1]


def renyi_centers(X: Any, delta: float, Q: Any = None, K: Any = None) -> np.ndarray:
    """Indices of the Rényi centers of one configuration, in increasing order.

    X : (n, d) tokens on the unit sphere, in arrival order.
    delta : separation radius in radians, in [0, pi].
    Q, K : optional (d, d) matrices; the distance is then the query-key angle of the module
        docstring instead of the geodesic distance.

    Token i is a center when its distance to every earlier center exceeds delta
    (docs/science.md §4). Token 0 is always a center. Tokens are taken in chunks: each chunk is
    first screened against the centers already found (one matrix product), and only the
    survivors are decided one by one. Cost O(n m d) for m centers, mostly in BLAS.
    """
    delta = radius("delta", delta)
    q, k = _queries_keys(X, Q, K)
    n = q.shape[0]
    cos_delta = np.cos(delta)
    centers: list[int] = []
    lo, size = 0, 64
    while lo < n:
        hi = min(n, lo + size)
        # Tokens of this chunk that no center of the earlier chunks covers ...
        candidates = np.arange(lo, hi)
        if centers:
            free = np.all(q[lo:hi] @ k[centers].T < cos_delta, axis=1)
            candidates = candidates[free]
        # ... are decided in order against the centers found in this chunk.
        while candidates.size:
            c = candidates[0]
            centers.append(int(c))
            rest = candidates[1:]
            candidates = rest[q[rest] @ k[c] < cos_delta]
        lo, size = hi, min(2 * size, _BLOCK * 8)
    return np.asarray(centers, dtype=np.intp)


def strong_renyi_centers(X: Any, delta: float, Q: Any = None, K: Any = None) -> np.ndarray:
    """Indices of the strong Rényi centers of one configuration, in increasing order.

    X : (n, d) tokens on the unit sphere, in arrival order.
    delta : separation radius in radians, in [0, pi].
    Q, K : optional (d, d) matrices; the distance is then the query-key angle of the module
        docstring instead of the geodesic distance.

    Token i is a strong center when its distance to every earlier token exceeds delta
    (docs/science.md §4). Token 0 is always one. Blocks of 1024 tokens are compared with the
    earlier tokens a block at a time, dropping each token as soon as one earlier token is
    within delta: at most O(n^2 d / 2), much less when most tokens are close to an early one.
    """
    delta = radius("delta", delta)
    q, k = _queries_keys(X, Q, K)
    n = q.shape[0]
    cos_delta = np.cos(delta)
    strong = np.ones(n, dtype=bool)
    for lo in range(0, n, _BLOCK):
        rows = np.arange(lo, min(n, lo + _BLOCK))  # undecided tokens of this block
        for start in range(0, lo + 1, _BLOCK):  # earlier tokens, a block at a time
            cols = np.arange(start, min(n, start + _BLOCK))
            close = q[rows] @ k[cols].T >= cos_delta
            if start == lo:
                close &= cols[None, :] < rows[:, None]  # only earlier tokens j < i
            hit = close.any(axis=1)
            strong[rows[hit]] = False
            rows = rows[~hit]
            if rows.size == 0:
                break
    return np.flatnonzero(strong)


def consumed_fraction(states: Any, centers: Any, r: float | None = None) -> np.ndarray:
    """Fraction of tokens consumed by a set of centers, at every saved time of one run.

    states : (T, n, d) token positions of one run, or a Trajectory of one run.
    centers : int indices of the center tokens, chosen once (typically at t = 0 with
        `renyi_centers` or `strong_renyi_centers`) and then followed by index.
    r : consumption radius in radians (geodesic), in [0, pi]. Default min(pi, |beta|^{-1/2})
        (`attnflow.analysis.clusters.length_scale`, beta of either sign, not 0), available only when
        ``states`` is a Trajectory (beta read from its model).

    Definition (docs/science.md §4; the paper leaves it open): token i is consumed at time t when
    dist(x_i(t), x_c(t)) <= r for some center c, geodesic distance (from
    `attnflow.sphere.pairwise_geodesic`, accurate to about 1e-8 rad). A center consumes
    itself. Returns (T,) fractions in [0, 1].
    """
    model = getattr(states, "model", None)
    if r is None:
        if model is None:
            raise fail("r", "a radius in radians (the default beta^{-1/2} needs a Trajectory)",
                       None)
        if model.beta == 0:
            raise fail("r", "a radius in radians (the default |beta|^{-1/2} needs beta != 0)",
                       None)
        r = min(np.pi, length_scale(model.beta))
    r = radius("r", r)
    states = sphere_points("states", states, ndim=3,
                           quantity="consumed_fraction (a fraction of tokens)")
    n = states.shape[1]
    centers = finite_array("centers", centers, ndim=1)
    if not np.issubdtype(centers.dtype, np.integer) or centers.size == 0 \
            or centers.min() < 0 or centers.max() >= n:
        raise fail("centers", f"a non-empty 1-d array of token indices in [0, {n})",
                   describe(centers))
    consumed = pairwise_geodesic(states, states[:, centers]).min(axis=2) <= r  # (T, n)
    consumed[:, centers] = True  # exactly, whatever the rounding of a zero distance
    return np.mean(consumed, axis=1)
