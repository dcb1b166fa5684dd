"""The circle: tokens at one or several times, clusters, Rényi centers (Fig. 2 of the paper)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnflow._checks import fail
from attnflow.analysis.clusters import Clusters, clusters
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers
from attnflow.plot._input import (
    _beta,
    _causal_marks,
    _delta,
    _finite,
    _layer,
    _states,
    _time_index,
    _tol,
)
from attnflow.plot._style import (
    COLUMN,
    RED,
    STYLE,
    _blank,
    _figure,
    _time_label,
    _token_colorbar,
    _token_colors,
)
from attnflow.plot.projection import Frame, frame
from attnflow.trajectory import Trajectory


def plot_circle(
    traj: Trajectory,
    t: float | Sequence[float] | None = None,
    *,
    run: int = 0,
    color: str = "index",
    centers: bool | None = None,
    delta: float | None = None,
    centers_from: float | str | None = "start",
    tol: float | None = None,
    basis: Any = None,
    colorbar: bool = True,
    ax: Axes | Sequence[Axes] | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Tokens on the unit circle at one or several times (Fig. 2 of the paper).

    Parameters
    ----------
    traj : a Trajectory with d >= 2 (for d > 2 tokens are projected, see `frame`); token
        directions x / |x| are drawn (the states themselves on the sphere).
    t : a time, or a sequence of times for a row of snapshots; default the final time.
    run : which run of a batch.
    color : "index": every token in the colour of its index k, the earliest drawn on top;
        "cluster": one disk per single-linkage cluster at tolerance `tol`
        (`attnflow.analysis.clusters`), placed at its first token, in that token's colour,
        with area proportional to the cluster's size.
    centers : mark Rényi centers (black rings) and strong Rényi centers (red dots) of radius
        `delta` (default 4 beta^{-1/2}, at most pi), placed on an outer ring at the angles of
        the tokens. Default None: for causal runs only (centers are defined by the arrival
        order, which full attention does not have).
    centers_from : the time whose configuration defines the centers: "start" (default, the
        first saved time: centers chosen at arrival and followed by index, as in the paper),
        a time (the nearest saved one), or None to recompute them at each time shown.
        Memory tokens of the layer acting at each time shown (the frozen centers of
        Theorem 5.2) are drawn as diamonds.
    tol : geodesic cluster tolerance in radians (default beta^{-1/2} / 4).
        The default `delta` and `tol` take beta from the layer acting at the first time shown
        (for tied weights, the model's beta).
    basis : directions for d > 2 (see `frame`); by default the top principal directions.
    colorbar : add a colour bar for the token index (labelled the arrival order for causal
        runs).
    ax : an Axes, or one Axes per time, to draw into.
    figsize : inches; default one column wide for one snapshot, up to 7.2 in for a row.
    """
    X = _states(traj, run)
    times = traj.times
    ts = [times[-1]] if t is None else (list(t) if np.ndim(t) == 1 else [t])
    if not ts:
        raise fail("t", "a time or a non-empty sequence of times", repr(t))
    idx = [_time_index(times, s) for s in ts]
    if color not in ("index", "cluster"):
        raise fail("color", "'index' or 'cluster'", repr(color))
    shown = _finite("traj", X[idx], times[idx])
    fr = frame(traj, X, 2, basis)
    beta = _beta(traj, times[idx[0]])
    tol = _tol(beta, tol)
    centers = _causal_marks(traj, centers)
    if centers:
        delta = _delta(beta, delta)
        if centers_from is not None:
            i0 = 0 if isinstance(centers_from, str) and centers_from == "start" else \
                _time_index(times, centers_from, "centers_from")
            fixed = _center_indices(_finite("traj", X[i0:i0 + 1], times[i0:i0 + 1])[0], delta)
    memories = [_layer(traj, None, times[i])[1].memory for i in idx]
    if figsize is None:
        extra = 0.45 if colorbar else 0.0
        figsize = (min(2.0 * len(idx) + 1.4, 7.2), 2.2 + extra) if len(idx) > 1 else \
            (COLUMN, COLUMN + extra)
    with mpl.rc_context(STYLE):
        fig, axes = _figure(ax, figsize, len(idx))
        for a, i, Xt, memory in zip(axes, idx, shown, memories):
            _draw_disk(a, fr)
            P = fr(Xt)
            if color == "index":  # early tokens on top: a cluster shows its earliest member
                a.scatter(P[::-1, 0], P[::-1, 1], s=14, c=_token_colors(traj.n)[::-1],
                          alpha=0.6, linewidths=0, zorder=3)
            else:
                _draw_clusters(a, P, clusters(Xt, tol))
            if centers:
                renyi, strong = fixed if centers_from is not None else \
                    _center_indices(Xt, delta)
                _mark_centers(a, P, renyi, strong, fr.note == "")
            if memory is not None:
                M = fr(memory[0])
                a.scatter(M[:, 0], M[:, 1], s=40, marker="D", facecolors="none",
                          edgecolors="0.3", linewidths=1.0, zorder=4)
            a.set_title(_time_label(times[i]))
        handles, title = [], None
        if centers:
            handles += _center_handles()
            title = f"δ = {delta:.3g}, " + ("recomputed at each t" if centers_from is None
                                            else f"chosen at t = {times[i0]:.4g}")
        if any(memory is not None for memory in memories):
            handles.append(mpl.lines.Line2D([], [], ls="", marker="D", mfc="none", mec="0.3",
                                            ms=6, label="memory (frozen) tokens"))
        if color == "cluster":
            handles.append(mpl.lines.Line2D([], [], ls="", marker="o", color="0.5", ms=6,
                                            label=f"cluster (tol = {tol:.2g}),\narea ∝ size"))
        if handles:
            kw = dict(handles=handles, title=title, handletextpad=0.3,
                      title_fontsize=STYLE["legend.fontsize"])
            if ax is None and len(axes) > 1:
                fig.legend(loc="outside right center", **kw)
            elif fr.note == "":  # the middle of the circle is empty
                axes[0].legend(loc="center", **kw)
            else:  # projected points fill the disk: beside it
                axes[-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), **kw)
        if fr.note and ax is None:  # in given axes, the axis labels say it
            fig.suptitle(fr.note)
        if colorbar:
            _token_colorbar(fig, axes, traj.n, "" if color == "index" else
                            "index of the cluster's first token", traj.model.is_causal)
    return fig


def _draw_disk(a: Axes, fr: Frame) -> None:
    """The unit circle, equal aspect, no frame; axis labels for a projection."""
    th = np.linspace(0, 2 * np.pi, 361)
    a.plot(np.cos(th), np.sin(th), color="0.7", lw=0.8, zorder=1)
    a.set_aspect("equal")
    if fr.note:
        a.set(xlim=(-1.08, 1.08), ylim=(-1.08, 1.08), xlabel=fr.labels[0], ylabel=fr.labels[1])
    else:
        _blank(a, 1.32)


def _center_indices(X: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Token indices of the Rényi and strong Rényi centers of X (n, d) (docs/science.md §4)."""
    return renyi_centers(X, delta), strong_renyi_centers(X, delta)


def _draw_clusters(a: Axes, P: np.ndarray, cl: Clusters) -> None:
    """One disk per cluster at its first token (lowest index), in that token's colour, with
    area proportional to the cluster's size (all n tokens together: about 30 pt across)."""
    _, first = np.unique(cl.labels, return_index=True)  # labels are numbered by first token
    n = len(cl.labels)
    a.scatter(P[first, 0], P[first, 1], s=np.maximum(700.0 * cl.sizes / n, 6.0),
              c=_token_colors(n)[first], alpha=0.8, edgecolors="white", linewidths=0.5,
              zorder=3)


def _mark_centers(a: Axes, P: np.ndarray, renyi: np.ndarray, strong: np.ndarray,
                  outer: bool) -> None:
    """Centers on an outer ring (r = 1.13 and 1.24) for the circle itself, else at the token."""
    r_renyi, r_strong = (1.13, 1.24) if outer else (1.0, 1.0)
    for ids, r, style in ((renyi, r_renyi, dict(s=30, facecolors="none", edgecolors="k",
                                                linewidths=1.0)),
                          (strong, r_strong, dict(s=14, c=RED, linewidths=0))):
        if ids.size:
            Q = P[ids]
            if outer:
                Q = r * Q / np.linalg.norm(Q, axis=1, keepdims=True)
            a.scatter(Q[:, 0], Q[:, 1], zorder=4, **style)


def _center_handles() -> list[mpl.lines.Line2D]:
    return [mpl.lines.Line2D([], [], ls="", marker="o", mfc="none", mec="k", ms=5.5,
                             label="Rényi centers"),
            mpl.lines.Line2D([], [], ls="", marker="o", color=RED, ms=4,
                             label="strong Rényi centers")]
