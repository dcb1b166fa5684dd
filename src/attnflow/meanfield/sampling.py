"""Tokens drawn from a mean-field density: the bridge from densities back to particles
(docs/science.md §9, "Particles and densities"; guide: docs/guide/meanfield.md).

A density is given by its Fourier coefficients (K + 1,), (1, K + 1) or (S, K + 1) (the
solver's shapes, `attnflow.meanfield.initial`) or by a `MeanFieldResult` at one of its saved
times. Tokens come out as points (n, 2) on the circle, in the order of their labels: token i
(0-based) carries the label s_i = (i + 1) / n (`token_labels`), as `from_tokens` and the
solver read them, and is drawn from the density of its label cell ((j - 1) / S, j / S]
(one density, S = 1, serves every label). Two ways to draw:

* ``"iid"``: independent draws F^{-1}(U), U uniform (a numpy Generator from `seed`): the
  empirical measure's moments fluctuate by n^{-1/2} and its Wasserstein distance to the
  density falls like n^{-1/2} (`attnflow.analysis.moments`);
* ``"quantile"``: deterministic, the m tokens of a label cell at the levels (r + 1/2) / m,
  r = 0..m - 1, in increasing angle from 0 (in label order): Wasserstein distance
  pi / (2 m) (1 + O(1 / m)) radians from a smooth positive density (docs/science.md §9), and
  smooth moments exact to the midpoint rule's (geometric) error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import as_generator, fail, integer
from attnflow._memory import check_allocation
from attnflow.analysis.closedforms import inverse_cdf
from attnflow.meanfield.density import Density
from attnflow.meanfield.initial import DEFAULT_TAIL
from attnflow.meanfield.result import MeanFieldResult
from attnflow.meanfield.spectral import to_grid

__all__ = ["METHODS", "density_at", "sample", "token_labels"]

METHODS = ("iid", "quantile")


def token_labels(n: int) -> np.ndarray:
    """The labels s_i = (i + 1) / n (n,) of tokens i = 0..n - 1 (the causal mask's positions
    in (0, 1]; token i sees the tokens j <= i)."""
    return (np.arange(_count(n)) + 1) / n


def density_at(source: Any, t: float | None = None) -> Density:
    """The coefficients (S, K + 1) of a density: `source` is coefficients (K + 1,),
    (1, K + 1) or (S, K + 1), or a `MeanFieldResult` read at its saved time `t` (None: the
    last; a time in its range that is not saved, or one off its range, is refused).
    Checked: finite, mass 1 per label to 1e-12, and nowhere below -tol / (2 pi) on a grid of
    max(8 (K + 1), 1024) angles (tol = 1e-8, the solver's own bound of a resolved state).
    Returned as a `Density` with the label scheme of the result (or the one `source`
    carries), so that `solve` continues from it in the same labels."""
    scheme = source.scheme if isinstance(source, Density) else None
    if isinstance(source, MeanFieldResult):
        scheme = source.settings.get("scheme")
        times = source.times
        if t is None:
            i = len(times) - 1
        else:
            i = int(np.argmin(np.abs(times - t)))
            if not (np.isfinite(t) and abs(times[i] - t) <= 1e-9 * max(1.0, abs(t))):
                raise fail("t", f"one of the result's saved times in [{times[0]:g}, "
                           f"{times[-1]:g}] ({len(times)} saves; None for the last)", repr(t))
        c = source.coefficients[i]
    else:
        if t is not None:
            raise fail("t", "None for coefficients (a time only with a MeanFieldResult)",
                       repr(t))
        c = source
    arr = np.asarray(c)
    if arr.ndim not in (1, 2) or arr.shape[-1] < 2 or not np.issubdtype(
            arr.dtype, np.number) or not np.all(np.isfinite(arr)):
        raise fail("density", "finite Fourier coefficients (K + 1,) or (S, K + 1), or a "
                   "MeanFieldResult", f"an array of shape {arr.shape}" if isinstance(
                       c, np.ndarray) else type(c).__name__)
    arr = np.atleast_2d(arr).astype(complex)
    mass = 2 * np.pi * arr[:, 0].real
    if not np.allclose(mass, 1.0, rtol=0, atol=1e-12):
        worst = int(np.argmax(np.abs(mass - 1)))
        raise fail("density", "densities of mass 1 (c[:, 0] = 1 / (2 pi))",
                   f"mass {mass[worst]:.15g} (label {worst})")
    points = max(8 * arr.shape[1], 1024)
    lowest = to_grid(arr, points).min(axis=-1) * 2 * np.pi
    if lowest.min() < -DEFAULT_TAIL:
        worst = int(np.argmin(lowest))
        raise fail("density", "a density >= 0 everywhere (to -1e-8 / (2 pi))",
                   f"a minimum of {lowest[worst] / (2 * np.pi):.3g} (label {worst})")
    return Density(arr, scheme)


def sample(source: Any, n: int, *, t: float | None = None, method: str = "iid",
           seed: int | np.random.Generator | None = None) -> np.ndarray:
    """n tokens (n, 2) on the circle drawn from a density (module docstring).

    source : coefficients (K + 1,), (1, K + 1) or (S, K + 1), or a `MeanFieldResult`
        (`density_at`).
    n : the number of tokens, >= 1 (for S label cells, at least S: every cell gets one).
    t : the saved time of a `MeanFieldResult` (None: its last).
    method : "iid" (independent draws) or "quantile" (deterministic, at the levels
        (r + 1/2) / m of each cell's m tokens).
    seed : for "iid": an int, a numpy Generator or None.

    Token i carries the label (i + 1) / n (`token_labels`) and is drawn from its label
    cell's density: the tokens are in label order, ready for a causal `attnflow.simulate`.
    """
    c = density_at(source, t)
    n = _count(n)
    if method not in METHODS:
        raise fail("method", f"one of {METHODS}", repr(method))
    S = c.shape[0]
    if n < S:
        raise fail("n", f"at least S = {S} tokens (one per label cell)", repr(n))
    cell = np.ceil(token_labels(n) * S).astype(int) - 1  # label (i + 1) / n
    cell = np.clip(cell, 0, S - 1)
    counts = np.bincount(cell, minlength=S)
    rng = as_generator(seed) if method == "iid" else None
    theta = np.empty(n)
    start = 0
    for j, m in enumerate(counts):  # a cell's tokens are consecutive
        levels = rng.random(m) if rng is not None else (np.arange(m) + 0.5) / m
        theta[start:start + m] = inverse_cdf(c[j], levels)
        start += m
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def _count(n: Any) -> int:
    """n tokens, >= 1, whose labels, angles and (n, 2) float64 tokens (eight numbers a token
    at the peak) fit in memory."""
    n = integer("n", n, 1, expected="an integer number of tokens >= 1")
    check_allocation("n", 64 * n, f"{n} tokens (labels, angles and (n, 2) float64 tokens)")
    return n
