"""Clusters as the modes of a density on the circle, at the length scale beta^{-1/2}: a count
that means the same at n = 10 and at n = 10^6 (docs/science.md §9, "Counting clusters at
large n"; guide: docs/guide/analysis.md).

Single linkage (`attnflow.analysis.clusters.cluster_count`) chains through dense tokens: at n = 10^6
consecutive tokens on the circle are 6e-6 rad apart, far below any tolerance, so a
clustered configuration is one cluster. Here the tokens are first smoothed at the scale of
the attention kernel, then the bumps are counted:

1. The kernel density estimate with the von Mises kernel of width w (concentration
   kappa = 1 / w^2; default w = |beta|^{-1/2}, `length_scale`): rho_w(theta) = (1/n) sum_j
   e^{kappa cos(theta - theta_j)} / (2 pi I_0(kappa)), computed on a grid of P >= 16 / w
   angles by linear binning and FFT (mode k multiplied by I_k(kappa) / I_0(kappa), negligible
   beyond P / 2), O(n + P log P).
2. Its modes by 0-dimensional persistence on the circular grid (the "ToMATo" rule of Chazal,
   Guibas, Oudot & Skraba, *Persistence-based clustering in Riemannian manifolds*, J. ACM 60
   (2013)): grid points are added from the highest value down; a new local maximum starts a
   component; where two components meet (at a saddle s), the one with the lower peak p
   survives as a cluster if it is prominent, s <= (1 - depth) p, and holds at least the
   fraction `mass` of the total, and is absorbed otherwise. The count is the number of
   survivors plus the highest component.

The same counting applies to a density given by Fourier coefficients (the mean-field
solver's, `density_peak_count`), smoothed by the same kernel: one instrument for particles
and densities. For tight clusters that hold at least `mass` each and lie farther apart than
about 3 w (two equal kernels 2.9 w apart dip by 30 % between them; a sum of two stops being
bimodal at 2 w), the count equals single linkage's at any tolerance between the clusters'
width and their distance. The k* clusters of the first phase are 2 pi / k* ~ 4.4 w apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ive

from attnflow._checks import fail, number
from attnflow._repr import ShortRepr
from attnflow.analysis._density import one_density
from attnflow.analysis._input import host, run_states
from attnflow.analysis.clusters import length_scale
from attnflow.analysis.moments import circle_angles

__all__ = ["DEFAULT_DEPTH", "DEFAULT_MASS", "DensityModes", "density_cluster_count",
           "density_modes", "density_peak_count", "kde_circle"]

DEFAULT_MASS = 0.01  # a counted cluster holds at least 1 % of the tokens
DEFAULT_DEPTH = 0.3  # and the density dips by 30 % of its peak between it and a higher one


@dataclass(frozen=True, repr=False)
class DensityModes(ShortRepr):
    """The counted modes of one density on the circle.

    count : the number of clusters.
    angles : (count,) the peaks' angles in [0, 2 pi), highest peak first.
    masses : (count,) the fraction of the total mass in each cluster's component when it met
        a higher one (the highest: what is left), in the same order.
    width : the kernel width the density was smoothed with (radians; 0: not smoothed).
    """

    count: int
    angles: np.ndarray
    masses: np.ndarray
    width: float


def kde_circle(x: Any, width: float, points: int | None = None) -> np.ndarray:
    """The von Mises kernel density estimate (..., P) of tokens x (..., n, 2) on the circle
    at theta_j = 2 pi j / P, per unit angle (module docstring, step 1). width: the kernel's
    width w > 0 (radians); points: P (default the least power of two >= max(512, 16 / w))."""
    theta = np.mod(circle_angles("x", x, quantity="kde_circle (computed by FFT on the host)"),
                   2 * np.pi)
    w = number("width", width, 0.0, low_open=True, expected="a kernel width w > 0 (radians)")
    P = _points(points, w)
    h = 2 * np.pi / P
    u = theta / h
    lo = np.floor(u).astype(np.intp) % P
    frac = u - np.floor(u)
    batch = theta.shape[:-1]
    flat_lo = lo.reshape(-1, theta.shape[-1])
    flat_frac = frac.reshape(flat_lo.shape)
    offset = (np.arange(flat_lo.shape[0]) * P)[:, None]
    weights = np.bincount((flat_lo + offset).ravel(), (1 - flat_frac).ravel(),
                          minlength=flat_lo.shape[0] * P)
    weights += np.bincount(((flat_lo + 1) % P + offset).ravel(), flat_frac.ravel(),
                           minlength=flat_lo.shape[0] * P)
    weights = weights.reshape(*batch, P) / theta.shape[-1]
    return np.fft.irfft(_smooth(np.fft.rfft(weights, axis=-1), w, P), n=P, axis=-1) * (
        P / (2 * np.pi))


def density_modes(values: Any, mass: float = DEFAULT_MASS, depth: float = DEFAULT_DEPTH,
                  width: float = 0.0) -> DensityModes:
    """The modes of one density given by its values (P,) >= 0 at theta_j = 2 pi j / P, by
    persistence with the `mass` and `depth` rules (module docstring, step 2)."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size < 3 or not np.all(np.isfinite(v)):
        raise fail("values", "finite density values (P,) on a circular grid, P >= 3",
                   f"an array of shape {v.shape}")
    mass = number("mass", mass, 0.0, 1.0, expected="a mass fraction in [0, 1]")
    depth = number("depth", depth, 0.0, 1.0, expected="a relative depth in [0, 1]")
    P = v.size
    total = float(np.clip(v, 0, None).sum())
    parent = np.full(P, -1)
    peak = np.zeros(P, dtype=np.intp)
    held = np.zeros(P)
    found: list[tuple[int, float]] = []

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in np.argsort(-v, kind="stable"):
        parent[i], peak[i], held[i] = i, i, max(v[i], 0.0)
        for j in ((i - 1) % P, (i + 1) % P):
            if parent[j] < 0 or j == i:
                continue
            a, b = root(i), root(j)
            if a == b:
                continue
            high, low = (a, b) if v[peak[a]] >= v[peak[b]] else (b, a)
            if v[i] <= (1 - depth) * v[peak[low]] and held[low] >= mass * total:
                found.append((int(peak[low]), held[low] / total))  # a cluster: its mass kept
            else:
                held[high] += held[low]  # absorbed
            parent[low] = high
    top = root(int(np.argmax(v)))
    found.append((int(peak[top]), held[top] / total))  # the highest: what is left
    found.sort(key=lambda item: -v[item[0]])
    return DensityModes(count=len(found),
                        angles=2 * np.pi * np.array([p for p, _ in found]) / P,
                        masses=np.array([m for _, m in found]), width=float(width))


def density_cluster_count(x: Any, beta: float | None = None, *, width: float | None = None,
                          mass: float = DEFAULT_MASS, depth: float = DEFAULT_DEPTH,
                          points: int | None = None) -> np.ndarray:
    """The number of clusters of tokens x (..., n, 2) on the circle (leading axes:
    independent configurations; a Trajectory: its directions), the modes of their kernel
    density estimate at the width w = |beta|^{-1/2} (or `width`) that hold at least `mass`
    of the tokens and are `depth` deep (module docstring). Returns an int array (...)."""
    w = _width(beta, width)
    values = kde_circle(host("x", run_states("x", x), "density_cluster_count (a count)",
                             "fourier_moments"), w, points)
    flat = values.reshape(-1, values.shape[-1])
    counts = [density_modes(row, mass, depth, w).count for row in flat]
    return np.array(counts, dtype=int).reshape(values.shape[:-1])


def density_peak_count(c: Any, beta: float | None = None, *, width: float | None = None,
                       mass: float = DEFAULT_MASS, depth: float = DEFAULT_DEPTH,
                       points: int | None = None) -> DensityModes:
    """The modes of a density given by Fourier coefficients c (K + 1,) or (1, K + 1) (mean
    field: one density; for label cells pass a row), smoothed by the same von Mises kernel
    as `density_cluster_count` (width |beta|^{-1/2}, or `width`; width = 0: not smoothed),
    counted by the same rule: what that count of infinitely many tokens drawn from the
    density would be."""
    c = one_density(c)
    K = len(c) - 1
    w = _width(beta, width, allow_zero=True)
    P = max(_points(points, w) if w > 0 else 512, 1 << int(np.ceil(np.log2(4 * (K + 1)))))
    coeffs = np.zeros(P // 2 + 1, dtype=complex)
    coeffs[:K + 1] = c
    smoothed = _smooth(coeffs, w, P) if w > 0 else coeffs
    return density_modes(np.fft.irfft(smoothed * P, n=P), mass, depth, w)


def _smooth(coeffs: np.ndarray, width: float, P: int) -> np.ndarray:
    """Fourier coefficients (..., P // 2 + 1) times the von Mises kernel's I_k / I_0."""
    kappa = 1.0 / (width * width)
    k = np.arange(coeffs.shape[-1])
    return coeffs * (ive(k, kappa) / ive(0, kappa))


def _points(points: Any, width: float) -> int:
    if points is None:
        return max(512, 1 << int(np.ceil(np.log2(16 / width))))
    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or \
            points < 16 / width:
        raise fail("points", f"an integer grid size >= 16 / width = {16 / width:.4g}",
                   repr(points))
    return int(points)


def _width(beta: float | None, width: float | None, allow_zero: bool = False) -> float:
    if (beta is None) == (width is None):
        raise fail("beta, width", "exactly one of beta (width |beta|^-1/2) and width",
                   f"beta {beta!r}, width {width!r}")
    if width is not None:
        return number("width", width, 0.0, low_open=not allow_zero,
                      expected="a kernel width > 0 (radians)" + (", or 0: no smoothing"
                                                                if allow_zero else ""))
    w = length_scale(number("beta", beta, expected="a finite beta != 0"))
    if not np.isfinite(w):
        raise fail("beta", "a finite beta != 0 (beta = 0 and +-inf have no length scale "
                   "|beta|^-1/2: pass width)", repr(beta))
    return w
