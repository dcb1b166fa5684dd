"""The influence of each token on the last one: the linearised prediction (docs/science.md §11.7).

The model of `attnflow.analysis.kinetic`'s retrieval with ALiBi: n iid uniform tokens on the
circle, causal mask, the positional weighting, ALiBi's slope per unit label, Q = K = V = I,
attnflow time. The influence of token j (label s = j/n) on the last one is the derivative
J(s, t) = d theta_n(t) / d theta_j(0) (on the circle the tangent block of dx_n(t)/dx_j(0) is
this one number: its operator and Frobenius norms are |J|). Linearised about the uniform
state (first order in the fluctuations, the causal Hardy operator of §11.1):

    n J(s, t) -> G(s, phi, t) = sum_{k>=1} 2 K_k(s, t) cos(k phi),  phi = theta_j(0) - theta_n(0),

K_k(s, t) = (sigma'(s) / sigma(1)) psi_{r_k t}(log(sigma(1) / sigma(s))) the retrieval kernel
of mode k (`alibi_memory`). So

* the mean influence n E|J| -> (1/2 pi) int |G| d phi (`mean_influence`);
* its root mean square n (E J^2)^{1/2} -> (2 sum_k K_k^2)^{1/2} (`rms_influence`);
* its right end s -> 1 stops rising at t_I = 2 (1 - e^{-slope}) E|g| / E[sign(g) h], g(phi) =
  sum_k 2 r_k cos k phi = e^{beta cos phi} (cos phi - beta sin^2 phi), h = sum_k 2 r_k^2 cos k phi
  (`influence_recency_time`; the retrieval's t_crit has the soft weights in place of E|.|).

The modes are summed to k = `modes` (24): the tail is below 1e-15 of the sum for beta <= 4
(r_k <= k^2 (beta/2)^k e^{beta^2/4} / (beta k!), docs/science.md §11.7).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.integrate import quad
from scipy.optimize import brentq

from attnflow._checks import fail
from attnflow.analysis.dispersion import dispersion_rate
from attnflow.analysis.kinetic import alibi_memory

__all__ = ["influence_recency_time", "mean_influence", "rms_influence"]

MODES = 24  # the modes k = 1..MODES summed (the tail's bound: module docstring)


def kernels(s: Any, t: float, beta: float, slope: float, modes: int = MODES) -> np.ndarray:
    """K_k(s, t) (..., modes) for k = 1..modes: the retrieval kernels `alibi_memory` at u = 1,
    the cosine coefficients / 2 of the linearised influence n J over phi. s in (0, 1)."""
    s = np.asarray(s, dtype=float)
    return np.stack([alibi_memory(s, t, beta, slope, k) for k in range(1, modes + 1)], axis=-1)


def mean_abs_cosines(c: Any) -> float:
    """(1/2 pi) int_0^{2 pi} |sum_k c_k cos(k phi)| d phi for coefficients c (K,), k = 1..K:
    exact up to the roots, which are bracketed on 64 K points of [0, pi] and refined by
    brentq; between consecutive roots the integral is the antiderivative's difference
    (sum_k c_k sin(k phi) / k). A pair of roots closer than the grid step is missed; its
    contribution is O(step^3 max|G''|)."""
    c = np.asarray(c, dtype=float)
    k = np.arange(1, c.size + 1)

    def g(phi):
        return np.cos(np.multiply.outer(phi, k)) @ c

    def antiderivative(phi):
        return np.sin(np.multiply.outer(phi, k)) @ (c / k)

    grid = np.linspace(0.0, np.pi, 64 * c.size + 1)
    values = g(grid)
    change = np.nonzero(np.sign(values[:-1]) * np.sign(values[1:]) < 0)[0]
    roots = [brentq(g, grid[i], grid[i + 1], xtol=1e-15) for i in change]
    edges = np.array([0.0, *roots, np.pi])
    return float(np.sum(np.abs(np.diff(antiderivative(edges)))) / np.pi)


def mean_influence(s: Any, t: float, beta: float, slope: float, modes: int = MODES) -> np.ndarray:
    """The n -> infinity limit of n E|d theta_n(t) / d theta_j(0)| for the token at label s =
    j/n in (0, 1) (module docstring): (1/2 pi) int |sum_k 2 K_k(s, t) cos k phi| d phi.
    Vectorised over s; t > 0, beta > 0, slope >= 0."""
    if not (t > 0 and beta > 0):
        raise fail("t, beta", "t > 0 and beta > 0", f"{t}, {beta}")
    K = kernels(s, t, beta, slope, modes)
    flat = K.reshape(-1, modes)
    return np.array([mean_abs_cosines(2 * row) for row in flat]).reshape(K.shape[:-1])


def rms_influence(s: Any, t: float, beta: float, slope: float, modes: int = MODES) -> np.ndarray:
    """The n -> infinity limit of n (E[(d theta_n(t) / d theta_j(0))^2])^{1/2}: (2 sum_k
    K_k(s, t)^2)^{1/2} (Parseval over the uniform phi). Vectorised over s in (0, 1)."""
    return np.sqrt(2 * np.sum(kernels(s, t, beta, slope, modes) ** 2, axis=-1))


def influence_recency_time(beta: float, slope: float, modes: int = MODES) -> float:
    """t_I = 2 (1 - e^{-slope}) E|g| / E[sign(g) h] (attnflow time; module docstring): the time
    at which the slope of `mean_influence` at its right end s -> 1 changes sign, positive
    before (recency), negative after. beta > 0, slope >= 0."""
    if not beta > 0:
        raise fail("beta", "beta > 0", repr(beta))
    r = dispersion_rate(np.arange(1, modes + 1), beta, attention="unnormalised")
    k = np.arange(1, modes + 1)
    g = lambda phi: np.cos(np.multiply.outer(phi, k)) @ (2 * r)  # noqa: E731
    h = lambda phi: np.cos(np.multiply.outer(phi, k)) @ (2 * r * r)  # noqa: E731
    grid = np.linspace(0.0, np.pi, 64 * modes + 1)
    values = g(grid)
    change = np.nonzero(np.sign(values[:-1]) * np.sign(values[1:]) < 0)[0]
    edges = [0.0, *(brentq(g, grid[i], grid[i + 1], xtol=1e-15) for i in change), np.pi]
    signed = sum(np.sign(g((a + b) / 2)) * quad(h, a, b, epsabs=1e-14)[0]
                 for a, b in zip(edges[:-1], edges[1:])) / np.pi
    return float(-2 * np.expm1(-slope) * mean_abs_cosines(2 * r) / signed)
