"""Fitting single-head attention dynamics to an observed trajectory (docs/science.md §11.8).

The model is the paper's causal (or full) self-attention on the sphere,
dx_k/dt = P_{x_k}(sum_j w_kj V x_j), w_kj ∝ exp(x_k^T B x_j), with B = beta Q^T K: only the
product B (d x d) and V (d x d) enter the field, so they are the identifiable parameters
(beta and Q^T K only through B; `split` names the convention that separates them). Given the
initial tokens x0 (n, d), exactly known, and observations y (m, n, d) of the tokens at m save
times t_1 < ... < t_m with additive Gaussian noise in R^d, `fit` minimises the full-trajectory
misfit

    L(B, V) = (1 / 2 m n) sum_i sum_k |x_k(t_i; B, V) - y_k(t_i)|^2,

the maximum-likelihood estimate for independent noise, with `attnflow.simulate` on torch
tensors (float64, the same fixed-step method and step for every evaluation) and torch's
L-BFGS with a strong-Wolfe line search; the gradient is reverse mode through the run.
`misfit` is the objective itself (numpy arrays in, float out: the numpy engine; tensors in,
a tensor in the graph), `fisher` the Fisher information J^T J / sigma^2 of the observations
from central differences of the numpy engine. torch is imported only by `fit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import fail, finite_array
from attnflow.family import Attention
from attnflow.simulate import simulate

__all__ = ["Fit", "fisher", "fit", "misfit", "observe", "split", "states"]


@dataclass(frozen=True)
class Fit:
    """The result of `fit`: B = beta Q^T K and V (d x d numpy arrays), the final misfit, the
    number of misfit evaluations, and whether L-BFGS stopped on its tolerance (not on the
    evaluation limit)."""

    B: np.ndarray
    V: np.ndarray
    misfit: float
    evaluations: int
    converged: bool


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


def states(B: Any, V: Any, x0: Any, times: Any, dt: float = 0.05, method: str = "rk4",
           mask: str = "causal") -> Any:
    """The tokens at `times` (m,) from x0 (n, d) under B, V (d, d): shape (m, n, d), numpy
    or a tensor as B, V and x0 are (`attnflow.simulate`, fixed step dt)."""
    times = np.asarray(times, dtype=float)
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
    x0 = finite_array("x0", x0, ndim=2)
    n, d = x0.shape
    times = finite_array("times", times, ndim=1)
    if times.size == 0 or times[0] <= 0 or np.any(np.diff(times) <= 0):
        raise fail("times", "increasing save times > 0 (t = 0 is x0, known)", times)
    observed = finite_array("observed", observed, ndim=3)
    if observed.shape != (times.size, n, d):
        raise fail("observed", f"shape (len(times), n, d) = {(times.size, n, d)}",
                   observed.shape)
    if times.size * n * (d - 1) < 2 * d * d:
        raise fail("times", f"at least 2 d^2 = {2 * d * d} tangent observations (m n (d - 1) "
                   f"with n = {n}, d = {d}) for the {2 * d * d} unknowns of B and V",
                   f"m = {times.size} save times")
    return x0, times, observed


def fit(x0: Any, times: Any, observed: Any, start: tuple[Any, Any], dt: float = 0.05,
        method: str = "rk4", mask: str = "causal", metric: Any = None,
        max_evaluations: int = 300, tolerance: float = 1e-12) -> Fit:
    """Fit B = beta Q^T K and V to observations (m, n, d) at save times (m,) > 0 from the
    known tokens x0 (n, d), starting at `start` = (B0, V0), by L-BFGS (strong Wolfe, history
    20) on `misfit` (float64 tensors on the CPU; reverse mode through `simulate`).

    `metric`: None, or a symmetric positive definite (2 d^2, 2 d^2) matrix M (e.g. `fisher`
    at the start, sigma = 1) to precondition with: L-BFGS then moves u with
    theta = theta_0 + C^-T u, M = C C^T (Cholesky), in which a misfit whose Hessian is near
    M / (m n) is near round. Stops when the largest gradient component in u is below
    `tolerance` or after `max_evaluations`."""
    import torch

    x0, times, observed = _check(x0, times, observed)
    d = x0.shape[1]
    theta0 = np.concatenate([np.asarray(s, dtype=float).ravel() for s in start])
    if theta0.size != 2 * d * d:
        raise fail("start", f"(B0, V0), two {d} x {d} matrices", tuple(np.shape(s)
                                                                       for s in start))
    C_inv_T = np.eye(theta0.size)
    if metric is not None:
        try:
            C = np.linalg.cholesky(finite_array("metric", metric, ndim=2))
        except np.linalg.LinAlgError:
            raise fail("metric", "a symmetric positive definite matrix", "a matrix that is "
                       "not (Cholesky failed)") from None
        C_inv_T = np.linalg.inv(C).T
    origin, to_theta = torch.from_numpy(theta0), torch.from_numpy(C_inv_T)
    u = torch.zeros(theta0.size, dtype=torch.float64, requires_grad=True)
    x0_t, y_t = torch.from_numpy(x0), torch.from_numpy(observed)
    opt = torch.optim.LBFGS([u], lr=1, max_iter=max_evaluations,
                            max_eval=max_evaluations, tolerance_grad=tolerance,
                            tolerance_change=1e-24, history_size=20,
                            line_search_fn="strong_wolfe")
    count = [0]

    def value() -> Any:
        theta = origin + to_theta @ u
        return misfit(theta[:d * d].reshape(d, d), theta[d * d:].reshape(d, d), x0_t, times,
                      y_t, dt, method, mask)

    def closure():
        opt.zero_grad()
        count[0] += 1
        out = value()
        out.backward()
        return out

    opt.step(closure)
    with torch.no_grad():
        final = value()
        th = (origin + to_theta @ u).numpy()
    return Fit(th[:d * d].reshape(d, d).copy(), th[d * d:].reshape(d, d).copy(), float(final),
               count[0], count[0] < max_evaluations)


def fisher(B: Any, V: Any, x0: Any, times: Any, sigma: float = 1.0, dt: float = 0.05,
           method: str = "rk4", mask: str = "causal", step: float = 1e-6) -> np.ndarray:
    """The Fisher information (2 d^2, 2 d^2) of observations with noise sigma about
    theta = (B, V) (row-major, B first): J^T J / sigma^2, J = d states / d theta by central
    differences (step `step`) of the numpy engine. sigma^2 tr(J^T J)^-1 is the Cramér-Rao
    bound on E|theta_hat - theta|^2."""
    B, V = np.asarray(B, dtype=float), np.asarray(V, dtype=float)
    theta = np.concatenate([B.ravel(), V.ravel()])
    d = B.shape[0]

    def run(th):
        return np.asarray(states(th[:d * d].reshape(d, d), th[d * d:].reshape(d, d), x0,
                                 times, dt, method, mask)).ravel()

    J = np.stack([(run(theta + step * e) - run(theta - step * e)) / (2 * step)
                  for e in np.eye(theta.size)], axis=1)
    return J.T @ J / sigma**2
