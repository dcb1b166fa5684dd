"""The integration methods by name, their defaults, and the checks of a run's arguments before
it starts (`check_solver_args`, `check_tensor_method`): what `attnflow.integrate` steps, what
`simulate`, the mean-field solver, sweeps and the CLI validate against."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import describe, fail, finite_array, integer, nonnegative, positive
from attnflow.implicit import IMPLICIT
from attnflow.savetimes import as_times

__all__ = ["DEFAULT_ATOL", "DEFAULT_DT", "DEFAULT_RTOL", "EVENTS", "FIXED_STEP", "GRADIENTS",
           "MAX_STEPS", "METHODS", "NOISY", "SPHERE_ONLY", "TENSOR_METHODS", "check_gradients",
           "check_solver_args", "check_tensor_method"]

EVENTS = "events"  # hardmax (beta = +-inf) only: RK4 with located leader changes (events.py)
METHODS = ("euler", "rk4", "geodesic", "dopri5", *IMPLICIT, EVENTS)
FIXED_STEP = ("euler", "rk4", "geodesic", EVENTS)
NOISY = ("euler", "geodesic")  # the methods that take noise
SPHERE_ONLY = ("geodesic",)
TENSOR_METHODS = ("euler", "rk4", "geodesic", "dopri5")  # the methods that step torch tensors
DEFAULT_DT = 0.05
# How reverse mode differentiates a tensor run: torch's graph of every step, or the discrete
# adjoint of the fixed steps (`attnflow.adjoint`: one state per step, a step recomputed).
GRADIENTS = ("backprop", "adjoint")
# The most steps a run may ask for (`check_solver_args`): t_end / dt for the fixed-step
# methods; the adaptive and implicit ones, whose step count is only known as they go, take
# t_end <= MAX_STEPS * DEFAULT_DT (5e6 layers: beyond any horizon the recipes use, 1e4).
MAX_STEPS = 10**8
DEFAULT_RTOL = 1e-6
DEFAULT_ATOL = 1e-9



def check_tensor_method(x0: Any, method: str, noise: Any = None, checkpoint: Any = None
                        ) -> None:
    """Raise ValueError (one line) for torch tensors with a method that cannot step them
    (implicit solves and event location run on numpy arrays), and for `checkpoint` where it
    does not apply (a positive int, with tensors and fixed steps without noise)."""
    if checkpoint is not None:
        integer("checkpoint", checkpoint, 1, expected="None or a number of steps per chunk >= 1")
    if not is_tensor(x0):
        if checkpoint is not None:
            raise fail("checkpoint", "None for numpy arrays (checkpointing saves memory in "
                       "torch's reverse mode: pass x0 as a tensor)", repr(checkpoint))
        return
    if method not in TENSOR_METHODS:
        grad = " (x0 requires grad: an implicit solve has no autograd path)" if (
            x0.requires_grad and method in IMPLICIT) else ""
        raise fail("method", f"one of {TENSOR_METHODS} for torch tensors (the implicit "
                   f"methods and 'events' run on numpy arrays){grad}", repr(method))
    if checkpoint is not None and (method == "dopri5" or noise is not None):
        raise fail("checkpoint", "None with dopri5 and with noise (checkpointing chunks the "
                   "deterministic fixed steps)", repr(checkpoint))


def check_gradients(gradients: Any, x0: Any, method: str, noise: Any = None) -> str:
    """The reverse-mode strategy (`GRADIENTS`) checked against the run: "adjoint" needs torch
    tensors and a fixed-step method without noise. Returns it."""
    if not isinstance(gradients, str) or gradients not in GRADIENTS:
        raise fail("gradients", f"one of {GRADIENTS}", repr(gradients))
    if gradients == "backprop":
        return gradients
    if not is_tensor(x0):
        raise fail("gradients", "'backprop' for numpy arrays (the adjoint is torch's reverse "
                   "mode: pass x0 as a tensor)", repr(gradients))
    fixed = tuple(m for m in FIXED_STEP if m != EVENTS)
    if method not in fixed:
        raise fail("method", f"one of {fixed} with gradients='adjoint' (the discrete adjoint "
                   "re-runs fixed steps; gradients='backprop' differentiates "
                   f"{method!r})", repr(method))
    if noise is not None:
        raise fail("noise", "None with gradients='adjoint' (it re-runs deterministic steps; "
                   "gradients='backprop' differentiates noisy runs)", repr(noise))
    return gradients


def check_solver_args(
    method: Any, t_end: Any, save_at: Any, dt: Any, rtol: Any, atol: Any
) -> tuple[float, np.ndarray, float | None, float | None, float | None]:
    """Validate the integration arguments; return (t_end, save times, dt, rtol, atol).
    save_at: times, None for `attnflow.savetimes.default_times`, or a text form ("log",
    "log:NUM", "linspace:START:STOP:NUM", "t1,t2,...", "default")."""
    if method not in METHODS:
        raise fail("method", f"one of {METHODS}", repr(method))
    t_end = nonnegative("t_end", t_end)
    dt = None if dt is None else positive("dt", dt)
    rtol = None if rtol is None else positive("rtol", rtol)
    atol = None if atol is None else positive("atol", atol)
    if method in IMPLICIT and dt is not None and t_end > 0 and dt > t_end:
        raise fail("dt", f"a first step <= t_end = {t_end:g} for the implicit method "
                   f"{method!r}", repr(dt))
    if method in FIXED_STEP and (rtol is not None or atol is not None):
        raise fail("rtol/atol", f"None for the fixed-step method {method!r} (use dt)",
                   f"rtol={rtol}, atol={atol}")
    _check_steps(method, t_end, dt)
    times = as_times(save_at, t_end)
    if isinstance(times, (bool, np.bool_)) or getattr(times, "dtype", None) == np.bool_:
        raise fail("save_at", "times (a number or a list of them), a text form or None",
                   repr(save_at))
    save = np.atleast_1d(finite_array("save_at", times, dtype=float))
    if save.ndim != 1 or save.size == 0:
        raise fail("save_at", "a non-empty 1-d list of times", describe(save))
    if np.any(np.diff(save) <= 0) or save[0] < 0 or save[-1] > t_end * (1 + 1e-12):
        raise fail("save_at", f"strictly increasing times in [0, t_end = {t_end}]",
                   describe(save) + f" from {save[0]} to {save[-1]}")
    if save[-1] < t_end:
        save = np.append(save, t_end)
    return t_end, save, dt, rtol, atol


def _check_steps(method: str, t_end: float, dt: float | None) -> None:
    """Refuse a run of more than MAX_STEPS steps before it starts: t_end / dt for the
    fixed-step methods (naming dt when it is the step that is too small), t_end above
    MAX_STEPS * DEFAULT_DT for the others."""
    step = dt if dt is not None and method in FIXED_STEP else DEFAULT_DT
    if t_end <= MAX_STEPS * step:
        return
    if step != DEFAULT_DT and t_end <= MAX_STEPS * DEFAULT_DT:
        raise fail("dt", f"a step >= t_end / {MAX_STEPS:.0e} = {t_end / MAX_STEPS:.3g} (at "
                   f"most {MAX_STEPS:.0e} steps to t_end = {t_end:g})", repr(dt))
    what = (f"{MAX_STEPS:.0e} steps of dt = {step:g}" if method in FIXED_STEP else
            f"{MAX_STEPS:.0e} steps of {DEFAULT_DT:g}: the bound on the adaptive and implicit "
            "methods' horizon")
    raise fail("t_end", f"at most {MAX_STEPS * step:g} ({what})", f"{t_end:g}")
