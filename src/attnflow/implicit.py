"""Implicit (stiff) integrators: scipy's BDF, Radau and LSODA, run by run, with the exact
Jacobian of the field.

Why: on long horizons the tokens sit in tight clusters whose internal contraction (rate about
1 and faster) bounds the step of every explicit method by stability, not accuracy, while the
clusters themselves move on time scales of hundreds to thousands. An implicit method with the
Jacobian takes steps as long as accuracy allows (benchmarks/RESULTS.md, W3: t = 10^4 with
about 40 times fewer field evaluations than RK4 at equal error).

Each run (leading index) is one system of n d unknowns for `scipy.integrate.solve_ivp`; the
Jacobian is dense (n d x n d), so these methods suit runs of a few thousand unknowns. States
at the save times come from the solver's dense output and are renormalised onto the sphere.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from attnflow.errors import NonFiniteStateError
from attnflow.manifolds import SPHERE, Manifold

__all__ = ["IMPLICIT", "solve_implicit"]

SCIPY_NAMES = {"bdf": "BDF", "radau": "Radau", "lsoda": "LSODA"}  # scipy.integrate's classes
IMPLICIT = tuple(SCIPY_NAMES)


def solve_implicit(
    field: Callable[[np.ndarray], np.ndarray],
    jacobian: Callable[[np.ndarray], np.ndarray] | None,
    x0: np.ndarray,
    times: np.ndarray,
    method: str,
    first_step: float | None,
    rtol: float,
    atol: float,
    progress: Callable[[float], None] | None,
    manifold: Manifold = SPHERE,
) -> tuple[np.ndarray, dict[str, int]]:
    """States (len(times), ..., n, d) of every run of x0 (..., n, d) from times[0], and
    the work per run, averaged over the runs and rounded up: field evaluations ("n_evals"),
    Jacobian evaluations ("n_jacobians"), steps ("n_steps"). `jacobian(x)` maps (n, d) to
    (n, d, n, d); None lets scipy estimate it by finite differences (n d extra field
    evaluations each time). `progress` receives the time reached, with the runs taken as
    consecutive stretches of [times[0], times[-1]]. Raises `NonFiniteStateError` if a state
    or the Jacobian turns non-finite, FloatingPointError if a solver fails otherwise. States
    are retracted onto the `manifold` (on the sphere: renormalised)."""
    lead, (n, d) = x0.shape[:-2], x0.shape[-2:]
    runs = x0.reshape(-1, n, d)
    out = np.empty((len(times), len(runs), n, d))
    work = {"n_evals": 0, "n_jacobians": 0, "n_steps": 0}
    for r, x in enumerate(runs):
        where = f"run {tuple(int(i) for i in np.unravel_index(r, lead))}"
        span = times[-1] - times[0]
        report = None if progress is None else (
            lambda t, r=r, span=span: progress(times[0] + (r * span + t - times[0]) / len(runs)))
        out[:, r] = _one_run(field, jacobian, x, times, method, first_step, rtol, atol,
                             work, where, report, manifold, lead, r)
    work = {key: math.ceil(value / len(runs)) for key, value in work.items()}
    return out.reshape(len(times), *lead, n, d), work


def _one_run(field, jacobian, x, times, method, first_step, rtol, atol, work, where, report,
             manifold, lead, r):
    """The states of one run (n, d) at `times`; adds its work to `work`."""
    n, d = x.shape
    states = np.empty((len(times), n, d))
    states[0] = x
    t0, t_end = float(times[0]), float(times[-1])
    if t_end == t0:
        return states

    def finite(what: str, t: float, value: np.ndarray) -> np.ndarray:
        if not np.isfinite(value).all():
            raise NonFiniteStateError(t, [tuple(int(i) for i in np.unravel_index(r, lead))])
        return value

    def fun(t: float, y: np.ndarray) -> np.ndarray:
        return finite("field", t, field(y.reshape(n, d)).ravel())

    def jac(t: float, y: np.ndarray) -> np.ndarray:
        return finite("Jacobian", t, jacobian(y.reshape(n, d)).reshape(n * d, n * d))

    import scipy.integrate  # here: importing it costs 0.3 s, which `import attnflow` skips

    solver_class = getattr(scipy.integrate, SCIPY_NAMES[method])
    solver = solver_class(fun, t0, x.ravel(), t_end, rtol=rtol, atol=atol,
                          jac=None if jacobian is None else jac, first_step=first_step)
    nxt = 1
    stalled, t_last = 0, t0  # steps in a row that did not advance t
    while nxt < len(times):
        try:
            message = solver.step()
        except ValueError as err:  # Radau's LU factorisation meets inf/NaN before our checks
            if "infs or NaNs" not in str(err):
                raise
            raise NonFiniteStateError(float(solver.t), [
                tuple(int(i) for i in np.unravel_index(r, lead))]) from None
        if solver.status == "failed":
            raise FloatingPointError(f"{method}: the solver stopped at t = {solver.t:.6g} in "
                                     f"{where}: {message}")
        # A field too large for the solver's arithmetic (a diverging state) makes LSODA retry
        # the same step forever without failing: 100 steps in a row that leave t where it was
        # (a successful step always advances it) stop the run as a non-finite state.
        stalled = stalled + 1 if solver.t <= t_last else 0
        t_last = max(t_last, float(solver.t))
        if stalled >= 100 or not np.isfinite(solver.y).all():
            raise NonFiniteStateError(float(solver.t), [
                tuple(int(i) for i in np.unravel_index(r, lead))])
        work["n_steps"] += 1
        done = nxt + int(np.searchsorted(times[nxt:], solver.t, side="right"))
        if done > nxt:
            dense = solver.dense_output()
            states[nxt:done] = manifold.retract(dense(times[nxt:done]).T.reshape(-1, n, d))
            nxt = done
        if report is not None:
            report(solver.t)
    work["n_evals"] += solver.nfev
    work["n_jacobians"] += solver.njev
    return states
