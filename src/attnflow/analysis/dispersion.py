"""The dispersion relation of the uniform state on every sphere S^{d-1} (docs/science.md §9,
"The dispersion relation on S^{d-1}").

Full attention, Q = K = V = I, the attention output times the strength K, noise sigma
(attnflow's dX = F dt + sigma P_X dW: the diffusion (sigma^2 / 2) Lap_S). With alpha =
(d - 2) / 2 and lambda_l = Gamma(d/2) (2 / beta)^alpha I_{l + alpha}(beta) the Funk-Hecke
eigenvalue of e^{beta <x, y>} on degree-l harmonics (the uniform probability measure),
degree l grows at

    softmax:       gamma_l = l (l + d - 2) (K lambda_l / (beta lambda_0) - sigma^2 / 2),
    unnormalised:  gamma_l = l (l + d - 2) (K lambda_l / beta - sigma^2 / 2).

On the circle (d = 2) lambda_l = I_l(beta): k^2 I_k(beta) / (beta I_0(beta)); on S^2
lambda_l = i_l(beta), the modified spherical Bessel function. Evaluated without a division
by beta (I_{nu-1} - I_{nu+1} = 2 nu I_nu / beta): with D_l = (I_{l+alpha-1}(beta) -
I_{l+alpha+1}(beta)) / I_alpha(beta),

    lambda_l / (beta lambda_0) = D_l / (2 (l + alpha)),

finite at beta = 0 (degree 1: (d - 1) / d at K = 1, sigma = 0; the others 0) and, through
lambda_l(-beta) = (-1)^l lambda_l(beta), for beta < 0 (odd degrees grow, even ones decay).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import gammaln, hyp0f1, ive

from attnflow._checks import fail, nonnegative, number

__all__ = ["ATTENTIONS", "dispersion_rate"]

ATTENTIONS = ("softmax", "unnormalised")
_TINY = 1e-280  # e^-|beta| I_alpha(|beta|) below this: the entire-function form instead


def dispersion_rate(l: Any, beta: Any, d: int = 2, sigma: float = 0.0,
                    attention: str = "softmax", strength: float = 1.0) -> np.ndarray:
    """gamma_l, the growth rate (per unit time) of degree-l perturbations of the uniform
    density on S^{d-1} (module docstring; < 0: decay), for full attention with Q = K = V = I,
    interaction strength K = `strength` and noise `sigma`.

    l : integer degrees >= 1 (on the circle the Fourier modes k); beta : finite inverse
    temperatures of either sign; both broadcast, and the result has their broadcast shape.
    d : the ambient dimension, an integer >= 2 (d = 2 the circle, 3 the sphere S^2).
    Unnormalised rates grow like e^|beta| and overflow to inf past |beta| ~ 700."""
    l = np.asarray(l)
    if l.dtype == bool or not (np.issubdtype(l.dtype, np.integer) or (
            np.issubdtype(l.dtype, np.floating) and np.all(l == np.round(l)))) or np.any(l < 1):
        raise fail("l", "integer degrees l >= 1", repr(l))
    beta = np.asarray(beta, dtype=float)
    if not np.all(np.isfinite(beta)):
        raise fail("beta", "finite values", repr(beta))
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2:
        raise fail("d", "an integer dimension d >= 2 (tokens on S^{d-1})", repr(d))
    sigma = nonnegative("sigma", sigma)
    strength = number("strength", strength, expected="a finite strength K")
    if attention not in ATTENTIONS:
        raise fail("attention", f"one of {ATTENTIONS}", repr(attention))
    lf, alpha = l.astype(float), (d - 2) / 2
    coefficient = lf * (lf + 2 * alpha) / (2 * (lf + alpha))
    a = np.abs(beta)
    sign = np.where((beta < 0) & (lf % 2 == 0), -1.0, 1.0)  # (-1)^(l - 1) for beta < 0
    # e^-|beta| (I_{l+alpha-1} - I_{l+alpha+1}) and e^-|beta| I_alpha at |beta|
    difference = ive(lf + alpha - 1, a) - ive(lf + alpha + 1, a)
    base = ive(alpha, a)
    tiny = base < _TINY  # only for alpha > 0 and |beta| near 0 (base(0) = 0)
    if attention == "softmax":
        rate = coefficient * (sign * difference) / np.where(tiny, 1.0, base)
    else:
        # lambda_0 / (e^-|beta| I_alpha) = Gamma(alpha + 1) (2 / |beta|)^alpha e^|beta|
        log_scale = gammaln(alpha + 1) + a
        if alpha > 0:
            log_scale = log_scale + alpha * np.log(2 / np.where(tiny, 1.0, a))
        rate = coefficient * (sign * difference) * np.exp(log_scale)
    if np.any(tiny):
        rate = np.where(tiny, coefficient * _small_ratio(lf, beta, alpha) * (
            1.0 if attention == "softmax" else hyp0f1(alpha + 1, beta * beta / 4)), rate)
    return strength * rate - sigma * sigma * lf * (lf + 2 * alpha) / 2


def _small_ratio(l: np.ndarray, beta: np.ndarray, alpha: float) -> np.ndarray:
    """D_l (module docstring) from I_nu(x) = (x / 2)^nu 0F1(; nu + 1; x^2 / 4) / Gamma(nu + 1),
    exact at beta = 0 and for tiny |beta| where the scaled Bessel functions underflow."""
    q = beta * beta / 4
    half = beta / 2
    upper = (half ** (l - 1) * np.exp(gammaln(alpha + 1) - gammaln(l + alpha))
             * hyp0f1(l + alpha, q))
    lower = (half ** (l + 1) * np.exp(gammaln(alpha + 1) - gammaln(l + alpha + 2))
             * hyp0f1(l + alpha + 2, q))
    return (upper - lower) / hyp0f1(alpha + 1, q)
