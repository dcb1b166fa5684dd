"""Integrators for fields on the sphere or in R^d, deterministic or noisy.

The integrators know nothing about attention (they import no model and no kernel): they
advance X (..., n, d) under any field F(X), on a manifold (`attnflow.manifolds`): the sphere
(F tangent to the sphere at each row, states renormalised after every step: "retraction") or
R^d (no retraction; the pre- and peri-LN schemes). Methods (``method=``):

* ``"euler"``: x <- normalize(x + dt D(x)), where D is the ambient drift whose tangent part is
  the field (for attention, the unprojected attention output; D = F when no drift is given).
  With dt = 1 this is exactly one attention-only post-LN Transformer layer with a residual
  connection, normalize(x + attn(x)). Order 1.
* ``"rk4"``: classical Runge-Kutta 4 on the ambient extension of the field (stages are not
  renormalised; the sphere is invariant for that extension), then renormalise. Order 4.
* ``"geodesic"``: Runge-Kutta 4 in normal coordinates: the ODE is pulled back to the
  tangent space at the current point through the exponential map, integrated there by RK4
  and mapped back by exp. Stays on the sphere by construction (no renormalisation needed).
  Order 4. (The Runge-Kutta-Munthe-Kaas idea with the exponential chart of the sphere.)
  Sphere only.
* ``"dopri5"``: the adaptive Dormand-Prince 5(4) pair with error control (rtol, atol),
  renormalisation after each accepted step, and its 4th-order dense output (renormalised)
  at the requested save times. One step size for the whole batch.
* ``"bdf"``, ``"radau"``, ``"lsoda"``: scipy's implicit (stiff) solvers, run by run, with the
  field's exact Jacobian when one is given (`attnflow.implicit`): for long horizons, where
  the contraction inside clusters limits every explicit method's step.
* ``"events"``: hardmax models (beta = +-inf) only, integrated by `attnflow.events` through
  `attnflow.simulate` (RK4 with every leader change located); `integrate` refuses it.

Fixed-step methods divide each interval between consecutive save times into equal steps of
size at most dt (exactly dt when the interval is a multiple of dt). A `splitting` (the
sublayers' drifts D_1, D_2, ... of a block in sequential form) makes the Euler step their
composition, x <- retract(retract(x + h D_1(x)) + h D_2(.)) ... (Lie-Trotter).

With noise (`Noise`: dX = D dt + sigma P_X dW on the sphere, dX = D dt + sigma dW in R^d, W a
`attnflow.brownian.BrownianPath`) the steps are exactly dt on the grid k dt, and

* ``"euler"`` is Euler-Maruyama followed by retraction: x <- retract(x + dt D(x) + sigma
  P_x dW) (with sigma = 0, bit for bit the deterministic Euler step);
* ``"geodesic"`` is its geodesic variant on the sphere: x <- exp_x(dt F(x) + sigma P_x dW).

Normalising after the step supplies the Ito correction -(d - 1) sigma^2 / 2 x dt of Brownian
motion on the sphere, so both converge to the Ito SDE on S^{d-1} whose noise is the projected
ambient Brownian motion (strong order 1/2, measured in tests/test_noise.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import numpy as np
from numba import njit

from attnflow._array import is_tensor, moved, namespace, sinc
from attnflow._checks import fail
from attnflow.brownian import BrownianPath
from attnflow.checkpointing import run_steps
from attnflow.ensembles import Progress, step_pieces
from attnflow.errors import NonFiniteStateError
from attnflow.implicit import IMPLICIT, solve_implicit
from attnflow.manifolds import SPHERE, Manifold, as_manifold
from attnflow.methods import (
    DEFAULT_ATOL,
    DEFAULT_DT,
    DEFAULT_RTOL,
    EVENTS,
    FIXED_STEP,
    METHODS,
    NOISY,
    SPHERE_ONLY,
    check_tensor_method,
)
from attnflow.parallel import parallel_ranges
from attnflow.sphere import compiled_width, exp_map, inner, normalize, project

Field = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Drift:
    """The drift term F(X) dt of the equation, with what the methods need beside F.

    field : F, the velocity (tangent to the sphere there).
    euler : the ambient drift D of Euler steps x <- retract(x + h D) (default: F).
    jacobian : one run's state (n, d) -> dF/dx (n, d, n, d) for the implicit methods
        (default: finite differences).
    splitting : drifts D_1, D_2, ... applied in turn by an Euler step (a block in sequential
        form; "euler" only, module docstring).
    runs_independent : F maps each run (leading index) on its own: the fixed-step methods
        may step pieces of the runs on their own, in parallel and in cache
        (`attnflow.ensembles`).
    """

    field: Field
    euler: Field | None = None
    jacobian: Callable[[np.ndarray], np.ndarray] | None = None
    splitting: tuple[Field, ...] | None = None
    runs_independent: bool = False

    def __post_init__(self) -> None:
        for name in ("field", "euler", "jacobian"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise fail(f"drift.{name}", "a function of the state", repr(value)[:80])
        if self.splitting is not None and (not self.splitting or not all(
                callable(f) for f in self.splitting)):
            raise fail("drift.splitting", "None or a non-empty tuple of functions",
                       repr(self.splitting)[:80])


@dataclass(frozen=True)
class Noise:
    """The diffusion term sigma dW of an SDE: W a Brownian path whose grid has step
    path.dt0 / 2^level (the integrator's dt); `first_step` is the index on that grid of the
    integrator's first step (for a run integrated in segments)."""

    sigma: float
    path: BrownianPath
    level: int = 0
    first_step: int = 0


@dataclass
class Solution:
    """What an integrator returns: states at the save times, and its work."""

    times: np.ndarray  # (T,)
    states: np.ndarray  # (T, ..., n, d)
    n_evals: int
    n_steps: int
    n_rejected: int
    n_jacobians: int = 0
    h_min: float | None = None  # the smallest step taken (fixed-step methods)


# ---------------------------------------------------------------------------- fixed steps
def euler_step(field: Field, x: np.ndarray, h: float, manifold: Manifold = SPHERE
               ) -> np.ndarray:
    """One Euler step followed by retraction (on the sphere in one pass, the same pass as the
    noisy step's, so that noise 0 is this step bit for bit)."""
    D = field(x)
    if manifold == SPHERE and _fusable(x, D):
        out = np.empty_like(x)
        _em_finish(*(a.reshape(-1, x.shape[-1]) for a in (x, D, np.zeros_like(x), out)), h,
                   0.0)
        return out
    return manifold.retract(x + h * D)


def split_euler_step(drifts: tuple[Field, ...], x: np.ndarray, h: float,
                     manifold: Manifold = SPHERE) -> np.ndarray:
    """Euler steps of the drifts one after the other (Lie-Trotter splitting), each retracted:
    with h = 1, a Transformer layer's sublayers in order."""
    for drift in drifts:
        x = euler_step(drift, x, h, manifold)
    return x


def rk4_step(field: Field, x: np.ndarray, h: float, manifold: Manifold = SPHERE
             ) -> np.ndarray:
    """One classical RK4 step on the ambient extension of the field, retracted."""
    k1 = field(x)
    k2 = field(_axpy(x, h / 2, k1))
    k3 = field(_axpy(x, h / 2, k2))
    k4 = field(_axpy(x, h, k3))
    if manifold == SPHERE and _fusable(x, k1, k2, k3, k4):  # one pass instead of ten (W1)
        out = np.empty_like(x)
        d = x.shape[-1]
        _rk4_finish_of(compiled_width(d))(
            *(a.reshape(-1, d) for a in (x, k1, k2, k3, k4, out)), h)
        return out
    return manifold.retract(x + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4))


def _fusable(x: np.ndarray, *ks: np.ndarray) -> bool:
    """True when x and the ks are C-contiguous float numpy arrays of one shape and dtype."""
    return isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.flags.c_contiguous and \
        x.ndim >= 1 and all(k.shape == x.shape and k.dtype == x.dtype and k.flags.c_contiguous
                            for k in ks)


def _axpy(x: np.ndarray, a: float, k: np.ndarray) -> np.ndarray:
    """x + a k, in one pass where `_fusable` (float64: the same arithmetic as numpy's; float32
    inputs are combined in float64, then rounded)."""
    if not _fusable(x, k):
        return x + a * k
    out = np.empty_like(x)
    _axpy_flat(x.reshape(-1), a, k.reshape(-1), out.reshape(-1))
    return out


@njit(nogil=True, cache=True)
def _axpy_flat(x, a, k, out):
    for i in range(x.size):
        out[i] = x[i] + a * k[i]


@cache
def _rk4_finish_of(d: int):
    """rk4_finish(x, k1, k2, k3, k4, out, h): out = normalize(x + (h/6) (k1 + 2 k2 + 2 k3 +
    k4)) row by row for (m, d) arrays, with numpy's order of operations (in float64 also for
    float32 inputs); d fixed at compile time as in `sphere.project` (d = 0: any d)."""

    @njit(nogil=True, cache=True)
    def rk4_finish(x, k1, k2, k3, k4, out, h):
        c = h / 6
        width = d if d else x.shape[1]
        for r in range(x.shape[0]):
            norm2 = 0.0
            for j in range(width):
                y = x[r, j] + c * (((k1[r, j] + 2 * k2[r, j]) + 2 * k3[r, j]) + k4[r, j])
                out[r, j] = y
                norm2 += y * y
            norm = np.sqrt(norm2)
            for j in range(width):
                out[r, j] /= norm

    return rk4_finish


def exp_chart(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The point y = exp_x(v) and the pieces needed to pull tangent vectors at y back to T_x.

    Returns (y, e) where e = d/dr exp_x(r u) is the unit velocity of the geodesic at y
    (u = v/|v|); see `pullback`.
    """
    xp = namespace(x, v)
    r = xp.sqrt(inner(v, v))
    safe = xp.where(r > 0, r, 1.0)
    u = xp.where(r > 0, v / safe, 0.0)
    y = xp.cos(r) * x + xp.sin(r) * u
    e = -xp.sin(r) * x + xp.cos(r) * u
    return y, e


def pullback(x: np.ndarray, v: np.ndarray, y: np.ndarray, e: np.ndarray, z: np.ndarray):
    """(d exp_x)_v^{-1} z: the tangent vector at x whose image under the differential of
    exp_x at v is z (tangent at y = exp_x(v)).

    Along the geodesic direction the differential is an isometry (u -> e); orthogonal to it
    it scales by sin r / r. So the inverse is <z, e> u + (r / sin r) (z - <z, e> e - <z, y> y).
    """
    xp = namespace(x, v)
    r = xp.sqrt(inner(v, v))
    safe = xp.where(r > 0, r, 1.0)
    u = xp.where(r > 0, v / safe, 0.0)
    ze = inner(z, e)
    zy = inner(z, y)
    ortho = z - ze * e - zy * y
    return ze * u + ortho / sinc(r / np.pi)


def geodesic_step(field: Field, x: np.ndarray, h: float, manifold: Manifold = SPHERE
                  ) -> np.ndarray:
    """One RK4 step in the exponential chart at x (stays on the sphere by construction)."""

    def chart_field(v: np.ndarray) -> np.ndarray:
        y, e = exp_chart(x, v)
        return project(x, pullback(x, v, y, e, field(y)))

    k1 = project(x, field(x))
    k2 = chart_field((h / 2) * k1)
    k3 = chart_field((h / 2) * k2)
    k4 = chart_field(h * k3)
    v = project(x, (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4))
    return exp_chart(x, v)[0]


STEPPERS = {"euler": (euler_step, 1), "rk4": (rk4_step, 4), "geodesic": (geodesic_step, 4)}


def _fixed(field, x0, times, dt, method, progress, runs_independent, manifold, grain,
           splitting=None, checkpoint=None, runner=None) -> Solution:
    step, evals_per_step = STEPPERS[method]
    if splitting is not None:  # Euler on the sublayers in turn (sequential blocks)
        evals_per_step = len(splitting)

        def step(_field: Field, x: np.ndarray, h: float) -> np.ndarray:
            return split_euler_step(splitting, x, h, manifold)
    else:
        step = partial(step, manifold=manifold)
    grid = []  # (start, step h, steps) of each interval between save times
    for t0, t1 in zip(times[:-1], times[1:]):
        span = t1 - t0
        m = max(1, math.ceil(span / dt * (1 - 1e-12))) if span > 0 else 0
        grid.append((t0, float(span / m) if m else 0.0, m))  # Python floats keep float32
    n_steps = sum(m for _, _, m in grid)
    if is_tensor(x0):  # on the tensor's device: no host copy; finiteness read at the end
        states = [x0]
        x = x0
        finite = DeviceFinite()
        for t0, h, m in grid:
            x = run_steps(partial(step, field), x, t0, h, m, checkpoint, progress) \
                if runner is None else runner(partial(step, field), x, t0, h, m, progress)
            finite.add(x, t0 + m * h)
            states.append(x)
        finite.check()
        states = namespace(x0).stack(states)
    elif runs_independent and x0.ndim > 2:
        states = step_pieces(partial(step, field), x0, grid, progress, grain)
    else:
        states = None  # filled at each save time, not stacked at the end
        x = x0
        for k, (t0, h, m) in enumerate(grid, 1):
            for i in range(m):
                x = step(field, x, h)
                _check_finite(x, t0 + (i + 1) * h)
                if progress is not None:
                    progress(t0 + (i + 1) * h)
            if states is None:
                states = np.empty((len(grid) + 1, *x0.shape), np.result_type(x0, x))
                states[0] = x0
            states[k] = x
        if states is None:  # a single save time
            states = x0[None].copy()
    h_min = min((h for _, h, m in grid if m), default=None)
    return Solution(np.asarray(times), states, n_steps * evals_per_step, n_steps, 0,
                    h_min=h_min)


def _stochastic(field, drift, x0, times, dt, method, progress, manifold, noise,
                runs_independent, grain) -> Solution:
    """Euler-Maruyama (or its geodesic variant) on the grid k dt: every interval between
    save times must be a whole number of steps. With `runs_independent`, each step runs in
    shares of the runs on the kernel threads, each share in cache (the noise increments
    are drawn for the whole batch step by step, so the steps are not independent as in
    `attnflow.ensembles`)."""
    states = [x0]
    x = x0
    s = noise.first_step
    n_steps = 0
    finite = DeviceFinite()
    step = partial(_noisy_step, drift, field, sigma=noise.sigma, method=method,
                   manifold=manifold)
    for t0, t1 in zip(times[:-1], times[1:]):
        for i in range(round((t1 - t0) / dt)):
            dW = noise.path.increment(s, noise.level).reshape(x.shape)
            if is_tensor(x):  # numpy's counter-based normals, moved to the device per step
                dW = moved(dW, x)
            else:
                dW = dW.astype(x.dtype, copy=False)
            if is_tensor(x):
                x = step(x, dt, dW)
            elif runs_independent and x.ndim > 2:
                flat, flat_dW = x.reshape(-1, *x.shape[-2:]), dW.reshape(-1, *x.shape[-2:])
                out = np.empty_like(flat)

                def share(a: int, b: int, flat=flat, flat_dW=flat_dW, out=out) -> None:
                    out[a:b] = step(flat[a:b], dt, flat_dW[a:b])

                parallel_ranges(share, len(flat), cost=flat.size * flat.shape[-2],
                                grain=grain)
                x = out.reshape(x.shape)
            else:
                x = step(x, dt, dW)
            s += 1
            n_steps += 1
            if not is_tensor(x):
                _check_finite(x, t0 + (i + 1) * dt)
            if progress is not None:
                progress(t0 + (i + 1) * dt)
        if is_tensor(x):
            finite.add(x, t1)
        states.append(x)
    finite.check()
    return Solution(np.asarray(times), namespace(x0).stack(states), n_steps, n_steps, 0,
                    h_min=dt if n_steps else None)


def _noisy_step(drift: Field, field: Field, x: np.ndarray, h: float, dW: np.ndarray,
                sigma: float, method: str, manifold: Manifold) -> np.ndarray:
    """One Euler-Maruyama step x + h D(x) + sigma P_x dW, retracted (or its geodesic variant
    exp_x(h F(x) + sigma P_x dW)); in R^d x + h D(x) + sigma dW."""
    if manifold != SPHERE:
        return x + h * drift(x) + sigma * dW
    if method == "geodesic":
        return exp_map(x, h * field(x) + sigma * project(x, dW))
    D = drift(x)
    if _fusable(x, D, dW):  # one pass instead of six (the noisy W1 step)
        out = np.empty_like(x)
        _em_finish(*(a.reshape(-1, x.shape[-1]) for a in (x, D, dW, out)), h, sigma)
        return out
    return normalize(x + h * D + sigma * project(x, dW))


@njit(nogil=True, cache=True)
def _em_finish(x, D, dW, out, h, sigma):
    """out = normalize((x + h D) + sigma (dW - <x, dW> x)) row by row, (m, d) arrays, with
    numpy's order of operations (sigma = 0: exactly the Euler step)."""
    for r in range(x.shape[0]):
        s = 0.0
        for j in range(x.shape[1]):
            s += x[r, j] * dW[r, j]
        norm2 = 0.0
        for j in range(x.shape[1]):
            y = (x[r, j] + h * D[r, j]) + sigma * (dW[r, j] - s * x[r, j])
            out[r, j] = y
            norm2 += y * y
        norm = np.sqrt(norm2)
        for j in range(x.shape[1]):
            out[r, j] /= norm


# ---------------------------------------------------------------------------- Dormand-Prince
# Butcher tableau of Dormand & Prince (1980), "A family of embedded Runge-Kutta formulae",
# J. Comput. Appl. Math. 6(1), 19-26; dense output of Shampine (1986), Math. Comp. 46, 135-150,
# in the polynomial form used by Hairer, Norsett & Wanner, Solving ODEs I, §II.6.
DP_C = np.array([0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1, 1])
DP_A = [
    [],
    [1 / 5],
    [3 / 40, 9 / 40],
    [44 / 45, -56 / 15, 32 / 9],
    [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
    [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
    [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84],
]
DP_B = np.array([35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0])
DP_E = np.array([71 / 57600, 0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40])
# Dense output: y(t + s h) = y + h * sum_i K_i * (P[i] @ [s, s^2, s^3, s^4]).
DP_P = np.array([
    [1, -8048581381 / 2820520608, 8663915743 / 2820520608, -12715105075 / 11282082432],
    [0, 0, 0, 0],
    [0, 131558114200 / 32700410799, -68118460800 / 10900136933, 87487479700 / 32700410799],
    [0, -1754552775 / 470086768, 14199869525 / 1410260304, -10690763975 / 1880347072],
    [0, 127303824393 / 49829197408, -318862633887 / 49829197408, 701980252875 / 199316789632],
    [0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844],
    [0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423],
])


def _combine(coeffs, ks) -> np.ndarray:
    out = None
    for c, k in zip(coeffs, ks):
        if c != 0:
            c = c if isinstance(k, np.ndarray) else float(c)  # a tensor keeps its dtype
            out = c * k if out is None else out + c * k
    return out


def _dopri5(field, x0, times, dt, rtol, atol, progress, manifold) -> Solution:
    t_end = float(times[-1])
    t = float(times[0])
    x = x0
    f = field(x)
    n_evals = 1
    out = [x0]
    nxt = 1
    h = dt if dt is not None else _initial_step(field, x, f, rtol, atol)
    n_evals += 0 if dt is not None else 1
    n_steps = n_rejected = 0
    while nxt < len(times):
        h = min(h, t_end - t)
        ks = [f]
        for i in range(1, 7):
            ks.append(field(x + h * _combine(DP_A[i], ks)))
        n_evals += 6
        x_new = x + h * _combine(DP_B, ks)
        err = h * _combine(DP_E, ks)
        xp = namespace(x)
        scale = atol + rtol * xp.maximum(xp.abs(x), xp.abs(x_new))
        # (on a device: the one number each step sends to the host, to accept or reject)
        err_norm = float(xp.sqrt(xp.mean((err / scale) ** 2)))
        if not np.isfinite(err_norm):
            _check_finite(x_new, t + h)
        if err_norm <= 1.0:
            t_new = t + h
            while nxt < len(times) and times[nxt] <= t_new * (1 + 1e-14):
                s = (times[nxt] - t) / h
                q = DP_P @ np.array([s, s**2, s**3, s**4])
                out.append(manifold.retract(x + h * _combine(q, ks)))
                nxt += 1
            t, x = t_new, manifold.retract(x_new)
            _check_finite(x, t)
            f = field(x)  # not FSAL after retraction: the field at the retracted point
            n_evals += 1
            n_steps += 1
            if progress is not None:
                progress(t)
            factor = 5.0 if err_norm == 0 else min(5.0, 0.9 * err_norm ** (-1 / 5))
        else:
            n_rejected += 1
            factor = max(0.2, 0.9 * err_norm ** (-1 / 5))
        h *= factor
        if h < 1e-14 * max(1.0, abs(t)):
            raise FloatingPointError(f"dopri5: step size underflow at t = {t:.6g}")
    return Solution(np.asarray(times), namespace(x0).stack(out), n_evals, n_steps, n_rejected)


def _initial_step(field, x, f, rtol, atol) -> float:
    """Starting step of Hairer, Norsett & Wanner (II.4), for a 5th order method."""
    xp = namespace(x)
    scale = atol + rtol * xp.abs(x)
    d0 = float(xp.sqrt(xp.mean((x / scale) ** 2)))
    d1 = float(xp.sqrt(xp.mean((f / scale) ** 2)))
    h0 = 1e-6 if d0 < 1e-5 or d1 < 1e-5 else 0.01 * d0 / d1
    f1 = field(x + h0 * f)
    d2 = float(xp.sqrt(xp.mean(((f1 - f) / scale) ** 2))) / h0
    h1 = max(1e-6, h0 * 1e-3) if max(d1, d2) <= 1e-15 else (0.01 / max(d1, d2)) ** (1 / 5)
    return float(min(100 * h0, h1))


class DeviceFinite:
    """Finiteness of a tensor run's saved states without a host sync per save time: for
    each run the index of the first save time at which its state was non-finite, kept as an
    integer tensor on the states' device (-1 while finite) and read by the host once, in
    `check` (the integrators call it at the end of each `integrate` call: `simulate` makes
    one per layer and per `budget.CHUNK_BYTES` of states). The error names the earliest such
    save time and every run non-finite then, as a check at every save time would."""

    def __init__(self) -> None:
        self.first: Any = None
        self.times: list[float] = []

    def add(self, x: Any, t: float) -> None:
        """Note the state x (..., n, d) at save time t (device operations only)."""
        import torch

        with torch.no_grad():
            bad = ~torch.isfinite(x).all(-1).all(-1)
            if self.first is None:
                self.first = torch.full(bad.shape, -1, dtype=torch.int64, device=bad.device)
            self.first = torch.where(bad & (self.first < 0), len(self.times), self.first)
        self.times.append(t)

    def check(self) -> None:
        """Raise `NonFiniteStateError` at the earliest save time a state was non-finite."""
        if self.first is None:
            return
        if bool((self.first < 0).all()):  # the one read on the host (torch.func's wrapped
            return  # tensors, which have no storage, read a scalar too)
        first = np.asarray(self.first.tolist())
        k = int(first[first >= 0].min())
        runs = [tuple(int(i) for i in idx) for idx in np.argwhere(first == k)]
        raise NonFiniteStateError(float(self.times[k]), runs or [()])


def _check_finite(x: np.ndarray, t: float) -> None:
    if is_tensor(x):
        import torch

        with torch.no_grad():
            finite = torch.isfinite(x).all(-1).all(-1)
            if bool(finite.all()):  # one scalar per step; torch.func's wrapped tensors pass
                return
            ok = finite.cpu().numpy()
    else:
        ok = np.isfinite(x).all(axis=(-1, -2))
    if not np.all(ok):
        runs = [tuple(int(i) for i in idx) for idx in np.argwhere(~np.asarray(ok))]
        raise NonFiniteStateError(float(t), runs or [()])


# ---------------------------------------------------------------------------- driver
def integrate(
    drift: Drift,
    x0: np.ndarray,
    times: np.ndarray,
    method: str = "rk4",
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    progress: Progress | None = None,
    manifold: Manifold | str = SPHERE,
    noise: Noise | None = None,
    t0: float = 0.0,
    grain: int = 1,
    checkpoint: int | None = None,
    runner: Callable[..., np.ndarray] | None = None,
) -> Solution:
    """Advance x0 (..., n, d) from time t0 under the `drift` term (and the `noise` term, an
    SDE: methods in `NOISY`, steps of exactly dt); return the states at `times` (strictly
    increasing, >= t0). See the module docstring for the methods. For the implicit methods,
    which solve run by run, the counts are averages per run. Independent runs are stepped
    in shares that are multiples of `grain` runs. `manifold` is a `Manifold` (or "sphere",
    "euclidean"). torch tensors step on their device with the `TENSOR_METHODS` (no host copy
    per step; the fixed steps' finiteness at the save times is read once at the end,
    `DeviceFinite`), recorded by autograd; `checkpoint` (tensors, fixed steps without
    noise) recomputes chunks of that many steps in the backward
    pass (`attnflow.checkpointing`); `runner` (tensors, fixed steps without noise) replaces
    the loop of m steps between save times, called as runner(step, x, t0, h, m, progress)
    (`attnflow.adjoint.adjoint_runner`: reverse mode by the discrete adjoint)."""
    if not isinstance(drift, Drift):
        raise fail("drift", "an attnflow.integrate.Drift term", type(drift).__name__)
    manifold = as_manifold(manifold)
    keep_start = times[0] == t0
    if not keep_start:
        times = np.concatenate([[t0], times])
    sol = _solve(drift.field, x0, times, method, dt, rtol, atol, progress, drift.euler,
                 drift.jacobian, drift.runs_independent, manifold, noise, drift.splitting,
                 grain, checkpoint, runner)
    if not keep_start:
        sol.times, sol.states = sol.times[1:], sol.states[1:]
    return sol


def _solve(field, x0, times, method, dt, rtol, atol, progress, drift, jacobian,
           runs_independent, manifold, noise, splitting, grain, checkpoint=None,
           runner=None) -> Solution:
    check_tensor_method(x0, method, noise, checkpoint)
    if method == EVENTS:
        raise fail("method", f"one of {METHODS[:-1]} here ({EVENTS!r} integrates hardmax "
                   "models, through attnflow.simulate and attnflow.events)", repr(method))
    if not manifold.geodesic and method in SPHERE_ONLY:
        raise fail("method", f"a method for states in R^d (not {SPHERE_ONLY})", repr(method))
    if splitting is not None and (method != "euler" or noise is not None):
        raise fail("method", "'euler' without noise for blocks in sequential form (their "
                   "sublayers step in turn; form='continuous' integrates the summed field "
                   "with any method)", repr(method) + (" with noise" if noise else ""))
    euler_drift = drift if drift is not None else field
    if noise is not None:
        if method not in NOISY:
            raise fail("method", f"one of {NOISY} with noise", repr(method))
        return _stochastic(field, euler_drift, x0, times, DEFAULT_DT if dt is None else dt,
                           method, progress, manifold, noise, runs_independent, grain)
    if method == "euler":
        field = euler_drift
    if method in FIXED_STEP:
        return _fixed(field, x0, times, DEFAULT_DT if dt is None else dt, method, progress,
                      runs_independent, manifold, grain, splitting, checkpoint, runner)
    rtol = DEFAULT_RTOL if rtol is None else rtol
    atol = DEFAULT_ATOL if atol is None else atol
    if method in IMPLICIT:
        states, work = solve_implicit(field, jacobian, x0, times, method, dt, rtol, atol,
                                      progress, manifold)
        return Solution(np.asarray(times), states, work["n_evals"], work["n_steps"], 0,
                        work["n_jacobians"])
    return _dopri5(field, x0, times, dt, rtol, atol, progress, manifold)
