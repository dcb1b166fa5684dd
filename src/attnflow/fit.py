"""Fitting single-head attention dynamics to an observed trajectory (docs/science.md §11.8).

The model is the paper's causal (or full) self-attention on the sphere,
dx_k/dt = P_{x_k}(sum_j w_kj V x_j), w_kj ∝ exp(x_k^T B x_j), with B = beta Q^T K: only the
product B (d x d) and V (d x d) enter the field, so they are the identifiable parameters
(beta and Q^T K only through B; `split` names the convention that separates them). Given the
initial tokens x0 (n, d), exactly known, and observations y (m, n, d) of the tokens at m save
times t_1 < ... < t_m with additive Gaussian noise in R^d, `fit` minimises the full-trajectory
misfit

    L(B, V) = (1 / 2 m n) sum_i sum_k |x_k(t_i; B, V) - y_k(t_i)|^2,

the maximum-likelihood estimate for independent noise, as a least-squares problem in the
residuals r = x(t_i; theta) - y (theta = (B, V), row-major, B first): Levenberg-Marquardt
with the Jacobian J = dr/dtheta from forward-mode autograd (`torch.func.jacfwd`) through
`attnflow.simulate` on float64 tensors (the same fixed-step method and step for every
evaluation).

Convergence is stated in the data's units: at the estimate, the Gauss-Newton step
delta = -(J^T J)^-1 J^T r is shorter than `tolerance` standard errors in the metric of the
estimate's covariance, sqrt(delta^T F delta) <= tolerance with F = J^T J / sigma^2 (so every
parameter's step is below `tolerance` of its standard error); sigma is the given noise level
or the residual standard error |r| / sqrt(m n d - 2 d^2), at least `NOISE_FLOOR`. A fit that
stops without meeting it says so: `converged=False` and a `FitWarning`. The standard errors
returned are those of F at the estimate.

`misfit` is the objective itself (numpy arrays in, float out: the numpy engine; tensors in,
a tensor in the graph), `fisher` the Fisher information J^T J / sigma^2 of the observations
from central differences of the numpy engine. torch is imported only by `fit`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import describe, fail, finite_array, positive, square_matrix
from attnflow._repr import ShortRepr
from attnflow.errors import NonFiniteStateError
from attnflow.family import Attention
from attnflow.simulate import simulate

__all__ = ["MAX_CONDITION", "NOISE_FLOOR", "Fit", "FitWarning", "fisher", "fit", "misfit",
           "observe", "split", "states"]

NOISE_FLOOR = 1e-10  # the least noise level of the convergence test, in the states' units
MAX_CONDITION = 1 / np.sqrt(np.finfo(float).eps)  # 6.7e7: the largest metric condition number
_DAMPING0 = 1e-3  # the first damping, relative to J^T J's scale in the metric


class FitWarning(UserWarning):
    """A fit that did not meet its convergence test, a metric set aside for its conditioning,
    or parameters that the observations do not determine (infinite standard errors)."""


@dataclass(frozen=True, repr=False)
class Fit(ShortRepr):
    """The result of `fit`.

    B, V : the estimates of B = beta Q^T K and V, (d, d) numpy arrays.
    misfit : L(B, V) of the module docstring at the estimate (squared states' units).
    evaluations : runs of the model without derivatives (the start and every trial step).
    jacobians : Jacobian evaluations (one run carrying the 2 d^2 tangents), at the start and
        at each accepted step.
    converged : whether the convergence test (module docstring) was met.
    step : the Gauss-Newton step at the estimate in standard errors, sqrt(delta^T F delta):
        the quantity the test bounds by `tolerance`.
    sigma : the noise level of the standard errors: as given, or the residual standard error
        |r| / sqrt(m n d - 2 d^2) at the estimate (states' units).
    covariance : (2 d^2, 2 d^2) sigma^2 (J^T J)^-1 at the estimate, theta = (B, V) row-major,
        B first; infinite where J^T J is singular (warned).
    """

    B: np.ndarray
    V: np.ndarray
    misfit: float
    evaluations: int
    jacobians: int
    converged: bool
    step: float
    sigma: float
    covariance: np.ndarray

    @property
    def B_se(self) -> np.ndarray:
        """The standard errors of B's entries, (d, d)."""
        return self._se()[: self.B.size].reshape(self.B.shape)

    @property
    def V_se(self) -> np.ndarray:
        """The standard errors of V's entries, (d, d)."""
        return self._se()[self.B.size:].reshape(self.V.shape)

    def _se(self) -> np.ndarray:
        return np.sqrt(np.diag(self.covariance))


def split(B: Any) -> tuple[float, np.ndarray]:
    """beta and Q^T K from B = beta Q^T K under the convention |Q^T K|_F = sqrt(d) (the
    identity's norm, so Q = K = I gives beta itself): beta = |B|_F / sqrt(d) >= 0."""
    B = np.asarray(B, dtype=float)
    beta = float(np.linalg.norm(B) / np.sqrt(B.shape[0]))
    return beta, (B / beta if beta > 0 else np.full_like(B, np.nan))


def _model(B: Any, V: Any, mask: str) -> Attention:
    """Attention with scores x_k^T B x_j: the head (Q, K) = (B^T, I) has Q^T K = B."""
    eye = np.eye(B.shape[0])
    if is_tensor(B):
        import torch

        eye = torch.eye(B.shape[0], dtype=B.dtype, device=B.device)
    return Attention(heads=[(B.T, eye, V)], beta=1.0, mask=mask)


def _save_times(times: Any, first: str) -> np.ndarray:
    """Increasing finite save times (m,), m >= 1, each > 0 (first = "> 0") or >= 0."""
    times = finite_array("times", times, ndim=1, dtype=float)
    if times.size == 0 or np.any(np.diff(times) <= 0) or not (
            times[0] > 0 if first == "> 0" else times[0] >= 0):
        why = " (t = 0 is x0, known)" if first == "> 0" else ""
        raise fail("times", f"one or more increasing save times {first}{why}", times)
    return times


def states(B: Any, V: Any, x0: Any, times: Any, dt: float = 0.05, method: str = "rk4",
           mask: str = "causal") -> Any:
    """The tokens at `times` (m,) >= 0 from x0 (n, d) under B, V (d, d): shape (m, n, d),
    numpy or a tensor as B, V and x0 are (`attnflow.simulate`, fixed step dt)."""
    times = _save_times(times, ">= 0")
    d = x0.shape[-1] if hasattr(x0, "shape") else np.shape(x0)[-1]
    for name, a in (("B", B), ("V", V)):
        if tuple(np.shape(a) if not hasattr(a, "shape") else a.shape) != (d, d):
            raise fail(name, f"a ({d}, {d}) matrix (d of x0)", describe(a))
    return simulate(_model(B, V, mask), x0, float(times[-1]), save_at=times, method=method,
                    dt=dt).states


def misfit(B: Any, V: Any, x0: Any, times: Any, observed: Any, dt: float = 0.05,
           method: str = "rk4", mask: str = "causal") -> Any:
    """The misfit L(B, V) of the module docstring for observations `observed` (m, n, d) at
    `times` (m,) from x0 (n, d); a float for numpy input, a tensor for tensor input."""
    r = states(B, V, x0, times, dt, method, mask) - observed
    value = 0.5 * (r * r).sum() / (r.shape[0] * r.shape[1])
    return value if is_tensor(value) else float(value)


def observe(exact: Any, sigma: float, seed: int | np.random.Generator | None = None
            ) -> np.ndarray:
    """Observations: the exact states (m, n, d) plus independent N(0, sigma^2) noise in each
    of the d coordinates (in R^d: not projected back to the sphere)."""
    if not np.isfinite(sigma) or sigma < 0:
        raise fail("sigma", "a finite noise level >= 0", sigma)
    x = np.asarray(exact, dtype=float)
    return x + sigma * np.random.default_rng(seed).standard_normal(x.shape)


def _check(x0: Any, times: Any, observed: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x0 = finite_array("x0", x0, ndim=2, dtype=float)
    n, d = x0.shape
    times = _save_times(times, "> 0")
    observed = finite_array("observed", observed, ndim=3, dtype=float)
    if observed.shape != (times.size, n, d):
        raise fail("observed", f"shape (len(times), n, d) = {(times.size, n, d)}",
                   observed.shape)
    if times.size * n * (d - 1) < 2 * d * d:
        raise fail("times", f"at least 2 d^2 = {2 * d * d} tangent observations (m n (d - 1) "
                   f"with n = {n}, d = {d}) for the {2 * d * d} unknowns of B and V",
                   f"m = {times.size} save times")
    return x0, times, observed


def _start(start: Any, d: int) -> np.ndarray:
    """theta0 (2 d^2,) from start = (B0, V0), two finite (d, d) matrices."""
    expected = f"(B0, V0), two finite {d} x {d} real matrices"
    if not isinstance(start, (tuple, list)) or len(start) != 2:
        raise fail("start", expected, describe(start))
    try:
        pair = [np.asarray(a, dtype=float) for a in start]
    except (TypeError, ValueError):
        raise fail("start", expected, repr(tuple(start))) from None
    if any(a.shape != (d, d) or not np.all(np.isfinite(a)) for a in pair):
        raise fail("start", expected, ", ".join(describe(a) for a in pair))
    return np.concatenate([a.ravel() for a in pair])


def _evaluations(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise fail("max_evaluations", "an integer >= 1", repr(value))
    return int(value)


def _metric_factor(metric: Any, p: int) -> np.ndarray | None:
    """The Cholesky factor C (M = C C^T) of a symmetric positive definite metric (p, p), or
    None (the Jacobian's column scaling) with a FitWarning when M's condition number is over
    MAX_CONDITION or M is singular; an error when M is not symmetric or has a negative
    eigenvalue beyond round-off."""
    M = square_matrix("metric", metric, p)
    scale = np.abs(M).max()
    if np.abs(M - M.T).max() > 1e-10 * scale:
        raise fail("metric", "a symmetric matrix", f"largest |M - M^T| "
                   f"{np.abs(M - M.T).max():.3g} against largest |M| {scale:.3g}")
    eig = np.linalg.eigvalsh(0.5 * (M + M.T))
    if scale == 0 or eig[0] < -np.sqrt(np.finfo(float).eps) * eig[-1]:
        raise fail("metric", "a symmetric positive definite matrix",
                   f"eigenvalues from {eig[0]:.3g} to {eig[-1]:.3g}")
    if eig[0] <= 0 or eig[-1] / eig[0] > MAX_CONDITION:
        condition = f"{eig[-1] / eig[0]:.3g}" if eig[0] > 0 else "infinite"
        warnings.warn(f"metric: condition number {condition} (eigenvalues {eig[0]:.3g} to "
                      f"{eig[-1]:.3g}) over {MAX_CONDITION:.3g}: damping with the Jacobian's "
                      "column scaling instead (as metric=None)", FitWarning, stacklevel=3)
        return None
    return np.linalg.cholesky(0.5 * (M + M.T))


def _engine(x0: np.ndarray, times: np.ndarray, observed: np.ndarray, dt: float, method: str,
            mask: str) -> tuple[Callable, Callable]:
    """(residuals, jacobian): theta (2 d^2,) -> r (m n d,) and -> J (m n d, 2 d^2), numpy in
    and out, through `simulate` on float64 tensors (J by forward mode)."""
    import torch

    d = x0.shape[1]
    x0_t, y_t = torch.tensor(x0), torch.tensor(observed)  # copies: inputs may be read-only

    def r(theta):
        return (states(theta[:d * d].reshape(d, d), theta[d * d:].reshape(d, d), x0_t, times,
                       dt, method, mask) - y_t).reshape(-1)

    jacfwd = torch.func.jacfwd(r)

    def residuals(theta: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return r(torch.from_numpy(theta)).numpy()

    def jacobian(theta: np.ndarray) -> np.ndarray:
        return jacfwd(torch.from_numpy(theta)).detach().numpy()

    return residuals, jacobian


def _gauss_newton_se(J: np.ndarray, r: np.ndarray, sigma: float) -> float:
    """The Gauss-Newton step's length in standard errors: |J delta| / sigma = |P_J r| / sigma
    (P_J the projection onto J's columns), by least squares."""
    delta = np.linalg.lstsq(J, -r, rcond=None)[0]
    return float(np.linalg.norm(J @ delta) / sigma)


def _residual_sigma(r: np.ndarray, p: int) -> float:
    """The residual standard error |r| / sqrt(N - p)."""
    return float(np.linalg.norm(r) / np.sqrt(r.size - p))


def _covariance(J: np.ndarray, sigma: float) -> np.ndarray:
    """sigma^2 (J^T J)^-1 by the SVD of J; infinite, with a FitWarning, where J is rank
    deficient (numpy's matrix_rank tolerance)."""
    _, s, Vt = np.linalg.svd(J, full_matrices=False)
    rank = int(np.sum(s > s[0] * max(J.shape) * np.finfo(float).eps)) if s[0] > 0 else 0
    if rank < J.shape[1]:
        warnings.warn(f"fit: the observations do not determine the parameters (the Jacobian "
                      f"has rank {rank} of {J.shape[1]}): infinite standard errors",
                      FitWarning, stacklevel=3)
        return np.full((J.shape[1], J.shape[1]), np.inf)
    return sigma**2 * (Vt.T / s**2) @ Vt


def _levenberg_marquardt(residuals: Callable, jacobian: Callable, theta: np.ndarray,
                         C: np.ndarray | None, noise: Callable, tolerance: float, limit: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, float, bool]:
    """Levenberg-Marquardt from theta with Nielsen's damping update, damped in C C^T (or by
    Moré's column scaling where C is None), until the Gauss-Newton step is at most
    `tolerance` standard errors (`noise(r)` the noise level), `limit` residual evaluations,
    or a step the linear model cannot improve on (stalled). Returns (theta, r, J there,
    evaluations, jacobians, the step in standard errors, stalled)."""
    r, J = residuals(theta), jacobian(theta)
    evaluations, jacobians, p = 1, 1, theta.size
    column = np.linalg.norm(J, axis=0)  # Moré's scaling: the largest column norms so far
    trace_M = np.trace(C @ C.T) if C is not None else np.sum(column**2)
    lam = _DAMPING0 * np.sum(J * J) / trace_M if trace_M > 0 else _DAMPING0
    nu = 2.0
    step = _gauss_newton_se(J, r, noise(r))
    while step > tolerance and evaluations < limit:
        D = C if C is not None else np.diag(column)
        delta = np.linalg.lstsq(np.vstack([J, np.sqrt(lam) * D.T]),
                                np.concatenate([-r, np.zeros(p)]), rcond=None)[0]
        predicted = float(r @ r - np.sum((r + J @ delta) ** 2))
        if not predicted > 0:  # no step the linear model improves on: round-off
            return theta, r, J, evaluations, jacobians, step, True
        try:
            trial = residuals(theta + delta)
        except NonFiniteStateError:
            trial = np.full_like(r, np.nan)
        evaluations += 1
        rho = float(r @ r - trial @ trial) / predicted if np.all(np.isfinite(trial)) \
            else -np.inf
        if rho > 0:
            theta, r = theta + delta, trial
            J = jacobian(theta)
            jacobians += 1
            column = np.maximum(column, np.linalg.norm(J, axis=0))
            lam *= max(1 / 3, 1 - (2 * rho - 1) ** 3)
            nu = 2.0
            step = _gauss_newton_se(J, r, noise(r))
        else:
            lam, nu = lam * nu, nu * 2
    return theta, r, J, evaluations, jacobians, step, False


def fit(x0: Any, times: Any, observed: Any, start: tuple[Any, Any], dt: float = 0.05,
        method: str = "rk4", mask: str = "causal", metric: Any = None,
        max_evaluations: int = 100, tolerance: float = 0.01, sigma: float | None = None
        ) -> Fit:
    """Fit B = beta Q^T K and V to observations (m, n, d) at save times (m,) > 0 from the
    known tokens x0 (n, d), starting at `start` = (B0, V0), by Levenberg-Marquardt on the
    residuals (module docstring; Nielsen's damping update), until the Gauss-Newton step is
    below `tolerance` standard errors or `max_evaluations` runs of the model.

    `metric`: None, or a symmetric positive definite (2 d^2, 2 d^2) matrix M (e.g. `fisher`
    at the start) for the damping: the step solves (J^T J + lambda M) delta = -J^T r, a trust
    region round in M. None damps with the Jacobian's largest column norms so far (Moré's
    scaling). M's condition number is checked: over `MAX_CONDITION` (or singular), it is set
    aside for the column scaling with a `FitWarning`. The damping shapes the path, not the
    estimate (the test is the undamped step's); M = F, the Fisher information, makes every
    damped step a shortened Gauss-Newton step, slower than None from a start far off.

    `sigma`: the observations' noise level, if known (states' units); otherwise the residual
    standard error at the estimate. It sets the standard errors and the convergence test
    (there at least `NOISE_FLOOR`, so that round-off does not bar noiseless data).

    Returns a `Fit` with the standard errors; `converged=False` comes with a `FitWarning`."""
    x0, times, observed = _check(x0, times, observed)
    d = x0.shape[1]
    theta = _start(start, d)
    p = theta.size
    limit = _evaluations(max_evaluations)
    tolerance = positive("tolerance", tolerance)
    if sigma is not None:
        sigma = positive("sigma", sigma)
    C = _metric_factor(metric, p) if metric is not None else None
    residuals, jacobian = _engine(x0, times, observed, dt, method, mask)

    def noise(r: np.ndarray) -> float:  # the convergence test's noise level
        return max(sigma if sigma is not None else _residual_sigma(r, p), NOISE_FLOOR)

    theta, r, J, evaluations, jacobians, step, stalled = _levenberg_marquardt(
        residuals, jacobian, theta, C, noise, tolerance, limit)
    converged = step <= tolerance
    if not converged:
        why = ("no step reduces the linearised misfit (round-off)" if stalled else
               f"stopped at max_evaluations = {limit}")
        warnings.warn(f"fit: not converged ({why}): the Gauss-Newton step is {step:.3g} "
                      f"standard errors, over the tolerance {tolerance:g}; the estimate is not "
                      "a minimum of the misfit to that accuracy", FitWarning, stacklevel=2)
    level = sigma if sigma is not None else _residual_sigma(r, p)
    return Fit(theta[:d * d].reshape(d, d).copy(), theta[d * d:].reshape(d, d).copy(),
               float(0.5 * (r @ r) / (times.size * x0.shape[0])), evaluations, jacobians,
               converged, step, level, _covariance(J, level))


def fisher(B: Any, V: Any, x0: Any, times: Any, sigma: float = 1.0, dt: float = 0.05,
           method: str = "rk4", mask: str = "causal", step: float = 1e-6) -> np.ndarray:
    """The Fisher information (2 d^2, 2 d^2) of observations with noise sigma > 0 about
    theta = (B, V) (row-major, B first): J^T J / sigma^2, J = d states / d theta by central
    differences (step `step` > 0) of the numpy engine, at save times (m,) > 0 from x0 (n, d).
    sigma^2 tr(J^T J)^-1 is the Cramér-Rao bound on E|theta_hat - theta|^2."""
    x0 = finite_array("x0", x0, ndim=2, dtype=float)
    d = x0.shape[1]
    B, V = square_matrix("B", B, d), square_matrix("V", V, d)
    times = _save_times(times, "> 0")
    sigma, step = positive("sigma", sigma), positive("step", step)
    theta = np.concatenate([B.ravel(), V.ravel()])

    def run(th):
        return np.asarray(states(th[:d * d].reshape(d, d), th[d * d:].reshape(d, d), x0,
                                 times, dt, method, mask)).ravel()

    J = np.stack([(run(theta + step * e) - run(theta - step * e)) / (2 * step)
                  for e in np.eye(theta.size)], axis=1)
    return J.T @ J / sigma**2
