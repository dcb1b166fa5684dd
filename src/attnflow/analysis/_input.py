"""Input checks shared by the analysis functions."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, number
from attnflow.manifolds import sphere_tolerance


def sphere_points(name: str, X: Any, ndim: int | None = None, min_ndim: int = 2) -> np.ndarray:
    """A finite float array of points on the unit sphere, shape (..., n, d) with d >= 2."""
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
