"""Input checks shared by the analysis functions.

The analysis computes with the array it is given (`attnflow._array.namespace`): numpy
arrays, or torch tensors on their device and in their autograd graph. A combinatorial
quantity (a count, a set of indices) has no gradient: given a tensor that requires grad it
refuses in one line naming its differentiable neighbour (`host`); given a tensor without
grad it computes on a host copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._array import check_tokens, is_tensor, namespace, to_numpy
from attnflow._checks import describe, fail, finite_array, number
from attnflow.manifolds import directions, sphere_tolerance

# What the combinatorial quantities name as their differentiable neighbours.
SMOOTH = "order_parameter (|mean x|), mean_pairwise_cosine or energy"


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


def host(name: str, X: Any, quantity: str, instead: str = SMOOTH) -> Any:
    """X for a computation on the host: a tensor without grad as a numpy copy, anything else
    as it is; a tensor that requires grad is refused in one line (`quantity` is not
    differentiable; `instead` names what is)."""
    if not is_tensor(X):
        return X
    if X.requires_grad:
        raise fail(name, f"an array or a tensor without gradients ({quantity} is not "
                   f"differentiable; differentiable instead: {instead})",
                   f"{describe(X)} that requires grad")
    return to_numpy(X)


def tokens(name: str, X: Any, min_n: int = 1, of_run: str = "states") -> Any:
    """Finite float tokens (..., n, d) with n >= min_n and d >= 1: a numpy array
    (`finite_array`, float64) or a floating tensor as it is (checked on its device, kept in
    its graph). A Trajectory counts as its states (its directions with of_run="directions")."""
    X = run_states(name, X, directions=of_run == "directions")
    if is_tensor(X):
        X = check_tokens(name, X)
    else:
        X = finite_array(name, X, min_ndim=2, dtype=float)
    if X.shape[-2] < min_n or X.shape[-1] < 1:
        raise fail(name, f"tokens of shape (..., n, d) with n >= {min_n} and d >= 1",
                   describe(X))
    return X


def unit_directions(name: str, X: Any, min_n: int = 1, as_they_are: bool = True) -> Any:
    """The directions x / |x| of tokens (..., n, d) (`tokens`; numpy or a tensor in its
    graph). With `as_they_are`, X itself when its norms are within `sphere_tolerance` of 1
    (tokens on the sphere used as they are), else `Trajectory.directions`' division
    (`manifolds.directions`); without, always X / |X| (the battery's measures of direction).
    A token with |x| = 0 has no direction."""
    X = tokens(name, X, min_n)
    if is_tensor(X):
        norms = namespace(X).linalg.vector_norm(X.detach(), axis=-1, keepdims=True)
    else:
        norms = np.linalg.norm(X, axis=-1, keepdims=True)
    if as_they_are and (0 in tuple(norms.shape) or float(abs(norms - 1.0).max())
                        <= sphere_tolerance(X.dtype)):
        return X
    zero = int((norms == 0).sum())
    if zero:
        raise fail(name, "tokens with nonzero norm (their directions are measured)",
                   f"{zero} zero tokens")
    if as_they_are:
        return directions(X)
    if is_tensor(X):  # the norms again, in the graph
        return X / namespace(X).linalg.vector_norm(X, axis=-1, keepdims=True)
    return X / norms


def sphere_points(name: str, X: Any, ndim: int | None = None, min_ndim: int = 2,
                  quantity: str | None = None, instead: str = SMOOTH) -> np.ndarray:
    """A finite float array of points on the unit sphere, shape (..., n, d) with d >= 2; a
    Trajectory counts as its token directions (T, ..., n, d) (`run_states`). A tensor goes
    through `host` (refused with grad, naming `quantity` and `instead`)."""
    X = host(name, run_states(name, X, ndim=ndim), quantity or "this quantity", instead)
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
