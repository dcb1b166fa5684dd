"""The atlas of final configurations (docs/science.md §3, the paper's Table 1).

Conjecture: only the spectrum of the value matrix V decides where causal attention
dynamics end. With lambda_max the eigenvalue of largest real part, L its eigenspace and xi a
unit vector spanning L when dim L = 1:

=============  ============  ==========================================================
row            lambda_max    final configuration
=============  ============  ==========================================================
first-token    > 0, dim L=d  the first token x_1(0) (V = lambda I; Theorem 4.1)
point-in-L     > 0, dim L>=2 one point in L, the limit of token 1 (below)
two-points     > 0, dim L=1  two points, xi and -xi
cloud-L        < 0, dim L>=2 a cloud of points around L
two-clouds     < 0, dim L=1  two clouds, around xi and -xi
=============  ============  ==========================================================

Token 1 attends only to itself, so x_1(t) = e^{tV} x_1(0) / |e^{tV} x_1(0)| exactly, and for
a semisimple lambda_max > 0 it tends to Pi x_1(0) / |Pi x_1(0)|, with Pi the *spectral*
projector onto L (along the other generalised eigenspaces of V). The table writes P_L, the
orthogonal projector; the two agree when V is normal (e.g. symmetric) and the spectral one is
the right one otherwise, which is what `predict_configuration` returns.

The atlas says nothing when lambda_max = 0, when the eigenvalues of largest real part are
complex, or when lambda_max has a non-trivial Jordan block (Lemma 3.1: then tokens approach
the top of the block only at rate 1/t); `predict_configuration` then answers
"not-covered" and says why, rather than guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, positive, square_matrix
from attnflow._repr import ShortRepr
from attnflow.analysis._input import radius, sphere_points
from attnflow.analysis.clusters import clusters
from attnflow.sphere import geodesic_distance, normalize

__all__ = ["ROWS", "AtlasPrediction", "ObservedConfiguration", "predict_configuration",
           "classify_configuration", "distance_to_subspace"]

#: Row names of the atlas and of the observed configurations, with their descriptions.
ROWS: dict[str, str] = {
    "first-token": "one point, at the first token x_1(0)",
    "point-in-L": "one point in L",
    "two-points": "two antipodal points, xi and -xi",
    "cloud-L": "a cloud of points around L",
    "two-clouds": "two clouds, around xi and -xi",
    "k-clusters": "k clusters",
    "other": "other",
    "not-covered": "not covered by the atlas",
}


@dataclass(frozen=True, repr=False)
class AtlasPrediction(ShortRepr):
    """The atlas row that V's spectrum selects, and the numbers behind it.

    Attributes
    ----------
    row : a key of `ROWS` ("first-token", "point-in-L", "two-points", "cloud-L",
        "two-clouds" or "not-covered").
    label : a sentence: the predicted final configuration, or why V is not covered.
    eigenvalues : (d,) complex eigenvalues of V, by decreasing real part.
    lambda_max : the eigenvalue of largest real part (mean of the numerically equal ones).
    multiplicity : its algebraic multiplicity (eigenvalues within tol * |V| of it).
    dim_L : its geometric multiplicity, dim ker(V - lambda_max I) (0 when complex).
    L : (d, dim_L) orthonormal basis of the eigenspace L, or None when complex.
    xi : (d,) unit vector spanning L when dim_L = 1 (sign: largest entry positive), else None.
    point : (d,) the predicted single final point when the row is "first-token" or
        "point-in-L" and x1_0 was given: Pi x1_0 / |Pi x1_0| (module docstring), else None.
    """

    row: str
    label: str
    eigenvalues: np.ndarray
    lambda_max: complex
    multiplicity: int
    dim_L: int
    L: np.ndarray | None
    xi: np.ndarray | None
    point: np.ndarray | None


@dataclass(frozen=True, repr=False)
class ObservedConfiguration(ShortRepr):
    """What a final configuration looks like, and the numbers behind the verdict.

    Attributes
    ----------
    row : a key of `ROWS` other than "not-covered".
    label : a sentence naming the configuration (with k for "k-clusters").
    n_clusters, sizes, centroids : single-linkage clusters at geodesic tolerance ``tol``
        (see `attnflow.analysis.clusters.clusters`).
    xi : (d,) the observed axis for "two-points" / "two-clouds", else None.
    max_dist_x1 : largest geodesic distance from a token to x1_0 (NaN without x1_0).
    max_dist_L : largest geodesic distance from a token to the unit sphere of L
        (`distance_to_subspace`; NaN without V or when V's top eigenvalue is complex).
    antipodal_gap : pi minus the distance between the two centroids when there are exactly
        two clusters, else NaN.
    sides : with dim L = 1, the number of tokens with <x, xi> > 0 and < 0, else None.
    tol, cloud_radius : the tolerances used (radians).
    """

    row: str
    label: str
    n_clusters: int
    sizes: np.ndarray
    centroids: np.ndarray
    xi: np.ndarray | None
    max_dist_x1: float
    max_dist_L: float
    antipodal_gap: float
    sides: tuple[int, int] | None
    tol: float
    cloud_radius: float


def predict_configuration(V: Any, x1_0: Any = None, tol: float = 1e-6) -> AtlasPrediction:
    """The atlas row (docs/science.md §3) that the spectrum of V predicts.

    V : (d, d) value matrix (acting on column vectors).
    x1_0 : optional (d,) first token, to compute the predicted point of the one-point rows.
    tol : relative tolerance: eigenvalues within tol * |V|_2 count as equal, imaginary parts
        and lambda_max below tol * |V|_2 count as zero, and singular values of
        V - lambda_max I below tol * |V|_2 count as zero. Default 1e-6, well above the
        ~1e-8 splitting that rounding causes in a defective eigenvalue.

    Returns an `AtlasPrediction`; its row is "not-covered" (with the reason in its label)
    when lambda_max = 0, when the top eigenvalues are complex, or when lambda_max has a
    non-trivial Jordan block.
    """
    V = square_matrix("V", V)
    tol = positive("tol", tol)
    d = V.shape[0]
    x1 = None if x1_0 is None else _unit_vector("x1_0", x1_0, d)
    w = np.linalg.eigvals(V)
    w = w[np.argsort(-w.real, kind="stable")]
    scale = max(float(np.linalg.norm(V, 2)), np.finfo(float).tiny)
    top = w[w.real >= w[0].real - tol * scale]
    lam = complex(np.mean(top))
    common = dict(eigenvalues=w, lambda_max=lam, multiplicity=len(top))

    def uncovered(why: str, dim_L: int = 0, L: np.ndarray | None = None) -> AtlasPrediction:
        return AtlasPrediction(row="not-covered", label=f"not covered by the atlas: {why}",
                               dim_L=dim_L, L=L, xi=None, point=None, **common)

    if np.max(np.abs(top.imag)) > tol * scale:
        return uncovered(f"the eigenvalues of largest real part are complex ({_fmt(top)})")
    lam = lam.real
    common["lambda_max"] = complex(lam)
    shifted = V - lam * np.eye(d)
    _, s, vh = np.linalg.svd(shifted)
    dim_L = int(np.count_nonzero(s <= tol * scale))
    L = vh[d - dim_L:].T.copy()
    if abs(lam) <= tol * scale:
        return uncovered("lambda_max = 0", dim_L, L)
    if dim_L < len(top):
        return uncovered(f"lambda_max = {lam:.6g} has a non-trivial Jordan block (algebraic "
                         f"multiplicity {len(top)}, eigenspace dimension {dim_L})", dim_L, L)
    xi = None
    if dim_L == 1:
        xi = L[:, 0] * np.sign(L[np.argmax(np.abs(L[:, 0])), 0])
    point = None
    if lam > 0 and dim_L == d:
        row = "first-token"
        point = x1
    elif lam > 0 and dim_L >= 2:
        row = "point-in-L"
        if x1 is not None:
            left = np.linalg.svd(shifted.T)[2][d - dim_L:].T  # left eigenvectors (d, dim_L)
            image = L @ np.linalg.solve(left.T @ L, left.T @ x1)  # spectral projection
            point = None if np.linalg.norm(image) <= tol else normalize(image)
    elif lam > 0:
        row = "two-points"
    else:
        row = "cloud-L" if dim_L >= 2 else "two-clouds"
    label = f"{ROWS[row]} (lambda_max = {lam:.6g}, dim L = {dim_L})"
    return AtlasPrediction(row=row, label=label, dim_L=dim_L, L=L, xi=xi, point=point, **common)


def distance_to_subspace(X: Any, L: Any) -> np.ndarray:
    """Geodesic distance from points X (..., d) on the sphere to the unit sphere of span(L).

    L : (d, k) matrix whose columns span the subspace (orthonormalised here).
    The distance is arccos |P_L x| with P_L the orthogonal projector, in [0, pi/2], computed
    as atan2(|x - P_L x|, |P_L x|) (accurate near 0). Returns shape (...).
    """
    X = np.asarray(X, dtype=float)
    basis = np.linalg.qr(np.asarray(L, dtype=float))[0]
    inside = X @ basis @ basis.T
    return np.arctan2(np.linalg.norm(X - inside, axis=-1), np.linalg.norm(inside, axis=-1))


def classify_configuration(
    X_final: Any,
    V: Any = None,
    x1_0: Any = None,
    tol: float = 1e-2,
    cloud_radius: float = np.pi / 3,
) -> ObservedConfiguration:
    """Name an observed final configuration (the rows of `ROWS`).

    X_final : (n, d) tokens on the sphere at the final time.
    V : optional (d, d) value matrix; it supplies L and xi (through `predict_configuration`)
        for the rows that refer to them. Without it those rows cannot be named.
    x1_0 : optional (d,) initial first token, for the "first-token" row.
    tol : geodesic tolerance in radians (default 1e-2) for clustering (single linkage), for
        "at x1_0", "in L" and "antipodal".
    cloud_radius : a cloud is around L when every token is within this geodesic distance of
        L's unit sphere (default pi/3).

    Rules, in order (k = number of clusters at tol):

    1. k = 1 and every token within tol of x1_0: "first-token".
    2. k = 1 and every token within tol of L: "point-in-L".
    3. k = 2, the centroids antipodal within tol, and (when V is given) every token within
       tol of L: "two-points".
    4. k <= n / 2 (the tokens have merged into clusters): "k-clusters".
    5. Otherwise (unclustered), V given and every token within cloud_radius of L: "cloud-L"
       when dim L >= 2, "two-clouds" when dim L = 1 and both signs of <x, xi> occur.
    6. Otherwise "other".

    The default cloud_radius, pi/3, separates the clouds of the negative rows at beta = 9
    (d = 3, n = 32: every token within about 0.45 rad of L for dim L = 2, 0.8 rad for
    dim L = 1) from uniform tokens (for dim L = 2, n = 32 uniform tokens pass with
    probability sin(pi/3)^32 = 1%; for dim L = 1, 2^-32). Clouds narrow as beta grows; at
    beta = 1 the tokens do not concentrate around L at all.
    """
    X = sphere_points("X_final", X_final, ndim=2, quantity="classify_configuration")
    tol = radius("tol", tol)
    cloud_radius = radius("cloud_radius", cloud_radius)
    n, d = X.shape
    found = clusters(X, tol)
    k = found.count
    max_dist_x1 = np.nan
    if x1_0 is not None:
        max_dist_x1 = float(np.max(geodesic_distance(X, _unit_vector("x1_0", x1_0, d))))
    L = None
    if V is not None:
        L = predict_configuration(square_matrix("V", V, d)).L
    max_dist_L = np.nan if L is None else float(np.max(distance_to_subspace(X, L)))
    in_L = L is None or max_dist_L <= tol
    antipodal_gap = np.nan
    if k == 2:
        antipodal_gap = float(np.pi - geodesic_distance(*found.centroids))
    sides = None
    if L is not None and L.shape[1] == 1:
        dots = X @ L[:, 0]
        sides = (int(np.count_nonzero(dots > 0)), int(np.count_nonzero(dots < 0)))

    xi = None
    if k == 1 and max_dist_x1 <= tol:
        row = "first-token"
    elif k == 1 and L is not None and in_L:
        row = "point-in-L"
    elif k == 2 and antipodal_gap <= tol and in_L:
        row = "two-points"
        xi = found.centroids[0]
    elif k <= n / 2:
        row = "k-clusters"
    elif L is not None and max_dist_L <= cloud_radius and L.shape[1] >= 2:
        row = "cloud-L"
    elif L is not None and max_dist_L <= cloud_radius and L.shape[1] == 1 and min(sides) > 0:
        row = "two-clouds"
        xi = L[:, 0]
    else:
        row = "other"
    label = f"{k} clusters" if row == "k-clusters" else ROWS[row]
    return ObservedConfiguration(
        row=row, label=label, n_clusters=k, sizes=found.sizes, centroids=found.centroids,
        xi=xi, max_dist_x1=max_dist_x1, max_dist_L=max_dist_L, antipodal_gap=antipodal_gap,
        sides=sides, tol=tol, cloud_radius=cloud_radius,
    )


def _unit_vector(name: str, x: Any, d: int) -> np.ndarray:
    """A (d,) point on the sphere."""
    x = finite_array(name, x, ndim=1, dtype=float)
    if x.shape[0] != d:
        raise fail(name, f"a unit vector of length {d}", describe(x))
    return sphere_points(name, x[None, :], ndim=2)[0]


def _fmt(values: np.ndarray) -> str:
    return ", ".join(f"{complex(v):.4g}" for v in values)
