"""`solve`: the mean-field equation of an attnflow model on the circle, from a density.

    d_t rho + d_theta(rho v[rho]) = (sigma^2 / 2) d_theta^2 rho

(`attnflow.meanfield.spectral` for v and the labels of the causal mask; docs/science.md §9).
Time stepping on the coefficients, a Euclidean state:

* without noise, `attnflow.integrate.rk4_step` (classical RK4) on the coefficients;
* with noise, the integrating-factor (Lawson) RK4 below: the Fokker-Planck term damps mode k
  at the rate sigma^2 k^2 / 2, which for K modes would cap an explicit method's step at about
  2.8 / (sigma^2 K^2 / 2); the exact factor e^{-sigma^2 k^2 h / 2} removes that limit (and
  is exact for the heat part), while the transport term keeps RK4's order 4. The classical
  method is the case sigma = 0 of this one, so integrate.py's step is used there.

Steps: each interval between save times is cut into equal steps of at most dt (as the
fixed-step methods of `attnflow.integrate` do). The default dt = min(0.05, 0.5 / (K |v|max))
keeps the transport's Courant number at 0.5 (|v|max: |V|_2, times e^{beta c} for
unnormalised weights); a dt above 2 / (K |v|max) is refused (RK4's stability bound for the
transport of the highest mode is 2 sqrt 2 / (K |v|max)).

Resolution: after every step the solver checks that every label's density is resolved: the
modes above 2 K / 3 below `tol` (relative l2, `attnflow.meanfield.initial.tail`) and no value
below -tol / (2 pi) at the collocation points. When clusters concentrate the density past
what K modes resolve, the first failing step's time is recorded as `resolution_lost_at`, the
run stops, and the result ends with the last resolved step: it never returns an unresolved
density.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np

from attnflow._checks import fail, number
from attnflow.errors import NonFiniteStateError
from attnflow.family import Block
from attnflow.integrate import check_solver_args, rk4_step
from attnflow.manifolds import EUCLIDEAN
from attnflow.meanfield.initial import DEFAULT_TAIL, check_coefficients, tail
from attnflow.meanfield.model import MeanFieldModel
from attnflow.meanfield.result import MeanFieldResult, check_path
from attnflow.meanfield.spectral import TransportField, to_grid

__all__ = ["DEFAULT_DT", "solve"]

DEFAULT_DT = 0.05
COURANT = 0.5  # the default step's Courant number K |v|max dt
MAX_COURANT = 2.0  # refused above (RK4 is stable up to 2 sqrt 2 on imaginary eigenvalues)


def solve(model: Block | Mapping[str, Any], rho0: Any, t_end: float, *,
          save_at: Any = None, noise: float | None = None, dt: float | None = None,
          tol: float = DEFAULT_TAIL, path: str | os.PathLike | None = None
          ) -> MeanFieldResult:
    """Solve the mean-field equation of `model` from the density rho0 up to t_end.

    Parameters
    ----------
    model : an `attnflow.Attention` block, or its keyword arguments as a dict: d = 2, one
        (Q, K, V) head with Q^T K a multiple of an orthogonal matrix, any V, mask "full" or
        "causal", attention "softmax" or "unnormalised", post-LN
        (`attnflow.meanfield.model`). Its particles' n -> infinity limit is what is solved.
    rho0 : Fourier coefficients (K + 1,) or (S, K + 1) (`from_function`, `from_tokens`,
        `from_coefficients`): one density for the full mask; for the causal mask one per
        label cell ((j - 1) / S, j / S], j = 1..S (token i of n has the label i / n).
    t_end : final time >= 0 (one unit = one layer).
    save_at : increasing save times in [0, t_end] (default 101 evenly spaced); 0 and t_end
        are always saved.
    noise : sigma >= 0 of attnflow's SDE dX = F dt + sigma P_X dW (`attnflow.simulate`):
        on the circle theta does Brownian motion of variance sigma^2 t, so the density gains
        the Fokker-Planck term (sigma^2 / 2) d_theta^2 rho. None: no noise.
    dt : the largest step (default: module docstring).
    tol : the resolution bound (module docstring).
    path : if given, the result is also saved there (``.nc`` or ``.zarr``), atomically:
        an interrupted run leaves no file.

    Returns a `MeanFieldResult` (its `resolution_lost_at` says whether and when the run
    stopped for lack of resolution). Raises ValueError for unsupported settings (naming what
    is supported) and `NonFiniteStateError` if a state becomes non-finite.
    """
    mf = MeanFieldModel.of(model)
    c = check_coefficients(rho0, "rho0", number("tol", tol, 0.0, low_open=True))
    S, K = c.shape[0], c.shape[1] - 1
    if not mf.causal and S != 1:
        raise fail("rho0", "one density (K + 1,) or (1, K + 1) for the full mask (label cells "
                   "are for mask 'causal')", f"{S} label densities")
    t_end, times, dt, _, _ = check_solver_args("rk4", t_end, save_at, dt, None, None)
    sigma = 0.0 if noise is None else number("noise", noise, 0.0, expected="sigma >= 0")
    field = TransportField(mf, S, K)
    speed = field.speed_bound()
    bound = MAX_COURANT / (K * speed) if speed > 0 else math.inf
    if dt is None:
        dt = min(DEFAULT_DT, COURANT / (K * speed) if speed > 0 else DEFAULT_DT)
    elif dt > bound:
        raise fail("dt", f"a step <= {bound:.3g} (Courant number K |v|max dt <= "
                   f"{MAX_COURANT:g} for K = {K} modes, |v|max = {speed:.3g})", repr(dt))
    if path is not None:
        check_path(path)
    start = time.perf_counter()
    k2 = np.arange(K + 1) ** 2 * (sigma * sigma / 2)
    grid_times = np.concatenate([[0.0], times]) if times[0] > 0 else times
    saved_times, saved = [0.0], [c]
    lost = None
    n_steps = 0
    t = 0.0
    for t0, t1 in zip(grid_times[:-1], grid_times[1:]):
        span = t1 - t0
        m = max(1, math.ceil(span / dt * (1 - 1e-12))) if span > 0 else 0
        h = float(span / m) if m else 0.0
        for i in range(m):
            new = rk4_step(field, c, h, EUCLIDEAN) if sigma == 0 else _lawson_rk4(
                field, c, h, *_factors(k2.tobytes(), h))
            n_steps += 1
            step_time = t0 + (i + 1) * h
            if not np.all(np.isfinite(new)):
                raise NonFiniteStateError(f"mean-field state non-finite at t = {step_time:g}")
            if not _resolved(new, tol, field.points):
                lost = step_time
                break
            c, t = new, step_time
        if lost is not None:
            if t > saved_times[-1]:
                saved_times.append(t)
                saved.append(c)
            break
        saved_times.append(t1)
        saved.append(c)
    result = MeanFieldResult(
        times=np.array(saved_times), coefficients=np.stack(saved), model=mf.block,
        settings={"modes": K, "labels": S if mf.causal else None, "noise": sigma, "dt": dt,
                  "steps": n_steps, "tol": tol, "points": field.points,
                  "method": "rk4" if sigma == 0 else "lawson-rk4"},
        resolution_lost_at=lost, wall_time=time.perf_counter() - start)
    if path is not None:
        result.save(path)
    return result


def _resolved(c: np.ndarray, tol: float, points: int) -> bool:
    """True when every label's density is resolved (module docstring)."""
    return bool(tail(c).max() <= tol and to_grid(c, points).min() * 2 * np.pi >= -tol)


@cache
def _factors(k2: bytes, h: float) -> tuple[np.ndarray, np.ndarray]:
    """e^{-sigma^2 k^2 h / 2} and its square root, for the steps of size h."""
    rates = np.frombuffer(k2)
    half = np.exp(-rates * h / 2)
    return half * half, half


def _lawson_rk4(field: TransportField, u: np.ndarray, h: float, full: np.ndarray,
                half: np.ndarray) -> np.ndarray:
    """One integrating-factor RK4 step of du/dt = -D u + F(u), D = diag(sigma^2 k^2 / 2):
    RK4 on w = e^{D t} u (full = e^{-D h}, half = e^{-D h / 2})."""
    a = field(u)
    b = field(half * (u + (h / 2) * a))
    c = field(half * u + (h / 2) * b)
    d = field(full * u + h * half * c)
    return full * u + (h / 6) * (full * a + 2 * half * (b + c) + d)
