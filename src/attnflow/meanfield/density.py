"""Densities that carry their label scheme: `Density`, the coefficient array that
`from_function` and `from_tokens` return, and `label_scheme`, how `solve` reads it.

A causal mean-field state is one density per label, and the labels sit where their scheme
puts them (`attnflow.meanfield.labels`: cell midpoints or Chebyshev-Lobatto nodes): the same
array of coefficients means different states under the two schemes. The scheme is given
once, where the densities are made, and travels with them: `Density` is a numpy array (every
array operation works on it as on its coefficients) with the attribute `scheme`, kept by
operations that keep its labels (copies, arithmetic, slices of modes) and dropped (None) by
those that change the label axis (the first). A plain array has no scheme: `solve` reads
it in the scheme it is told, "cells" by default.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.meanfield.labels import SCHEMES

__all__ = ["DEFAULT_SCHEME", "Density", "label_scheme"]

DEFAULT_SCHEME = "cells"  # the scheme of a plain array of coefficients


class Density(np.ndarray):
    """Coefficients of one density per label (axis 0: labels; the other axes: modes, as the
    plain arrays of `attnflow.meanfield.initial`) with `scheme`: "cells", "chebyshev", or
    None (no labels: made without them, or an operation changed the label axis)."""

    scheme: str | None

    def __new__(cls, coefficients: Any, scheme: str | None) -> Density:
        if scheme is not None and scheme not in SCHEMES:
            raise fail("scheme", f"one of {SCHEMES} or None", repr(scheme))
        out = np.asarray(coefficients).view(cls)
        out.scheme = scheme
        return out

    def __array_finalize__(self, obj: Any) -> None:
        same_labels = (isinstance(obj, np.ndarray) and obj.ndim == self.ndim >= 1
                       and obj.shape[0] == self.shape[0])
        self.scheme = getattr(obj, "scheme", None) if same_labels else None

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (dask, multiprocessing) keep the scheme
        constructor, args, state = super().__reduce__()  # type: ignore[misc]
        return constructor, args, (state, self.scheme)

    def __setstate__(self, state: tuple[Any, str | None]) -> None:
        base, self.scheme = state
        super().__setstate__(base)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, scheme={self.scheme!r})"


def label_scheme(rho0: Any, scheme: str | None) -> str:
    """The scheme `solve` reads rho0 in: the one it carries (a `Density`), which an explicit
    `scheme` must equal; for a plain array (or a Density without labels) `scheme`, or
    "cells" when None."""
    carried = rho0.scheme if isinstance(rho0, Density) else None
    if scheme is not None and scheme not in SCHEMES:
        raise fail("scheme", f"one of {SCHEMES} or None (the scheme rho0 carries)",
                   repr(scheme))
    if carried is not None and scheme is not None and scheme != carried:
        raise fail("scheme", f"None or {carried!r}, the scheme rho0 was made with (its "
                   f"labels sit at the {carried} scheme's nodes)", repr(scheme))
    return carried or scheme or DEFAULT_SCHEME
