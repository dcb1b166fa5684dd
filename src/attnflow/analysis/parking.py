"""How many (strong) Rényi centers: exact expectations and Rényi's parking constant.

Strong centers (Lemma C.1, docs/science.md §2). For i.i.d. tokens with law mu, token k is a
strong center with probability E[(1 - mu(B_delta(x)))^{k-1}]. For the uniform law on
S^{d-1} every geodesic cap of radius delta has the same normalised mass p = p_d(delta), so

    E_n = sum_{k=1}^{n} (1 - p)^{k-1} = (1 - (1 - p)^n) / p,     E_inf = 1 / p,

exactly, with p_d(delta) = I_{sin^2 delta}((d-1)/2, 1/2) / 2 for delta <= pi/2 (I the
regularised incomplete beta function) and 1 - p_d(pi - delta) beyond. On the circle
p = delta / pi (E_inf = pi / delta); on S^2 p = sin^2(delta/2) (E_inf = 1 / sin^2(delta/2);
the paper prints (3 sin^2(delta/2))^{-1}, a typo).

Ordinary centers on the circle with infinitely many uniform tokens are Rényi's random
parking: once the first center is placed, the others are cars of length delta parked at
random on the remaining arc of length 2 pi - delta, so their expected number is
1 + M(2 pi / delta - 1) where M(x), the mean number of unit cars parked on [0, x], solves

    M(x) = 0 (x < 1),    M(x) = 1 + (2 / (x - 1)) int_0^{x-1} M(y) dy  (x >= 1),

and M(x) = c_R x + c_R - 1 + O((2e/x)^{x - 3/2}) with Rényi's constant c_R = 0.74759792...
(Rényi 1958; Dvoretzky & Robbins 1964 for the error). Hence the count is c_R 2 pi / delta up
to a super-exponentially small error.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from scipy.integrate import cumulative_simpson
from scipy.interpolate import CubicHermiteSpline
from scipy.special import betainc

from attnflow._checks import fail

__all__ = [
    "RENYI_PARKING_CONSTANT",
    "cap_mass",
    "expected_strong_centers",
    "renyi_parking_mean",
    "expected_renyi_centers_circle",
]

#: Rényi's parking constant c_R = int_0^inf exp(-2 int_0^t (1 - e^{-u}) / u du) dt.
RENYI_PARKING_CONSTANT = 0.7475979202534114

# M(x) is computed on [0, _X_ASYMPTOTIC] with _STEPS nodes per unit length; beyond, the
# asymptote is exact to ~1e-21.
_X_ASYMPTOTIC = 30
_STEPS = 512


def cap_mass(delta: Any, d: int) -> np.ndarray:
    """Normalised mass p_d(delta) of a geodesic cap of radius delta on S^{d-1}.

    delta : radius in radians, in [0, pi] (array-like, vectorised).
    d : ambient dimension, >= 2 (S^1 is the circle).
    Returns the fraction of the sphere's area within geodesic distance delta of a point
    (module docstring), same shape as delta.
    """
    d = _dimension(d)
    delta = _radii(delta)
    half = 0.5 * betainc((d - 1) / 2.0, 0.5, np.sin(delta) ** 2)
    return np.where(delta <= np.pi / 2, half, 1.0 - half)


def expected_strong_centers(n: float, delta: Any, d: int) -> np.ndarray:
    """Expected number of strong Rényi centers of n i.i.d. uniform tokens on S^{d-1}.

    n : number of tokens, an integer >= 1 or ``np.inf``.
    delta : separation radius in radians, in [0, pi] (array-like, vectorised).
    d : ambient dimension, >= 2.
    Returns E_n = (1 - (1 - p)^n) / p with p = `cap_mass`(delta, d), and 1 / p for
    n = inf (Lemma C.1; module docstring). Exact, not asymptotic.
    """
    if not (n == np.inf or (float(n) == int(n) and n >= 1)):
        raise fail("n", "an integer >= 1 or numpy.inf", repr(n))
    p = cap_mass(delta, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        if n == np.inf:
            return np.where(p > 0, 1.0 / p, np.inf)
        # -expm1(n log1p(-p)) = 1 - (1 - p)^n without cancellation for small p.
        return np.where(p > 0, -np.expm1(n * np.log1p(-p)) / p, float(n))


def renyi_parking_mean(x: Any) -> np.ndarray:
    """Rényi's M(x): the expected number of unit-length cars parked at random on [0, x].

    x : length(s) >= 0 (array-like, vectorised).
    Solves the integral equation of the module docstring on a grid (Simpson's rule per
    unit interval, 512 steps per unit, cubic Hermite interpolation between nodes; error
    about 1e-11) up to x = 30, and uses the asymptote c_R x + c_R - 1 beyond (error below
    1e-20 there).
    """
    x = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise fail("x", "finite lengths >= 0", repr(x))
    c = RENYI_PARKING_CONSTANT
    y = np.clip(x, 2.0, _X_ASYMPTOTIC) - 1.0
    inside = 1.0 + 2.0 * _parking_integral()(y) / y
    return np.where(x < 1, 0.0, np.where(x < 2, 1.0,
                                         np.where(x <= _X_ASYMPTOTIC, inside, c * x + c - 1.0)))


def expected_renyi_centers_circle(delta: Any) -> np.ndarray:
    """Expected number of Rényi centers of infinitely many uniform tokens on the circle.

    delta : separation radius in radians, in (0, pi] (array-like, vectorised).
    Returns 1 + M(2 pi / delta - 1) (the jamming count; module docstring), which is
    RENYI_PARKING_CONSTANT * 2 pi / delta up to a super-exponentially small error.
    """
    delta = _radii(delta)
    if np.any(delta <= 0):
        raise fail("delta", "radii in (0, pi]", repr(delta))
    # At delta = pi no second center fits (distances are at most pi), while M(1) = 1.
    return np.where(delta < np.pi, 1.0 + renyi_parking_mean(2.0 * np.pi / delta - 1.0), 1.0)


@functools.cache
def _parking_integral() -> CubicHermiteSpline:
    """F(y) = int_0^y M on [1, _X_ASYMPTOTIC - 1], computed once, as a cubic Hermite spline
    through its values and its derivative M at the nodes 1 + i / _STEPS.

    On each unit interval [k, k+1], M(x) = 1 + 2 F(x - 1) / (x - 1), and F on [k-1, k]
    follows from M there, the interval before (Simpson's rule: M is smooth inside each
    interval). F is C^1 on [1, inf), so the spline is accurate to O(h^4) between nodes."""
    t = np.linspace(0.0, 1.0, _STEPS + 1)
    M = np.ones_like(t)  # on [1, 2]: nothing fits beside the first car
    F_start = 0.0  # F(1), as M = 0 on [0, 1)
    nodes, values, slopes = [], [], []
    for k in range(1, _X_ASYMPTOTIC - 1):
        F = F_start + cumulative_simpson(M, x=k + t, initial=0.0)  # F on [k, k+1]
        nodes.append(k + t[:-1])
        values.append(F[:-1])
        slopes.append(M[:-1])
        F_start = F[-1]
        M = 1.0 + 2.0 * F / (k + t)  # M on [k+1, k+2]
    nodes.append([_X_ASYMPTOTIC - 1.0])
    values.append([F_start])
    slopes.append(M[:1])
    return CubicHermiteSpline(np.concatenate(nodes), np.concatenate(values),
                              np.concatenate(slopes))


def _dimension(d: Any) -> int:
    if isinstance(d, bool) or not float(d) == int(d) or int(d) < 2:
        raise fail("d", "an integer >= 2 (S^{d-1} with d = 2 the circle)", repr(d))
    return int(d)


def _radii(delta: Any) -> np.ndarray:
    delta = np.asarray(delta, dtype=float)
    if not np.all((delta >= 0) & (delta <= np.pi)):
        raise fail("delta", "radii in [0, pi]", repr(delta))
    return delta
