"""Particles against a density on the circle: Fourier moments with their standard errors, and
the Wasserstein-1 distance (docs/science.md §9, "Particles and densities").

Tokens are points (..., n, 2) on the circle, theta_j their angles; a density is given by its
Fourier coefficients c (K + 1,) or (1, K + 1), rho(theta) = sum_{|k| <= K} c_k e^{i k theta}
(the mean-field solver's convention: its moments int e^{i k theta} rho = 2 pi conj(c_k)).

* `fourier_moments`: M_k = (1/n) sum_j e^{i k theta_j} and the standard errors of its real
  and imaginary parts, sqrt(Var cos k theta / n) and sqrt(Var sin k theta / n) (sample
  variances, ddof 1), the band within which i.i.d. draws of a density scatter about its
  moments.
* `wasserstein_circle`: W1 between the tokens' empirical measure and a density, by the closed
  form on the circle (Rabin, Delon & Gousseau, *Transportation distances on the circle*,
  J. Math. Imaging Vis. 41 (2011), Theorem 3.7; Werman, Peleg & Rosenfeld 1985 for the
  discrete case): with F_n and F the distribution functions from the angle 0,

      W1 = min_c int_0^{2 pi} |F_n(theta) - F(theta) - c| dtheta,

  the minimum reached at a median c of F_n - F (for the uniform measure dtheta): the line's
  formula, with the cut point's freedom as the shift c. Rates: i.i.d. draws n^{-1/2},
  quantile draws pi / (2 n) for any smooth positive density (docs/science.md §9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

from attnflow._array import is_tensor, namespace
from attnflow._checks import fail
from attnflow._repr import ShortRepr
from attnflow.analysis._density import cdf_at, cdf_table, one_density
from attnflow.analysis._input import run_states, sphere_points, tokens
from attnflow.analysis.harmonics import (
    HarmonicMoments,
    harmonic_basis,
    harmonic_dimension,
    harmonic_moments,
)
from attnflow.manifolds import sphere_tolerance

# harmonic_moments (every sphere) is defined in analysis/harmonics.py; this subject is its home
__all__ = ["FourierMoments", "HarmonicMoments", "fourier_moments", "harmonic_basis",
           "harmonic_dimension", "harmonic_moments", "wasserstein_circle"]


@dataclass(frozen=True, repr=False)
class FourierMoments(ShortRepr):
    """The particles' Fourier moments.

    k : (K,) the modes.
    mean : (..., K) complex, M_k = (1/n) sum_j e^{i k theta_j}.
    se_real, se_imag : (..., K) standard errors of Re M_k and Im M_k (module docstring).
    n : the number of tokens.
    """

    k: np.ndarray
    mean: np.ndarray
    se_real: np.ndarray
    se_imag: np.ndarray
    n: int


def circle_angles(name: str, x: Any, ndim: int | None = None,
                  quantity: str | None = None) -> np.ndarray:
    """The angles (..., n) in (-pi, pi] of points (..., n, 2) on the circle (numpy: a tensor
    through `_input.host`, refused with grad naming `quantity`)."""
    X = sphere_points(name, x, ndim=ndim, quantity=quantity, instead="fourier_moments")
    if X.shape[-1] != 2:
        raise fail(name, "points (..., n, 2) on the circle (d = 2)",
                   f"an array of shape {X.shape}")
    return np.arctan2(X[..., 1], X[..., 0])


def fourier_moments(x: Any, modes: Any) -> FourierMoments:
    """The moments M_k = (1/n) sum_j e^{i k theta_j} of tokens x (..., n, 2) on the circle
    (leading axes: independent configurations; a Trajectory: its directions) for the modes
    k (an int K: 1..K; or a sequence of integers), with the standard errors of their real and
    imaginary parts (module docstring; 0 for n = 1). A tensor x gives tensors (complex
    mean) on its device, in its autograd graph."""
    if is_tensor(run_states("x", x)):
        return _tensor_moments(run_states("x", x), modes)
    theta = circle_angles("x", x)
    k = _modes(modes)
    n = theta.shape[-1]
    mean = np.empty((*theta.shape[:-1], k.size), dtype=complex)
    se_real, se_imag = np.zeros(mean.shape), np.zeros(mean.shape)
    for i, mode in enumerate(k):  # one mode at a time: (..., n) temporaries only
        wave = np.exp(1j * mode * theta)
        mean[..., i] = wave.mean(axis=-1)
        if n > 1:
            se_real[..., i] = wave.real.std(axis=-1, ddof=1) / np.sqrt(n)
            se_imag[..., i] = wave.imag.std(axis=-1, ddof=1) / np.sqrt(n)
    return FourierMoments(k=k, mean=mean, se_real=se_real, se_imag=se_imag, n=n)


def _modes(modes: Any) -> np.ndarray:
    """The modes (K,) of an int K (1..K) or a sequence of integers."""
    k = np.arange(1, modes + 1) if isinstance(modes, (int, np.integer)) and not isinstance(
        modes, bool) else np.asarray(modes)
    if k.ndim != 1 or k.size == 0 or not np.issubdtype(k.dtype, np.integer):
        raise fail("modes", "an integer K >= 1 (modes 1..K) or a sequence of integer modes",
                   repr(modes))
    return k


def _tensor_moments(x: Any, modes: Any) -> FourierMoments:
    """`fourier_moments` of a tensor (..., n, 2) on the circle, computed on its device."""
    X = tokens("x", x)
    xp = namespace(X)
    if X.shape[-1] != 2:
        raise fail("x", "points (..., n, 2) on the circle (d = 2)",
                   f"a tensor of shape {tuple(X.shape)}")
    off = float(xp.max(xp.abs(xp.linalg.vector_norm(X.detach(), axis=-1) - 1.0)))
    if off > sphere_tolerance(X.dtype):
        raise fail("x", "unit vectors (points on the circle)", f"norms off 1 by up to {off:.3g}")
    k = _modes(modes)
    theta = xp.atan2(X[..., 1], X[..., 0])
    n = theta.shape[-1]
    means, se_real, se_imag = [], [], []
    for mode in k.tolist():
        c, s = xp.cos(mode * theta), xp.sin(mode * theta)
        means.append(xp.mean(c, axis=-1) + 1j * xp.mean(s, axis=-1))
        for se, part in ((se_real, c), (se_imag, s)):
            se.append(xp.std(part, axis=-1, correction=1) / math.sqrt(n) if n > 1
                      else xp.zeros_like(part[..., 0]))
    return FourierMoments(k=k, mean=xp.stack(means, axis=-1), se_real=xp.stack(se_real, axis=-1),
                          se_imag=xp.stack(se_imag, axis=-1), n=n)


def wasserstein_circle(x: Any, c: Any) -> float:
    """W1 (radians) between the empirical measure of tokens x (n, 2) on the circle (each of
    mass 1 / n) and the density with coefficients c (K + 1,) or (1, K + 1) (module
    docstring: min over c of int |F_n - F - c|).

    F is exact (tabulated by FFT, `attnflow.analysis.closedforms.inverse_cdf`'s table) at the
    tokens'
    angles and on 2^16 or more equal steps; between consecutive breakpoints F_n is constant
    and F is taken linear, so |F_n - F - c| is integrated exactly on each piece (the error,
    h^2 int |rho'| / 12 for pieces of length h <= 1e-4, is below 1e-9 for the densities the
    solver resolves). The shift c is the minimiser of that convex piecewise function (Brent's
    bounded method to 1e-13)."""
    theta = np.sort(np.mod(circle_angles("x", x, ndim=2, quantity="wasserstein_circle "
                                         "(computed by scipy on the host)"), 2 * np.pi))
    table = cdf_table(one_density(c))
    n, M = len(theta), len(table.F) - 1
    grid = np.arange(M + 1) * table.h
    points = np.concatenate([grid, theta])
    Fn_points = np.concatenate([np.searchsorted(theta, grid, side="right"),
                                np.arange(1, n + 1)]) / n
    order = np.argsort(points, kind="stable")
    points, Fn_points = points[order], Fn_points[order]
    F = np.concatenate([table.F, cdf_at(table, theta)])[order]
    width = np.diff(points)
    # on [points[i], points[i + 1]) F_n = #(theta <= points[i]) / n; F linear
    left = np.maximum.accumulate(Fn_points)[:-1] - F[:-1]
    right = np.maximum.accumulate(Fn_points)[:-1] - F[1:]

    def cost(shift: float) -> float:
        a, b = left - shift, right - shift
        same = a * b >= 0
        mixed = (a * a + b * b) / np.where(same, 1.0, np.abs(a) + np.abs(b))
        return float(np.sum(width * np.where(same, np.abs(a + b), mixed)) / 2)

    lo, hi = float(min(left.min(), right.min())), float(max(left.max(), right.max()))
    if hi - lo <= 0:
        return cost(lo)
    best = minimize_scalar(cost, bounds=(lo, hi), method="bounded",
                           options={"xatol": 1e-13 * max(1.0, hi - lo)})
    return min(float(best.fun), cost(lo), cost(hi))
