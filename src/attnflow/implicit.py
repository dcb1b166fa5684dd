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

On the sphere the solvers never retract inside a step, so they integrate an extension of the
field to R^{nd}. The plain one, F(x) = a - <x, a> x, makes the sphere repelling wherever
<x, a> < 0 (d(|x|^2 - 1)/dt = -2 <x, a> (|x|^2 - 1)): with a V of negative spectrum every
round-off grows like exp(2 |<x, a>| t) and the runs leave the sphere near t = 20. They
integrate instead G(x) = F(x / |x|) - RADIAL_RATE (|x| - 1) x / |x|, equal to F on the sphere,
whose radius relaxes to 1 at the rate RADIAL_RATE whatever the field: d|x|/dt =
-RADIAL_RATE (|x| - 1), since F(y) is tangent at y.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from attnflow.errors import NonFiniteStateError
from attnflow.manifolds import SPHERE, Manifold, Sphere

__all__ = ["IMPLICIT", "RADIAL_RATE", "solve_implicit", "sphere_extension"]

SCIPY_NAMES = {"bdf": "BDF", "radau": "Radau", "lsoda": "LSODA"}  # scipy.integrate's classes
IMPLICIT = tuple(SCIPY_NAMES)
#: The rate at which the radius of a token relaxes to 1 in the extension G (module docstring):
#: the time unit of the dynamics, so the radial mode is neither stiffer nor slower than the rest.
RADIAL_RATE = 1.0


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
    if isinstance(manifold, Sphere):
        field, jacobian = sphere_extension(field, jacobian)
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


def sphere_extension(
    field: Callable[[np.ndarray], np.ndarray],
    jacobian: Callable[[np.ndarray], np.ndarray] | None,
) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray] | None]:
    """G(x) = F(y) - RADIAL_RATE (r - 1) y with r = |x|, y = x / r token by token (the module
    docstring), and its Jacobian dG_i/dx_k = DF(y)_ik P_k / r_k - [i = k] RADIAL_RATE
    (y_i y_i^T + (r_i - 1) / r_i P_i), P = I - y y^T (None if `jacobian` is None)."""

    def radius(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = np.linalg.norm(x, axis=-1, keepdims=True)
        return r, x / r

    def g(x: np.ndarray) -> np.ndarray:
        r, y = radius(x)
        return field(y) - RADIAL_RATE * (r - 1.0) * y

    if jacobian is None:
        return g, None

    def dg(x: np.ndarray) -> np.ndarray:
        r, y = radius(x)
        n, d = x.shape
        P = np.eye(d) - y[:, :, None] * y[:, None, :]  # (n, d, d)
        J = np.einsum("iakc,kcb->iakb", jacobian(y), P / r[:, :, None])
        idx = np.arange(n)
        J[idx, :, idx, :] -= RADIAL_RATE * (y[:, :, None] * y[:, None, :]
                                            + ((r - 1.0) / r)[:, :, None] * P)
        return J

    return g, dg


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
