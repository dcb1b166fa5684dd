"""Input checks shared by the analysis functions."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, number
from attnflow.manifolds import sphere_tolerance


def is_run(X: Any) -> bool:
    """Whether X is a run (a `Trajectory`, recognised by its `times` and `directions`: the
    analysis imports no Trajectory, by the layering)."""
    return hasattr(X, "times") and hasattr(X, "directions") and hasattr(X, "states")


def run_states(name: str, X: Any, directions: bool = True, ndim: int | None = None) -> Any:
    """A run's states (T, ..., n, d) (its token `directions` when `directions`, what clusters
    and Rényi centers measure; the raw states otherwise); any other X unchanged. A function
    of one configuration (`ndim` 2) given a run says which configuration to pass."""
    if not is_run(X):
        return X
    states = X.directions if directions else X.states
    if ndim is not None and states.ndim != ndim:
        raise fail(name, f"an array with {ndim} dimensions (one configuration (n, d): pass "
                   "traj.final or traj.at(t) of a Trajectory)",
                   f"a Trajectory of states of shape {states.shape}")
    return states


def sphere_points(name: str, X: Any, ndim: int | None = None, min_ndim: int = 2) -> np.ndarray:
    """A finite float array of points on the unit sphere, shape (..., n, d) with d >= 2; a
    Trajectory counts as its token directions (T, ..., n, d) (`run_states`)."""
    X = run_states(name, X, ndim=ndim)
    raw = finite_array(name, X, ndim=ndim, min_ndim=None if ndim is not None else min_ndim)
    # the one tolerance of "on the sphere", for the dtype the points were computed in
    tol = sphere_tolerance(raw.dtype if raw.dtype.kind == "f" else np.float64)
    X = raw.astype(float, copy=False)
    if X.shape[-1] < 2 or X.shape[-2] < 1:
        raise fail(name, "an array of shape (..., n, d) with n >= 1 and d >= 2", describe(X))
    off = float(np.max(np.abs(np.linalg.norm(X, axis=-1) - 1.0)))
    if off > tol:
        raise fail(name, f"unit vectors (points on the sphere, norms within {tol:.2g} of 1;"
                   " for pre- or peri-LN states pass their directions, Trajectory.directions)",
                   f"norms off 1 by up to {off:.3g}")
    return X


def radius(name: str, value: Any) -> float:
    """A geodesic radius in [0, pi] (radians)."""
    return number(name, value, 0.0, np.pi, expected="a geodesic radius in [0, pi]")
