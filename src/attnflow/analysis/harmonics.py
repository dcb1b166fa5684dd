"""Harmonic moments of tokens on every sphere S^{d-1}: real orthonormal harmonics averaged
over the tokens, with standard errors and the power per degree (docs/science.md §9,
"Particles and densities"; guide: docs/guide/meanfield.md).

The harmonics are real and orthonormal for the uniform probability measure of S^{d-1}
(mean of Y^2 over the sphere 1), so n iid uniform tokens have moments of variance 1 / n and
a power per degree of mean dim_l / n:

* circle (d = 2): sqrt(2) sin(k theta) (order -k) and sqrt(2) cos(k theta) (order k), the
  real and imaginary parts of sqrt(2) e^{i k theta} (`fourier_moments`' M_k times sqrt(2));
* S^2 (d = 3): Y_{l,m} = Pbar_lm(z) cos(m phi) (m > 0), Pbar_l|m|(z) sin(|m| phi) (m < 0),
  Pbar_l0(z) (m = 0), Pbar the fully normalised associated Legendre functions without the
  Condon-Shortley phase (Pbar_l0 = sqrt(2 l + 1) P_l; Y_{l,m} = sqrt(8 pi) (-1)^m Re or Im of
  scipy's sph_harm_y, sqrt(4 pi) Y_l0 at m = 0), computed as polynomials in the Cartesian
  coordinates: sin^m(theta) e^{i m phi} = (x_1 + i x_2)^m, so gradients are smooth everywhere;
* S^{d-1}, d >= 4: the zonal harmonics about a unit `axis` (default e_d, the last
  coordinate: the axis of the zonal mean-field solver), sqrt(dim_l) P_l(<x, axis>), P_l the
  Gegenbauer polynomial C_l^{(d-2)/2} normalised to P_l(1) = 1.

The power per degree, sum over the orders of the squared moments, is rotation invariant: by
the addition theorem it is dim_l / n^2 sum_{i,j} P_l(<x_i, x_j>). On the circle and S^2 it is
summed from the moments (O(n L^2)); on S^{d-1}, d >= 4, where only the zonal moment is made, it
is this pair sum (O(n^2 L), in blocks of rows). Arrays in, arrays out: numpy arrays or torch
tensors (any float dtype and device, differentiable; `attnflow._array.namespace`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import check_tokens, is_tensor, namespace
from attnflow._checks import describe, fail
from attnflow._repr import ShortRepr
from attnflow.analysis._input import run_states, sphere_points
from attnflow.manifolds import sphere_tolerance

__all__ = ["HarmonicMoments", "harmonic_basis", "harmonic_moments", "harmonic_dimension"]

BLOCK = 1 << 22  # entries of one block of the pair sum's inner products (32 MB in float64)


@dataclass(frozen=True, repr=False)
class HarmonicMoments(ShortRepr):
    """The tokens' harmonic moments (module docstring for the harmonics).

    d : the ambient dimension (tokens on S^{d-1}).
    degree, order : (M,) the degree l >= 1 and order m of each moment (circle: m = -k sin,
        +k cos; S^2: m = -l..l; d >= 4: m = 0, the zonal harmonic about `axis`).
    mean : (..., M) (1/n) sum_j Y(x_j), real, in the tokens' library.
    se : (..., M) standard errors sqrt(Var Y / n) (sample variance, ddof 1; 0 for n = 1).
    power : (..., L) the power of degrees 1..L, sum over the orders of the squared moments
        (rotation invariant; d >= 4: by the pair sum, module docstring).
    n : the number of tokens.
    axis : (d,) the zonal axis for d >= 4, None on the circle and S^2.
    """

    d: int
    degree: np.ndarray
    order: np.ndarray
    mean: Any
    se: Any
    power: Any
    n: int
    axis: np.ndarray | None


def harmonic_dimension(l: int, d: int) -> int:
    """dim_l: the dimension of the degree-l spherical harmonics on S^{d-1} (2 on the circle
    for l >= 1, 2 l + 1 on S^2)."""
    return math.comb(l + d - 1, d - 1) - (math.comb(l + d - 3, d - 1) if l >= 2 else 0)


def _degree(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise fail("degree", "an integer L >= 1 (the degrees 1..L)", repr(value))
    return int(value)


def _tokens(x: Any) -> Any:
    """Points (..., n, d) on the sphere: numpy (a Trajectory: its directions) through the
    analysis' check; a tensor checked where it is (finite, floating, unit norms)."""
    x = run_states("x", x)
    if not is_tensor(x):
        return sphere_points("x", x)
    x = check_tokens("x", x)
    if x.shape[-1] < 2 or x.shape[-2] < 1:
        raise fail("x", "an array of shape (..., n, d) with n >= 1 and d >= 2", describe(x))
    import torch

    with torch.no_grad():
        off = float((torch.linalg.vector_norm(x, dim=-1) - 1).abs().max())
    tol = sphere_tolerance(x.dtype)
    if off > tol:
        raise fail("x", f"unit vectors (points on the sphere, norms within {tol:.2g} of 1)",
                   f"norms off 1 by up to {off:.3g}")
    return x


def _axis(axis: Any, d: int) -> np.ndarray | None:
    if d <= 3:
        if axis is not None:
            raise fail("axis", "None on the circle and S^2 (their moments take every order)",
                       repr(axis))
        return None
    if axis is None:
        return np.eye(d)[-1]
    a = np.asarray(axis, dtype=float)
    if a.shape != (d,) or not np.all(np.isfinite(a)) or abs(np.linalg.norm(a) - 1) > 1e-8:
        raise fail("axis", f"a unit vector of shape ({d},)", describe(axis))
    return a


def harmonic_basis(x: Any, degree: int, axis: Any = None) -> tuple[list[Any], np.ndarray,
                                                                     np.ndarray]:
    """The real orthonormal harmonics of degrees 1..L at points x (..., d) (module
    docstring): a list of M arrays (...,) in x's library, and the degree and order (M,) of
    each. No validation of x beyond its last axis: `harmonic_moments` checks tokens."""
    L, d = _degree(degree), int(x.shape[-1])
    columns: list[Any] = []
    degrees: list[int] = []
    orders: list[int] = []
    if d == 2:
        c, s = x[..., 0], x[..., 1]  # cos and sin of k theta, by the angle sum
        root2 = math.sqrt(2.0)
        for k in range(1, L + 1):
            columns += [root2 * s, root2 * c]
            degrees += [k, k]
            orders += [-k, k]
            c, s = x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c
    elif d == 3:
        table: dict[tuple[int, int], Any] = {}
        z = x[..., 2]
        c, s, sectoral = None, None, 1.0  # Re, Im of (x_1 + i x_2)^m; Pbar_mm / sin^m
        for m in range(L + 1):
            if m == 1:
                c, s, sectoral = x[..., 0], x[..., 1], math.sqrt(3.0)
            elif m >= 2:
                c, s = x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c
                sectoral *= math.sqrt((2 * m + 1) / (2 * m))
            before, q = None, sectoral * (z * 0 + 1)  # Pbar_lm / sin^m theta, l = m
            for l in range(m, L + 1):
                if l == m + 1:
                    before, q = q, math.sqrt(2 * m + 3) * z * q
                elif l >= m + 2:
                    a = math.sqrt((2 * l - 1) * (2 * l + 1) / ((l - m) * (l + m)))
                    b = math.sqrt((2 * l + 1) * (l + m - 1) * (l - m - 1)
                                  / ((l - m) * (l + m) * (2 * l - 3)))
                    before, q = q, a * z * q - b * before
                if l >= 1:
                    table[l, m] = q if m == 0 else q * c
                    if m > 0:
                        table[l, -m] = q * s
        for l in range(1, L + 1):
            for m in range(-l, l + 1):
                columns.append(table[l, m])
                degrees.append(l)
                orders.append(m)
    else:
        xp = namespace(x)
        e = np.asarray(axis, dtype=float)
        z = xp.sum(x * (xp.asarray(e, dtype=x.dtype, device=x.device) if xp is not np
                        else e), axis=-1)
        for l, p in enumerate(_gegenbauer(z, d, L)[1:], start=1):
            columns.append(math.sqrt(harmonic_dimension(l, d)) * p)
            degrees.append(l)
            orders.append(0)
    return columns, np.array(degrees), np.array(orders)


def _gegenbauer(z: Any, d: int, L: int) -> list[Any]:
    """P_0..P_L at z, P_l = C_l^alpha / C_l^alpha(1), alpha = (d - 2) / 2, by the three-term
    recurrence (l + 2 alpha - 1) P_l = (2 l + 2 alpha - 2) z P_{l-1} - (l - 1) P_{l-2}."""
    alpha = (d - 2) / 2
    out = [z * 0 + 1, z]
    for l in range(2, L + 1):
        out.append(((2 * l + 2 * alpha - 2) * z * out[-1] - (l - 1) * out[-2])
                   / (l + 2 * alpha - 1))
    return out[:L + 1]


def harmonic_moments(x: Any, degree: int, axis: Any = None) -> HarmonicMoments:
    """The moments (1/n) sum_j Y(x_j) of tokens x (..., n, d) on S^{d-1} (leading axes:
    independent configurations; a Trajectory: its directions) for the real orthonormal
    harmonics Y of degrees 1..`degree` (module docstring), with their standard errors and
    the power per degree. `axis`: the zonal axis for d >= 4 (a unit vector (d,); default
    e_d); None on the circle and S^2. numpy in, numpy out; a torch tensor in, tensors out
    (differentiable)."""
    x = _tokens(x)
    L, d, n = _degree(degree), int(x.shape[-1]), int(x.shape[-2])
    e = _axis(axis, d)
    xp = namespace(x)
    columns, degrees, orders = harmonic_basis(x, L, e)
    means, errors = [], []
    for values in columns:  # one harmonic at a time: (..., n) temporaries only
        mu = xp.mean(values, axis=-1)
        means.append(mu)
        if n > 1:
            spread = xp.sum((values - mu[..., None]) ** 2, axis=-1) / (n - 1)
            errors.append(xp.sqrt(spread / n))
        else:
            errors.append(mu * 0)
    mean, se = xp.stack(means, axis=-1), xp.stack(errors, axis=-1)
    if d <= 3:
        power = xp.stack([sum(means[i] ** 2 for i in np.flatnonzero(degrees == l))
                          for l in range(1, L + 1)], axis=-1)
    else:
        power = _pair_power(x, L, d)
    return HarmonicMoments(d=d, degree=degrees, order=orders, mean=mean, se=se, power=power,
                           n=n, axis=e)


def _pair_power(x: Any, L: int, d: int) -> Any:
    """dim_l / n^2 sum_{i,j} P_l(<x_i, x_j>), l = 1..L: (..., L), in blocks of rows."""
    xp = namespace(x)
    n = int(x.shape[-2])
    batch = math.prod(int(s) for s in x.shape[:-2])
    rows = max(1, BLOCK // max(1, n * batch))
    total = None
    for start in range(0, n, rows):
        g = x[..., start:start + rows, :] @ (np.swapaxes(x, -1, -2) if xp is np
                                             else x.transpose(-1, -2))
        block = xp.stack([xp.sum(p, axis=(-2, -1)) for p in _gegenbauer(g, d, L)[1:]],
                         axis=-1)
        total = block if total is None else total + block
    dims = np.array([harmonic_dimension(l, d) for l in range(1, L + 1)], dtype=float)
    scale = dims / (n * n)
    return total * (xp.asarray(scale, dtype=x.dtype, device=x.device) if xp is not np
                    else scale)
