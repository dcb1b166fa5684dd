"""Selectivity of one query over n iid uniform keys on S^{d-1} (docs/science.md §11.4).

The weight of key j is w_j = e^{-beta delta_j} / sum_k e^{-beta delta_k} with the gap
delta_j = 1 - <q, k_j> in [0, 2] (softmax over the scores beta <q, k_j>, shifted). For uniform
keys delta / 2 ~ Beta(kappa, kappa), kappa = (d - 1) / 2 (the first coordinate of a uniform
point), and a cap of small angle t about q holds the mass c_d t^{d-1} (1 + O(t^2)),
c_d = Gamma(d/2) / ((d - 1) sqrt(pi) Gamma((d - 1)/2)) (`cap_constant`).

* The critical scale: at beta_n = gamma n^{2/(d-1)} (`critical_beta`) the points
  x_j = beta_n delta_j of the nearest keys converge to a Poisson process on (0, inf) whose
  mean number of points below x is b x^kappa, b = c_d (2 / gamma)^kappa (`limit_keys`: the
  mean number of keys with weight above 1/e of an ideal nearest one), and the weights to
  w_j = e^{-x_j} / sum_k e^{-x_k}. `limit_statistics` gives E[max w], E[sum w^2] and
  E[1 / sum w^2] of that law by quadrature; `poisson_gaps` samples its nearest points.
* Below it (beta_n n^{-2/(d-1)} -> 0, e.g. beta = gamma log n) the sum of n e^{-beta delta}
  obeys the law of large numbers: max w ~ 1 / (n E[e^{-beta delta}]) -> 0
  (`mean_kernel`, exact). Above it every weight but the nearest key's vanishes.

Samplers of the gaps: `sample_gaps` (all n, exact), `nearest_gaps` (the k smallest of n,
exact joint law via uniform order statistics). `weight_statistics` turns gaps into the
statistics (a numerically stable softmax: shifted by the smallest gap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.special import betaincinv, gammaln, ive

from attnflow._checks import as_generator, fail, finite_array, positive

__all__ = [
    "LimitStatistics",
    "cap_constant",
    "critical_beta",
    "limit_keys",
    "limit_statistics",
    "mean_kernel",
    "nearest_gaps",
    "poisson_gaps",
    "sample_gaps",
    "weight_statistics",
]

# Quadrature of `limit_statistics`: the nearest point's v = sqrt(b x^kappa) ~ sqrt(Exp(1))
# on [0, V_MAX] (e^{-V_MAX^2} ~ 1e-18 left out), the Laplace variable t = e^tau on
# [TAU_MIN, TAU_MAX] (e^{-t} at e^{TAU_MAX} and t at e^{TAU_MIN} ~ 1e-16 left out), the gap
# above the nearest point z = s^2 on [0, S_MAX] (e^{-S_MAX^2} ~ 1e-28).
V_MAX, TAU_MIN, TAU_MAX, S_MAX = 6.5, -37.0, 4.3, 8.0


def _dimension(d: Any) -> int:
    if isinstance(d, (bool, np.bool_)) or not float(d) == int(d) or int(d) < 2:
        raise fail("d", "an integer dimension >= 2 (keys on S^{d-1})", repr(d))
    return int(d)


def _count(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not float(value) == int(value) or value < low:
        raise fail(name, f"an integer >= {low}", repr(value))
    return int(value)


def cap_constant(d: int) -> float:
    """c_d: a cap of small geodesic radius t on S^{d-1} holds the mass c_d t^{d-1} (1 + O(t^2))
    of the uniform law; c_d = Gamma(d/2) / ((d - 1) sqrt(pi) Gamma((d - 1)/2)) (1/pi on the
    circle, 1/4 on S^2)."""
    d = _dimension(d)
    return float(np.exp(gammaln(d / 2) - gammaln((d - 1) / 2)) / ((d - 1) * np.sqrt(np.pi)))


def critical_beta(n: Any, d: int, gamma: Any) -> np.ndarray:
    """beta_n = gamma n^{2/(d-1)}, the scale at which the weights keep a random limit law
    (n keys, array-like; gamma > 0)."""
    d = _dimension(d)
    n = finite_array("n", n, dtype=float)
    return positive("gamma", gamma) * n ** (2.0 / (d - 1))


def limit_keys(d: int, gamma: float) -> float:
    """b = c_d (2 / gamma)^{(d-1)/2}: the mean number of points x_j < 1 of the limit process
    at beta_n = gamma n^{2/(d-1)} (its mean count below x is b x^{(d-1)/2})."""
    d = _dimension(d)
    return cap_constant(d) * (2.0 / positive("gamma", gamma)) ** ((d - 1) / 2)


def mean_kernel(d: int, beta: Any) -> np.ndarray:
    """E[e^{-beta (1 - <q, k>)}] for k uniform on S^{d-1}, exactly:
    Gamma(d/2) (2/beta)^{d/2 - 1} e^{-beta} I_{d/2-1}(beta) (beta > 0, array-like)."""
    d = _dimension(d)
    beta = finite_array("beta", beta, dtype=float)
    if np.any(beta <= 0):
        raise fail("beta", "inverse temperatures > 0", beta)
    nu = d / 2 - 1
    return np.exp(gammaln(d / 2) + nu * np.log(2.0 / beta)) * ive(nu, beta)


def sample_gaps(n: int, d: int, size: int, rng: Any = None) -> np.ndarray:
    """Gaps delta = 1 - <q, k> of n iid uniform keys on S^{d-1} for `size` independent
    contexts: shape (size, n), delta / 2 ~ Beta((d-1)/2, (d-1)/2), exact."""
    n, d, size = _count("n", n), _dimension(d), _count("size", size)
    kappa = (d - 1) / 2
    return 2.0 * as_generator(rng).beta(kappa, kappa, size=(size, n))


def nearest_gaps(n: int, d: int, k: int, size: int, rng: Any = None) -> np.ndarray:
    """The k smallest gaps of n iid uniform keys on S^{d-1}, ascending, for `size` contexts:
    shape (size, k), exact joint law (the k smallest of n uniforms are Gamma_i / Gamma_{n+1},
    Gamma_i the arrival times of a unit Poisson process, mapped by the Beta quantile)."""
    n, d, size = _count("n", n), _dimension(d), _count("size", size)
    k = _count("k", k)
    if k > n:
        raise fail("k", f"at most n = {n} nearest keys", k)
    rng = as_generator(rng)
    arrivals = np.cumsum(rng.standard_exponential((size, k)), axis=1)
    total = arrivals[:, -1:] + (rng.standard_gamma(n + 1 - k, size=(size, 1)))
    kappa = (d - 1) / 2
    return 2.0 * betaincinv(kappa, kappa, arrivals / total)


def poisson_gaps(d: int, gamma: float, k: int, size: int, rng: Any = None) -> np.ndarray:
    """The k smallest points x_1 < ... < x_k of the limit process at beta_n = gamma
    n^{2/(d-1)} (mean count b x^{(d-1)/2} below x, `limit_keys`), for `size` draws: shape
    (size, k); x_i = (Gamma_i / b)^{2/(d-1)}. Their weights: `weight_statistics(x, 1)`."""
    b, d = limit_keys(d, gamma), _dimension(d)
    k, size = _count("k", k), _count("size", size)
    arrivals = np.cumsum(as_generator(rng).standard_exponential((size, k)), axis=1)
    return (arrivals / b) ** (2.0 / (d - 1))


def weight_statistics(gaps: Any, beta: float) -> dict[str, np.ndarray]:
    """Statistics of the weights w_j = e^{-beta delta_j} / sum_k e^{-beta delta_k} of each row
    of `gaps` (..., n), computed shifted by the row's smallest gap: "max_weight" (max_j w_j),
    "participation" (sum_j w_j^2) and "effective_keys" (1 / sum_j w_j^2), each of shape (...)."""
    gaps = finite_array("gaps", gaps, min_ndim=1, dtype=float)
    beta = positive("beta", beta)
    e = np.exp(-beta * (gaps - gaps.min(axis=-1, keepdims=True)))
    total = e.sum(axis=-1)
    participation = np.einsum("...i,...i->...", e, e) / total**2
    return {"max_weight": 1.0 / total, "participation": participation,
            "effective_keys": 1.0 / participation}


@dataclass(frozen=True)
class LimitStatistics:
    """Moments of the limit law of the weights at beta_n = gamma n^{2/(d-1)}."""

    d: int
    gamma: float
    b: float  # limit_keys(d, gamma)
    max_weight: float  # E[max_j w_j]
    participation: float  # E[sum_j w_j^2]
    effective_keys: float  # E[1 / sum_j w_j^2]


def limit_statistics(d: int, gamma: float, nodes: int = 96) -> LimitStatistics:
    """E[max w], E[sum w^2] and E[1 / sum w^2] of the limit law at beta_n = gamma n^{2/(d-1)}
    (docs/science.md §11.4) by quadrature with `nodes` Gauss-Legendre nodes per outer variable.

    Conditioned on the nearest point x, the others are a Poisson process z = x_j - x > 0 of
    intensity nu(dz) = b kappa (x + z)^{kappa - 1} dz, h = e^{-z}, R = sum h, Q = sum h^2:
    E[max w | x] = int e^{-t} L(t) dt, E[sum w^2 | x] = int t e^{-t} L(t) (1 + int h^2
    e^{-t h} dnu) dt, E[1 / sum w^2 | x] = int e^{-s} M(s) ((1 + m_1)^2 + m_2) ds, with
    L(t) = exp(-int (1 - e^{-t h}) dnu), M(s) = exp(-int (1 - e^{-s h^2}) dnu),
    m_p = int h^p e^{-s h^2} dnu; then averaged over b x^kappa ~ Exp(1)."""
    d = _dimension(d)
    b = limit_keys(d, gamma)
    nodes = _count("nodes", nodes, low=8)
    kappa = (d - 1) / 2
    g, gw = leggauss(nodes)
    v = 0.5 * V_MAX * (g + 1.0)
    vw = 0.5 * V_MAX * gw * 2.0 * v * np.exp(-v**2)  # b x^kappa = v^2 ~ Exp(1)
    x = (v**2 / b) ** (1.0 / kappa)
    tau = TAU_MIN + 0.5 * (TAU_MAX - TAU_MIN) * (g + 1.0)
    t = np.exp(tau)
    tw = 0.5 * (TAU_MAX - TAU_MIN) * gw * t * np.exp(-t)  # int e^{-t} f(t) dt

    s, sw = _gap_nodes()
    h = np.exp(-s * s)  # z = s^2: nu(dz) = b kappa (x + s^2)^{kappa - 1} 2 s ds
    dens = b * kappa * (x[:, None] + s * s) ** (kappa - 1.0) * (2.0 * s * sw)  # (x, s)
    th, th2 = np.outer(t, h), np.outer(t, h * h)  # (t, s)
    rows = np.stack([-np.expm1(-th), h**2 * np.exp(-th), -np.expm1(-th2),
                     h * np.exp(-th2), h * h * np.exp(-th2)])  # (5, t, s)
    psi, a2, phi, m1, m2 = np.einsum("xs,cts->cxt", dens, rows)
    given_x = np.stack([
        np.exp(-psi) @ tw,
        (t * np.exp(-psi) * (1.0 + a2)) @ tw,
        (np.exp(-phi) * ((1.0 + m1) ** 2 + m2)) @ tw])  # (3, x)
    mw, part, eff = given_x @ vw
    return LimitStatistics(d=d, gamma=float(gamma), b=b, max_weight=float(mw),
                           participation=float(part), effective_keys=float(eff))


def _gap_nodes() -> tuple[np.ndarray, np.ndarray]:
    """Composite 16-point Gauss-Legendre nodes and weights on [0, S_MAX]: geometric panels
    below 1 (they resolve the scale sqrt(x) of (x + s^2)^{-1/2} on the circle, x -> 0), unit
    panels above."""
    edges = np.concatenate([[0.0], np.geomspace(1e-8, 1.0, 9), np.arange(2.0, S_MAX + 1.0)])
    g, gw = leggauss(16)
    lo, hi = edges[:-1, None], edges[1:, None]
    return ((lo + hi) / 2 + (hi - lo) / 2 * g).ravel(), ((hi - lo) / 2 * gw).ravel()

