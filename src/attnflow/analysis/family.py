"""Closed forms for the model family of the follow-up literature (docs/science.md §6).

* Equiangular reduction (full attention, Q = K = V = I): tokens whose pairwise inner products
  all equal rho keep them equal, and with self-weight w_s and cross-weight w_o of the
  attention matrix,

      drho/dt = 2 w_o (1 - rho) (1 + (n - 1) rho) / s,

  softmax: w_o = e^{beta rho} / (e^beta + (n - 1) e^{beta rho}); unnormalised: w_o =
  e^{beta rho} / n. The speed factor s of the normalisation scheme is 1 (post-LN), r (pre-LN,
  dr/dt = <theta, A>), r |A| (peri-LN, dr/dt = <theta, A> / |A|) or |A| / alpha (nGPT), where
  <theta_i, A_i> = w_s + (n - 1) rho w_o and
  |A_i|^2 = w_s^2 + 2 (n - 1) rho w_s w_o + (n - 1)(1 + (n - 2) rho) w_o^2.
  (Derivation: A_i = w_s theta_i + w_o sum_{j != i} theta_j; d<theta_i, theta_k>/dt =
  2 <dtheta_i/dt, theta_k> by symmetry.) `equiangular_start` builds exact starts.
* Noisy Kuramoto (beta = 0, circle, full attention, noise sqrt(2/kappa)): the order parameter
  settles at the positive root of R = I_1(kappa R) / I_0(kappa R) for kappa > 2, at 0 below.
  For any beta (derived here by linearising the mean-field equation about the uniform
  density): Fourier mode k grows at the rate k^2 (I_k(beta) / (beta I_0(beta)) - 1/kappa), so
  the uniform state is stable for kappa < kappa_c(beta) = beta I_0(beta) / I_1(beta) (2 at
  beta = 0), and there n tokens fluctuate with n E[R^2] = 1 / (1 - kappa / kappa_c(beta)).
  kappa_c is even in beta: I_k(-b) = (-1)^k I_k(b), so for beta < 0 (repulsive) the odd modes
  have the rates of |beta| and mode 1 is still the first to lose stability.
* Long context (one layer, full attention, V = I, beta = gamma log n, equiangular inputs of
  correlation rho): self-weight n^{gamma(1-rho)} / (n^{gamma(1-rho)} + n - 1) and the exact
  correlation of two outputs at finite n; as n -> infinity it tends to 1, 4 rho / (1 + 3 rho)
  and rho below, at and above gamma = 1 / (1 - rho).
* Mean field on the circle: Fourier mode k of a near-uniform density grows at a rate
  proportional to k^2 I_k(beta); the first clusters number about k* = argmax_k k^2 I_k(beta).
  The rate itself (docs/science.md §9, Q = K = V = I, full attention, noise sigma):
  lambda_k = k^2 I_k(beta) / (beta I_0(beta)) - sigma^2 k^2 / 2 (softmax) and
  k^2 I_k(beta) / beta - sigma^2 k^2 / 2 (unnormalised): `dispersion_rate` (analysis/
  dispersion.py, every sphere S^{d-1}) at d = 2, for beta of either sign: at beta < 0,
  k^2 I_k(beta) / beta = (-1)^(k+1) k^2 I_k(|beta|) / |beta|, so the odd modes grow (mode 1
  at about 1/2 for small |beta|: V = I still attracts) and the even modes decay.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import i0e, i1e, ive

from attnflow._checks import as_generator, fail, inverse_temperature, number

__all__ = [
    "NORMS",
    "equiangular_rhs",
    "equiangular_start",
    "k_star",
    "kuramoto_order",
    "noise_threshold",
    "output_correlation",
    "output_correlation_limit",
    "self_weight",
    "uniform_fluctuation",
]

NORMS = ("post", "pre", "peri", "ngpt")
ATTENTIONS = ("softmax", "unnormalised")


def _weights(rho: np.ndarray, beta: float, n: int, attention: str) -> tuple[np.ndarray, ...]:
    """Self- and cross-weights (w_s, w_o) of equiangular tokens."""
    if attention == "softmax":
        # e^{beta rho} / (e^beta + (n - 1) e^{beta rho}), divided through by e^{beta rho}
        # (an overflowing e^{beta (1 - rho)} gives the right limit w_o = 0).
        with np.errstate(over="ignore"):
            w_o = 1.0 / (np.exp(beta * (1.0 - rho)) + (n - 1))
        return 1.0 - (n - 1) * w_o, w_o
    if attention == "unnormalised":
        return np.full_like(rho, np.exp(beta) / n), np.exp(beta * rho) / n
    raise fail("attention", f"one of {ATTENTIONS}", repr(attention))


def equiangular_rhs(rho: Any, beta: float, n: int, attention: str = "softmax",
                    norm: str = "post", r: Any = 1.0, alpha: float = 0.2
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The right-hand sides (drho/dt, dr/dt) of the equiangular reduction (module docstring).

    rho : common inner product of the directions, in [-1/(n-1), 1] (vectorised).
    beta : inverse temperature, either sign; n : number of tokens >= 2.
    attention : "softmax" or "unnormalised"; norm : "post", "pre", "peri" or "ngpt".
    r : common radius (pre- and peri-LN; ignored by the sphere schemes); alpha : nGPT's step.
    Returns (drho/dt, dr/dt), each broadcast over rho and r; dr/dt is 0 for post-LN and nGPT.
    With post-LN softmax: drho/dt = 2 e^{beta rho} (1 - rho)((n - 1) rho + 1) /
    (e^beta + (n - 1) e^{beta rho}); unnormalised: (2/n) e^{beta rho} (1 - rho)((n - 1) rho + 1).
    """
    beta = inverse_temperature("beta", beta)
    n = _count("n", n, 2)
    if norm not in NORMS:
        raise fail("norm", f"one of {NORMS}", repr(norm))
    rho, r = np.broadcast_arrays(np.asarray(rho, dtype=float), np.asarray(r, dtype=float))
    w_s, w_o = _weights(rho, beta, n, attention)
    drho = 2.0 * w_o * (1.0 - rho) * (1.0 + (n - 1) * rho)
    zero = np.zeros_like(drho)
    if norm == "post":
        return drho, zero
    radial = w_s + (n - 1) * rho * w_o  # <theta_i, A_i>
    length = np.sqrt(w_s**2 + 2 * (n - 1) * rho * w_s * w_o
                     + (n - 1) * (1 + (n - 2) * rho) * w_o**2)  # |A_i|
    if norm == "pre":
        return drho / r, radial
    if norm == "peri":
        return drho / (r * length), radial / length
    return number("alpha", alpha, 0.0, low_open=True) * drho / length, zero


def equiangular_start(n: int, d: int, rho: float, seed: Any = None) -> np.ndarray:
    """n unit vectors in R^d with every pairwise inner product equal to rho, exactly up to
    rounding: shape (n, d).

    The Gram matrix (1 - rho) I + rho 1 1^T has eigenvalue 1 + (n - 1) rho on the all-ones
    vector and 1 - rho on its orthogonal complement, so rho must lie in [-1/(n - 1), 1).
    Coordinates: column 0 is sqrt((1 + (n - 1) rho) / n) 1 (the common direction u), columns
    1..n-1 are sqrt(1 - rho) times the Helmert basis of 1^perp (a scaled regular simplex).
    That needs n <= d dimensions, or n <= d + 1 for the regular simplex rho = -1/(n - 1)
    (where column 0 vanishes); for rho >= 0 and n <= d - 1 it is sqrt(rho) u + sqrt(1 - rho)
    e_i in another orthonormal basis. seed : None for these coordinates, else an int or
    Generator for a uniformly random rotation of them.
    """
    n = _count("n", n, 2)
    d = _count("d", d, 2)
    rho = number("rho", rho, -1.0 / (n - 1), 1.0, expected=f"a number in [-1/(n-1), 1) = "
                 f"[{-1.0 / (n - 1):.6g}, 1) for n = {n}")
    if rho == 1.0:
        raise fail("rho", "a number < 1 (rho = 1 is a single point)", repr(rho))
    simplex = bool(np.isclose(1.0 + (n - 1) * rho, 0.0, rtol=0.0, atol=1e-15))
    if n > d + simplex:
        raise fail("n", f"n <= d (n <= d + 1 for the regular simplex rho = -1/(n-1)); d = {d}",
                   repr(n))
    helmert = np.zeros((n, n - 1))
    for k in range(1, n):
        helmert[:k, k - 1] = 1.0
        helmert[k, k - 1] = -float(k)
        helmert[:, k - 1] /= np.sqrt(k * (k + 1.0))
    common = np.full((n, 1), np.sqrt(max(1.0 + (n - 1) * rho, 0.0) / n))
    X = np.hstack([helmert * np.sqrt(1.0 - rho)] if simplex else
                  [common, helmert * np.sqrt(1.0 - rho)])
    X = np.hstack([X, np.zeros((n, d - X.shape[1]))])
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # rows are unit up to rounding already
    if seed is None:
        return X
    G = as_generator(seed).standard_normal((d, d))
    R, upper = np.linalg.qr(G)
    return X @ (R * np.sign(np.diag(upper))).T


def kuramoto_order(kappa: Any) -> np.ndarray:
    """The order parameter of the noisy Kuramoto model (beta = 0, circle, full attention,
    noise sqrt(2/kappa)): the positive root R of R = I_1(kappa R) / I_0(kappa R) for
    kappa > 2, and 0 for kappa <= 2 (the uniform state, the only root there).
    Vectorised over kappa >= 0; float64, root to about 1e-15."""
    kappa = np.asarray(kappa, dtype=float)
    if not np.all(np.isfinite(kappa) & (kappa >= 0)):
        raise fail("kappa", "finite values >= 0", repr(kappa))
    out = np.zeros(kappa.shape)
    for idx, k in np.ndenumerate(kappa):
        if k > 2.0:
            def f(R: float, k: float = float(k)) -> float:
                return i1e(k * R) / i0e(k * R) - R
            # f(R) = (k/2 - 1) R - k^3 R^3 / 16 + O(R^5) near 0, root ~ sqrt(8 (k - 2) / k^3),
            # and f(1) < 0: one sign change on [lo, 1].
            lo = 1e-6 * min(1.0, k - 2.0)
            out[idx] = brentq(f, lo, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps)
    return out


def noise_threshold(beta: Any) -> np.ndarray:
    """kappa_c(beta) = beta I_0(beta) / I_1(beta): the uniform density on the circle (full
    attention, noise sqrt(2/kappa)) is stable for kappa < kappa_c and unstable to Fourier mode 1
    above; 2 at beta = 0 (the Kuramoto threshold). Even in beta (module docstring): beta < 0
    gives kappa_c(|beta|). Vectorised over finite beta of either sign."""
    beta = np.asarray(beta, dtype=float)
    if not np.all(np.isfinite(beta)):
        raise fail("beta", "finite values", repr(beta))
    beta = np.abs(beta)
    safe = np.where(beta > 0, beta, 1.0)
    return np.where(beta > 0, safe * i0e(safe) / i1e(safe), 2.0)


def uniform_fluctuation(kappa: Any, beta: Any = 0.0) -> np.ndarray:
    """n E[R^2] of n tokens in the stable uniform state (kappa < kappa_c(beta)):
    1 / (1 - kappa / kappa_c(beta)) (linear fluctuation theory: mode 1 decays at
    (1/kappa)(1 - kappa / kappa_c) while driven by the noise of independent tokens, for which
    n E[R^2] = 1); inf for kappa >= kappa_c. Vectorised."""
    ratio = np.asarray(kappa, dtype=float) / noise_threshold(beta)
    with np.errstate(divide="ignore"):
        return np.where(ratio < 1.0, 1.0 / (1.0 - np.minimum(ratio, 1.0)), np.inf)


def self_weight(n: Any, gamma: Any, rho: Any) -> np.ndarray:
    """Softmax self-weight of a token among n equiangular tokens (correlation rho) at
    beta = gamma log n: n^{gamma(1-rho)} / (n^{gamma(1-rho)} + n - 1), computed as
    1 / (1 + (n - 1) n^{-gamma(1-rho)}). Vectorised (broadcast)."""
    n, gamma, rho = (np.asarray(a, dtype=float) for a in (n, gamma, rho))
    return 1.0 / (1.0 + (n - 1.0) * np.exp(-gamma * (1.0 - rho) * np.log(n)))


def output_correlation(n: Any, gamma: Any, rho: Any) -> np.ndarray:
    """Exact correlation <y_i, y_k> / (|y_i| |y_k|) of two outputs of one full-attention layer
    (V = I, beta = gamma log n) on n equiangular inputs of correlation rho, at finite n.

    With y_i = w_s theta_i + w_o sum_{j != i} theta_j, w_s = `self_weight`,
    w_o = (1 - w_s)/(n - 1):
      <y_i, y_k> = w_s^2 rho + 2 w_s w_o (1 + (n - 2) rho)
                   + w_o^2 ((n - 2) + ((n - 1)^2 - (n - 2)) rho),
      |y_i|^2    = w_s^2 + 2 (n - 1) rho w_s w_o + (n - 1)(1 + (n - 2) rho) w_o^2.
    Vectorised (broadcast); n >= 2."""
    n, gamma, rho = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (n, gamma, rho)))
    w_s = self_weight(n, gamma, rho)
    w_o = (1.0 - w_s) / (n - 1.0)
    cross = (w_s**2 * rho + 2 * w_s * w_o * (1 + (n - 2) * rho)
             + w_o**2 * ((n - 2) + ((n - 1) ** 2 - (n - 2)) * rho))
    norm2 = w_s**2 + 2 * (n - 1) * rho * w_s * w_o + (n - 1) * (1 + (n - 2) * rho) * w_o**2
    return cross / norm2


def output_correlation_limit(gamma: Any, rho: Any) -> np.ndarray:
    """The n -> infinity limit of `output_correlation`: 1 for gamma < 1/(1 - rho) (collapse),
    4 rho / (1 + 3 rho) at gamma = 1/(1 - rho), rho above (identity). Vectorised."""
    gamma, rho = np.broadcast_arrays(np.asarray(gamma, dtype=float),
                                     np.asarray(rho, dtype=float))
    x = gamma * (1.0 - rho)  # the critical gamma is where x = 1
    return np.where(np.isclose(x, 1.0, rtol=1e-12, atol=0.0), 4 * rho / (1 + 3 * rho),
                    np.where(x < 1.0, 1.0, rho))


def k_star(beta: float) -> int:
    """k* = argmax_{k >= 1} k^2 I_k(beta) / beta: the fastest-growing Fourier mode of a
    near-uniform density on the circle (`dispersion_rate`), the number of clusters it
    predicts (about sqrt(2 beta)); beta != 0 of either sign (beta < 0: the fastest odd mode,
    about sqrt(2 |beta|), since the even modes decay)."""
    beta = inverse_temperature("beta", beta)
    if beta == 0:
        raise fail("beta", "a nonzero number (at beta = 0 only mode 1 grows)", repr(beta))
    k = np.arange(1, int(4 * np.sqrt(abs(beta))) + 10)
    return int(k[np.argmax(k**2 * ive(k, beta) / beta)])


def _count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise fail(name, f"an integer >= {low}", repr(value))
    return int(value)


