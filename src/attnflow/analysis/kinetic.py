"""Closed forms of the mean-field (kinetic) equation on the circle (docs/science.md §9).

Softmax attention, Q = K = V = I, d = 2, no noise unless said.

* Growth rate of Fourier mode k of the uniform density: lambda_k = k^2 I_k(beta) /
  (beta I_0(beta)) = k (I_{k-1}(beta) - I_{k+1}(beta)) / (2 I_0(beta)) (`growth_rate`; the
  second form is finite at beta = 0: 1/2 for k = 1, 0 above).
* The causal linearisation: mode k of label s obeys d_t eps = lambda_k H eps, H the Hardy
  operator (1/s) int_0^s, whose resolvent gives a point perturbation at label s the weight
  (1/u) psi_tau(log(u / s)) at every later label u, tau = lambda_k t and
  psi_tau(y) = sqrt(tau / y) I_1(2 sqrt(tau y)) (`hardy_kernel`).
* Memory of the initial state (`causal_memory`). For n iid uniform tokens, token i carrying
  the label u = i / n, to first order in the fluctuations (docs/science.md §9, "Memory"):

      n E[cos k(theta_i(t) - theta_j(0))] -> (1/u) psi_{lambda_k t}(log(u / s)),  s = j/n < u,

  so the last token (u = 1) remembers the token at s with psi_tau(log(1/s)).
  `cell_memory` averages it over a cell of s and a cell of u (exactly in s, by the
  incomplete-gamma series of the integral; Gauss-Legendre in u).
* Quantiles of a density given by its Fourier coefficients (`inverse_cdf`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import gammaincc, ive

from attnflow._checks import fail

__all__ = ["causal_memory", "cell_memory", "growth_rate", "hardy_kernel", "inverse_cdf"]


def growth_rate(beta: float, k: Any) -> np.ndarray:
    """lambda_k = k (I_{k-1}(beta) - I_{k+1}(beta)) / (2 I_0(beta)) (per unit time): the rate
    at which Fourier mode k >= 1 of the uniform density grows under softmax attention
    (Q = K = V = I, no noise), for beta of either sign (beta < 0: negative for even k, see
    `attnflow.analysis.dispersion_rate`). Vectorised over k."""
    k = np.asarray(k, dtype=float)
    if not np.isfinite(beta) or np.any(k < 1) or np.any(k != np.round(k)):
        raise fail("beta, k", "a finite beta and integer modes k >= 1", f"beta {beta}, k {k}")
    return k * (ive(k - 1, beta) - ive(k + 1, beta)) / (2 * ive(0, beta))


def hardy_kernel(tau: float, y: Any) -> np.ndarray:
    """psi_tau(y) = sum_{m >= 0} tau^{m+1} y^m / (m! (m+1)!) = sqrt(tau / y) I_1(2 sqrt(tau y))
    for y >= 0 (its limit tau at y = 0), tau >= 0. Vectorised over y."""
    y = np.asarray(y, dtype=float)
    if tau < 0 or np.any(y < 0):
        raise fail("tau, y", "tau >= 0 and y >= 0", f"tau {tau}, y {y}")
    z = 2 * np.sqrt(tau * y)
    safe = np.where(z > 1e-8, z, 1.0)
    ratio = np.where(z > 1e-8, 2 * ive(1, safe) * np.exp(safe) / safe, 1.0)  # 2 I_1(z) / z
    return tau * ratio


def causal_memory(s: Any, t: float, beta: float, k: int = 1, u: float = 1.0) -> np.ndarray:
    """The n -> infinity limit of n E[cos k(theta_i(t) - theta_j(0))] for n iid uniform tokens
    under causal softmax attention, token i at label u = i/n, j at s = j/n < u:
    (1/u) psi_{lambda_k t}(log(u / s)) (module docstring). s: labels in (0, u), vectorised;
    t >= 0 (time), beta of either sign where lambda_k >= 0 (every k for beta >= 0, odd k for
    beta < 0; a decaying mode is refused by `hardy_kernel`, tau >= 0)."""
    s = np.asarray(s, dtype=float)
    if np.any(s <= 0) or np.any(s >= u):
        raise fail("s", f"labels in (0, u = {u})", repr(s))
    tau = float(growth_rate(beta, k)) * t
    return hardy_kernel(tau, np.log(u / s)) / u


def cell_memory(s_cell: tuple[float, float], u_cell: tuple[float, float], tau: float,
                nodes: int = 24) -> float:
    """The average of (1/u) psi_tau(log(u/s)) over s uniform in s_cell = (s_lo, s_hi) and u
    uniform in u_cell = (u_lo, u_hi), s_hi <= u_lo: what `causal_memory` predicts for the
    regression of a cell of late tokens on a cell of early ones. The s-integral is exact:
    int_{s_lo}^{s_hi} (1/u) psi_tau(log(u/s)) ds = sum_{m >= 0} tau^{m+1} / (m+1)!
    [Q(m+1, log(u/s_hi)) - Q(m+1, log(u/s_lo))], Q the regularised upper incomplete gamma
    function (Q(., inf) = 0 for s_lo = 0); the u-average uses `nodes` Gauss-Legendre
    points."""
    (s_lo, s_hi), (u_lo, u_hi) = s_cell, u_cell
    if not (0 <= s_lo < s_hi <= u_lo < u_hi) or tau < 0:
        raise fail("cells", "0 <= s_lo < s_hi <= u_lo < u_hi and tau >= 0",
                   f"{s_cell}, {u_cell}, tau {tau}")
    x, w = np.polynomial.legendre.leggauss(nodes)
    u = u_lo + (u_hi - u_lo) * (x + 1) / 2
    if tau == 0:
        return 0.0
    m = np.arange(int(tau) + 60)[:, None]
    log_weights = (m + 1) * np.log(tau) - np.cumsum(np.log(m + 1), axis=0)  # tau^{m+1}/(m+1)!
    near = gammaincc(m + 1, np.log(u / s_hi))
    far = gammaincc(m + 1, np.log(u / s_lo)) if s_lo > 0 else 0.0
    inner = np.sum(np.exp(log_weights) * (near - far), axis=0) / (s_hi - s_lo)
    return float(np.sum(w * inner) / 2)


def inverse_cdf(c: Any, q: Any) -> np.ndarray:
    """The angles theta in [0, 2 pi) with F(theta) = q, F(theta) = int_0^theta rho the
    distribution function of the density rho(theta) = sum_{|k| <= K} c_k e^{i k theta} given
    by its coefficients c (K + 1,) (c_0 = 1 / (2 pi), rho > 0), for levels q in [0, 1)
    (any shape). Linear interpolation on a table, then Newton steps on the exact F: accurate
    to about 1e-14 radians."""
    c = np.asarray(c, dtype=complex)
    q = np.asarray(q, dtype=float)
    if c.ndim != 1 or not np.isclose(2 * np.pi * c[0].real, 1.0) or np.any(q < 0) or np.any(
            q >= 1):
        raise fail("c, q", "coefficients (K + 1,) of a density of mass 1 and levels in [0, 1)",
                   f"c of shape {c.shape}, q in [{q.min()}, {q.max()}]")
    grid = np.linspace(0.0, 2 * np.pi, (1 << 14) + 1)
    theta = np.interp(q, _cdf(c, grid), grid)
    for _ in range(3):
        theta = theta - (_cdf(c, theta) - q) / _density(c, theta)
    return np.mod(theta, 2 * np.pi)


def _cdf(c: np.ndarray, theta: np.ndarray) -> np.ndarray:
    k = np.arange(1, len(c))
    out = theta / (2 * np.pi)
    for chunk in np.array_split(np.arange(theta.size), max(1, theta.size // 65536)):
        th = theta.ravel()[chunk][:, None]
        out.ravel()[chunk] += 2 * np.real((np.exp(1j * k * th) - 1) / (1j * k) @ c[1:])
    return out


def _density(c: np.ndarray, theta: np.ndarray) -> np.ndarray:
    k = np.arange(1, len(c))
    out = np.full(theta.shape, c[0].real)
    for chunk in np.array_split(np.arange(theta.size), max(1, theta.size // 65536)):
        th = theta.ravel()[chunk][:, None]
        out.ravel()[chunk] += 2 * np.real(np.exp(1j * k * th) @ c[1:])
    return out
