"""Initial densities: Fourier coefficients (S, K + 1) from a function, from coefficients or
from tokens (docs/science.md §9), as a `Density`: the array with its label scheme
(`attnflow.meanfield.density`), which `solve` reads.

Coefficients c[s, k] (complex) mean rho_s(theta) = sum_{|k| <= K} c[s, k] e^{i k theta},
c[s, -k] = conj(c[s, k]), each label's density of mass 1 (c[s, 0] = 1 / (2 pi)). S = 1 is the
full mask's one density; S > 1 label cells ((j - 1) / S, j / S], j = 1..S, for the causal mask.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.fft as sfft

from attnflow._checks import describe, fail, finite_array, integer, positive
from attnflow._memory import check_allocation
from attnflow.meanfield import sphere, zonal
from attnflow.meanfield.density import Density, label_scheme
from attnflow.meanfield.labels import label_nodes, token_cells

__all__ = ["DEFAULT_TAIL", "check_coefficients", "from_coefficients", "from_function",
           "from_tokens", "tail"]

DEFAULT_TAIL = 1e-8  # the resolution bound on the top third of the modes (`tail`)


def tail(c: np.ndarray) -> np.ndarray:
    """The resolution measure of each label (S,): the l2 norm of the modes k > 2 K / 3,
    relative to c[s, 0] = 1 / (2 pi). Small (e.g. < 1e-8) for a resolved smooth density;
    it grows fast once structures narrower than about 2 pi / K form."""
    K = c.shape[-1] - 1
    return np.sqrt(np.sum(np.abs(c[..., 2 * K // 3 + 1:]) ** 2, axis=-1)) * 2 * np.pi


def check_coefficients(c: Any, name: str = "rho0", tol: float = DEFAULT_TAIL) -> np.ndarray:
    """Validate coefficients (K + 1,) or (S, K + 1): finite, K >= 3, real mode 0 equal to
    1 / (2 pi) (mass 1 per label, to 1e-12 relative) and resolved (`tail` <= tol); returns
    them as a complex (S, K + 1) array."""
    arr = np.asarray(c)
    if arr.ndim not in (1, 2) or arr.shape[-1] < 4 or not (
            np.issubdtype(arr.dtype, np.number) and np.all(np.isfinite(arr))):
        raise fail(name, "finite Fourier coefficients of shape (K + 1,) or (S, K + 1), K >= 3",
                   describe(arr))
    arr = np.atleast_2d(arr).astype(complex)
    mass = 2 * np.pi * arr[:, 0]
    if not np.allclose(mass, 1.0, rtol=0, atol=1e-12):
        raise fail(name, "densities of mass 1 (mode 0 = 1 / (2 pi) for every label)",
                   f"masses {np.round(mass, 15)[:5].tolist()}")
    arr[:, 0] = 1 / (2 * np.pi)
    worst = float(tail(arr).max())
    if worst > tol:
        raise fail(name, f"a density resolved by its {arr.shape[1] - 1} modes (the modes above "
                   f"2 K / 3 below {tol:g} relative; more modes or a smoother start)",
                   f"a tail of {worst:.3g}")
    lowest = float(np.fft.irfft(arr * (points := 4 * arr.shape[1]), n=points).min())
    if lowest < -tol / (2 * np.pi):  # the solver's own test of a resolved state
        raise fail(name, "a density >= 0 (to -tol / (2 pi))", f"a minimum of {lowest:.3g}")
    return arr


def from_coefficients(c: Any, scheme: str | None = None) -> Density:
    """Coefficients (K + 1,) or (S, K + 1) checked by `check_coefficients`; (S, K + 1).
    A 3-d array (S, L + 1, L + 1) is a density on S^2 (`attnflow.meanfield.sphere`).
    `scheme`: the label scheme of the S labels ("cells" or "chebyshev"; None: the one `c`
    carries if it is a `Density`, else none, and `solve` reads it as told); one that
    contradicts the scheme `c` carries is refused."""
    if isinstance(c, Density) and c.scheme is not None:
        scheme = label_scheme(c, scheme)
    c = np.asarray(c)
    if np.ndim(c) == 3:
        return Density(sphere.check_coefficients(c, "c", DEFAULT_TAIL), scheme)
    return Density(check_coefficients(c, "c"), scheme)


def from_function(f: Callable[..., Any], modes: int, labels: int | None = None,
                  tol: float = DEFAULT_TAIL, scheme: str = "cells", *, d: int = 2
                  ) -> Density:
    """The coefficients (S, K + 1) of rho(theta) = f(theta) (labels None: S = 1) or of
    f(s, theta) at the S labels s of the `scheme` (`attnflow.meanfield.labels`: "cells", the
    cells' midpoints (j - 1/2) / S; "chebyshev", the Chebyshev-Lobatto nodes from 0 to 1)
    (arrays broadcast: s of shape (S, 1), theta of shape (P,)). f >= 0, not necessarily
    normalised: each label's density is
    scaled to mass 1. f is sampled at P = max(8 K, 256) points; the modes above K must be
    negligible (below `tol` relative), or the start is refused as unresolved.

    d = 3: a density on S^2, f(x) of points x (..., 3) returning (...,), or f(s, x) at the
    labels (s of shape (S, 1, 1), returning (S, ...)), as spherical-harmonic coefficients
    (S, L + 1, L + 1) of degree L = modes (`attnflow.meanfield.sphere`; sampled on the
    quadrature grid of degree 2 L). d >= 4: a zonal density on S^{d-1}, f(z) of z = <x, e> in
    [-1, 1] (or f(s, z), s of shape (S, 1)), as Gegenbauer coefficients (S, L + 1)
    (`attnflow.meanfield.zonal`; solve with the same d).

    Returns a `Density`: the coefficients with their `scheme` (None without labels), which
    `solve` reads (a different explicit scheme there is refused)."""
    K = _modes(modes)
    integer("d", d, 2, expected="2 (the circle), 3 (S^2) or more (zonal densities on S^{d-1})")
    S = 1 if labels is None else _labels(labels)
    _check_size(K, S, d)
    arity = _arity(f)
    if arity is not None and arity != (1 if labels is None else 2):
        raise fail("labels", "an integer S >= 1 (labels) for f(s, x) of two arguments, "
                   "None for f(x) of one", f"{labels!r} with f of {arity} arguments")
    s = None if labels is None else label_nodes(scheme, S)
    carried = None if labels is None else scheme
    if d == 3:
        return Density(sphere.from_values(f, K, tol, s), carried)
    if d > 3:
        return Density(zonal.from_values(f, int(d), K, tol, s), carried)
    P = max(8 * K, 256)
    theta = 2 * np.pi * np.arange(P) / P
    values = finite_array("f", f(theta) if labels is None else f(s[:, None], theta),
                          dtype=float)
    try:
        values = np.broadcast_to(values, (S, P))
    except ValueError:
        raise fail("f", f"values of shape ({P},) or ({S}, {P}) at the sample points",
                   describe(values)) from None
    if values.min() < 0 or np.any(values.sum(axis=-1) <= 0):
        raise fail("f", "a density: values >= 0 with positive mass", f"minimum {values.min()}")
    coeffs = sfft.rfft(values, axis=-1) / P
    coeffs /= 2 * np.pi * coeffs[:, :1].real
    beyond = float(np.max(np.sqrt(np.sum(np.abs(coeffs[:, K + 1:]) ** 2, axis=-1))) * 2 * np.pi)
    if beyond > tol:
        raise fail("modes", f"enough modes to resolve f (its modes above K = {K} below "
                   f"{tol:g} relative)", f"{K}, which leaves {beyond:.3g}")
    return Density(check_coefficients(coeffs[:, :K + 1], "f", tol), carried)


def from_tokens(x: Any, modes: int, width: float, labels: int | None = None,
                tol: float = DEFAULT_TAIL) -> Density:
    """The empirical measure of tokens x (n, 2) on the circle, smoothed by the wrapped normal
    kernel of standard deviation `width` (radians; mode k scaled by e^{-k^2 width^2 / 2},
    i.e. the heat kernel), as coefficients (S, K + 1). With `labels` S, token i (0-based)
    carries the label (i + 1) / n and each label cell ((j - 1) / S, j / S] averages its
    tokens (every cell needs one). The smoothed density must be resolved by K modes.

    Tokens (n, 3) on S^2 give coefficients (S, L + 1, L + 1) of degree L = modes, smoothed
    by the heat kernel (degree l scaled by e^{-l (l + 1) width^2 / 2}), per label cell as on
    the circle. Returns a `Density` of scheme "cells" (None without labels)."""
    K = _modes(modes)
    x = finite_array("x", x, ndim=2, dtype=float)
    if x.shape[1] not in (2, 3) or len(x) == 0:
        raise fail("x", "tokens of shape (n, 2) on the circle or (n, 3) on S^2, n >= 1",
                   describe(x))
    w = positive("width", width)
    n = len(x)
    S = 1 if labels is None else _labels(labels)
    check_allocation("modes", 32 * n * (K + 1), f"K = {K} modes x n = {n} tokens (their "
                     "complex waves, twice)")
    cell = token_cells(n, S)
    carried = None if labels is None else "cells"
    if x.shape[1] == 3:
        return Density(sphere.from_points(x, K, w, tol, None if labels is None else cell),
                       carried)
    theta = np.arctan2(x[:, 1], x[:, 0])
    waves = np.exp(-1j * np.outer(theta, np.arange(K + 1)))  # (n, K + 1)
    counts = np.bincount(cell, minlength=S)
    sums = np.zeros((S, K + 1), dtype=complex)
    np.add.at(sums, cell, waves)
    c = sums / counts[:, None] / (2 * np.pi) * np.exp(-0.5 * (np.arange(K + 1) * w) ** 2)
    return Density(check_coefficients(c, "x", tol), carried)


def _arity(f: Callable[..., Any]) -> int | None:
    """The number of positional arguments f requires (1 or 2 here), None when it cannot be
    told (a ufunc, *args) or it is not 1 or 2."""
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    required = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                   for p in params)
    return required if required in (1, 2) else None


def _check_size(K: int, S: int, d: int) -> None:
    """Refuse, naming modes, K modes whose sampling cannot fit in memory: on S^2 the tables
    of the grid of degree 2 L (the harmonics, their derivatives and a complex copy: four
    float64 arrays of (2 L + 1)^2 N_theta) and S samples per grid point (three copies);
    on S^{d-1}, d >= 4, the Gegenbauer tables of degree 2 L at its nodes (four copies); on
    the circle S x P samples (P = max(8 K, 256)) and their transform (four copies)."""
    G = max(2 * K, 16)  # the sampling grids' degree on S^2 and S^{d-1}
    if d == 3:
        n_theta, n_phi = sphere.grid_shape(G)
        nbytes = 32 * (G + 1) ** 2 * n_theta + 24 * S * n_theta * n_phi
    elif d > 3:
        nbytes = 32 * (G + 1) * ((3 * G + 4) // 2 + S)
    else:
        nbytes = 32 * S * max(8 * K, 256)
    check_allocation("modes, labels", nbytes, f"K = {K} modes for {S} label(s) on "
                     f"S^{d - 1}")


def _modes(modes: Any) -> int:
    return integer("modes", modes, 3, expected="an integer K >= 3")


def _labels(labels: Any) -> int:
    return integer("labels", labels, 1,
                   expected="an integer S >= 1 (the number of label cells) or None")
