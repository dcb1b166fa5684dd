"""Clusters of tokens on the sphere: single linkage at a geodesic tolerance.

Definition: two tokens are *linked* when their geodesic distance arccos<x, y> (docs/science.md §4)
is at most ``tol``; clusters are the connected components of the linked pairs (single
linkage). Equivalently, the clusters are what remains of a minimum spanning tree of the
tokens after deleting its edges longer than ``tol``, so the number of clusters is
1 + #(tree edges longer than tol). That is how it is computed here: Prim's algorithm on the
cosines <x, y> (a monotone function of the geodesic distance), vectorised over any number of
configurations at once, O(n^2 d) time and O(n d) memory per configuration. The tree's edge
lengths are then recomputed accurately; only distances within about 1e-8 rad of each other
(the square root of float64 rounding in a cosine) may be ordered either way. On the circle
(d = 2) the tree is read off the tokens sorted by angle instead, in O(n log n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from attnflow._checks import fail
from attnflow._repr import ShortRepr
from attnflow.analysis._input import radius, sphere_points
from attnflow.sphere import geodesic_distance, normalize

__all__ = ["Clusters", "clusters", "cluster_count", "default_cluster_tol",
           "length_scale", "spanning_tree"]

# Configurations handled per vectorised Prim pass: keeps the (chunk, n, d) temporaries
# around 2^22 floats (32 MiB).
_CHUNK_FLOATS = 1 << 22



def length_scale(beta: float) -> float:
    """The angular width |beta|^{-1/2} (rad) of the attention kernel e^{beta cos theta}: for
    beta > 0 the distance at which attraction is strongest (docs/science.md §1: tau ~
    beta^{-1/2}); for beta < 0 (repulsive) the width of the kernel's peak about the antipode,
    the same length. Infinite at beta = 0 and at beta = +-inf: a flat kernel and hardmax's
    (docs/science.md §11.6) have no length scale."""
    return abs(beta) ** -0.5 if 0 < abs(beta) < math.inf else math.inf


def default_cluster_tol(beta: float) -> float:
    """The package's default geodesic cluster tolerance (rad): `length_scale` / 4, that is
    |beta|^{-1/2} / 4 for beta of either sign (a quarter of the distance at which attraction
    is strongest, docs/science.md §1), capped at pi; 1e-2 when beta = 0 or beta = +-inf
    (hardmax: no length scale |beta|^{-1/2})."""
    return min(float(np.pi), 0.25 * length_scale(beta)) if 0 < abs(beta) < np.inf else 1e-2


@dataclass(frozen=True, repr=False)
class Clusters(ShortRepr):
    """Single-linkage clusters of one configuration of n tokens in R^d.

    Attributes
    ----------
    labels : (n,) int, cluster of each token; clusters are numbered 0, 1, ... in the order of
        their first token (token index = arrival order).
    count : number of clusters.
    sizes : (count,) number of tokens in each cluster.
    centroids : (count, d) normalised Euclidean mean of each cluster's tokens (the extrinsic
        mean on the sphere); a row is NaN when the members' mean is the zero vector (for
        example tokens spread evenly on a great circle), where no centroid is defined.
    tol : the geodesic linkage tolerance used (radians).
    """

    labels: np.ndarray
    count: int
    sizes: np.ndarray
    centroids: np.ndarray
    tol: float


def spanning_tree(X: Any) -> tuple[np.ndarray, np.ndarray]:
    """A minimum spanning tree of the tokens for the geodesic distance.

    X : (..., n, d) points on the unit sphere; leading axes are independent configurations
        (a Trajectory: its token directions (T, ..., n, d)).

    Returns (parent, length): parent (..., n) int, the tree neighbour through which token j
    joined the tree (parent[..., 0] = 0: token 0 is the root), and length (..., n) the
    geodesic length of that edge in radians (length[..., 0] = 0). The single-linkage
    clusters at any tolerance follow from this tree (module docstring).
    """
    return _tree(sphere_points("X", X, quantity="the spanning tree (discrete)"))


def _tree(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`spanning_tree` of points already checked by `sphere_points` (float64: a second check
    would hold float32 tokens to float64's tolerance)."""
    batch, (n, d) = X.shape[:-2], X.shape[-2:]
    flat = X.reshape(-1, n, d)
    parent = np.zeros(flat.shape[:2], dtype=np.intp)
    length = np.zeros(flat.shape[:2])
    tree = _circle_tree if d == 2 else _prim
    step = max(1, _CHUNK_FLOATS // (n * d))
    for lo in range(0, len(flat), step):
        parent[lo:lo + step], length[lo:lo + step] = tree(flat[lo:lo + step])
    return parent.reshape(*batch, n), length.reshape(*batch, n)


def _circle_tree(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The minimum spanning tree on the circle (d = 2), O(n log n): the tokens sorted by
    angle form a cycle of arcs, and the tree is that cycle without its longest arc, a path
    whose edges are here oriented towards token 0. X (B, n, 2) -> parent, length (B, n)."""
    B, n, _ = X.shape
    phi = np.arctan2(X[..., 1], X[..., 0])
    order = np.argsort(phi, axis=1)
    angles = np.take_along_axis(phi, order, axis=1)
    arcs = np.diff(np.concatenate([angles, angles[:, :1] + 2 * np.pi], axis=1), axis=1)
    first = np.argmax(arcs, axis=1) + 1  # the path starts after the longest arc
    path = np.take_along_axis(order, (first[:, None] + np.arange(n)) % n, axis=1)
    at0 = np.argmax(path == 0, axis=1)[:, None]
    position = np.arange(n)
    neighbour = np.where(position > at0, position - 1, np.minimum(position + 1, n - 1))
    neighbour = np.where(position == at0, position, neighbour)
    parent = np.empty((B, n), dtype=np.intp)
    np.put_along_axis(parent, path, np.take_along_axis(path, neighbour, axis=1), axis=1)
    length = geodesic_distance(X, np.take_along_axis(X, parent[:, :, None], axis=1))
    return parent, length


def _prim(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prim's algorithm on B configurations at once. X (B, n, d) -> parent, length (B, n).

    The tree grows by the largest cosine <x, y> (smallest geodesic distance); the edge
    lengths are then recomputed accurately with `geodesic_distance`."""
    B, n, _ = X.shape
    rows = np.arange(B)
    parent = np.zeros((B, n), dtype=np.intp)
    # best[b, i]: largest cosine between token i and the tree; -inf once i is in the tree.
    best = np.einsum("bnd,bd->bn", X, X[:, 0])
    best[:, 0] = -np.inf
    outside = np.ones((B, n), dtype=bool)
    outside[:, 0] = False
    new = np.empty((B, n, 1))
    closer = np.empty((B, n), dtype=bool)
    for _ in range(n - 1):
        j = np.argmax(best, axis=1)
        best[rows, j] = -np.inf
        outside[rows, j] = False
        np.matmul(X, X[rows, j][:, :, None], out=new)
        np.greater(new[..., 0], best, out=closer)
        closer &= outside
        np.copyto(best, new[..., 0], where=closer)
        np.copyto(parent, j[:, None], where=closer)
    length = geodesic_distance(X, np.take_along_axis(X, parent[:, :, None], axis=1))
    return parent, length


def cluster_count(X: Any, tol: float, min_size: int = 1) -> np.ndarray:
    """Number of single-linkage clusters at geodesic tolerance ``tol`` (radians) with at
    least ``min_size`` tokens.

    X : (..., n, d) points on the unit sphere; leading axes are independent configurations.
        A Trajectory counts as its token directions (T, ..., n, d).
    tol : the linkage tolerance in radians, in [0, pi].
    min_size : the fewest tokens a cluster needs to be counted (an integer >= 1). The
        default 1 counts every cluster, a lone straggler included; min_size = 2 or more
        leaves stragglers out. Single linkage chains: uniform tokens closer than tol to
        their neighbours are one cluster (at t = 0 for dense tokens), whatever min_size.
    Returns an int array of shape (...) (a 0-d array for one configuration).
    """
    tol = radius("tol", tol)
    X = sphere_points("X", X, quantity="cluster_count (a count)")
    if isinstance(min_size, (bool, np.bool_)) or not isinstance(min_size, (int, np.integer)) \
            or min_size < 1:
        raise fail("min_size", "an integer >= 1 (tokens in a counted cluster)", repr(min_size))
    parent, length = _tree(X)
    if min_size == 1:
        return 1 + np.count_nonzero(length[..., 1:] > tol, axis=-1)
    return _large_clusters(parent, length <= tol, int(min_size))


def _large_clusters(parent: np.ndarray, keep: np.ndarray, min_size: int) -> np.ndarray:
    """Per configuration, the clusters of at least min_size tokens left by the tree edges
    (j, parent[j]) that `keep` (..., n) keeps: one sparse graph of every configuration's
    tokens, block by block, and its connected components."""
    batch, n = parent.shape[:-1], parent.shape[-1]
    parent, keep = parent.reshape(-1, n), keep.reshape(-1, n)
    keep[:, 0] = False  # token 0 is the root, parent[0] = 0: no edge
    offset = (np.arange(len(parent)) * n)[:, None]
    j = (np.arange(n)[None, :] + offset)[keep]
    graph = coo_matrix((np.ones(len(j)), (j, (parent + offset)[keep])),
                       shape=(parent.size, parent.size))
    _, labels = connected_components(graph, directed=False)
    sizes = np.bincount(labels)
    roots = np.zeros(sizes.size, dtype=np.intp)  # each component's configuration
    roots[labels] = np.repeat(np.arange(len(parent)), n)
    large = sizes >= min_size
    return np.bincount(roots[large], minlength=len(parent)).reshape(batch)


def clusters(X: Any, tol: float) -> Clusters:
    """Single-linkage clusters of one configuration X (n, d) at geodesic tolerance ``tol``.

    Tokens at geodesic distance <= tol are linked; clusters are the connected components
    (module docstring). Returns a `Clusters` (labels, count, sizes, centroids).
    """
    X = sphere_points("X", X, ndim=2, quantity="clusters (a partition)")
    tol = radius("tol", tol)
    n = X.shape[0]
    parent, length = _tree(X)
    keep = np.flatnonzero(length[1:] <= tol) + 1  # tree edges (j, parent[j]) to keep
    graph = coo_matrix((np.ones(len(keep)), (keep, parent[keep])), shape=(n, n))
    count, raw = connected_components(graph, directed=False)
    # Number clusters by their first token.
    _, first = np.unique(raw, return_index=True)
    relabel = np.empty(count, dtype=np.intp)
    relabel[np.argsort(first)] = np.arange(count)
    labels = relabel[raw]
    sizes = np.bincount(labels, minlength=count)
    sums = np.zeros((count, X.shape[1]))
    np.add.at(sums, labels, X)
    with np.errstate(invalid="ignore", divide="ignore"):
        centroids = normalize(sums)
    centroids[np.linalg.norm(sums, axis=1) <= 1e-12 * sizes] = np.nan
    return Clusters(labels=labels, count=int(count), sizes=sizes, centroids=centroids, tol=tol)
