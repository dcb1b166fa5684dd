"""Zonal densities on S^{d-1}, d >= 4: the mean-field equation for densities that depend on
x only through z = <x, e> (e a fixed axis), in Gegenbauer polynomials (docs/science.md §9,
"S^{d-1}, d > 3").

State: real coefficients a (S, L + 1) of S label densities rho_s(x) = sum_l a[s, l] P_l(z),
P_l = C_l^alpha / C_l^alpha(1) the Gegenbauer polynomials of alpha = (d - 2) / 2 normalised to
P_l(1) = 1 (Legendre for d = 3); mass 1 means a[s, 0] = 1 / |S^{d-1}|. Area element:
dA = |S^{d-2}| w(z) dz, w(z) = (1 - z^2)^{(d-3)/2}.

The kernel e^{b <x, y>} (Q^T K = c I, b = beta c != 0) acts diagonally (Funk-Hecke):

    int e^{b <x, y>} P_l(<y, e>) dy = lambda_l P_l(<x, e>),
    lambda_l = (2 pi)^{d/2} I_{l + alpha}(b) / b^alpha     (lambda_l(-b) = (-1)^l lambda_l(b)),

so Z = sum lambda_l g_l P_l for what a label sees, g. With V = v I the attention vector's
tangential part is (1 / b) grad_S Z (as on S^2), so the velocity is v = h(z) (e - z x) with

    h = (v / b) Z'(z) / Z(z)  (softmax),   h = (v / b) Z'(z)  (unnormalised, positional),

and, weighing the continuity equation against P_l (integration by parts; (1 - z^2) w vanishes
at z = +-1 for d >= 3), N_l d a_l / dt = int w (1 - z^2) rho h P_l' dz, N_l = int w P_l^2 dz.
The integrals are Gauss-Jacobi sums over nodes of the weight w, exact for degree 3 L when h
is a polynomial (unnormalised weights: alias-free); mass (l = 0: P_0' = 0) is exact.
Noise: the Laplace-Beltrami operator has P_l as eigenfunction, eigenvalue -l (l + d - 2).
Labels (causal mask) act on the label axis as on the circle and S^2 (`labels.see`).
Only zonal states and V = v I: the flow keeps them zonal; anything else needs the
hyperspherical harmonics (docs/science.md §9).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy.special import binom, eval_gegenbauer, gammaln, ive, roots_jacobi

from attnflow._checks import describe, fail
from attnflow.meanfield.labels import Labels, see

__all__ = ["ZonalField", "ZonalGrid", "area", "funk_hecke", "gegenbauer", "label_tail",
           "values"]


def area(d: int) -> float:
    """|S^{d-1}| = 2 pi^{d/2} / Gamma(d/2)."""
    return float(2 * np.exp(0.5 * d * np.log(np.pi) - gammaln(d / 2)))


def funk_hecke(b: float, d: int, degree: int, scaled: bool = False) -> np.ndarray:
    """lambda_l / b, l = 0..L (module docstring), times e^{-|b|} if `scaled` (b != 0)."""
    alpha = (d - 2) / 2
    l = np.arange(degree + 1)
    a = abs(b)
    # log((2 pi)^{d/2} / a^{alpha + 1}), then the Bessel functions scaled by e^{-a}
    log_scale = 0.5 * d * np.log(2 * np.pi) - (alpha + 1) * np.log(a)
    out = np.exp(log_scale) * ive(l + alpha, a)
    if not scaled:
        out = out * np.exp(a)
    return out * np.where(l % 2 == 1, 1.0, np.sign(b))  # (-1)^l lambda_l(|b|) / (-|b|)


def gegenbauer(d: int, degree: int, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, dP), each (P, L + 1): P_l(z) = C_l^alpha(z) / C_l^alpha(1) and its derivative
    2 alpha C_{l-1}^{alpha+1}(z) / C_l^alpha(1), alpha = (d - 2) / 2, at z (P,)."""
    alpha = (d - 2) / 2
    l = np.arange(degree + 1)
    top = binom(l + 2 * alpha - 1, l)  # C_l^alpha(1)
    z = np.asarray(z, dtype=float)[:, None]
    lower = eval_gegenbauer(np.maximum(l - 1, 0), alpha + 1, z)
    return eval_gegenbauer(l, alpha, z) / top, np.where(l > 0, 2 * alpha * lower, 0.0) / top


def values(a: np.ndarray, d: int, z: np.ndarray) -> np.ndarray:
    """The zonal densities with coefficients a (..., L + 1) at z (P,): (..., P)."""
    return a @ gegenbauer(d, a.shape[-1] - 1, z)[0].T


class ZonalGrid:
    """Gauss-Jacobi nodes of the weight (1 - z^2)^{(d-3)/2}, and the tables of P_l and P_l'.

    z, weights : (N,) nodes and weights (N = (3 L + 4) // 2: exact for degree 3 L + 2).
    P, dP : (N, L + 1) P_l(z_j) and P_l'(z_j).
    norms : (L + 1,) N_l = int w P_l^2 dz.
    """

    def __init__(self, d: int, degree: int, nodes: int | None = None) -> None:
        self.d, self.degree = d, degree
        alpha = (d - 2) / 2
        n = (3 * degree + 4) // 2 if nodes is None else nodes
        self.z, self.weights = roots_jacobi(n, alpha - 0.5, alpha - 0.5)
        self.P, self.dP = gegenbauer(d, degree, self.z)
        self.norms = self.weights @ self.P**2

    @cached_property
    def sphere_weights(self) -> np.ndarray:
        """(N,) weights of the integral over the sphere: |S^{d-2}| w_j."""
        return area(self.d - 1) * self.weights

    def synthesis(self, a: np.ndarray) -> np.ndarray:
        """Values (..., N) at the nodes of coefficients a (..., L + 1)."""
        return a @ self.P.T

    def analysis(self, values: np.ndarray) -> np.ndarray:
        """Coefficients (..., L + 1) of values (..., N) at the nodes (exact for polynomials
        of degree below 2 N - L)."""
        return (values * self.weights) @ self.P / self.norms


class ZonalField:
    """F(a) = d a / dt of the transport term for zonal states a (S, L + 1) on S^{d-1}
    (module docstring).

    d : the dimension (the sphere S^{d-1}), >= 3.
    b : beta c != 0.  v : V = v I (times the strength).
    weighting : "softmax", "unnormalised" or "positional".
    labels : 1 (full mask) or the causal mask's `Labels`.
    degree : L.
    """

    def __init__(self, d: int, b: float, v: float, weighting: str, labels: int | Labels,
                 degree: int) -> None:
        if b == 0:
            raise fail("beta", "beta c != 0 for zonal densities on S^{d-1}, d > 3",
                       repr(b))
        self.d, self.b, self.v, self.weighting, self.degree = d, b, v, weighting, degree
        self.labels = labels if isinstance(labels, Labels) else None
        self._seen = None if self.labels is None else self.labels.seen(weighting)
        self.grid = ZonalGrid(d, degree)
        self.points = len(self.grid.z)
        self._kernel = funk_hecke(b, d, degree, scaled=weighting == "softmax")  # lambda_l / b
        self._b_kernel = self._kernel * b  # lambda_l (scaled alike)

    def velocity(self, a: np.ndarray) -> np.ndarray:
        """h (S, N) at the nodes: the velocity is h(z) (e - z x)."""
        g = a if self._seen is None else see(self._seen, a).real
        h = self.v * (g * self._kernel) @ self.grid.dP.T
        if self.weighting == "softmax":
            h = h / ((g * self._b_kernel) @ self.grid.P.T)
        return h

    def __call__(self, a: np.ndarray) -> np.ndarray:
        """d a / dt (S, L + 1)."""
        g = self.grid
        flux = g.synthesis(a) * self.velocity(a) * (1 - g.z**2) * g.weights
        return flux @ g.dP / g.norms

    def speed_bound(self) -> float:
        """|v| for softmax, |v| e^|b| otherwise (as on S^2)."""
        return abs(self.v) * (1.0 if self.weighting == "softmax" else float(np.exp(abs(self.b))))


def tail(a: np.ndarray, grid: ZonalGrid) -> np.ndarray:
    """The resolution measure (S,): the L2 norm over the sphere of the degrees above 2 L / 3,
    relative to the uniform density 1 / |S^{d-1}|."""
    high = slice(2 * (a.shape[-1] - 1) // 3 + 1, None)
    return _relative_l2(a[..., high], grid.norms[:a.shape[-1]][high], grid.d)


def _relative_l2(a: np.ndarray, norms: np.ndarray, d: int) -> np.ndarray:
    """The L2 norm over S^{d-1} (...,) of sum a_l P_l (coefficients a (..., k), their norms
    N_l (k,)), relative to that of the uniform density, 1 / sqrt(|S^{d-1}|)."""
    return np.sqrt(np.sum(a**2 * norms, axis=-1) * area(d - 1) * area(d))


def label_tail(labels: Labels, a: np.ndarray, d: int) -> float:
    """The resolution measure in s of states a (S, L + 1) (chebyshev labels; 0 for cells):
    the L2 norm over the sphere and the labels' Chebyshev coefficients above degree
    2 (S - 1) / 3, relative (as `tail`)."""
    norms = ZonalGrid(d, a.shape[-1] - 1).norms
    return float(np.sqrt(np.sum(_relative_l2(labels.excess(a), norms, d) ** 2)))


def minimum(a: np.ndarray, grid: ZonalGrid) -> float:
    """The smallest value at the nodes times |S^{d-1}| (1 at the uniform state)."""
    return float(grid.synthesis(a).min() * area(grid.d))


def check_coefficients(a, name: str, tol: float, d: int) -> np.ndarray:
    """Validate zonal coefficients (L + 1,) or (S, L + 1), L >= 3: finite, real, mass 1 per
    label (to 1e-12), resolved (`tail` <= tol) and >= -tol / |S^{d-1}| at the nodes; returns
    them as a float (S, L + 1) array."""
    arr = np.asarray(a)
    if (arr.ndim not in (1, 2) or arr.shape[-1] < 4 or not np.isrealobj(arr)
            or not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr))):
        raise fail(name, "finite real Gegenbauer coefficients (L + 1,) or (S, L + 1), L >= 3",
                   describe(arr))
    arr = np.atleast_2d(arr).astype(float)
    mass = arr[:, 0] * area(d)
    if not np.allclose(mass, 1.0, rtol=0, atol=1e-12):
        raise fail(name, f"densities of mass 1 (a[s, 0] = 1 / |S^{d - 1}|)",
                   f"masses {np.round(mass, 15)[:5].tolist()}")
    arr[:, 0] = 1 / area(d)
    grid = ZonalGrid(d, arr.shape[-1] - 1)
    worst = float(tail(arr, grid).max())
    if worst > tol:
        raise fail(name, f"a density resolved by degree {arr.shape[-1] - 1} (the degrees above "
                   f"2 L / 3 below {tol:g} relative)", f"a tail of {worst:.3g}")
    if minimum(arr, grid) < -tol:
        raise fail(name, "a density >= 0", f"a minimum of {minimum(arr, grid):.3g} / |S|")
    return arr


def from_values(f, d: int, degree: int, tol: float, s: np.ndarray | None = None
                ) -> np.ndarray:
    """Coefficients (S, L + 1) of the zonal densities proportional to f(z) (or f(s, z) at the
    labels s, called with s of shape (S, 1)), z = <x, e> in [-1, 1], sampled at the nodes of
    degree 2 L; degrees above L must be below `tol` (relative)."""
    from attnflow._checks import finite_array

    fine = ZonalGrid(d, max(2 * degree, 16))
    S = 1 if s is None else len(s)
    values = finite_array("f", f(fine.z) if s is None else f(s[:, None], fine.z), dtype=float)
    try:
        values = np.broadcast_to(values, (S, len(fine.z)))
    except ValueError:
        raise fail("f", f"values of shape ({len(fine.z)},) or ({S}, {len(fine.z)}) at the "
                   "sample points z", describe(values)) from None
    if values.min() < 0 or np.any(values.max(axis=1) <= 0):
        raise fail("f", "a density: values >= 0 with positive mass", f"minimum {values.min()}")
    a = fine.analysis(values)
    a = a / (a[:, :1] * area(d))
    left = float(_relative_l2(a[:, degree + 1:], fine.norms[degree + 1:], d).max())
    if left > tol:
        raise fail("modes", f"a degree L that resolves f (its degrees above L = {degree} below "
                   f"{tol:g} relative)", f"{degree}, which leaves {left:.3g}")
    return check_coefficients(a[:, :degree + 1], "f", tol, d)
