"""Closed forms of the mean-field (kinetic) equation on the circle (docs/science.md §9).

Softmax attention, Q = K = V = I, d = 2, no noise unless said.

* Growth rate of Fourier mode k of the uniform density: lambda_k = k^2 I_k(beta) /
  (beta I_0(beta)) = k (I_{k-1}(beta) - I_{k+1}(beta)) / (2 I_0(beta))
  (`attnflow.analysis.closedforms.dispersion_rate` at d = 2; the second form is finite at beta = 0:
  1/2
  for k = 1, 0 above).
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
* Retrieval with ALiBi (arXiv 2605.09213; docs/science.md §11.1). Causal mask, the positional
  weighting (exp(beta <x_i, x_j>) times the position weights e^{-slope (i - j) / n}
  normalised over the keys j <= i): in the label sigma(s) = (e^{slope s} - 1) / slope
  (`hardy_label`) the weighted average over the earlier labels is the Hardy operator, so

      n E[cos k(theta_i(t) - theta_j(0))] -> (sigma'(s) / sigma(u)) psi_{r_k t}(log(sigma(u) /
      sigma(s))),   r_k = k^2 I_k(beta) / beta   (`alibi_memory`),

  the soft accuracy sums it over k with the weights e^{-pi^2 k^2 / (2 M^2)}
  (`soft_accuracy`), and the last token's profile stops rising at its right end s -> 1 at
  t_crit = 2 (1 - e^{-slope}) sum_k w_k r_k / sum_k w_k r_k^2 (`recency_time`). `cell_memory`
  takes the slope too. `token_memory` is the same linear equation on n discrete tokens
  (attnflow's causal mask puts a token's own position weight into its normaliser): the
  finite-n linear theory, O(log(n) / n) from the limit (docs/science.md §11.1).
* Quantiles of a density given by its Fourier coefficients (`inverse_cdf`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from scipy.signal import lfilter
from scipy.special import gammaincc, ive

from attnflow._checks import fail
from attnflow.analysis._density import cdf_table, hermite, one_density
from attnflow.analysis.dispersion import dispersion_rate

__all__ = ["alibi_memory", "causal_memory", "cell_memory", "hardy_kernel",
           "hardy_label", "inverse_cdf", "recency_time", "soft_accuracy", "soft_weights",
           "token_memory"]

SOFT_WIDTH = 8.0  # M of the soft accuracy's weights e^{-pi^2 k^2 / (2 M^2)} (arXiv 2605.09213)
SOFT_MODES = 20  # the modes k = 1..SOFT_MODES it sums (the source's truncation)


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
    tau = float(dispersion_rate(k, beta)) * t
    return hardy_kernel(tau, np.log(u / s)) / u


def cell_memory(s_cell: tuple[float, float], u_cell: tuple[float, float], tau: float,
                nodes: int = 24, slope: float = 0.0) -> float:
    """The average of (sigma'(s) / sigma(u)) psi_tau(log(sigma(u) / sigma(s))) over s uniform
    in s_cell = (s_lo, s_hi) and u uniform in u_cell = (u_lo, u_hi), s_hi <= u_lo, sigma the
    `hardy_label` of ALiBi's `slope` (0: sigma(s) = s, the kernel (1/u) psi_tau(log(u/s)) of
    `causal_memory`; else that of `alibi_memory`): what they predict for the regression of a
    cell of late tokens on a cell of early ones. The s-integral is exact: with
    sigma = sigma(u) e^{-y} it is int psi_tau(y) e^{-y} dy = sum_{m >= 0} tau^{m+1} / (m+1)!
    [Q(m+1, log(sigma(u)/sigma(s_hi))) - Q(m+1, log(sigma(u)/sigma(s_lo)))], Q the
    regularised upper incomplete gamma function (Q(., inf) = 0 for s_lo = 0); the u-average
    uses `nodes` Gauss-Legendre points."""
    (s_lo, s_hi), (u_lo, u_hi) = s_cell, u_cell
    if not (0 <= s_lo < s_hi <= u_lo < u_hi) or tau < 0:
        raise fail("cells", "0 <= s_lo < s_hi <= u_lo < u_hi and tau >= 0",
                   f"{s_cell}, {u_cell}, tau {tau}")
    x, w = _gauss_legendre(nodes)
    su = hardy_label(u_lo + (u_hi - u_lo) * (x + 1) / 2, slope)
    if tau == 0:
        return 0.0
    m = np.arange(int(tau) + 60)[:, None]
    log_weights = (m + 1) * np.log(tau) - np.cumsum(np.log(m + 1), axis=0)  # tau^{m+1}/(m+1)!
    near = gammaincc(m + 1, np.log(su / hardy_label(s_hi, slope)))
    far = gammaincc(m + 1, np.log(su / hardy_label(s_lo, slope))) if s_lo > 0 else 0.0
    inner = np.sum(np.exp(log_weights) * (near - far), axis=0) / (s_hi - s_lo)
    return float(np.sum(w * inner) / 2)


@lru_cache(maxsize=8)
def _gauss_legendre(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """The Gauss-Legendre nodes and weights on [-1, 1] (cached: cell_memory is called per
    cell, mode and time)."""
    return np.polynomial.legendre.leggauss(nodes)


def hardy_label(s: Any, slope: float) -> np.ndarray:
    """sigma(s) = (e^{slope s} - 1) / slope (s itself at slope 0) for labels s >= 0 and ALiBi's
    slope >= 0 per unit label (position weights e^{-slope (i - j) / n}): the label in which the
    ALiBi-weighted average over the labels before s, int_0^s slope e^{-slope (s - s')} eps(s')
    ds' / (1 - e^{-slope s}), is the Hardy operator (1/sigma) int_0^sigma eps dsigma'.
    Vectorised over s."""
    s = np.asarray(s, dtype=float)
    if not (np.isfinite(slope) and slope >= 0) or np.any(s < 0):
        raise fail("slope, s", "a finite slope >= 0 and labels s >= 0", f"{slope}, {s}")
    return np.expm1(slope * s) / slope if slope > 0 else s


def token_memory(n: int, edges: Any, tau: Any, slope: float, self_key: bool = True,
                 step: float = 0.01) -> np.ndarray:
    """The linear label equation on n discrete tokens: c_l' = r_k sum_{m < l} p_lm c_m,
    p_lm = e^{-slope (l - m) / n} / P_l, P_l = sum over the keys m <= l (`self_key`, attnflow's
    causal mask: the token's own weight enters P_l though its velocity term sin 0 vanishes)
    or m < l (the source's strict mask), c_l(0) = n delta_lj; in the rescaled time tau = r_k t.
    Returns (len(tau), S - 1): c averaged over the tokens i of the last cell and j of each
    earlier cell of the label `edges` (S + 1,) (token l has the label l / n): the finite-n
    linear theory of what `cell_memory` gives as n -> infinity (docs/science.md §11.1).

    The row average over the last cell is carried back by the transposed equation v' = W^T v
    (W^T is a decayed reverse cumulative sum, O(n) by `scipy.signal.lfilter`), RK4 of step
    `step` in tau (W is nilpotent; the error is O(step^4))."""
    edges = np.asarray(edges, dtype=float)
    tau = np.atleast_1d(np.asarray(tau, dtype=float))
    if n < 2 or edges[0] != 0 or edges[-1] != 1 or np.any(np.diff(edges) <= 0):
        raise fail("n, edges", "n >= 2 and increasing edges from 0 to 1", f"{n}, {edges}")
    if np.any(tau < 0) or not (np.isfinite(slope) and slope >= 0) or not step > 0:
        raise fail("tau, slope, step", "tau >= 0, slope >= 0, step > 0",
                   f"{tau}, {slope}, {step}")
    a = np.exp(-slope / n)
    labels = np.arange(1, n + 1)
    keys = labels if self_key else labels - 1  # sum_{m <= l} or sum_{m < l} of a^{l - m}
    P = np.where(keys > 0, (a ** (labels - keys) - a ** labels) / (1 - a) if a < 1 else keys,
                 np.inf)
    cell = np.searchsorted(edges, labels / n * (1 - 1e-12)) - 1
    cells = len(edges) - 1

    def back(v: np.ndarray) -> np.ndarray:  # (W^T v)_m = sum_{l > m} a^{l - m} v_l / P_l
        return lfilter([0.0, a], [1.0, -a], (v / P)[::-1])[::-1]

    v = (cell == cells - 1) / np.sum(cell == cells - 1)
    out, now = np.zeros((len(tau), cells - 1)), 0.0
    for i in np.argsort(tau):
        m = max(1, int(np.ceil((tau[i] - now) / step)))
        h = (tau[i] - now) / m
        for _ in range(m):
            k1 = back(v)
            k2 = back(v + h / 2 * k1)
            k3 = back(v + h / 2 * k2)
            v = v + h / 6 * (k1 + 2 * k2 + 2 * k3 + back(v + h * k3))
        now = tau[i]
        out[i] = n * np.bincount(cell, v, cells)[:-1] / np.bincount(cell, None, cells)[:-1]
    return out


def alibi_memory(s: Any, t: float, beta: float, slope: float, k: int = 1, u: float = 1.0
                 ) -> np.ndarray:
    """The n -> infinity limit of n E[cos k(theta_i(t) - theta_j(0))] for n iid uniform tokens
    on the circle under causal attention with the positional weighting and ALiBi's slope per
    unit label (attnflow time, Q = K = V = I): (sigma'(s) / sigma(u)) psi_{r_k t}(log(sigma(u)
    / sigma(s))), sigma the `hardy_label`, r_k = k^2 I_k(beta) / beta (module docstring;
    docs/science.md §11.1). Token i at label u = i/n, j at s = j/n in (0, u), vectorised over
    s; t >= 0, beta >= 0, k >= 1. At slope 0 it is `causal_memory` with the rate r_k."""
    s = np.asarray(s, dtype=float)
    if np.any(s <= 0) or np.any(s >= u):
        raise fail("s", f"labels in (0, u = {u})", repr(s))
    rate = float(dispersion_rate(k, beta, attention="unnormalised"))
    jacobian = np.exp(slope * s) / hardy_label(u, slope)  # sigma'(s) / sigma(u)
    return jacobian * hardy_kernel(rate * t, np.log(hardy_label(u, slope) / hardy_label(s,
                                                                                       slope)))


def soft_weights(width: float = SOFT_WIDTH, modes: int = SOFT_MODES) -> np.ndarray:
    """w_k = e^{-pi^2 k^2 / (2 width^2)}, k = 1..modes (modes,): the soft accuracy's weights
    (a wrapped Gaussian of the angle's error, of standard deviation about pi / width)."""
    if not (np.isfinite(width) and width > 0) or modes < 1:
        raise fail("width, modes", "width > 0 and modes >= 1", f"{width}, {modes}")
    k = np.arange(1, modes + 1)
    return np.exp(-0.5 * (np.pi * k / width) ** 2)


def soft_accuracy(s: Any, t: float, beta: float, slope: float, width: float = SOFT_WIDTH,
                  modes: int = SOFT_MODES) -> np.ndarray:
    """sum_{k=1}^{modes} w_k `alibi_memory`(s, t, beta, slope, k) at u = 1, w_k the
    `soft_weights`: the n -> infinity limit of n E[sum_k w_k cos k(theta_n(t) - theta_j(0))],
    the last token's soft retrieval of the token at label s (arXiv 2605.09213's profile).
    Vectorised over s in (0, 1)."""
    w = soft_weights(width, modes)
    return sum(wk * alibi_memory(s, t, beta, slope, k) for k, wk in enumerate(w, start=1))


def recency_time(beta: float, slope: float, width: float = SOFT_WIDTH,
                 modes: int = SOFT_MODES) -> float:
    """t_crit = 2 (1 - e^{-slope}) sum_k w_k r_k / sum_k w_k r_k^2 (attnflow time; r_k =
    k^2 I_k(beta) / beta, w_k the `soft_weights`): the time at which the slope of
    `soft_accuracy` at its right end s -> 1 changes sign, positive before (recency: the profile
    rises towards the last tokens), negative after; 0 without ALiBi (docs/science.md §11.1).
    beta > 0, slope >= 0."""
    if not beta > 0:
        raise fail("beta", "beta > 0", repr(beta))
    w = soft_weights(width, modes)
    r = dispersion_rate(np.arange(1, modes + 1), beta, attention="unnormalised")
    return float(-2 * np.expm1(-slope) * np.sum(w * r) / np.sum(w * r * r))


def inverse_cdf(c: Any, q: Any) -> np.ndarray:
    """The angles theta in [0, 2 pi) with F(theta) = q, F(theta) = int_0^theta rho the
    distribution function of the density rho(theta) = sum_{|k| <= K} c_k e^{i k theta} given
    by its coefficients c (K + 1,) or (1, K + 1) (the mean-field solver's shape; c_0 =
    1 / (2 pi), rho >= 0), for levels q in [0, 1) (any shape).

    F and rho are tabulated exactly (by FFT) on M >= max(2^16, 256 (K + 1)) equal steps h;
    each level is located in its step and solved on the cubic Hermite interpolant of F there
    (values F, slopes rho), whose error is at most h^4 max|rho'''| / 384: about 1e-14 of the
    mass for the densities the solver resolves. O(M log M + len(q)) work (the exact sum at
    every level, used before, was O(len(q) K))."""
    c = one_density(c)
    q = np.asarray(q, dtype=float)
    if q.size and (not np.all(np.isfinite(q)) or q.min() < 0 or q.max() >= 1):
        raise fail("q", "levels in [0, 1)", f"levels in [{np.min(q)}, {np.max(q)}]")
    table = cdf_table(c)
    M = len(table.F) - 1
    j = np.clip(np.searchsorted(np.maximum.accumulate(table.F), q, side="right") - 1, 0, M - 1)
    F0, F1 = table.F[j], table.F[j + 1]
    s = np.clip((q - F0) / np.where(F1 > F0, F1 - F0, 1.0), 0.0, 1.0)
    for _ in range(4):  # Newton on the Hermite cubic H(s) = q, s in [0, 1]
        H, dH = hermite(table, j, s)
        s = np.clip(s - (H - q) / np.where(dH > 0, dH, np.inf), 0.0, 1.0)
    return np.mod((j + s) * table.h, 2 * np.pi)
