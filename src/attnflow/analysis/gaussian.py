"""The Gaussian closure of unnormalised attention (docs/science.md §11.5; Castin, Ablin,
Carrillo, Peyre, arXiv 2501.18322).

Tokens in R^d under full softmax attention without normalisation (the flat scheme,
`attnflow.family.Flat`), dx/dt = sum_j softmax_j(beta <Q x, K x_j>) V x_j, in the mean-field
limit: if the tokens' law is N(m, Sigma), the weights e^{y^T A x}, A = beta K^T Q, tilt it to
N(m + Sigma A x, Sigma), so the velocity is affine, v(x) = V (m + Sigma A x), and the law
stays Gaussian with

    dm/dt = V (m + Sigma A m),     dSigma/dt = V Sigma A Sigma + Sigma A^T Sigma V^T

(`gaussian_moment_rhs`, solved by `gaussian_moments`). For V = I, Q = K = I (A = beta I):
dSigma/dt = 2 beta Sigma^2, so Sigma(t) = Sigma_0 (I - 2 beta t Sigma_0)^{-1} and
m(t) = e^t (I - 2 beta t Sigma_0)^{-1/2} m_0 (`gaussian_isotropic_moments`), which blow up at
t* = 1 / (2 beta lambda_max(Sigma_0)) (`gaussian_blowup_time`).

Q, K are (e, d) query and key matrices (None: the identity), V is (d, d) (None: the
identity); beta is the inverse temperature (the score of (x, y) is beta x^T Q^T K y).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.integrate import solve_ivp

from attnflow._checks import describe, fail, finite_array, inverse_temperature, positive

__all__ = ["gaussian_blowup_time", "gaussian_isotropic_moments", "gaussian_moment_rhs",
           "gaussian_moments"]


def gaussian_moment_rhs(m: Any, Sigma: Any, beta: float = 1.0, Q: Any = None, K: Any = None,
                        V: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(dm/dt (d,), dSigma/dt (d, d)) of the Gaussian closure at mean m (d,) and covariance
    Sigma (d, d): V (m + Sigma A m) and V Sigma A Sigma + Sigma A^T Sigma V^T, A = beta K^T Q
    (module docstring)."""
    m, Sigma = _moments(m, Sigma)
    A, Vm = _matrices(m.shape[0], beta, Q, K, V)
    return _rhs(m, Sigma, A, Vm)


def gaussian_moments(m0: Any, Sigma0: Any, times: Any, beta: float = 1.0, Q: Any = None,
                     K: Any = None, V: Any = None, rtol: float = 1e-10, atol: float = 1e-12
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The mean (T, d) and covariance (T, d, d) of the Gaussian closure at the times (T,)
    (non-decreasing, >= 0; time 0 holds m0 (d,), Sigma0 (d, d) symmetric positive
    semi-definite), by scipy's DOP853 at tolerances rtol, atol. Raises ValueError naming
    `times` when the moments blow up before the last time."""
    m0, Sigma0 = _moments(m0, Sigma0, "m0", "Sigma0")
    d = m0.shape[0]
    A, Vm = _matrices(d, beta, Q, K, V)
    times = _times(times)
    rtol, atol = positive("rtol", rtol), positive("atol", atol)

    def rhs(_t: float, y: np.ndarray) -> np.ndarray:
        dm, dS = _rhs(y[:d], y[d:].reshape(d, d), A, Vm)
        return np.concatenate([dm, dS.ravel()])

    y0 = np.concatenate([m0, Sigma0.ravel()])
    if times[-1] == 0:
        return np.repeat(m0[None], times.size, 0), np.repeat(Sigma0[None], times.size, 0)
    sol = solve_ivp(rhs, (0.0, float(times[-1])), y0, method="DOP853", t_eval=times,
                    rtol=rtol, atol=atol)
    if sol.status != 0 or sol.y.shape[1] != times.size or not np.all(np.isfinite(sol.y)):
        raise fail("times", "times before the moments blow up", f"a solver stop at t = "
                   f"{sol.t[-1] if sol.t.size else 0.0:.6g} ({sol.message})")
    y = sol.y.T
    S = y[:, d:].reshape(-1, d, d)
    return y[:, :d], (S + S.swapaxes(-1, -2)) / 2


def gaussian_blowup_time(Sigma0: Any, beta: float) -> float:
    """t* = 1 / (2 beta lambda_max(Sigma0)): when the covariance of the Gaussian closure with
    V = I, Q = K = I blows up (beta > 0, Sigma0 (d, d) with lambda_max > 0)."""
    Sigma0 = _covariance("Sigma0", Sigma0)
    beta = positive("beta", beta)
    top = float(np.linalg.eigvalsh(Sigma0)[-1])
    if top <= 0:
        raise fail("Sigma0", "a covariance with a positive eigenvalue", f"lambda_max {top}")
    return 1.0 / (2.0 * beta * top)


def gaussian_isotropic_moments(m0: Any, Sigma0: Any, times: Any, beta: float
                               ) -> tuple[np.ndarray, np.ndarray]:
    """The closed form of the Gaussian closure with V = I, Q = K = I: m(t) = e^t (I - 2 beta
    t Sigma0)^{-1/2} m0 (T, d) and Sigma(t) = Sigma0 (I - 2 beta t Sigma0)^{-1} (T, d, d), at
    the times (T,), each before `gaussian_blowup_time` (beta > 0)."""
    m0, Sigma0 = _moments(m0, Sigma0, "m0", "Sigma0")
    beta = positive("beta", beta)
    times = _times(times)
    lam, U = np.linalg.eigh(Sigma0)
    p = 1.0 - 2.0 * beta * times[:, None] * lam[None, :]  # (T, d) eigenvalues of P(t)
    if np.any(p <= 0):
        raise fail("times", f"times before the blow-up t* = "
                   f"{gaussian_blowup_time(Sigma0, beta):.6g}", f"up to {times[-1]:.6g}")
    c = U.T @ m0
    m = np.exp(times)[:, None] * (c / np.sqrt(p)) @ U.T
    S = np.einsum("ab,tb,cb->tac", U, lam / p, U)
    return m, S


# ---------------------------------------------------------------------- helpers
def _rhs(m: np.ndarray, S: np.ndarray, A: np.ndarray, Vm: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray]:
    B = Vm @ S @ A @ S
    return Vm @ (m + S @ (A @ m)), B + B.T


def _matrices(d: int, beta: float, Q: Any, K: Any, V: Any) -> tuple[np.ndarray, np.ndarray]:
    """A = beta K^T Q (d, d) and V (d, d), identities for None."""
    beta = inverse_temperature("beta", beta)
    Qm = _projection("Q", Q, d)
    Km = _projection("K", K, d)
    if Qm.shape[0] != Km.shape[0]:
        raise fail("Q, K", "query and key matrices of one head size e ((e, d) each)",
                   f"shapes {Qm.shape} and {Km.shape}")
    Vm = np.eye(d) if V is None else finite_array("V", V, ndim=2, dtype=float)
    if Vm.shape != (d, d):
        raise fail("V", f"a ({d}, {d}) matrix", describe(Vm))
    return beta * (Km.T @ Qm), Vm


def _projection(name: str, M: Any, d: int) -> np.ndarray:
    if M is None:
        return np.eye(d)
    M = finite_array(name, M, ndim=2, dtype=float)
    if M.shape[1] != d:
        raise fail(name, f"an (e, {d}) matrix", describe(M))
    return M


def _moments(m: Any, Sigma: Any, m_name: str = "m", s_name: str = "Sigma"
             ) -> tuple[np.ndarray, np.ndarray]:
    m = finite_array(m_name, m, ndim=1, dtype=float)
    Sigma = _covariance(s_name, Sigma)
    if Sigma.shape[0] != m.shape[0]:
        raise fail(s_name, f"a ({m.shape[0]}, {m.shape[0]}) matrix (the mean's d)",
                   describe(Sigma))
    return m, Sigma


def _covariance(name: str, Sigma: Any) -> np.ndarray:
    """A symmetric positive semi-definite (d, d) matrix (to round-off)."""
    S = finite_array(name, Sigma, ndim=2, dtype=float)
    if S.shape[0] != S.shape[1] or S.shape[0] == 0:
        raise fail(name, "a square (d, d) matrix, d >= 1", describe(S))
    scale = max(float(np.abs(S).max()), np.finfo(float).tiny)
    if np.abs(S - S.T).max() > 1e-10 * scale:
        raise fail(name, "a symmetric matrix", f"asymmetry {np.abs(S - S.T).max():.3g}")
    S = (S + S.T) / 2
    low = float(np.linalg.eigvalsh(S)[0])
    if low < -1e-10 * scale:
        raise fail(name, "a positive semi-definite matrix", f"an eigenvalue {low:.3g}")
    return S


def _times(times: Any) -> np.ndarray:
    t = finite_array("times", times, dtype=float).ravel()
    if t.size == 0 or t[0] < 0 or np.any(np.diff(t) < 0):
        raise fail("times", "a non-empty non-decreasing array of times >= 0", describe(t))
    return t
