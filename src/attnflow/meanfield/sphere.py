"""The mean-field equation on S^2, pseudo-spectral in spherical harmonics (docs/science.md §9).

State: complex coefficients c (S, L + 1, L + 1) of S label densities in the orthonormal
spherical harmonics Y_lm(theta, phi) = P_lm(cos theta) e^{i m phi} (theta the polar angle,
scipy's `sph_harm_y` normalisation, Condon-Shortley phase), stored for m = 0..l (entries with
m > l are 0): rho_s = sum_l [c[s, l, 0] Y_l0 + 2 Re sum_{m > 0} c[s, l, m] Y_lm]. A real
density has real c[s, l, 0]; mass 1 means c[s, 0, 0] = 1 / sqrt(4 pi).

The kernel e^{b <x, y>} (Q^T K = c I, b = beta c) acts diagonally (Funk-Hecke: the integral
of e^{b <x, y>} Y_lm(y) over the sphere is 4 pi i_l(b) Y_lm(x), i_l the modified spherical
Bessel functions), and so does the attention vector, by the addition theorem differentiated:

    Z(x) = int e^{b <x, y>} sigma(dy)     coefficients 4 pi i_l(b) c_lm,
    N(x) = int e^{b <x, y>} y sigma(dy) = grad_S T(x) + x R(x), with coefficients
           T: 4 pi (i_{l-1} - i_{l+1}) / (2 l + 1) c_lm,
           R: 4 pi (l i_{l-1} + (l + 1) i_{l+1}) / (2 l + 1) c_lm

(N is (1 / b) times the ambient gradient of x -> int e^{b <x, y>} sigma(dy): its tangential
part (1 / b) grad_S Z, written with i_l(b) / b = (i_{l-1} - i_{l+1}) / (2 l + 1) so that b = 0
needs no limit; its normal part d/db of 4 pi i_l(b), i_l' = (l i_{l-1} + (l + 1) i_{l+1}) /
(2 l + 1)). The velocity is P_x V N [/ Z for softmax weights]; the transport term's
coefficients are the weak form of -div(rho v): int rho v . grad_S conj(Y_lm).

Quadrature: Gauss-Legendre nodes in cos theta and equispaced phi, enough (`grid_shape`) for
the products rho v . grad Y of degree <= 3 L + 4 to be integrated exactly when v is a
polynomial of degree L + 3 (unnormalised weights: exact, alias-free); for softmax weights
v is a quotient and this is the usual dealiased truncation. Mass (l = 0) has derivative 0
exactly. Transforms: an FFT in phi and, per order m, a matrix product with the tabulated
P_lm(cos theta_j) and d/dtheta P_lm: O(L^3) per evaluation.

Causal mask: the state is one density per label s in [0, 1] (`attnflow.meanfield.labels`,
the circle's label schemes and ALiBi), and label s sees sigma_s = int_0^s e^{-lambda (s - s')}
f(s', .) ds' scaled by the weighting (`Labels.seen`): the same real (S, S) matrix acts on the
label axis of the coefficients (`labels.see`), Z and N are those of sigma_s, and the flux is
that of label s's own density (docs/science.md §9, "The causal mask on S^2").
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy.special import ive, sph_harm_y

from attnflow._checks import fail
from attnflow.meanfield.labels import Labels, see

__all__ = ["SphereGrid", "TransportField2", "degrees", "grid_shape", "kernel_coefficients",
           "label_tail"]


def grid_shape(degree: int) -> tuple[int, int]:
    """(nodes in cos theta, points in phi) for degree L: 2 N_theta - 1 >= 3 L + 4 and
    N_phi >= 3 L + 5 (the module docstring's dealiasing), N_phi even."""
    n_theta = (3 * degree + 6) // 2
    n_phi = 3 * degree + 6
    return n_theta, n_phi + n_phi % 2


def degrees(degree: int) -> np.ndarray:
    """The degree l of each entry (L + 1, L + 1) of a coefficient array (rows l, columns m)."""
    return np.broadcast_to(np.arange(degree + 1)[:, None], (degree + 1, degree + 1))


def kernel_coefficients(b: float, degree: int) -> np.ndarray:
    """e^{-|b|} i_l(b), l = 0..L + 1 (scaled modified spherical Bessel functions, exact at
    b = 0; i_l(-b) = (-1)^l i_l(b))."""
    l = np.arange(degree + 2)
    if b == 0:
        return (l == 0).astype(float)
    a = abs(b)
    out = np.sqrt(np.pi / (2 * a)) * ive(l + 0.5, a)
    return out * np.where(l % 2 == 1, np.sign(b), 1.0)


class SphereGrid:
    """The quadrature grid of degree L and its tables (module docstring).

    cos_theta, weights : (N_theta,) Gauss-Legendre nodes and weights on [-1, 1].
    phi : (N_phi,) equispaced longitudes.
    P, dP : (M [m], N_theta, L + 1 [l]) values P_lm(cos theta_j) and d/dtheta of them
        (0 where m > l), for the orders m < M.
    orders : M, the orders the transforms handle: L + 1 (all), or 1 for functions
        independent of phi (axisymmetric about the z axis; N_phi = 2 points suffice).
    """

    def __init__(self, degree: int, orders: int | None = None) -> None:
        self.degree = L = degree
        self.orders = L + 1 if orders is None else orders
        self.n_theta, self.n_phi = grid_shape(degree)
        if self.orders == 1:
            self.n_phi = 2
        self.cos_theta, self.weights = np.polynomial.legendre.leggauss(self.n_theta)
        theta = np.arccos(self.cos_theta)
        self.sin_theta = np.sin(theta)
        self.phi = 2 * np.pi * np.arange(self.n_phi) / self.n_phi
        l, m = np.meshgrid(np.arange(L + 1), np.arange(self.orders))  # (m, l) grids
        ok = m <= l
        y, jac = sph_harm_y(np.where(ok, l, 0)[:, None, :], np.where(ok, m, 0)[:, None, :],
                            theta[None, :, None], 0.0, diff_n=1)
        self.P = np.where(ok[:, None, :], y.real, 0.0)
        self.dP = np.where(ok[:, None, :], jac[..., 0].real, 0.0)

    @cached_property
    def points(self) -> np.ndarray:
        """(N_theta, N_phi, 3) the grid's points on the sphere."""
        s, c = self.sin_theta[:, None], self.cos_theta[:, None]
        return np.stack(np.broadcast_arrays(s * np.cos(self.phi), s * np.sin(self.phi), c), -1)

    @cached_property
    def frames(self) -> tuple[np.ndarray, np.ndarray]:
        """(e_theta, e_phi), each (N_theta, N_phi, 3): the unit tangent vectors."""
        s, c = self.sin_theta[:, None], self.cos_theta[:, None]
        cp, sp = np.cos(self.phi), np.sin(self.phi)
        e_theta = np.stack(np.broadcast_arrays(c * cp, c * sp, -s), -1)
        shape = (self.n_theta, self.n_phi)
        e_phi = np.stack([np.broadcast_to(-sp, shape), np.broadcast_to(cp, shape),
                          np.zeros(shape)], -1)
        return e_theta, e_phi

    def _to_grid(self, f: np.ndarray) -> np.ndarray:
        """Values (..., N_theta, N_phi) from per-order coefficients f (..., N_theta, M)."""
        spec = np.zeros((*f.shape[:-1], self.n_phi // 2 + 1), dtype=complex)
        spec[..., :self.orders] = f
        return np.fft.irfft(spec * self.n_phi, n=self.n_phi, axis=-1)

    def _orders(self, g: np.ndarray) -> np.ndarray:
        """Per-order coefficients (..., N_theta, M) of grid values (..., N_theta, N_phi)."""
        return np.fft.rfft(g, axis=-1)[..., :self.orders] / self.n_phi

    def _columns(self, c: np.ndarray) -> np.ndarray:
        """The orders m < M of coefficients (..., L + 1, L + 1 or M)."""
        return c[..., :self.orders]

    def _full(self, c: np.ndarray) -> np.ndarray:
        """Coefficients (..., L + 1, M) padded with zero orders to (..., L + 1, L + 1)."""
        pad = [(0, 0)] * (c.ndim - 1) + [(0, self.degree + 1 - self.orders)]
        return np.pad(c, pad) if self.orders <= self.degree else c

    def synthesis(self, c: np.ndarray) -> np.ndarray:
        """Values (..., N_theta, N_phi) of coefficients c (..., L + 1, L + 1)."""
        return self._to_grid(np.einsum("mjl,...lm->...jm", self.P, self._columns(c)))

    def analysis(self, g: np.ndarray) -> np.ndarray:
        """Coefficients (..., L + 1, L + 1) of grid values g (exact for degree <= 2 N_theta -
        1 - L in cos theta and orders below N_phi / 2)."""
        gm = self._orders(g) * (2 * np.pi * self.weights[:, None])
        return self._full(np.einsum("mjl,...jm->...lm", self.P, gm))

    def gradient(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(d_theta f, d_phi f / sin theta) on the grid, each (..., N_theta, N_phi), of the
        function with coefficients c."""
        m = np.arange(self.orders)
        c = self._columns(c)
        g_theta = self._to_grid(np.einsum("mjl,...lm->...jm", self.dP, c))
        g_phi = self._to_grid(np.einsum("mjl,...lm->...jm", self.P, c) * (1j * m)
                              / self.sin_theta[:, None])
        return g_theta, g_phi

    def divergence_weak(self, f_theta: np.ndarray, f_phi: np.ndarray) -> np.ndarray:
        """The coefficients (..., L + 1, L + 1) of -div F for the tangent field F = f_theta
        e_theta + f_phi e_phi given on the grid: int F . grad_S conj(Y_lm) (integration by
        parts on the closed sphere)."""
        w = 2 * np.pi * self.weights[:, None]
        m = np.arange(self.orders)
        ft = self._orders(f_theta) * w
        fp = self._orders(f_phi) * (w * (-1j * m) / self.sin_theta[:, None])
        return self._full(np.einsum("mjl,...jm->...lm", self.dP, ft)
                          + np.einsum("mjl,...jm->...lm", self.P, fp))


class TransportField2:
    """F(c) = d c / dt of the transport term -div(rho v[rho]) on S^2 for states c
    (S, L + 1, L + 1) (module docstring).

    b : beta c, the kernel e^{b <x, y>} (Q^T K = c I), of either sign.
    V : (3, 3) value matrix (times the interaction strength).
    weighting : "softmax", "unnormalised" or "positional" (causal mask; for the full mask
        without ALiBi it is "unnormalised").
    labels : 1 (the full mask) or the causal mask's `Labels` (S labels; ALiBi's slope).
    degree : L, the highest degree.
    axisymmetric : compute the orders m = 0 only (exact for states independent of phi when
        V commutes with the rotations about the z axis, `keeps_axisymmetry`: such states
        stay so); the cost per evaluation falls from O(L^3) to O(L^2).
    """

    def __init__(self, b: float, V: np.ndarray, weighting: str, labels: int,
                 degree: int, axisymmetric: bool = False) -> None:
        if not isinstance(labels, Labels) and labels != 1:
            raise fail("labels", "1 (the full mask) or the causal mask's Labels", repr(labels))
        self.labels = labels if isinstance(labels, Labels) else None
        self._seen = None if self.labels is None else self.labels.seen(weighting)
        self.b, self.V, self.weighting, self.degree = b, np.asarray(V, float), weighting, degree
        self.grid = SphereGrid(degree, 1 if axisymmetric else None)
        self.points = self.grid.n_theta * self.grid.n_phi
        i = kernel_coefficients(b, degree)  # e^{-|b|} i_l, l = 0..L + 1
        if weighting != "softmax":  # no ratio for the factor e^{-|b|} to cancel in
            i = i * np.exp(abs(b))
        l = np.arange(degree + 1)
        lower = np.concatenate([[0.0], i[:-2]])[: degree + 1]  # i_{l-1} (unused at l = 0)
        upper = i[1:degree + 2]  # i_{l+1}
        self._z = (4 * np.pi * i[:degree + 1])[:, None]
        self._t = (4 * np.pi * np.where(l > 0, (lower - upper) / (2 * l + 1), 0.0))[:, None]
        self._r = (4 * np.pi * (l * lower + (l + 1) * upper) / (2 * l + 1))[:, None]

    def seen(self, c: np.ndarray) -> np.ndarray:
        """Coefficients (S, L + 1, L + 1) of what each label sees: c itself for the full mask
        (module docstring)."""
        return c if self._seen is None else see(self._seen, c)

    def velocity(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The velocity's components (v_theta, v_phi) on the grid, each (S, N_theta, N_phi),
        of the labels with densities c (S, L + 1, L + 1)."""
        g = self.grid
        c = self.seen(c)
        t_theta, t_phi = g.gradient(self._t * c)
        R = g.synthesis(self._r * c)
        e_theta, e_phi = g.frames
        N = (t_theta[..., None] * e_theta + t_phi[..., None] * e_phi
             + R[..., None] * g.points)
        U = N @ self.V.T
        v_theta, v_phi = np.sum(U * e_theta, -1), np.sum(U * e_phi, -1)
        if self.weighting == "softmax":
            Z = g.synthesis(self._z * c)
            v_theta, v_phi = v_theta / Z, v_phi / Z
        return v_theta, v_phi

    def __call__(self, c: np.ndarray) -> np.ndarray:
        """d c / dt (S, L + 1, L + 1) of the transport term."""
        rho = self.grid.synthesis(c)
        v_theta, v_phi = self.velocity(c)
        return self.grid.divergence_weak(rho * v_theta, rho * v_phi) * _triangle(self.degree)

    def speed_bound(self) -> float:
        """An upper bound of |v| over states of mass 1 per label: |V|_2 for softmax (|N| <=
        Z), |V|_2 e^|b| for unnormalised and positional weights (what a label sees has mass
        at most 1)."""
        norm = float(np.linalg.norm(self.V, 2))
        return norm if self.weighting == "softmax" else norm * float(np.exp(abs(self.b)))


def label_tail(labels: Labels, c: np.ndarray) -> float:
    """The resolution measure in s of states c (S, L + 1, L + 1) (chebyshev labels; 0 for
    cells): the L2 norm over the sphere and the labels' Chebyshev coefficients above degree
    2 (S - 1) / 3 (`Labels.excess`), relative to c[s, 0, 0] (the circle's `Labels.tail`)."""
    return float(np.sqrt(np.sum(_norm(labels.excess(c)) ** 2)) / MASS0)


def keeps_axisymmetry(c: np.ndarray, V: np.ndarray) -> bool:
    """True when states c (S, L + 1, L + 1) have no order m > 0 (to round-off: below
    `AXISYMMETRIC_TOL` times c[s, 0, 0]) and V commutes with the rotations about the z axis
    ([[a, -b, 0], [b, a, 0], [0, 0, e]]): the flow then keeps them independent of phi."""
    V = np.asarray(V, dtype=float)
    R = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the generator
    return bool(np.abs(c[..., 1:]).max(initial=0.0) <= AXISYMMETRIC_TOL * MASS0
                and np.allclose(V @ R, R @ V, rtol=0,
                                                          atol=1e-14 * max(1.0, np.abs(V).max())))


def _triangle(degree: int) -> np.ndarray:
    """(L + 1, L + 1) 1 where m <= l, else 0 (the entries a coefficient array holds)."""
    l = np.arange(degree + 1)
    return (l[None, :] <= l[:, None]).astype(float)


# ------------------------------------------------------------------ densities on S^2
MASS0 = 1 / np.sqrt(4 * np.pi)  # c[s, 0, 0] of a density of mass 1
AXISYMMETRIC_TOL = 1e-13  # orders m > 0 below this (relative) are round-off of a zonal start


def tail(c: np.ndarray) -> np.ndarray:
    """The resolution measure of each label (S,): the l2 norm of the degrees l > 2 L / 3,
    relative to c[s, 0, 0] = 1 / sqrt(4 pi) (as `attnflow.meanfield.initial.tail` on the
    circle)."""
    L = c.shape[-1] - 1
    return _norm(c[..., 2 * L // 3 + 1:, :]) / MASS0


def _norm(c: np.ndarray) -> np.ndarray:
    """The L2 norm over the sphere (..,) of the real functions with coefficients c (.., l, m)."""
    power = np.abs(c[..., 0]) ** 2 + 2 * np.sum(np.abs(c[..., 1:]) ** 2, axis=-1)
    return np.sqrt(np.sum(power, axis=-1))


def minimum(c: np.ndarray, grid: SphereGrid) -> float:
    """The smallest value of the densities on `grid`, times 4 pi (1 at the uniform state)."""
    return float(grid.synthesis(c).min() * 4 * np.pi)


def check_coefficients(c: np.ndarray, name: str, tol: float) -> np.ndarray:
    """Validate coefficients (S, L + 1, L + 1) on S^2: finite, L >= 3, zero where m > l,
    real m = 0 column, mass 1 per label (to 1e-12), resolved (`tail` <= tol) and >= -tol /
    (4 pi) on the dealiased grid; returns them as complex."""
    from attnflow._checks import describe

    arr = np.asarray(c)
    if (arr.ndim != 3 or arr.shape[-1] != arr.shape[-2] or arr.shape[-1] < 4
            or not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr))):
        raise fail(name, "finite spherical-harmonic coefficients of shape (S, L + 1, L + 1), "
                   "L >= 3 (rows l, columns m = 0..l)", describe(arr))
    arr = arr.astype(complex)
    L = arr.shape[-1] - 1
    if np.any(arr * (1 - _triangle(L)) != 0) or np.any(arr[..., 0].imag != 0):
        raise fail(name, "coefficients of a real density: 0 where m > l, real where m = 0",
                   "nonzero entries above the diagonal or a complex m = 0 column")
    mass = arr[:, 0, 0].real / MASS0
    if not np.allclose(mass, 1.0, rtol=0, atol=1e-12):
        raise fail(name, "densities of mass 1 (c[s, 0, 0] = 1 / sqrt(4 pi))",
                   f"masses {np.round(mass, 15)[:5].tolist()}")
    arr[:, 0, 0] = MASS0
    worst = float(tail(arr).max())
    if worst > tol:
        raise fail(name, f"a density resolved by degree {L} (the degrees above 2 L / 3 below "
                   f"{tol:g} relative; a higher degree or a smoother start)",
                   f"a tail of {worst:.3g}")
    lowest = minimum(arr, SphereGrid(L))
    if lowest < -tol:
        raise fail(name, "a density >= 0 (to -tol / (4 pi))", f"a minimum of {lowest:.3g} / (4 pi)")
    return arr


def from_values(f, degree: int, tol: float, s: np.ndarray | None = None) -> np.ndarray:
    """Coefficients (S, L + 1, L + 1) of the densities proportional to f(x) (s None: S = 1)
    or to f(s, x) at the labels s (S,) (called with s of shape (S, 1, 1)), x (..., 3) points
    of the sphere, sampled on the grid of degree 2 L (so degrees up to 2 L are seen); degrees
    above L must be negligible (below `tol` relative)."""
    from attnflow._checks import describe, finite_array

    fine = SphereGrid(max(2 * degree, 16))
    x = fine.points
    S = 1 if s is None else len(s)
    values = finite_array("f", f(x) if s is None else f(s[:, None, None], x), dtype=float)
    try:
        values = np.broadcast_to(values, (S, *x.shape[:-1]))
    except ValueError:
        raise fail("f", f"one value per point: shape {x.shape[:-1]} (or {(S, *x.shape[:-1])} "
                   f"for S labels) for points of shape {x.shape}", describe(values)) from None
    if values.min() < 0 or np.any(values.reshape(S, -1).max(axis=1) <= 0):
        raise fail("f", "a density: values >= 0 with positive mass", f"minimum {values.min()}")
    c = fine.analysis(values)
    c = c / (c[:, :1, :1].real / MASS0)
    beyond = c.copy()
    beyond[:, :degree + 1, :degree + 1] = 0
    left = float(_norm(beyond).max() / MASS0)
    if left > tol:
        raise fail("modes", f"a degree L that resolves f (its degrees above L = {degree} below "
                   f"{tol:g} relative)", f"{degree}, which leaves {left:.3g}")
    return check_coefficients(c[:, :degree + 1, :degree + 1], "f", tol)


def angles(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(theta, phi): the polar angle and the longitude of points x (..., 3) (any norm > 0)."""
    theta = np.arccos(np.clip(x[..., 2] / np.linalg.norm(x, axis=-1), -1, 1))
    return theta, np.arctan2(x[..., 1], x[..., 0])


def empirical(x: np.ndarray, degree: int, cells: np.ndarray | None = None) -> np.ndarray:
    """The empirical measure's coefficients M_lm = (1/n) sum_j conj(Y_lm(x_j)) (..., L + 1,
    L + 1) of tokens x (..., n, 3), one (l, m) at a time (memory of n tokens, not n (L + 1)^2);
    0 where m > l. With `cells` (n,) (tokens x (n, 3), cell indices 0..S-1, each cell
    non-empty): the mean over each cell's tokens, (S, L + 1, L + 1)."""
    theta, phi = angles(np.asarray(x, dtype=float))
    if cells is None:
        mean = lambda y: y.mean(axis=-1)  # noqa: E731
        shape = theta.shape[:-1]
    else:
        counts = np.bincount(cells)
        mean = lambda y: (np.bincount(cells, y.real) + 1j * np.bincount(cells, y.imag)  # noqa: E731
                          ) / counts
        shape = counts.shape
    out = np.zeros((*shape, degree + 1, degree + 1), dtype=complex)
    for l in range(degree + 1):
        for m in range(l + 1):
            out[..., l, m] = mean(np.conj(sph_harm_y(l, m, theta, phi)))
    return out


def from_points(x: np.ndarray, degree: int, width: float, tol: float,
                cells: np.ndarray | None = None) -> np.ndarray:
    """Coefficients (S, L + 1, L + 1) of tokens x (n, 3) on S^2 (S = 1, or the label cells
    `cells` (n,) of `empirical`), smoothed by the heat kernel of width `width` (degree l
    scaled by e^{-l (l + 1) width^2 / 2})."""
    l = np.arange(degree + 1)[:, None]
    c = empirical(x, degree, cells) * np.exp(-0.5 * l * (l + 1) * width**2)
    if cells is None:
        c = c[None]
    c[..., 0] = c[..., 0].real
    return check_coefficients(c, "x", tol)


def values(c: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The densities with coefficients c (..., L + 1, L + 1) at points x (P, 3) of the
    sphere: (..., P)."""
    L = c.shape[-1] - 1
    theta, phi = angles(np.asarray(x, dtype=float))
    l, m = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    ok = m <= l
    y = np.where(ok[..., None], sph_harm_y(np.where(ok, l, 0)[..., None],
                                           np.where(ok, m, 0)[..., None], theta, phi), 0)
    y[:, 1:] *= 2  # m > 0 stands for m and -m: 2 Re(c_lm Y_lm)
    return np.einsum("...lm,lmp->...p", c, y).real


def mean_direction(c: np.ndarray) -> np.ndarray:
    """int x rho(x) dx (..., 3) of densities with coefficients c (..., L + 1, L + 1): the
    coordinates are degree-1 harmonics (z = sqrt(4 pi / 3) Y_10, x + i y = -sqrt(8 pi / 3)
    Y_11), so only c_10 and c_11 enter."""
    z = np.sqrt(4 * np.pi / 3) * c[..., 1, 0].real
    xy = -np.sqrt(8 * np.pi / 3) * np.conj(c[..., 1, 1])
    return np.stack([xy.real, xy.imag, z], axis=-1)


def lat_lon(points: int) -> np.ndarray:
    """(points // 2, points, 3) the centres of an equiangular grid in (theta, phi)."""
    theta = (np.arange(points // 2) + 0.5) * np.pi / (points // 2)
    phi = (np.arange(points) + 0.5) * 2 * np.pi / points
    s = np.sin(theta)[:, None]
    return np.stack(np.broadcast_arrays(s * np.cos(phi), s * np.sin(phi),
                                        np.cos(theta)[:, None]), -1)
