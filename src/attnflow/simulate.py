"""`simulate`: integrate an attention model from initial tokens into a Trajectory."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.implicit import IMPLICIT
from attnflow.integrate import check_solver_args, integrate
from attnflow.model import Attention
from attnflow.sphere import normalize as _normalize
from attnflow.trajectory import Trajectory

__all__ = ["simulate"]

SPHERE_TOL = 1e-8


def simulate(
    model: Attention,
    x0: Any,
    t_end: float,
    save_at: Any = None,
    method: str = "rk4",
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool | Callable[[float], None] = False,
    normalize: bool = False,
    seed: int | None = None,
) -> Trajectory:
    """Integrate the dynamics of `model` from tokens x0 up to time t_end.

    Parameters
    ----------
    model : the Attention model.
    x0 : (..., n, d) initial tokens on the sphere; leading axes are independent runs.
    t_end : final time >= 0 (one unit of time = one layer).
    save_at : increasing save times in [0, t_end]; default 101 evenly spaced times from 0 to
        t_end. t_end is always saved.
    method : "rk4" (default), "euler", "geodesic", "dopri5", or the implicit "bdf", "radau",
        "lsoda" for long horizons (see `attnflow.integrate`; these solve run by run with
        `model.jacobian`, dense in n d: a few thousand unknowns per run at most).
        "euler" steps x <- normalize(x + dt attn(x)): with dt = 1, one post-LN layer.
    dt : step of the fixed-step methods (default 0.05); initial step for the adaptive ones.
    rtol, atol : tolerances of the adaptive methods (defaults 1e-6 and 1e-9).
    progress : True for a progress bar on stderr, or a callable receiving the current time.
    normalize : project x0 onto the sphere first; otherwise x0 off the sphere by more than
        1e-8 is an error.
    seed : the seed x0 was drawn with, recorded in the Trajectory (not used otherwise).

    Returns a Trajectory with states of shape (len(save times), ..., n, d).
    Raises ValueError for bad input and `NonFiniteStateError` if a state becomes non-finite.
    """
    if not isinstance(model, Attention):
        raise fail("model", "an attnflow.Attention", type(model).__name__)
    t_end, times, dt, rtol, atol = check_solver_args(method, t_end, save_at, dt, rtol, atol)
    x0 = model.check_tokens(x0, "x0")
    if normalize:
        x0 = _normalize(x0)
    else:
        off = float(np.max(np.abs(np.linalg.norm(x0, axis=-1) - 1.0)))
        if off > SPHERE_TOL:
            raise fail("x0", f"unit vectors (|norm - 1| <= {SPHERE_TOL:g}; or pass "
                       "normalize=True)", f"norms off 1 by up to {off:.3g}")
    with _progress(progress, t_end) as report:
        start = time.perf_counter()
        # One kernel for the whole simulation (chosen for the batch, or for one run where
        # the implicit methods solve run by run).
        kernel = model.kernel_for(x0 if method not in IMPLICIT else x0[(0,) * (x0.ndim - 2)])
        sol = integrate(partial(model.tangent_field, kernel=kernel), x0, times, method, dt,
                        rtol, atol, report, drift=partial(model.attention_output, kernel=kernel),
                        jacobian=model.jacobian, runs_independent=True)
        wall = time.perf_counter() - start
    integrator = {"method": method, "dt": dt, "rtol": rtol, "atol": atol,
                  "n_steps": sol.n_steps, "n_rejected": sol.n_rejected}
    if method in IMPLICIT:
        integrator["n_jacobians"] = sol.n_jacobians
    return Trajectory(times=sol.times, states=sol.states, model=model, integrator=integrator,
                      seed=seed, n_evals=sol.n_evals, wall_time=wall)


@contextlib.contextmanager
def _progress(progress: bool | Callable[[float], None], t_end: float
              ) -> Iterator[Callable[[float], None] | None]:
    if callable(progress):
        yield progress
        return
    if not progress:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("simulating"), BarColumn(), TextColumn("t = {task.completed:.4g}"
               f" / {t_end:g}"), TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("simulate", total=t_end or 1.0)
        yield lambda t: bar.update(task, completed=t)
