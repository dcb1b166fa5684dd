"""Brownian paths for the noisy dynamics, counter-based and refinable (docs/science.md §6).

A `BrownianPath` is a standard Brownian motion W in R^(n d) for every run, defined on the grid
of step dt0 / 2^level of [0, infinity) for any level >= 0:

* level 0: the increment over coarse step k is sqrt(dt0) Z(k, 0);
* level l: each increment of level l - 1 (an interval of length h) is split at its midpoint by
  the Brownian bridge, halves dW / 2 + (sqrt(h) / 2) Z and dW / 2 - (sqrt(h) / 2) Z, with fresh
  normals Z(k, l).

So halving the step refines the same path (what a strong-convergence measurement needs), and
the increments at one level, summed in pairs, are exactly those of the level above.

The normals Z(k, l) of a block of `RUN_BLOCK` consecutive runs come from their own
counter-based stream (numpy's Philox keyed by the seed, counter (block, k, l)), drawn run by
run: the noise of a run depends only on the seed, its index and the level, never on how many
runs are simulated with it, how they are split among threads, or which Dask worker runs them.
"""

from __future__ import annotations

import numpy as np

from attnflow._checks import integer
from attnflow.parallel import parallel_ranges

__all__ = ["BrownianPath", "RUN_BLOCK"]

RUN_BLOCK = 32  # runs per random stream (streams are generated in parallel)


class BrownianPath:
    """Brownian increments for `runs` runs of shape `shape` (n, d) each.

    seed : a non-negative int (the key of every stream).
    runs : number of independent runs (leading axes of the states, flattened).
    shape : the shape of one run's state, (n, d).
    dt0 : the coarse step (level 0).
    """

    def __init__(self, seed: int, runs: int, shape: tuple[int, ...], dt0: float) -> None:
        self.seed = integer("seed", seed, 0,
                            expected="a non-negative int (the key of the Brownian path)")
        self.runs = runs
        self.shape = tuple(shape)
        self.dt0 = float(dt0)
        self._key = np.random.SeedSequence(self.seed).generate_state(2, np.uint64)
        self._cached: tuple[int, int, np.ndarray] | None = None

    def normals(self, k: int, level: int, count: int) -> np.ndarray:
        """Z(k, level): `count` standard normal arrays per run, (count, runs, *shape)."""
        out = np.empty((self.runs, count, *self.shape))

        def fill(a: int, b: int) -> None:
            for block in range(a // RUN_BLOCK, -(-b // RUN_BLOCK)):
                lo, hi = block * RUN_BLOCK, min(self.runs, (block + 1) * RUN_BLOCK)
                bits = np.random.Philox(key=self._key, counter=[0, block, k, level])
                np.random.Generator(bits).standard_normal(out=out[lo:hi])

        parallel_ranges(fill, self.runs, cost=out.size * 20, grain=RUN_BLOCK)
        return np.moveaxis(out, 1, 0)

    def coarse_increments(self, k: int, level: int) -> np.ndarray:
        """The 2^level increments of W over coarse step k at that level, in time order:
        shape (2^level, runs, *shape)."""
        if self._cached is not None and self._cached[:2] == (k, level):
            return self._cached[2]
        inc = self.normals(k, 0, 1)
        inc *= np.sqrt(self.dt0)
        for lvl in range(1, level + 1):
            h = self.dt0 / 2 ** (lvl - 1)  # length of the intervals being split
            half = inc / 2 + (np.sqrt(h) / 2) * self.normals(k, lvl, len(inc))
            inc = np.stack([half, inc - half], axis=1).reshape(2 * len(inc), *inc.shape[1:])
        self._cached = (k, level, inc)
        return inc

    def increment(self, step: int, level: int) -> np.ndarray:
        """W(t_{s+1}) - W(t_s) on the grid of step dt0 / 2^level, (runs, *shape)."""
        k, i = divmod(step, 2 ** level)
        return self.coarse_increments(k, level)[i]
