"""Noisy unnormalised attention on S^{d-1}: the uniform state's instability, the tricritical
point and the stationary branch (docs/science.md §11.2; Mun and Rosenzweig, arXiv 2604.16288
and 2606.05140; Balasubramanian, Banerjee and Rigollet, arXiv 2510.20094).

attnflow's model, in its own units: full attention, unnormalised weights e^{beta <x, y>} / n,
Q = K = V = I, interaction strength K (`attnflow.family.Strength`), noise sigma, so that the
density rho of the tokens (a probability density for the uniform measure of S^{d-1}) obeys

    d_t rho = -div(rho K grad Phi) + (sigma^2 / 2) Lap rho,
    Phi(x) = int e^{beta <x, y>} rho(dy) / beta   (grad Phi: attnflow's unnormalised field),

the gradient flow of F(rho) = (sigma^2 / 2) int rho log rho - (K / 2) int Phi rho. Stationary
states are rho = e^{2 kappa Phi} / Z: they depend on kappa = K / sigma^2 only, which is the
papers' coupling K (their noise is attnflow's sigma = 1).

* Funk-Hecke: int e^{beta <x, y>} Y_l(y) dy = lambda_l Y_l(x) for spherical harmonics Y_l of
  degree l, lambda_l = Gamma(d/2) (2 / beta)^{d/2 - 1} I_{l + d/2 - 1}(beta) (`funk_hecke`;
  I_l(beta) on the circle).
* Mode l of the uniform state grows at l (l + d - 2) (K lambda_l / beta - sigma^2 / 2)
  (`attnflow.analysis.closedforms.dispersion_rate(l, beta, d, sigma, "unnormalised", K)`); lambda_l
  decreases in l, so l = 1 goes first, at
  K_# = sigma^2 beta / (2 lambda_1) = sigma^2 beta^{d/2} / (2^{d/2} Gamma(d/2) I_{d/2}(beta))
  (`instability_strength`; sigma^2 d / 2 as beta -> 0, the Kuramoto threshold).
* Landau expansion of the self-consistency at K_#: r^2 = (1 - K_# / K) / (g d^2) + ..., with
  g = (1 - d m) / (d (d + 2) (1 - m)), m = I_{d/2+1}(beta) / I_{d/2}(beta)
  (`landau_coefficient`): g > 0 (a continuous transition) iff m < 1/d, i.e. beta < beta_*,
  the root of I_{d/2+1} / I_{d/2} = 1/d (`tricritical_beta`).
* The axially symmetric stationary states, rho(x) = f(<x, e>), by their order parameter
  r = |int x rho| (`stationary_branch`, in Gegenbauer coefficients and Gauss-Jacobi
  quadrature): the strength K(r) and the free energy against the uniform state; above
  beta_* K(r) falls below K_# before it rises: its minimum is the saddle-node (spinodal)
  K_sn, where a state swept down from the clustered branch falls back to uniform, and the
  free energies cross at the first-order strength K_c, K_sn < K_c < K_# (`transition_strengths`).
  `stationary_order` is r of the clustered branch at a strength.
* n particles from iid uniform tokens: n E[R^2](t) = S + (1 - S) e^{-2 a t} to linear order,
  a = (d - 1)(sigma^2 / 2)(1 - K / K_#), S = 1 / (1 - K / K_#) (`linear_fluctuation`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import eval_chebyt, eval_gegenbauer, gammaln, ive, roots_jacobi
from threadpoolctl import threadpool_limits

from attnflow._checks import fail, number

__all__ = ["StationaryBranch", "TransitionStrengths", "funk_hecke", "instability_strength",
           "landau_coefficient", "linear_fluctuation", "stationary_branch",
           "stationary_order", "transition_strengths", "tricritical_beta"]

DEGREE = 64  # Gegenbauer degrees of the stationary densities: e^{c t} to 1e-15 for c <~ 60,
# beyond the concentrations of r <= 0.98 (about 1 / (2 (1 - r)) on the circle, 1 / (1 - r) on S^2)
NODES = 160  # Gauss-Jacobi nodes (exact for products of degree < 2 NODES)


def _one_blas_thread(f):
    """Run f with single-threaded BLAS: its products are (64, 160) and a thread pool only
    costs (10x slower on a loaded 2-core machine)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with threadpool_limits(limits=1, user_api="blas"):
            return f(*args, **kwargs)

    return wrapper


def _dimension(d: Any) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2:
        raise fail("d", "an integer dimension d >= 2 (tokens on S^{d-1})", repr(d))
    return int(d)


def _beta(beta: Any) -> float:
    return number("beta", beta, 0.0, low_open=True, expected="a finite beta > 0")


def funk_hecke(beta: float, d: int, l: Any) -> np.ndarray:
    """lambda_l = Gamma(d/2) (2 / beta)^{d/2 - 1} I_{l + d/2 - 1}(beta): the eigenvalue of
    f -> int e^{beta <x, y>} f(y) dy (the uniform probability measure of S^{d-1}) on spherical
    harmonics of degree l >= 0. Vectorised over l."""
    beta, d = _beta(beta), _dimension(d)
    l = np.asarray(l, dtype=float)
    if np.any(l < 0) or np.any(l != np.round(l)):
        raise fail("l", "degrees l = 0, 1, 2, ...", repr(l))
    log_pref = gammaln(d / 2) + (d / 2 - 1) * math.log(2 / beta) + beta
    return np.exp(log_pref) * ive(l + d / 2 - 1, beta)


def instability_strength(beta: float, d: int, sigma: float = 1.0) -> float:
    """K_# = sigma^2 beta / (2 lambda_1) = sigma^2 beta^{d/2} / (2^{d/2} Gamma(d/2)
    I_{d/2}(beta)): the strength above which the uniform state is unstable (mode l = 1), for
    noise sigma > 0 (module docstring). The papers' K_#(beta) is sigma = 1."""
    sigma = number("sigma", sigma, 0.0, low_open=True, expected="a noise sigma > 0")
    return float(sigma**2 * _beta(beta) / (2 * funk_hecke(beta, d, 1)))


def linear_fluctuation(ratio: Any, t: Any, d: int, sigma: float = 1.0) -> np.ndarray:
    """n E[R^2](t), R = |mean of the tokens|, of n particles started iid uniform, to linear
    order about the uniform state at K / K_# = ratio (use K (1 - 1/n): a token's own term has
    no tangential part): the first moment decays at a = (d - 1)(sigma^2 / 2)(1 - ratio) (grows
    for ratio > 1) and the noise feeds n E[R^2] at (d - 1) sigma^2, so n E[R^2] = 1 +
    (d - 1) sigma^2 t phi(2 a t) - (1 - e^{-2 a t}), phi(x) = (1 - e^{-x}) / x: S + (1 - S)
    e^{-2 a t} with S = 1 / (1 - ratio), and 1 + (d - 1) sigma^2 t at the threshold.
    Vectorised (broadcast) over ratio and t >= 0."""
    d = _dimension(d)
    sigma = number("sigma", sigma, 0.0, expected="a noise sigma >= 0")
    ratio, t = np.broadcast_arrays(np.asarray(ratio, dtype=float), np.asarray(t, dtype=float))
    x = (d - 1) * sigma**2 * (1 - ratio) * t  # 2 a t
    small = np.abs(x) < 1e-8
    safe = np.where(small, 1.0, x)
    phi = np.where(small, 1 - x / 2, -np.expm1(-safe) / safe)
    return 1 + (d - 1) * sigma**2 * t * phi + np.expm1(-x)


def landau_coefficient(beta: float, d: int) -> float:
    """g = (1 - d m) / (d (d + 2) (1 - m)), m = I_{d/2+1}(beta) / I_{d/2}(beta): near K_# the
    stationary order parameter is r^2 = (1 - K_# / K) / (g d^2) + O(r^4) (module docstring).
    g > 0: continuous (supercritical) transition; g < 0: first order."""
    beta, d = _beta(beta), _dimension(d)
    m = float(ive(d / 2 + 1, beta) / ive(d / 2, beta))
    return (1 - d * m) / (d * (d + 2) * (1 - m))


def tricritical_beta(d: int) -> float:
    """beta_*: the root of I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d (the ratio rises from 0 to 1
    in beta), where `landau_coefficient` changes sign."""
    d = _dimension(d)
    return float(brentq(lambda b: ive(d / 2 + 1, b) / ive(d / 2, b) - 1 / d, 1e-6, 100.0,
                        xtol=1e-14, rtol=1e-15))


@dataclass(frozen=True)
class StationaryBranch:
    """Axially symmetric stationary states by their order parameter.

    r : (M,) order parameters |int x rho| in (0, 1).
    strength : (M,) the strength K at which each state is stationary (noise sigma).
    free_energy : (M,) F(rho) - F(uniform) (F of the module docstring, per unit mass).
    coefficients : (M, L + 1) the Gegenbauer coefficients a_l of rho = sum a_l P_l(<x, e>),
        P_l(1) = 1 (a_0 = 1).
    """

    r: np.ndarray
    strength: np.ndarray
    free_energy: np.ndarray
    coefficients: np.ndarray


class _Basis:
    """Normalised Gegenbauer polynomials P_l (P_l(1) = 1) of S^{d-1} at Gauss-Jacobi nodes of
    the weight (1 - t^2)^{(d-3)/2}, the law of <x, e> for x uniform."""

    def __init__(self, d: int, degree: int, nodes: int) -> None:
        a = (d - 3) / 2
        t, w = roots_jacobi(nodes, a, a)
        self.t, self.w = t, w / w.sum()
        ls = np.arange(degree + 1)
        if d == 2:
            P = np.stack([eval_chebyt(l, t) for l in ls])
        else:
            P = np.stack([eval_gegenbauer(l, d / 2 - 1, t) / eval_gegenbauer(l, d / 2 - 1, 1.0)
                          for l in ls])
        self.P = P  # (L + 1, N)
        self.norms = P**2 @ self.w  # <P_l^2>

    def project(self, f: np.ndarray) -> np.ndarray:
        """Coefficients a_l = <f P_l> / <P_l^2> of values f at the nodes."""
        return (self.P @ (self.w * f)) / self.norms


def _density(kappa: float, a: np.ndarray, lam_b: np.ndarray, basis: _Basis
             ) -> tuple[np.ndarray, np.ndarray]:
    """rho = e^{2 kappa Phi} / Z at the nodes from coefficients a (L + 1,), and log rho;
    2 kappa Phi = kappa sum_l (2 lambda_l / beta) a_l P_l (lam_b = 2 lambda_l / beta)."""
    U = kappa * ((lam_b[1:] * a[1:]) @ basis.P[1:])
    U -= U.max()
    log_z = math.log(float(basis.w @ np.exp(U)))
    log_rho = U - log_z
    return np.exp(log_rho), log_rho


class _Continuation:
    """The self-consistency at fixed r (unknowns: log kappa and a_2..a_L), solved by Powell's
    hybrid method from a guess (the previous state of a continuation)."""

    def __init__(self, beta: float, d: int, sigma: float, degree: int, nodes: int) -> None:
        self.beta, self.d, self.sigma, self.degree = beta, d, sigma, degree
        self.basis = _Basis(d, degree, nodes)
        self.lam_b = 2 * funk_hecke(beta, d, np.arange(degree + 1)) / beta
        g = landau_coefficient(beta, d)
        self.guess = lambda r: np.concatenate(  # the Landau expansion's kappa at small r
            [[math.log(1 / self.lam_b[1] / max(1 - g * d * d * r * r, 0.05))],
             np.zeros(degree - 1)])

    def solve(self, r: float, x: np.ndarray) -> tuple[np.ndarray, float, float, np.ndarray]:
        """(unknowns, K, F - F_uniform, coefficients) of the stationary state at r: Newton's
        method with the exact Jacobian, halving steps that do not reduce the residual."""
        basis, lam_b, a1 = self.basis, self.lam_b, self.d * r
        P = basis.P

        def parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            coef = np.concatenate([[1.0, a1], x[1:]])
            rho, _ = _density(math.exp(x[0]), coef, lam_b, basis)
            return coef, rho, (basis.project(rho) - coef)[1:]

        coef, rho, res = parts(x)
        for _ in range(60):
            if np.abs(res).max() <= 1e-13:
                break
            # dU/d(log kappa) = U, dU/da_l = kappa lam_b_l P_l (l >= 2); d rho = rho (dU - <rho dU>)
            kappa = math.exp(x[0])
            dU = np.vstack([kappa * ((lam_b[1:] * coef[1:]) @ P[1:]),
                            kappa * lam_b[2:, None] * P[2:]])  # (L, N)
            drho = rho * (dU - (dU @ (basis.w * rho))[:, None])
            J = ((drho * basis.w) @ P[1:].T / basis.norms[1:]).T  # (L, L): d proj_l / d x_m
            J[1:, 1:] -= np.eye(len(x) - 1)
            step = np.linalg.solve(J, -res)
            for _ in range(30):
                trial = parts(x + step)
                if np.abs(trial[2]).max() < np.abs(res).max():
                    break
                step = step / 2
            x = x + step
            coef, rho, res = trial
        if not np.abs(res).max() <= 1e-10:
            raise fail("r", f"order parameters whose stationary state {self.degree} degrees "
                       f"resolve (beta {self.beta:g}, d {self.d})",
                       f"no solution at r = {r:g} (residual {np.abs(res).max():.2g})")
        kappa = math.exp(x[0])
        rho, log_rho = _density(kappa, coef, lam_b, basis)
        interaction = float(np.sum(lam_b[1:] * coef[1:] ** 2 * basis.norms[1:])) / 2
        free = float(basis.w @ (rho * log_rho)) / 2 - kappa * interaction / 2
        return x, self.sigma**2 * kappa, self.sigma**2 * free, coef


@_one_blas_thread
def stationary_branch(beta: float, d: int, r: Any, sigma: float = 1.0, degree: int = DEGREE,
                      nodes: int = NODES) -> StationaryBranch:
    """The stationary states rho = e^{2 K Phi / sigma^2} / Z (module docstring) with order
    parameters r (increasing, in (0, 1)), continued from the uniform state along r: for each
    r the strength K and the other coefficients solve the self-consistency a_l = <rho P_l> /
    <P_l^2>, l = 1..degree, with a_1 = d r. Raises ValueError where a solve fails (an r
    too close to 1 for `degree`)."""
    return _branch(_continuation(beta, d, sigma, degree, nodes), r)[0]


def _continuation(beta: Any, d: Any, sigma: Any, degree: int, nodes: int) -> _Continuation:
    return _Continuation(_beta(beta), _dimension(d),
                         number("sigma", sigma, 0.0, low_open=True,
                                expected="a noise sigma > 0"), degree, nodes)


def _branch(c: _Continuation, r: Any) -> tuple[StationaryBranch, list[np.ndarray]]:
    r = np.asarray(r, dtype=float)
    if r.ndim != 1 or r.size == 0 or np.any(np.diff(r) <= 0) or r[0] <= 0 or r[-1] >= 1:
        raise fail("r", "increasing order parameters in (0, 1)", repr(r))
    x = c.guess(r[0])
    out: list[tuple[float, float, np.ndarray]] = []
    xs = []
    for ri in r:
        x, K, F, coef = c.solve(float(ri), x)
        out.append((K, F, coef))
        xs.append(x)
    return StationaryBranch(r.copy(), np.array([o[0] for o in out]), np.array([o[1] for o in out]),
                  np.array([o[2] for o in out])), xs


@dataclass(frozen=True)
class TransitionStrengths:
    """The strengths of the transition at (beta, d, sigma).

    instability : K_#, where the uniform state loses stability.
    spinodal : K_sn, the smallest strength with a clustered stationary state (the lower
        switching strength of a slow sweep down); K_# when the transition is continuous.
    critical : K_c, where the clustered state's free energy equals the uniform state's (the
        papers' critical coupling); K_# when continuous.
    continuous : beta <= beta_* (no clustered state below K_#).
    """

    instability: float
    spinodal: float
    critical: float
    continuous: bool


_R_GRID = np.linspace(0.02, 0.98, 49)  # (r = 0.98: e^{c t} with c about 50 on the circle)


@_one_blas_thread
def transition_strengths(beta: float, d: int, sigma: float = 1.0, degree: int = DEGREE
                         ) -> TransitionStrengths:
    """K_#, K_sn and K_c (`TransitionStrengths`) from `stationary_branch` on r in [0.02,
    0.98]: K_sn its minimum strength (refined by golden-section search), K_c the free
    energy's zero on the rising part (refined by Brent's method)."""
    K_sharp = instability_strength(beta, d, sigma)
    if landau_coefficient(beta, d) >= 0:
        return TransitionStrengths(K_sharp, K_sharp, K_sharp, True)
    c = _continuation(beta, d, sigma, degree, NODES)
    b, xs = _branch(c, _R_GRID)
    i = int(np.argmin(b.strength))
    lo, hi = _R_GRID[max(i - 1, 0)], _R_GRID[min(i + 1, len(_R_GRID) - 1)]
    start = xs[max(i - 1, 0)]
    K_sn = min(float(b.strength[i]), _golden_min(lambda r: c.solve(r, start)[1], lo, hi))
    rising = (np.arange(len(_R_GRID)) >= i) & (b.free_energy < 0)
    if not np.any(rising) or np.flatnonzero(rising)[0] == 0:
        raise fail("beta", "a first-order transition whose free energies cross below r = 0.988",
                   f"beta {beta:g}, d {d}")
    j = int(np.flatnonzero(rising)[0])
    r_c = brentq(lambda r: c.solve(r, xs[j - 1])[2], _R_GRID[j - 1], _R_GRID[j], xtol=1e-12)
    return TransitionStrengths(K_sharp, K_sn, c.solve(r_c, xs[j - 1])[1], False)


def _golden_min(f, lo: float, hi: float, tol: float = 1e-7) -> float:
    """The minimum value of a unimodal f on [lo, hi] (golden-section search)."""
    phi = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, e = b - phi * (b - a), a + phi * (b - a)
    fc, fe = f(c), f(e)
    while b - a > tol:
        if fc < fe:
            b, e, fe = e, c, fc
            c = b - phi * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, e, fe
            e = a + phi * (b - a)
            fe = f(e)
    return min(fc, fe)


@_one_blas_thread
def stationary_order(strength: Any, beta: float, d: int, sigma: float = 1.0,
                     degree: int = DEGREE) -> np.ndarray:
    """r of the clustered (stable) stationary state at strengths K (vectorised): the root r
    in (0, 0.98] of K(r) = K on the rising part of `stationary_branch` (one branch for all
    K); 0 where there is none (below K_# for a continuous transition, below K_sn for a
    first-order one)."""
    K = np.asarray(strength, dtype=float)
    if not np.all(np.isfinite(K) & (K > 0)):
        raise fail("strength", "finite strengths K > 0", repr(strength))
    c = _continuation(beta, d, sigma, degree, NODES)
    b, xs = _branch(c, _R_GRID)
    i = int(np.argmin(b.strength))
    if np.any(K > b.strength[-1]):
        raise fail("strength", f"strengths whose clustered state has r <= 0.98 (K <= "
                   f"{b.strength[-1]:.6g})", repr(strength))
    K_sharp = instability_strength(beta, d, sigma)
    out = np.zeros(K.shape)
    for idx, k in np.ndenumerate(K):
        if k < b.strength[i] or (i == 0 and k <= K_sharp):
            continue
        j = int(np.flatnonzero((np.arange(len(_R_GRID)) >= i) & (b.strength >= k))[0])
        if j == 0:  # continuous: the branch leaves r = 0 at K_#
            lo = 1e-4
            x0 = c.solve(lo, c.guess(lo))[0]
        else:
            lo, x0 = _R_GRID[j - 1], xs[j - 1]
        out[idx] = brentq(lambda r, x0=x0, k=k: c.solve(r, x0)[1] - k, lo, _R_GRID[j],
                          xtol=1e-13)
    return out
