"""What a picture reads from a Trajectory: token directions, times, and the layer in use.

Pictures code against the model protocol only: ``model.layers`` (a tuple of layers, one for
tied weights), ``model.layer_at(t)`` (the layer acting at time t; layer L acts on [L, L + 1))
and, on each layer, ``beta``, ``heads``, ``memory``, ``mask`` and ``attention_matrix``. So any
model, a Stack of mixed layers included, is drawn the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._array import to_numpy
from attnflow._checks import fail, positive
from attnflow.analysis.clusters import default_cluster_tol, length_scale
from attnflow.trajectory import Trajectory


def _trajectory(traj: Any) -> Trajectory:
    """traj itself, if it is a Trajectory."""
    if not isinstance(traj, Trajectory):
        raise TypeError(f"traj: expected an attnflow.Trajectory, received {type(traj).__name__}")
    return traj


def _causal_marks(traj: Trajectory, centers: bool | None) -> bool:
    """Whether to draw the causal annotations (Rényi centers, which are defined by arrival
    order): as asked, or by default for causal runs only (every layer's mask lower
    triangular), not for full attention."""
    if centers is not None and not isinstance(centers, (bool, np.bool_)):
        raise fail("centers", "True, False or None (None: for causal runs only)", repr(centers))
    return bool(_trajectory(traj).model.is_causal if centers is None else centers)


def _runs(traj: Any, raw: bool = False) -> np.ndarray:
    """The trajectory's token directions x / |x| as (T, runs, n, d) (what is drawn: the states
    themselves on the sphere, their directions for pre- and peri-LN runs in R^d), or with
    `raw` its states (what a layer acts on); a run on torch tensors is drawn from a host copy."""
    T, n, d = len(_trajectory(traj).times), traj.n, traj.d
    return to_numpy(traj.states if raw else traj.directions).reshape(T, -1, n, d)


def _states(traj: Trajectory, run: int | None, raw: bool = False) -> np.ndarray:
    """Directions (or raw states) of one run, (T, n, d), or of all runs, (T, runs, n, d) when
    run is None."""
    states = _runs(traj, raw)
    if run is None:
        return states
    n_runs = states.shape[1]
    if isinstance(run, bool) or not isinstance(run, (int, np.integer)) or not 0 <= run < n_runs:
        raise fail("run", f"a run index in [0, {n_runs})", repr(run))
    return states[:, run]


def _finite(name: str, X: np.ndarray, times: np.ndarray) -> np.ndarray:
    """X (T, ...) with finite entries, else an error that says where it is not."""
    ok = np.isfinite(X)
    if not ok.all():
        bad = ~ok.reshape(len(times), -1).all(axis=1)
        raise fail(name, "finite token positions",
                   f"{int(np.size(X) - np.count_nonzero(ok))} non-finite entries, the first at "
                   f"t = {times[np.argmax(bad)]:g}")
    return X


def _time_index(times: np.ndarray, t: Any, name: str = "t") -> int:
    """Index of the saved time nearest to t; t must lie within the saved range."""
    try:
        t = float(t)
    except (TypeError, ValueError) as err:
        raise fail(name, "a time (a number)", repr(t)) from err
    lo, hi = float(times[0]), float(times[-1])
    slack = 1e-9 * max(1.0, abs(lo), abs(hi))
    if not (np.isfinite(t) and lo - slack <= t <= hi + slack):
        raise fail(name, f"a time in the saved range [{lo:g}, {hi:g}]", repr(t))
    return int(np.argmin(np.abs(times - t)))


def _time_range(times: np.ndarray, t_range: Any) -> np.ndarray:
    """Indices of the saved times in the closed interval t_range = (t_min, t_max)."""
    if t_range is None:
        return np.arange(len(times))
    try:
        lo, hi = (float(v) for v in t_range)
    except (TypeError, ValueError) as err:
        raise fail("t_range", "a pair (t_min, t_max)", repr(t_range)) from err
    idx = np.flatnonzero((times >= lo) & (times <= hi))
    if idx.size == 0:
        raise fail("t_range", f"an interval containing a saved time (saved: {len(times)} times "
                   f"in [{times[0]:g}, {times[-1]:g}])", repr(t_range))
    return idx


# --------------------------------------------------------------------------- layers
def _layer(traj: Trajectory, layer: Any, t: float = 0.0) -> tuple[int, Any]:
    """(index, layer): traj.model.layers[layer], or with layer=None the layer acting at time t
    (`model.layer_at(t)`; layer L acts on [L, L + 1), so its index is floor(t), clipped to the
    layers there are: 0 for tied weights)."""
    layers = traj.model.layers
    if layer is not None:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or \
                not 0 <= layer < len(layers):
            raise fail("layer", f"a layer index in [0, {len(layers)})", repr(layer))
        return int(layer), layers[layer]
    return int(min(max(np.floor(t), 0), len(layers) - 1)), traj.model.layer_at(t)


def _beta(traj: Trajectory, t: float) -> float:
    """The beta of the layer acting at time t: what the default radii below are made of."""
    return float(_layer(traj, None, t)[1].beta)


def _delta(beta: float, delta: float | None) -> float:
    """The Rényi radius: given, or 4 |beta|^{-1/2} as in all the paper's figures
    (docs/science.md §3; `attnflow.analysis.clusters.length_scale`, beta of either sign), capped at
    pi
    (for |beta| < 16 / pi^2 the ball is the whole sphere)."""
    if delta is not None:
        return positive("delta", delta)
    if not 0 < abs(beta) < np.inf:
        raise fail("delta", "a radius (the default 4 |beta|^{-1/2} needs a finite beta != 0)",
                   "None")
    return min(float(np.pi), 4.0 * length_scale(beta))


def _tol(beta: float, tol: float | None) -> float:
    """The cluster tolerance: given, or |beta|^{-1/2} / 4 (1e-2 when beta = 0), as the CLI's."""
    if tol is not None:
        return positive("tol", tol)
    return default_cluster_tol(beta)
