"""Token normalisations used by the schemes and QK-norm: the direction x / |x| (the
idealisation of the theory) and RMSNorm with a gain (trained decoders).

    Direction:  N(x) = x / |x|
    RMSNorm:    N(x) = g * x / sqrt(mean(x^2) + eps)      (mean over the last axis, size e)

With eps = 0 and g = 1, RMSNorm(x) = sqrt(e) x / |x|: the two differ by a constant factor
that a model may fold into its weights. Both act row by row on (..., n, e) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, nonnegative
from attnflow.manifolds import directions
from attnflow.sphere import inner

__all__ = ["Direction", "Norm", "RMSNorm", "norm_from_record", "unit"]


def unit(A: np.ndarray) -> np.ndarray:
    """A / |A| row by row, 0 where A = 0."""
    norm = np.sqrt(inner(A, A))
    return np.divide(A, norm, out=np.zeros_like(A), where=norm > 0)


@dataclass(frozen=True)
class Norm:
    """Base class of the token normalisations (module docstring)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def check(self, size: int | None, name: str) -> None:
        """Raise ValueError if the norm cannot act on vectors of this size (None: unknown)."""

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        """dN/dx per row: (..., n, e, e)."""
        raise NotImplementedError

    def to_record(self, prefix: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        raise NotImplementedError


@dataclass(frozen=True)
class Direction(Norm):
    """x / |x| (zero rows stay zero on outputs, where a sublayer may give 0)."""

    zero_safe: bool = False

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return unit(x) if self.zero_safe else directions(x)

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        r = np.sqrt(inner(x, x))[..., None]
        t = x / r[..., 0]
        eye = np.eye(x.shape[-1], dtype=x.dtype)
        return (eye - t[..., :, None] * t[..., None, :]) / r

    def to_record(self, prefix: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"kind": "direction", "zero_safe": self.zero_safe}, {}


@dataclass(frozen=True, eq=False)
class RMSNorm(Norm):
    """g * x / sqrt(mean(x^2) + eps); gain g of shape (e,) (None: ones), eps >= 0."""

    gain: Any = None
    eps: float = 0.0

    def __post_init__(self) -> None:
        if self.gain is not None:
            gain = finite_array("gain", self.gain, ndim=1)
            if not np.issubdtype(gain.dtype, np.floating):
                gain = gain.astype(float)
            object.__setattr__(self, "gain", gain)
        object.__setattr__(self, "eps", nonnegative("eps", self.eps))

    def check(self, size: int | None, name: str) -> None:
        if self.gain is not None and size is not None and self.gain.shape[0] != size:
            raise fail(f"{name}.gain", f"a gain of shape ({size},)", describe(self.gain))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return y if self.gain is None else y * self.gain.astype(x.dtype, copy=False)

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        e = x.shape[-1]
        r = np.sqrt(np.mean(x * x, axis=-1) + self.eps)[..., None, None]
        eye = np.eye(e, dtype=x.dtype)
        J = eye / r - x[..., :, None] * x[..., None, :] / (e * r**3)
        return J if self.gain is None else self.gain[:, None] * J

    def to_record(self, prefix: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta: dict[str, Any] = {"kind": "rms", "eps": self.eps}
        if self.gain is None:
            return meta, {}
        return {**meta, "gain": f"{prefix}gain"}, {f"{prefix}gain": self.gain}


def norm_from_record(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Norm:
    """Inverse of `Norm.to_record`."""
    if meta["kind"] == "direction":
        return Direction(bool(meta.get("zero_safe", False)))
    if meta["kind"] == "rms":
        return RMSNorm(arrays[meta["gain"]] if "gain" in meta else None, meta["eps"])
    raise fail("record", "a norm of kind 'direction' or 'rms'", repr(meta.get("kind")))
