"""Time series: counts of clusters and centers, spread, and angles on the circle against time;
any registered quantity against time (`plot_metric`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from attnflow._array import to_numpy
from attnflow._checks import fail
from attnflow.analysis.clusters import cluster_count
from attnflow.analysis.metrics import METRICS
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers
from attnflow.plot._input import (
    _beta,
    _causal_marks,
    _delta,
    _finite,
    _states,
    _time_range,
    _tol,
    _trajectory,
)
from attnflow.plot._style import (
    COLUMN,
    RED,
    STYLE,
    _figure,
    _pi_axis,
    _plain_log,
    _token_colorbar,
    _token_colors,
)
from attnflow.sphere import geodesic_distance
from attnflow.trajectory import Trajectory


def _positive_times(times: np.ndarray, t_range: Any) -> np.ndarray:
    """Indices of the saved times > 0 in t_range (for a log time axis)."""
    idx = _time_range(times, t_range)
    idx = idx[times[idx] > 0]
    if idx.size == 0:
        raise fail("t_range", "a range with a saved time > 0 (log time axis)", repr(t_range))
    return idx


def _series(traj: Trajectory, run: int | None, t_range: Any, tol: float, delta: float,
            centers: bool = True) -> dict[str, np.ndarray]:
    """What `plot_timeseries` draws, each (T', runs) at the selected positive times (the
    center counts only with `centers`)."""
    X = _states(traj, run)
    X = X if run is None else X[:, None]
    times = traj.times
    idx = _positive_times(times, t_range)
    start = _finite("traj", X[:1, :, :1], times[:1])  # x_1(0) of each run, (1, runs, 1, d)
    X = _finite("traj", X[idx], times[idx])
    shape = X.shape[:2]
    out = {"t": times[idx], "clusters": np.asarray(cluster_count(X, tol)),
           "spread": geodesic_distance(X, start).max(axis=-1)}
    if centers:
        configurations = X.reshape(-1, *X.shape[2:])
        for key, find in (("renyi", renyi_centers), ("strong", strong_renyi_centers)):
            out[key] = np.array([len(find(x, delta)) for x in configurations]).reshape(shape)
    return out


def plot_timeseries(
    traj: Trajectory,
    *,
    run: int | None = None,
    t_range: tuple[float, float] | None = None,
    tol: float | None = None,
    delta: float | None = None,
    centers: bool | None = None,
    ax: Sequence[Axes] | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Counts and spread of the tokens against time, on a log time axis.

    Top panel: the number of single-linkage clusters at geodesic tolerance tol (default
    beta^{-1/2} / 4; `attnflow.analysis.clusters.cluster_count`) and the numbers of Rényi and strong
    Rényi centers of radius delta (default 4 beta^{-1/2}, at most pi) of the configuration at
    each time (docs/science.md §4); the centers by default for causal runs only
    (`centers=None`; they are defined by the arrival order, which full attention does not
    have). Bottom panel: max_k d(x_k(t), x_1(0)), the largest
    geodesic distance to the first token's start, which tends to 0 when all tokens join
    x_1(0) (Theorem 4.1).
    Meta-stable plateaus show as flat stretches (docs/science.md §3). t = 0 is left out (log axis).
    Token directions x / |x| are counted (the states themselves on the sphere); the default
    tol and delta take beta from the layer acting at the first time shown (for tied weights,
    the model's beta), and hold at every time.

    For a batch, run=None (default) draws the mean over runs and a 10th-90th percentile band;
    run=i draws one run. `ax` is a pair of Axes (counts, spread). Cost: the centers are
    recomputed at every saved time of every run, O(T runs n^2 d).
    """
    beta = _beta(traj, _trajectory(traj).times[_positive_times(traj.times, t_range)[0]])
    tol, delta = _tol(beta, tol), _delta(beta, delta)
    centers = _causal_marks(traj, centers)
    data = _series(traj, run, t_range, tol, delta, centers)
    t = data["t"]
    if figsize is None:
        figsize = (COLUMN, 3.8)
    with mpl.rc_context(STYLE):
        fig, (top, bottom) = _figure(ax, figsize, 2) if ax is not None else _stacked(figsize)
        lines = (("clusters", f"clusters (tol = {tol:.2g})", "k", "-"),
                 ("renyi", f"Rényi centers (δ = {delta:.2g})", "0.45", "--"),
                 ("strong", f"strong Rényi centers (δ = {delta:.2g})", RED, ":"))
        for key, label, color, ls in lines:
            if key in data:
                _band(top, t, data[key], label, color, ls)
        top.set_yscale("log")
        _plain_log(top.yaxis, (1, 2, 3, 5))
        top.set_ylim(bottom=0.8)  # counts are >= 1: keep 1, 2, 3, 5 in view
        top.set_ylabel("count")
        runs = data["spread"].shape[1]
        top.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), borderaxespad=0.2,
                   title=f"mean and 10-90% band of {runs} runs" if runs > 1 else None,
                   title_fontsize=STYLE["legend.fontsize"], alignment="left")
        _band(bottom, t, data["spread"], "", "k", "-")
        bottom.set_ylim(0, 1.05 * np.pi)
        _pi_axis(bottom.yaxis)
        bottom.set_ylabel("rad")
        bottom.set_title("max$_k$ d(x$_k$(t), x$_1$(0))",
                         loc="left", fontsize=STYLE["legend.fontsize"])
        for a in (top, bottom):
            a.set_xscale("log")
        _plain_log(bottom.xaxis)
        bottom.set_xlabel("t (log scale)")
        fig.align_ylabels([top, bottom])
    return fig


def _stacked(figsize: tuple[float, float]) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, list(fig.subplots(2, 1, sharex=True, height_ratios=(3, 2)))


def _band(a: Axes, t: np.ndarray, y: np.ndarray, label: str, color: str, ls: str,
          center: Any = np.mean) -> None:
    """y (T, runs): the line itself for one run; else `center` (the mean, or np.median) over
    runs and a 10-90% band."""
    if y.shape[1] == 1:
        a.plot(t, y[:, 0], color=color, ls=ls, label=label)
        return
    a.plot(t, center(y, axis=1), color=color, ls=ls, label=label)
    lo, hi = np.percentile(y, [10, 90], axis=1)
    a.fill_between(t, lo, hi, color=color, alpha=0.2, lw=0)


def plot_metric(
    traj: Trajectory,
    name: str,
    *,
    run: int | None = None,
    t_range: tuple[float, float] | None = None,
    log_time: bool = False,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
    **context: Any,
) -> Figure:
    """Any registered quantity (`attnflow.analysis.metrics.METRICS`) of a run against time:
    `Trajectory.metric(name, **context)` at the saved times (context: tol=, delta=, beta=,
    modes=, ...; the defaults of the layer acting at each time otherwise).

    For a batch, run=None (default) draws the median over runs and a 10th-90th percentile
    band; run=i draws one run. A vector-valued entry ("mean_direction", "fourier_moduli")
    draws one line per component. log_time: a log time axis (t = 0 left out). The y label
    gives the entry's units, the title its description. A run on tensors is drawn from a
    host copy of the values.
    """
    traj = _trajectory(traj)
    if not isinstance(log_time, (bool, np.bool_)):
        raise fail("log_time", "True or False", repr(log_time))
    idx = _positive_times(traj.times, t_range) if log_time else _time_range(traj.times,
                                                                            t_range)
    values = np.asarray(to_numpy(traj.metric(name, **context)), dtype=float)  # checks name
    entry = METRICS[name]
    T, batch = len(traj.times), traj.batch_shape
    values = values.reshape(T, int(np.prod(batch)), -1)  # (T, runs, components)
    if run is not None:
        if isinstance(run, bool) or not isinstance(run, (int, np.integer)) or \
                not 0 <= run < values.shape[1]:
            raise fail("run", f"a run index in [0, {values.shape[1]})", repr(run))
        values = values[:, run:run + 1]
    values, t = values[idx], traj.times[idx]
    with mpl.rc_context(STYLE):
        fig, (a,) = _figure(ax, figsize or (COLUMN, 2.6))
        k = values.shape[2]
        for j in range(k):
            color = "k" if k == 1 else mpl.colormaps["viridis"](j / max(1, k - 1))
            _band(a, t, values[:, :, j], f"component {j + 1}" if k > 1 else name, color, "-",
                  center=np.median)
        if log_time:
            a.set_xscale("log")
            _plain_log(a.xaxis)
        a.set_xlabel("t (log scale)" if log_time else "t")
        a.set_ylabel(f"{name} ({entry.units})" if entry.units != "1" else name)
        a.set_title(entry.description, loc="left", fontsize=STYLE["legend.fontsize"],
                    wrap=True)
        runs = values.shape[1]
        if k > 1 or runs > 1:
            a.legend(title=f"median and 10-90% band of {runs} runs" if runs > 1 else None,
                     title_fontsize=STYLE["legend.fontsize"])
    return fig


def plot_angles(
    traj: Trajectory,
    *,
    run: int = 0,
    t_range: tuple[float, float] | None = None,
    log_time: bool = True,
    colorbar: bool = True,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Angles phi_k(t) - phi_1(0) of tokens on the circle against time (d = 2).

    The angle is measured from the first token's starting point x_1(0), where all tokens end
    (Theorem 4.1), and unwrapped in time so paths stay continuous (it may leave [-pi, pi]).
    On a log time axis (t = 0 is then left out) meta-stable clusters show as bundles of flat
    lines that merge. Tokens are coloured by index.
    """
    X = _states(traj, run)
    times = traj.times
    if traj.d != 2:
        raise fail("traj", "tokens on the circle (d = 2) for plot_angles", f"d = {traj.d}")
    idx = _positive_times(times, t_range) if log_time else _time_range(times, t_range)
    X = _finite("traj", X, times)
    phi = np.arctan2(X[..., 1], X[..., 0]) - np.arctan2(X[0, 0, 1], X[0, 0, 0])
    phi = np.unwrap(np.angle(np.exp(1j * phi)), axis=0)[idx]
    if figsize is None:
        figsize = (COLUMN, 2.6 + (0.35 if colorbar else 0.0))
    with mpl.rc_context(STYLE):
        fig, (a,) = _figure(ax, figsize)
        lines = np.stack([np.broadcast_to(times[idx][:, None], phi.shape), phi], -1)
        # early tokens on top, as in plot_circle
        a.add_collection(LineCollection(lines.transpose(1, 0, 2)[::-1],
                                        colors=_token_colors(traj.n)[::-1], lw=0.7))
        a.autoscale()
        if log_time:
            a.set_xscale("log")
            _plain_log(a.xaxis)
        a.set_xlabel("t (log scale)" if log_time else "t")
        a.set_ylabel(r"$\varphi_k(t) - \varphi_1(0)$  (π ≡ −π)")
        _pi_axis(a.yaxis)
        if colorbar:
            _token_colorbar(fig, [a], traj.n, causal=traj.model.is_causal)
    return fig
