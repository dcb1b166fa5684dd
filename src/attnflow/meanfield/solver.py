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
keeps the transport's Courant number at 0.5 (|v|max: |V|_2, times e^{|beta| c} for
unnormalised and positional weights); a dt above 2 / (K |v|max) is refused (RK4's stability
bound for the transport of the highest mode is 2 sqrt 2 / (K |v|max)).

Resolution: after every step the solver checks that every label's density is resolved: the
modes above 2 K / 3 below `tol` (relative l2, `attnflow.meanfield.initial.tail`) and no value
below -tol / (2 pi) at the collocation points; with Chebyshev labels also the coefficients
of degree above 2 (S - 1) / 3 in s below `tol` (`attnflow.meanfield.labels.Labels.tail`).
When clusters concentrate the density past what K modes resolve, the first failing step's time
is recorded as `resolution_lost_at`, the run stops, and the result ends with the last resolved
step: it never returns an unresolved density. With `refine_to`, the solver first doubles K
(and halves the step) from the last resolved state, as often as refine_to allows.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from attnflow._checks import fail, integer, number
from attnflow._memory import check_allocation
from attnflow.errors import NonFiniteStateError
from attnflow.family import Block
from attnflow.integrate import rk4_step
from attnflow.manifolds import EUCLIDEAN
from attnflow.meanfield import sphere, zonal
from attnflow.meanfield.density import label_scheme
from attnflow.meanfield.initial import DEFAULT_TAIL, check_coefficients, tail
from attnflow.meanfield.labels import Labels
from attnflow.meanfield.model import MeanFieldModel
from attnflow.meanfield.result import MeanFieldResult, check_path
from attnflow.meanfield.spectral import TransportField, to_grid
from attnflow.methods import check_solver_args

__all__ = ["DEFAULT_DT", "solve"]

DEFAULT_DT = 0.05
COURANT = 0.5  # the default step's Courant number K |v|max dt
MAX_COURANT = 2.0  # refused above (RK4 is stable up to 2 sqrt 2 on imaginary eigenvalues)


def solve(model: Block | Mapping[str, Any], rho0: Any, t_end: float, *,
          save_at: Any = None, noise: float | None = None, dt: float | None = None,
          tol: float = DEFAULT_TAIL, refine_to: int | None = None,
          scheme: str | None = None, alibi: float | None = None,
          path: str | os.PathLike | None = None, d: int | None = None) -> MeanFieldResult:
    """Solve the mean-field equation of `model` from the density rho0 up to t_end.

    Parameters
    ----------
    model : an `attnflow.Attention` block, or its keyword arguments as a dict: d = 2, one
        (Q, K, V) head with Q^T K a multiple of an orthogonal matrix, any V, mask "full" or
        "causal", attention "softmax", "unnormalised" or "positional", post-LN
        (`attnflow.meanfield.model`). Its particles' n -> infinity limit is what is solved.
    rho0 : Fourier coefficients (K + 1,) or (S, K + 1) (`from_function`, `from_tokens`,
        `from_coefficients`): one density for the full mask; for the causal mask one per
        label of the `scheme` (token i of n has the label i / n).
        On S^2: spherical-harmonic coefficients (S, L + 1, L + 1) (`from_function` with
        d = 3, `from_tokens` of (n, 3) tokens; `attnflow.meanfield.sphere`): a 3-d array
        means S^2, and the model's d, if set, must be 3. K below is then the degree L;
        labels, schemes, ALiBi and weightings are as on the circle.
    t_end : final time >= 0 (one unit = one layer).
    save_at : increasing save times in [0, t_end] (default 101 evenly spaced); 0 and t_end
        are always saved.
    noise : sigma >= 0 of attnflow's SDE dX = F dt + sigma P_X dW (`attnflow.simulate`):
        on the circle theta does Brownian motion of variance sigma^2 t, so the density gains
        the Fokker-Planck term (sigma^2 / 2) d_theta^2 rho (on S^2: (sigma^2 / 2) times the
        Laplace-Beltrami operator, degree l damped at sigma^2 l (l + 1) / 2). None: no noise.
    dt : the largest step (default: module docstring).
    tol : the resolution bound (module docstring).
    refine_to : None (default: stop where resolution is lost), or the most modes to refine
        to: an unresolved step is then retried from the last resolved state with twice the
        modes (zero-padded) and half the step, as long as 2 K <= refine_to.
    scheme : the causal mask's labels (`attnflow.meanfield.labels`): "cells" (S label
        cells ((j - 1) / S, j / S], j = 1..S, second order at best, for states not smooth
        in s) or "chebyshev" (S Chebyshev-Lobatto labels from s = 0 to 1, spectral for
        states smooth in s). None (default): the scheme rho0 carries (a `Density` from
        `from_function`, `from_tokens`, `from_coefficients(c, scheme)`; its labels sit at
        that scheme's nodes), "cells" for a plain array. A scheme that contradicts the one
        rho0 carries is refused (`attnflow.meanfield.density`).
    alibi : ALiBi's slope lambda >= 0 per unit label (causal mask): label s weighs label
        s' <= s by e^{-lambda (s - s')}. The particles' `ALiBi(m)` (bias -m (i - j), slope m
        per token) at n tokens is lambda = m n. None: no ALiBi.
    path : if given, the result is also saved there (``.nc`` or ``.zarr``), atomically:
        an interrupted run leaves no file.
    d : the dimension of the space holding the sphere S^{d-1}: None (2 for Fourier
        coefficients, 3 for a 3-d array of spherical-harmonic coefficients) or an integer
        d >= 4 for zonal densities on S^{d-1}, rho0 their Gegenbauer coefficients (L + 1,) or
        (S, L + 1) (`attnflow.meanfield.zonal`: V a multiple of the identity; K below is the
        degree L).

    Returns a `MeanFieldResult` (its `resolution_lost_at` says whether and when the run
    stopped for lack of resolution; settings["refinements"] lists [time, new K] of each
    refinement, and every saved state is padded to the final K). Raises ValueError for
    unsupported settings (naming what is supported) and `NonFiniteStateError` if a state
    becomes non-finite.
    """
    tol = number("tol", tol, 0.0, low_open=True)
    scheme = label_scheme(rho0, scheme)
    rho0 = np.asarray(rho0)  # a Density's plain coefficients
    d = _dimension(d, rho0)
    mf = MeanFieldModel.of(model, alibi, d)
    c = (check_coefficients(rho0, "rho0", tol) if d == 2
         else sphere.check_coefficients(rho0, "rho0", tol) if d == 3
         else zonal.check_coefficients(rho0, "rho0", tol, d))
    S, K = c.shape[0], c.shape[-1] - 1
    labels = Labels.of(scheme, S, mf.slope) if mf.causal else None
    if labels is not None and (in_s := _label_tail(labels, c, d)) > tol:
        raise fail("rho0", f"densities resolved in s by {S} {scheme} labels (Chebyshev "
                   f"coefficients above degree 2 (S - 1) / 3 below {tol:g} relative; more "
                   "labels or a smoother start)", f"a tail of {in_s:.3g}")
    if not mf.causal and S != 1:
        raise fail("rho0", "one density (K + 1,) or (1, K + 1) for the full mask (label cells "
                   "are for mask 'causal')", f"{S} label densities")
    if refine_to is not None:
        integer("refine_to", refine_to, K,
                expected=f"None or an integer number of modes >= K = {K}")
        check_allocation("refine_to", 16 * 8 * S * (refine_to + 1), f"{refine_to} modes for "
                         f"{S} label(s) (complex, the state and its stages: eight copies)")
    t_end, times, dt, _, _ = check_solver_args("rk4", t_end, save_at, dt, None, None)
    sigma = 0.0 if noise is None else number("noise", noise, 0.0, expected="sigma >= 0")
    if path is not None:
        check_path(path)
    start = time.perf_counter()
    axisymmetric = d == 3 and sphere.keeps_axisymmetry(c, mf.V)
    if axisymmetric:  # the round-off of a zonal start's orders m > 0 (sphere.AXISYMMETRIC_TOL)
        c[..., 1:] = 0
    march = _March(mf, labels or S, K, sigma, dt, axisymmetric)
    grid_times = np.concatenate([[0.0], times]) if times[0] > 0 else times
    saved_times, saved = [0.0], [c]
    refinements: list[list[float]] = []
    lost = None
    t = 0.0
    n_steps = 0
    for t1 in grid_times[1:]:
        while t < t1 and lost is None:
            m = max(1, math.ceil((t1 - t) / march.dt * (1 - 1e-12)))
            h, t0 = float((t1 - t) / m), t
            for i in range(m):
                new = march.step(c, h)
                n_steps += 1
                if not np.all(np.isfinite(new)):
                    raise NonFiniteStateError(t0 + (i + 1) * h, [(0,)])
                if march.resolved(new, tol):
                    c, t = new, (t0 + (i + 1) * h if i < m - 1 else float(t1))
                elif refine_to is not None and 2 * march.modes <= refine_to:
                    march = _March(mf, labels or S, 2 * march.modes, sigma, march.dt / 2,
                                   axisymmetric)
                    c = _padded(c, march.modes)
                    refinements.append([t, march.modes])
                    break
                else:
                    lost = t0 + (i + 1) * h
                    break
        if lost is not None:
            if t > saved_times[-1]:
                saved_times.append(t)
                saved.append(c)
            break
        saved_times.append(float(t1))
        saved.append(c)
    result = MeanFieldResult(
        times=np.array(saved_times),
        coefficients=np.stack([_padded(x, march.modes) for x in saved]), model=mf.block,
        settings={"modes": march.modes, "labels": S if mf.causal else None,
                  "scheme": scheme if mf.causal else None, "alibi": mf.slope, "noise": sigma,
                  **({"d": 3, "axisymmetric": axisymmetric} if d == 3 else
                     {"d": d, "zonal": True} if d > 3 else {}),
                  "dt": march.dt, "steps": n_steps, "tol": tol, "points": march.field.points,
                  "method": "rk4" if sigma == 0 else "lawson-rk4",
                  "refinements": refinements},
        resolution_lost_at=lost, wall_time=time.perf_counter() - start)
    if path is not None:
        result.save(path)
    return result


class _March:
    """What depends on the number of modes K (on S^2: the degree L): the transport field,
    the step (checked against the Courant bound) and the noise factors."""

    def __init__(self, mf: MeanFieldModel, labels: int | Labels, modes: int, sigma: float,
                 dt: float | None, axisymmetric: bool = False) -> None:
        self.modes = modes
        self.d = mf.d
        self.sphere = mf.d == 3
        self.field: TransportField | sphere.TransportField2 | zonal.ZonalField = (
            TransportField(mf, labels, modes) if mf.d == 2 else
            sphere.TransportField2(mf.b, mf.V, mf.weighting, labels, modes, axisymmetric)
            if mf.d == 3 else
            zonal.ZonalField(mf.d, mf.b, float(mf.V[0, 0]), mf.weighting, labels, modes))
        speed = self.field.speed_bound()
        if dt is None:
            dt = min(DEFAULT_DT, COURANT / (modes * speed)) if speed > 0 else DEFAULT_DT
        elif speed > 0 and dt > MAX_COURANT / (modes * speed):
            raise fail("dt", f"a step <= {MAX_COURANT / (modes * speed):.3g} (Courant number "
                       f"K |v|max dt <= {MAX_COURANT:g} for K = {modes} modes, |v|max = "
                       f"{speed:.3g})", repr(dt))
        self.dt = dt
        self.sigma = sigma
        k = np.arange(modes + 1)
        # the heat semigroup's rates: k^2 on the circle, l (l + d - 2) on S^{d-1} (on S^2
        # along the rows l)
        self._rates = (k * (k + mf.d - 2)) * (sigma * sigma / 2)
        if self.sphere:
            self._rates = self._rates[:, None]
        self._factors: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def step(self, c: np.ndarray, h: float) -> np.ndarray:
        """One step of size h: RK4 without noise, integrating-factor RK4 with it."""
        if self.sigma == 0:
            return rk4_step(self.field, c, h, EUCLIDEAN)
        if h not in self._factors:
            half = np.exp(-self._rates * h / 2)  # e^{-sigma^2 k^2 h / 4}
            self._factors[h] = (half * half, half)
        return _lawson_rk4(self.field, c, h, *self._factors[h])

    def resolved(self, c: np.ndarray, tol: float) -> bool:
        """True when every label's density is resolved (module docstring)."""
        labels = self.field.labels
        if self.d > 3:
            grid = self.field.grid
            return bool(zonal.tail(c, grid).max() <= tol and zonal.minimum(c, grid) >= -tol
                        and (labels is None or _label_tail(labels, c, self.d) <= tol))
        if self.sphere:
            return bool(sphere.tail(c).max() <= tol
                        and sphere.minimum(c, self.field.grid) >= -tol
                        and (labels is None or sphere.label_tail(labels, c) <= tol))
        return bool(tail(c).max() <= tol
                    and to_grid(c, self.field.points).min() * 2 * np.pi >= -tol
                    and labels.tail(c) <= tol)


def _label_tail(labels: Labels, c: np.ndarray, d: int) -> float:
    """The resolution measure in s of states c on the circle (S, K + 1), S^2 (S, L + 1,
    L + 1) or, zonal, S^{d-1} (S, L + 1)."""
    if d == 2:
        return labels.tail(c)
    if d == 3:
        return sphere.label_tail(labels, c)
    return zonal.label_tail(labels, c, d)


def _dimension(d: Any, rho0: Any) -> int:
    """The d of `solve` (its docstring), checked against the shape of rho0."""
    ndim = np.ndim(rho0)
    if d is None:
        return 3 if ndim == 3 else 2
    d = integer("d", d, 2, expected="None or an integer d >= 2")
    if (d == 3) != (ndim == 3):
        raise fail("rho0", f"coefficients for d = {d}: (S, L + 1, L + 1) spherical-harmonic "
                   "coefficients for d = 3, (K + 1,) or (S, K + 1) otherwise",
                   f"an array of {ndim} dimensions")
    return int(d)


def _padded(c: np.ndarray, modes: int) -> np.ndarray:
    """Coefficients (S, K + 1) with zeros up to mode `modes` (S^2: (S, L + 1, L + 1) up to
    degree `modes`)."""
    grow = modes + 1 - c.shape[-1]
    return np.pad(c, ((0, 0), (0, grow)) if c.ndim == 2 else ((0, 0), (0, grow), (0, grow)))


def _lawson_rk4(field: TransportField, u: np.ndarray, h: float, full: np.ndarray,
                half: np.ndarray) -> np.ndarray:
    """One integrating-factor RK4 step of du/dt = -D u + F(u), D = diag(sigma^2 k^2 / 2):
    RK4 on w = e^{D t} u (full = e^{-D h}, half = e^{-D h / 2})."""
    a = field(u)
    b = field(half * (u + (h / 2) * a))
    c = field(half * u + (h / 2) * b)
    d = field(full * u + h * half * c)
    return full * u + (h / 6) * (full * a + 2 * half * (b + c) + d)
