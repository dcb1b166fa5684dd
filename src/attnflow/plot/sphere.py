"""The sphere: token paths on S^2 with final points in red (Fig. 1 of the paper), drawn by our
own orthographic camera on 2D axes (matplotlib's 3D axes cannot hide what is behind a surface).
"""

from __future__ import annotations

from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from attnflow._checks import fail
from attnflow.plot._input import _finite, _states, _time_index
from attnflow.plot._style import (
    COLUMN,
    DEFAULT_VIEW,
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


def _camera(view: Any) -> np.ndarray:
    """Rows (right, up, towards the viewer) of an orthographic camera at view = (elevation,
    azimuth) in degrees: screen coordinates of a point y are (y·right, y·up), its depth y·c."""
    try:
        elev, azim = np.radians([float(v) for v in view])
    except (TypeError, ValueError) as err:
        raise fail("view", "(elevation, azimuth) in degrees", repr(view)) from err
    ce, se, ca, sa = np.cos(elev), np.sin(elev), np.cos(azim), np.sin(azim)
    return np.array([[-sa, ca, 0.0], [-se * ca, -se * sa, ce], [ce * ca, ce * sa, se]])


def _shaded_sphere(a: Axes, pixels: int = 240) -> None:
    """An opaque light-grey ball lit from the upper left (Lambert shading) and its outline."""
    s = np.linspace(-1, 1, pixels)
    x, y = np.meshgrid(s, s)
    r2 = x**2 + y**2
    z = np.sqrt(np.clip(1 - r2, 0, 1))
    light = np.array([-0.45, 0.55, 0.70]) / np.linalg.norm([-0.45, 0.55, 0.70])
    lambert = np.clip(x * light[0] + y * light[1] + z * light[2], 0, 1)
    rgba = np.ones((pixels, pixels, 4))
    rgba[..., :3] = (0.80 + 0.17 * lambert)[..., None]
    rgba[..., 3] = (r2 <= 1).astype(float)
    a.imshow(rgba, extent=(-1, 1, -1, 1), origin="lower", interpolation="bilinear", zorder=0)
    th = np.linspace(0, 2 * np.pi, 361)
    a.plot(np.cos(th), np.sin(th), color="0.55", lw=0.8, zorder=1)


def _split_segments(S: np.ndarray, colors: np.ndarray) -> tuple[tuple, tuple]:
    """Polylines S (T, n, 3) in screen coordinates as segments split by depth sign:
    ((front segments, colours), (back segments, colours))."""
    seg = np.stack([S[:-1, :, :2], S[1:, :, :2]], axis=2).reshape(-1, 2, 2)
    depth = (S[:-1, :, 2] + S[1:, :, 2]).reshape(-1)
    cols = np.broadcast_to(colors, (S.shape[0] - 1, *colors.shape)).reshape(-1, 4)
    front = depth >= 0
    return (seg[front], cols[front]), (seg[~front], cols[~front])


def _sphere_grid(a: Axes, C: np.ndarray, fr: Frame) -> None:
    """Equator, two meridians and labelled axis ends, faint where behind the sphere."""
    th = np.linspace(0, 2 * np.pi, 181)
    c, s, o = np.cos(th), np.sin(th), np.zeros_like(th)
    for circle in (np.stack([c, s, o], -1), np.stack([c, o, s], -1), np.stack([o, c, s], -1)):
        S = circle @ C.T
        (front, _), (back, _) = _split_segments(S[:, None, :], np.zeros((1, 4)))
        a.add_collection(LineCollection(front, colors="0.6", lw=0.5, zorder=1))
        a.add_collection(LineCollection(back, colors="0.75", lw=0.4, ls=":", zorder=1))
    for e, name in zip(np.eye(3), fr.names):
        p = 1.12 * e @ C.T
        a.text(p[0], p[1], name, ha="center", va="center", fontsize=7,
               color="0.2" if p[2] >= 0 else "0.65", zorder=6)


def plot_sphere(
    traj: Trajectory,
    t: float | None = None,
    *,
    t_start: float | None = None,
    run: int = 0,
    view: tuple[float, float] = DEFAULT_VIEW,
    basis: Any = None,
    colorbar: bool = True,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Trajectories on the unit sphere S^2 with final points in red (Fig. 1 of the paper).

    An orthographic picture of the sphere seen from `view`: curves are the token paths from
    t_start (default the first saved time) to t (default the last), coloured by token index,
    solid in front and faint behind the sphere; small dots mark where they start, red dots
    where they end (at t). For d > 3 the tokens are projected onto three directions (see
    `frame`; default the top principal directions) and lie inside the ball.

    Parameters
    ----------
    traj : a Trajectory with d >= 3; token directions x / |x| are drawn (the states
        themselves on the sphere).
    t, t_start : the end and start of the paths shown (saved times nearest to them).
    run : which run of a batch.
    view : (elevation, azimuth) of the viewer in degrees.
    basis : directions for d > 3 (see `frame`).
    colorbar : add a colour bar for the token index (labelled the arrival order for causal
        runs).
    ax : an Axes to draw into.
    figsize : inches; default one column wide.
    """
    X = _states(traj, run)
    times = traj.times
    i1 = len(times) - 1 if t is None else _time_index(times, t)
    i0 = 0 if t_start is None else _time_index(times, t_start, "t_start")
    if i0 > i1:
        raise fail("t_start", f"a time <= t = {times[i1]:g}", repr(t_start))
    path = _finite("traj", X[i0:i1 + 1], times[i0:i1 + 1])
    fr = frame(traj, path, 3, basis)
    C = _camera(view)
    S = fr(path) @ C.T
    colors = _token_colors(traj.n)
    if figsize is None:
        caption = 0.15 + 0.13 * len(fr.labels) if fr.note else 0.0
        figsize = (COLUMN, COLUMN + (0.35 if colorbar else 0.0) + caption)
    with mpl.rc_context(STYLE):
        fig, (a,) = _figure(ax, figsize)
        _shaded_sphere(a)
        _sphere_grid(a, C, fr)
        if len(S) > 1:
            (front, fc), (back, bc) = _split_segments(S, colors)
            a.add_collection(LineCollection(back, colors=bc, lw=0.6, alpha=0.3, zorder=2))
            a.add_collection(LineCollection(front, colors=fc, lw=0.9, zorder=3))
        red = np.broadcast_to(mpl.colors.to_rgba(RED), colors.shape)
        for P, c, size, edge in ((S[0], colors, 6, "none"), (S[-1], red, 16, "k")):
            behind = P[:, 2] < 0
            for sel, alpha, z in ((behind, 0.35, 2), (~behind, 1.0, 5)):
                a.scatter(P[sel, 0], P[sel, 1], s=size, c=c[sel], edgecolors=edge,
                          linewidths=0.4, alpha=alpha, zorder=z)
        _blank(a, 1.2)
        span = _time_label(times[i1]) if i0 == i1 else \
            f"t from {times[i0]:.4g} to {times[i1]:.4g} (red: t = {times[i1]:.4g})"
        a.set_title(span)
        if fr.note:
            a.set_xlabel(fr.note + ":\n" + "\n".join(
                lb if lb.startswith(nm) else f"{nm}: {lb}" for nm, lb in zip(fr.names, fr.labels)),
                fontsize=7)
        if colorbar:
            _token_colorbar(fig, [a], traj.n, causal=traj.model.is_causal)
    return fig
