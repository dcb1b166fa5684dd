"""Independent references on S^2 for the mean-field tests: a density from its coefficients
by scipy's spherical harmonics, and a product quadrature rule (neither uses attnflow)."""

from __future__ import annotations

import numpy as np
from scipy.special import sph_harm_y


def density_at(c: np.ndarray, x: np.ndarray) -> np.ndarray:
    """rho(x) for coefficients c (L + 1, L + 1), summing scipy's Y_lm over m = -l..l
    (c_{l,-m} = (-1)^m conj(c_lm)): independent of the module's own evaluation."""
    theta = np.arccos(np.clip(x[:, 2], -1, 1))
    phi = np.arctan2(x[:, 1], x[:, 0])
    out = np.zeros(len(x), dtype=complex)
    for l in range(c.shape[0]):
        for m in range(-l, l + 1):
            clm = c[l, m] if m >= 0 else (-1) ** m * np.conj(c[l, -m])
            out += clm * sph_harm_y(l, m, theta, phi)
    return out.real


def quadrature(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Points (P, 3) and weights (P,) of a product rule on the sphere: Gauss-Legendre in
    cos theta times the trapezoidal rule in phi (exact for degree < 2 nodes - 1)."""
    z, w = np.polynomial.legendre.leggauss(nodes)
    phi = 2 * np.pi * np.arange(2 * nodes) / (2 * nodes)
    s = np.sqrt(1 - z * z)
    x = np.stack(np.broadcast_arrays(s[:, None] * np.cos(phi), s[:, None] * np.sin(phi),
                                     z[:, None]), -1).reshape(-1, 3)
    return x, np.repeat(w * np.pi / nodes, 2 * nodes)
