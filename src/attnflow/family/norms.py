"""Token normalisations used by the schemes and QK-norm: the direction x / |x| (the
idealisation of the theory), RMSNorm with a gain (trained decoders) and LayerNorm with a gain
and a bias (BERT-style encoders).

    Direction:  N(x) = x / |x|
    RMSNorm:    N(x) = g * x / sqrt(mean(x^2) + eps)      (mean over the last axis, size e)
    LayerNorm:  N(x) = g * (x - mean(x)) / sqrt(var(x) + eps) + b

With eps = 0 and g = 1, RMSNorm(x) = sqrt(e) x / |x|: the two differ by a constant factor
that a model may fold into its weights. Both act row by row on (..., n, e) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import check_parameter, like, namespace
from attnflow._checks import describe, fail, nonnegative
from attnflow.manifolds import directions
from attnflow.sphere import inner

__all__ = ["Direction", "LayerNorm", "Norm", "RMSNorm", "norm_from_record", "unit"]


def unit(A: np.ndarray) -> np.ndarray:
    """A / |A| row by row, 0 where A = 0."""
    if not isinstance(A, np.ndarray):
        xp = namespace(A)
        norm = inner(A, A).sqrt()
        return xp.where(norm > 0, A / xp.where(norm > 0, norm, xp.ones_like(norm)), 0.0)
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
            object.__setattr__(self, "gain", check_parameter("gain", self.gain, ndim=1))
        object.__setattr__(self, "eps", nonnegative("eps", self.eps))

    def check(self, size: int | None, name: str) -> None:
        if self.gain is not None and size is not None and self.gain.shape[0] != size:
            raise fail(f"{name}.gain", f"a gain of shape ({size},)", describe(self.gain))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        xp = namespace(x)
        y = x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return y if self.gain is None else y * like(self.gain, x)

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


@dataclass(frozen=True, eq=False)
class LayerNorm(Norm):
    """g * (x - mean(x)) / sqrt(var(x) + eps) + b over the last axis (size e); gain g and bias
    b of shape (e,) (None: ones, zeros), eps >= 0 (BERT: 1e-12)."""

    gain: Any = None
    bias: Any = None
    eps: float = 1e-12

    def __post_init__(self) -> None:
        for attr in ("gain", "bias"):
            a = getattr(self, attr)
            if a is not None:
                object.__setattr__(self, attr, check_parameter(attr, a, ndim=1))
        object.__setattr__(self, "eps", nonnegative("eps", self.eps))

    def check(self, size: int | None, name: str) -> None:
        for attr in ("gain", "bias"):
            a = getattr(self, attr)
            if a is not None and size is not None and a.shape[0] != size:
                raise fail(f"{name}.{attr}", f"an array of shape ({size},)", describe(a))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        xp = namespace(x)
        c = x - xp.mean(x, axis=-1, keepdims=True)
        y = c / xp.sqrt(xp.mean(c * c, axis=-1, keepdims=True) + self.eps)
        if self.gain is not None:
            y = y * like(self.gain, x)
        return y if self.bias is None else y + like(self.bias, x)

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        e = x.shape[-1]
        c = x - np.mean(x, axis=-1, keepdims=True)
        r = np.sqrt(np.mean(c * c, axis=-1) + self.eps)[..., None, None]
        centre = np.eye(e, dtype=x.dtype) - 1.0 / e
        J = centre / r - c[..., :, None] * c[..., None, :] / (e * r**3)
        return J if self.gain is None else self.gain[:, None] * J

    def to_record(self, prefix: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta: dict[str, Any] = {"kind": "layer", "eps": self.eps}
        arrays = {}
        for attr in ("gain", "bias"):
            a = getattr(self, attr)
            if a is not None:
                meta[attr] = f"{prefix}{attr}"
                arrays[f"{prefix}{attr}"] = a
        return meta, arrays


def norm_from_record(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Norm:
    """Inverse of `Norm.to_record`."""
    if meta["kind"] == "direction":
        return Direction(bool(meta.get("zero_safe", False)))
    if meta["kind"] == "rms":
        return RMSNorm(arrays[meta["gain"]] if "gain" in meta else None, meta["eps"])
    if meta["kind"] == "layer":
        return LayerNorm(*(arrays[meta[a]] if a in meta else None for a in ("gain", "bias")),
                         meta["eps"])
    raise fail("record", "a norm of kind 'direction', 'rms' or 'layer'",
               repr(meta.get("kind")))
