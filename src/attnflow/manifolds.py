"""The state spaces of the dynamics: the unit sphere, or R^d with the radius in the state.

A manifold object tells the integrators the little geometry they need, and nothing about
attention: how to retract an ambient step onto the space, how far a state may sit from it in
a given dtype, and whether exponential-map (geodesic) steps make sense there. The
normalisation scheme of a model decides its manifold (`attnflow.family.schemes`): post-LN and
nGPT keep tokens on the sphere, pre- and peri-LN keep them in R^d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import fail
from attnflow.sphere import inner

__all__ = ["EUCLIDEAN", "MANIFOLDS", "SPHERE", "Euclidean", "Manifold", "Sphere",
           "as_manifold", "directions", "sphere_tolerance"]


def directions(X: np.ndarray) -> np.ndarray:
    """theta = x / |x| row by row, (..., n, d) (tensors stay tensors)."""
    if not isinstance(X, np.ndarray) and is_tensor(X):
        return X / inner(X, X).sqrt()
    return X / np.sqrt(inner(X, X))


def sphere_tolerance(dtype: Any) -> float:
    """How far from 1 the norms of tokens "on the sphere" may be in this dtype: 1e-8 in
    float64, 64 ulps (7.6e-6) in float32, whose unit vectors are off by ~6e-8. The one
    tolerance for "on the sphere" everywhere in attnflow."""
    if not isinstance(dtype, np.dtype) and str(dtype).startswith("torch."):
        dtype = np.dtype(str(dtype).removeprefix("torch."))
    return max(1e-8, 64 * float(np.finfo(dtype).eps))


@dataclass(frozen=True)
class Manifold:
    """Base class of the state spaces (see the module docstring)."""

    name: ClassVar[str] = ""
    geodesic: ClassVar[bool] = False  # exponential-map steps available

    def retract(self, X: np.ndarray) -> np.ndarray:
        """The state after an ambient step X (..., n, d)."""
        raise NotImplementedError

    def tolerance(self, dtype: Any) -> float:
        """How far a state of this dtype may sit off the manifold (0: anywhere is on it)."""
        return 0.0

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Sphere(Manifold):
    """The unit sphere S^{d-1} of every token: states renormalised after every step."""

    name: ClassVar[str] = "sphere"
    geodesic: ClassVar[bool] = True

    def retract(self, X: np.ndarray) -> np.ndarray:
        return directions(X)

    def tolerance(self, dtype: Any) -> float:
        return sphere_tolerance(dtype)


@dataclass(frozen=True)
class Euclidean(Manifold):
    """R^d for every token: the radius is part of the state, no retraction."""

    name: ClassVar[str] = "euclidean"

    def retract(self, X: np.ndarray) -> np.ndarray:
        return X


SPHERE = Sphere()
EUCLIDEAN = Euclidean()
MANIFOLDS: dict[str, Manifold] = {m.name: m for m in (SPHERE, EUCLIDEAN)}


def as_manifold(manifold: Manifold | str, name: str = "manifold") -> Manifold:
    """A manifold object from itself or its name ("sphere", "euclidean")."""
    if isinstance(manifold, Manifold):
        return manifold
    if isinstance(manifold, str) and manifold in MANIFOLDS:
        return MANIFOLDS[manifold]
    raise fail(name, f"a Manifold or one of {tuple(MANIFOLDS)}", repr(manifold))
