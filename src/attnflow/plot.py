"""Pictures of token dynamics: the circle, the sphere, time series, attention maps, movies.

Every function takes a `Trajectory` and returns a matplotlib Figure (drawn without pyplot,
so it works headless, in scripts and in notebooks); pass ``ax=`` to draw into your own axes
and compose panels. Conventions of the paper's figures (docs/science.md §5):

* tokens are coloured by their index k (the arrival order; dark = early, light = late) with
  a colour map whose lightness increases monotonically, so it survives greyscale printing;
* final positions are red (Fig. 1); strong Rényi centers are red and Rényi centers black
  (Fig. 2), with delta = 4 beta^{-1/2} by default (docs/science.md §3, §4);
* for d larger than the picture (d > 2 on the circle, d > 3 on the sphere) tokens are
  projected orthogonally onto two or three orthonormal directions: the top principal
  directions of the plotted states (default), eigenvectors of V, or any given directions;
  projected points lie inside the unit disk or ball, and the axes say which directions.

Times are the saved times of the trajectory (one unit = one layer); a requested time selects
the nearest saved time and the picture is labelled with the time actually shown.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.colors import LinearSegmentedColormap, LogNorm, Normalize
from matplotlib.figure import Figure

from attnflow._checks import fail, positive
from attnflow._files import atomic_path
from attnflow.analysis import (
    Clusters,
    cluster_count,
    clusters,
    default_cluster_tol,
    renyi_centers,
    strong_renyi_centers,
)
from attnflow.kernels.masks import mask_matrix
from attnflow.sphere import geodesic_distance
from attnflow.trajectory import Trajectory

__all__ = [
    "Frame",
    "animate",
    "frame",
    "plot_angles",
    "plot_attention",
    "plot_circle",
    "plot_sphere",
    "plot_timeseries",
]

#: Sizes and fonts for a single-column figure of a paper (3.4 in wide) that also reads on screen.
STYLE = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.2,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "savefig.dpi": 200,
}
COLUMN = 3.4  # inches, one column of a two-column paper
#: Token colours: viridis without its lightest eighth, so late tokens stay visible on white
#: and on the light sphere; lightness still increases monotonically with the token index.
TOKEN_CMAP = LinearSegmentedColormap.from_list(
    "attnflow_tokens", mpl.colormaps["viridis"](np.linspace(0.0, 0.85, 256)))
RED = "#d62728"
DEFAULT_VIEW = (25.0, -60.0)  # (elevation, azimuth) in degrees, as in matplotlib's 3D axes


# --------------------------------------------------------------------------- input
def _runs(traj: Any) -> np.ndarray:
    """The trajectory's states as (T, runs, n, d)."""
    if not isinstance(traj, Trajectory):
        raise TypeError(f"traj: expected an attnflow.Trajectory, received {type(traj).__name__}")
    T, n, d = len(traj.times), traj.n, traj.d
    return traj.states.reshape(T, -1, n, d)


def _states(traj: Trajectory, run: int | None) -> np.ndarray:
    """States of one run, (T, n, d), or of all runs, (T, runs, n, d) when run is None."""
    states = _runs(traj)
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


def _delta(traj: Trajectory, delta: float | None) -> float:
    """The Rényi radius: given, or 4 beta^{-1/2} as in all the paper's figures
    (docs/science.md §3)."""
    if delta is not None:
        return positive("delta", delta)
    if traj.model.beta == 0:
        raise fail("delta", "a radius (the default 4 beta^{-1/2} needs beta > 0)", "None")
    return 4.0 / np.sqrt(traj.model.beta)


def _tol(traj: Trajectory, tol: float | None) -> float:
    """The cluster tolerance: given, or beta^{-1/2} / 4 (1e-2 when beta = 0), as the CLI's."""
    if tol is not None:
        return positive("tol", tol)
    return default_cluster_tol(traj.model.beta)


# --------------------------------------------------------------------------- figures and axes
def _figure(ax: Axes | Sequence[Axes] | None, figsize: tuple[float, float],
            count: int = 1) -> tuple[Figure, list[Axes]]:
    """The figure and `count` axes: the given ones, or a row of new ones on a new Figure."""
    if ax is None:
        fig = Figure(figsize=figsize, layout="constrained")
        axes = fig.subplots(1, count, squeeze=False)[0]
        return fig, list(axes)
    axes = [ax] if isinstance(ax, Axes) else list(ax)
    if len(axes) != count or not all(isinstance(a, Axes) for a in axes):
        raise fail("ax", f"{count} matplotlib Axes" if count > 1 else "a matplotlib Axes",
                   repr(ax))
    fig = axes[0].figure
    while fig is not fig.figure:  # a SubFigure: climb to the root Figure
        fig = fig.figure
    return fig, axes


def _token_colors(n: int) -> np.ndarray:
    """RGBA colours of tokens 0..n-1 along TOKEN_CMAP, (n, 4)."""
    return TOKEN_CMAP(np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1))


def _token_colorbar(fig: Figure, axes: list[Axes], n: int, label: str = "") -> None:
    """A colour bar under the axes that explains the token colours."""
    sm = mpl.cm.ScalarMappable(Normalize(1, max(n, 2)), TOKEN_CMAP)
    cb = fig.colorbar(sm, ax=axes, location="bottom", shrink=0.6, aspect=30, pad=0.02)
    cb.set_label(label or "token index k (arrival order)")
    cb.ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(5, integer=True))


def _time_label(t: float) -> str:
    return f"t = {t:.4g}"


# --------------------------------------------------------------------------- projections
@dataclass(frozen=True)
class Frame:
    """Orthonormal directions to draw tokens in: coordinates are X @ basis.T.

    basis : (k, d) orthonormal rows; names : short names of the k directions; labels : the
    k axis labels (name and what it is); note : how the directions were chosen ("" when the
    picture is the sphere itself, d = k).
    """

    basis: np.ndarray
    names: tuple[str, ...]
    labels: tuple[str, ...]
    note: str

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return X @ self.basis.T


def frame(traj: Trajectory, X: np.ndarray, k: int, basis: Any = None) -> Frame:
    """The k directions in which to draw tokens of dimension d = traj.d.

    basis : None (identity when d == k, else "pca"); "pca": the top k principal directions
        of the points X (..., d), i.e. eigenvectors of the uncentred second moment
        mean x x^T, whose eigenvalues are the shares of |x|^2 = 1 they carry; "V": the
        eigenvectors of the value matrix V with the k eigenvalues of largest real part
        (docs/science.md §3; a complex pair gives its real and imaginary parts), or ("V", [i, j])
        with indices into the eigenvalues sorted by decreasing real part; or a (k, d) array
        of directions. Non-orthogonal directions are orthonormalised in order (Gram-Schmidt).
    """
    d = traj.d
    if d < k:
        raise fail("traj", f"tokens of dimension d >= {k} for this picture", f"d = {d}")
    if basis is None:
        if d == k:
            names = tuple(f"x{i + 1}" for i in range(d))
            return Frame(np.eye(d), names, names, "")
        basis = "pca"
    if isinstance(basis, str) and basis == "pca":
        flat = X.reshape(-1, d)
        eigval, eigvec = np.linalg.eigh(flat.T @ flat / len(flat))
        order = np.argsort(eigval)[::-1][:k]
        share = eigval[order] / eigval.sum()
        names = tuple(f"PC{i + 1}" for i in range(k))
        labels = tuple(f"{nm} ({100 * s:.0f}% of |x|²)" for nm, s in zip(names, share))
        return Frame(eigvec[:, order].T, names, labels,
                     f"projection onto the top {k} principal directions")
    if isinstance(basis, str) and basis == "V" or (
            isinstance(basis, (tuple, list)) and len(basis) == 2 and basis[0] == "V"):
        return _value_frame(traj, k, None if isinstance(basis, str) else basis[1])
    try:
        B = np.asarray(basis, dtype=float)
    except (TypeError, ValueError) as err:
        raise fail("basis", f"None, 'pca', 'V', ('V', indices) or a ({k}, {d}) array",
                   repr(basis)) from err
    if B.shape != (k, d) or not np.all(np.isfinite(B)):
        raise fail("basis", f"a finite ({k}, {d}) array of directions", f"shape {B.shape}")
    names = tuple(f"b{i + 1}" for i in range(k))
    return Frame(_orthonormal("basis", B), names, tuple(f"{nm} (given direction)" for nm in names),
                 f"projection onto {k} given directions")


def _value_frame(traj: Trajectory, k: int, picks: Any) -> Frame:
    """Directions from eigenvectors of V (see `frame`)."""
    heads = traj.model.heads
    if len(heads) != 1:
        raise fail("basis", "'pca' or explicit directions for a multi-head model ('V' is "
                   "ambiguous)", f"'V' with {len(heads)} heads")
    V = heads[0][2]
    if V is None:
        raise fail("basis", "'pca' or explicit directions (V is the identity: every direction "
                   "is an eigenvector)", "'V'")
    eigval, eigvec = np.linalg.eig(V)
    order = np.argsort(-eigval.real, kind="stable")
    eigval, eigvec = eigval[order], eigvec[:, order]
    if picks is None:  # each complex pair once, through its eigenvalue with Im > 0
        picks = np.flatnonzero(eigval.imag >= 0)
    try:
        picks = [int(i) for i in picks]
    except (TypeError, ValueError) as err:
        raise fail("basis", "('V', indices) with integer indices", repr(picks)) from err
    if any(not 0 <= i < len(eigval) for i in picks):
        raise fail("basis", f"eigenvalue indices in [0, {len(eigval)})", repr(picks))
    vectors, labels = [], []
    for i in picks:
        lam = eigval[i]
        name = f"λ{i + 1} = {lam.real:.3g}" + (f"{lam.imag:+.3g}i" if lam.imag else "")
        parts = [("", eigvec[:, i].real)] if lam.imag == 0 else [
            ("Re ", eigvec[:, i].real), ("Im ", eigvec[:, i].imag)]
        for prefix, v in parts:
            if len(vectors) < k:
                vectors.append(v)
                labels.append(f"{prefix}eigvec {name}")
    if len(vectors) < k:
        raise fail("basis", f"eigenvalue indices giving {k} real directions", repr(picks))
    return Frame(_orthonormal("basis", np.array(vectors)),
                 tuple(f"v{i + 1}" for i in range(k)), tuple(labels),
                 "projection onto eigenvectors of V (orthonormalised)")


def _orthonormal(name: str, B: np.ndarray) -> np.ndarray:
    """Gram-Schmidt on the rows of B (k, d), through QR; an error if they are dependent."""
    q, r = np.linalg.qr(B.T)
    diag = np.abs(np.diag(r))
    if diag.min() <= 1e-10 * max(diag.max(), 1e-300):
        raise fail(name, "linearly independent directions", "dependent directions")
    return (q * np.sign(np.diag(r))).T


# --------------------------------------------------------------------------- the circle
def plot_circle(
    traj: Trajectory,
    t: float | Sequence[float] | None = None,
    *,
    run: int = 0,
    color: str = "index",
    centers: bool = True,
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
    traj : a Trajectory with d >= 2 (for d > 2 tokens are projected, see `frame`).
    t : a time, or a sequence of times for a row of snapshots; default the final time.
    run : which run of a batch.
    color : "index": every token in the colour of its index k, the earliest drawn on top;
        "cluster": one disk per single-linkage cluster at tolerance `tol`
        (`attnflow.analysis.clusters`), placed at its first token, in that token's colour,
        with area proportional to the cluster's size.
    centers : mark Rényi centers (black rings) and strong Rényi centers (red dots) of radius
        `delta` (default 4 beta^{-1/2}), placed on an outer ring at the angles of the tokens.
    centers_from : the time whose configuration defines the centers: "start" (default, the
        first saved time: centers chosen at arrival and followed by index, as in the paper),
        a time (the nearest saved one), or None to recompute them at each time shown.
        Memory tokens of the model (the frozen centers of Theorem 5.2) are drawn as diamonds.
    tol : geodesic cluster tolerance in radians (default beta^{-1/2} / 4).
    basis : directions for d > 2 (see `frame`); by default the top principal directions.
    colorbar : add a colour bar for the token index.
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
    tol = _tol(traj, tol)
    if centers:
        delta = _delta(traj, delta)
        if centers_from is not None:
            i0 = 0 if isinstance(centers_from, str) and centers_from == "start" else \
                _time_index(times, centers_from, "centers_from")
            fixed = _center_indices(_finite("traj", X[i0:i0 + 1], times[i0:i0 + 1])[0], delta)
    if figsize is None:
        extra = 0.45 if colorbar else 0.0
        figsize = (min(2.0 * len(idx) + 1.4, 7.2), 2.2 + extra) if len(idx) > 1 else \
            (COLUMN, COLUMN + extra)
    with mpl.rc_context(STYLE):
        fig, axes = _figure(ax, figsize, len(idx))
        for a, i, Xt in zip(axes, idx, shown):
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
            if traj.model.memory is not None:
                M = fr(traj.model.memory[0])
                a.scatter(M[:, 0], M[:, 1], s=40, marker="D", facecolors="none",
                          edgecolors="0.3", linewidths=1.0, zorder=4)
            a.set_title(_time_label(times[i]))
        handles, title = [], None
        if centers:
            handles += _center_handles()
            title = f"δ = {delta:.3g}, " + ("recomputed at each t" if centers_from is None
                                            else f"chosen at t = {times[i0]:.4g}")
        if traj.model.memory is not None:
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
                            "index of the cluster's first token")
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


# --------------------------------------------------------------------------- the sphere
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


def _blank(a: Axes, lim: float) -> None:
    """Equal aspect on [-lim, lim]^2 without ticks or spines; the x label stays usable."""
    a.set_aspect("equal")
    a.set(xlim=(-lim, lim), ylim=(-lim, lim), xticks=[], yticks=[])
    for spine in a.spines.values():
        spine.set_visible(False)


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
    traj : a Trajectory with d >= 3.
    t, t_start : the end and start of the paths shown (saved times nearest to them).
    run : which run of a batch.
    view : (elevation, azimuth) of the viewer in degrees.
    basis : directions for d > 3 (see `frame`).
    colorbar : add a colour bar for the token index.
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
            _token_colorbar(fig, [a], traj.n)
    return fig


# --------------------------------------------------------------------------- angles
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
    idx = _time_range(times, t_range)
    if log_time:
        idx = idx[times[idx] > 0]
        if idx.size == 0:
            raise fail("t_range", "a range with a saved time > 0 (log time axis)", repr(t_range))
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
            _token_colorbar(fig, [a], traj.n)
    return fig


def _pi_axis(axis: Any) -> None:
    """Ticks at multiples of pi/2, written with π."""
    def label(v: float, _pos: int) -> str:
        k = int(round(2 * v / np.pi))
        text = {0: "0", 1: "π/2", 2: "π"}.get(abs(k), f"{k // 2}π" if k % 2 == 0 else
                                                  f"{abs(k)}π/2")
        return ("−" if k < 0 else "") + text.lstrip("-")

    axis.set_major_locator(mpl.ticker.MultipleLocator(np.pi / 2))
    axis.set_major_formatter(mpl.ticker.FuncFormatter(label))


# --------------------------------------------------------------------------- time series
def _series(traj: Trajectory, run: int | None, t_range: Any, tol: float, delta: float
            ) -> dict[str, np.ndarray]:
    """What `plot_timeseries` draws, each (T', runs) at the selected positive times."""
    X = _states(traj, run)
    X = X if run is None else X[:, None]
    times = traj.times
    idx = _time_range(times, t_range)
    idx = idx[times[idx] > 0]
    if idx.size == 0:
        raise fail("t_range", "a range with a saved time > 0 (log time axis)", repr(t_range))
    start = _finite("traj", X[:1, :, :1], times[:1])  # x_1(0) of each run, (1, runs, 1, d)
    X = _finite("traj", X[idx], times[idx])
    shape = X.shape[:2]
    return {
        "t": times[idx],
        "clusters": np.asarray(cluster_count(X, tol)),
        "renyi": np.array([len(renyi_centers(x, delta)) for x in X.reshape(-1, *X.shape[2:])]
                          ).reshape(shape),
        "strong": np.array([len(strong_renyi_centers(x, delta))
                            for x in X.reshape(-1, *X.shape[2:])]).reshape(shape),
        "spread": geodesic_distance(X, start).max(axis=-1),
    }


def plot_timeseries(
    traj: Trajectory,
    *,
    run: int | None = None,
    t_range: tuple[float, float] | None = None,
    tol: float | None = None,
    delta: float | None = None,
    ax: Sequence[Axes] | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Counts and spread of the tokens against time, on a log time axis.

    Top panel: the number of single-linkage clusters at geodesic tolerance tol (default
    beta^{-1/2} / 4; `attnflow.analysis.cluster_count`) and the numbers of Rényi and strong
    Rényi centers of radius delta (default 4 beta^{-1/2}) of the configuration at each time
    (docs/science.md §4). Bottom panel: max_k d(x_k(t), x_1(0)), the largest geodesic distance to
    the first token's start, which tends to 0 when all tokens join x_1(0) (Theorem 4.1).
    Meta-stable plateaus show as flat stretches (docs/science.md §3). t = 0 is left out (log axis).

    For a batch, run=None (default) draws the mean over runs and a 10th-90th percentile band;
    run=i draws one run. `ax` is a pair of Axes (counts, spread). Cost: the centers are
    recomputed at every saved time of every run, O(T runs n^2 d).
    """
    tol, delta = _tol(traj, tol), _delta(traj, delta)
    data = _series(traj, run, t_range, tol, delta)
    t = data["t"]
    if figsize is None:
        figsize = (COLUMN, 3.8)
    with mpl.rc_context(STYLE):
        fig, (top, bottom) = _figure(ax, figsize, 2) if ax is not None else _stacked(figsize)
        lines = (("clusters", f"clusters (tol = {tol:.2g})", "k", "-"),
                 ("renyi", f"Rényi centers (δ = {delta:.2g})", "0.45", "--"),
                 ("strong", f"strong Rényi centers (δ = {delta:.2g})", RED, ":"))
        for key, label, color, ls in lines:
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


def _plain_log(axis: Any, subs: tuple[float, ...] = (1, 2, 5)) -> None:
    """Log-axis ticks at `subs` times powers of ten, written as plain numbers."""
    axis.set_major_locator(mpl.ticker.LogLocator(subs=subs))
    axis.set_major_formatter(mpl.ticker.StrMethodFormatter("{x:g}"))
    axis.set_minor_formatter(mpl.ticker.NullFormatter())


def _stacked(figsize: tuple[float, float]) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, list(fig.subplots(2, 1, sharex=True, height_ratios=(3, 2)))


def _band(a: Axes, t: np.ndarray, y: np.ndarray, label: str, color: str, ls: str) -> None:
    """y (T, runs): the line itself for one run; else the mean and a 10-90% band."""
    if y.shape[1] == 1:
        a.plot(t, y[:, 0], color=color, ls=ls, label=label)
        return
    a.plot(t, y.mean(axis=1), color=color, ls=ls, label=label)
    lo, hi = np.percentile(y, [10, 90], axis=1)
    a.fill_between(t, lo, hi, color=color, alpha=0.2, lw=0)


# --------------------------------------------------------------------------- attention maps
def plot_attention(
    traj: Trajectory,
    t: float | None = None,
    *,
    run: int = 0,
    head: int = 0,
    floor: float = 1e-6,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """The attention matrix A_kj of one head at a time (docs/science.md §1), on a log colour scale.

    Row k is query token k, column j key token j (memory tokens, if any, are the last
    columns, after a line). Pairs the mask forbids (j > k for causal attention) are hatched,
    so the causal triangle shows; weights below `floor` are drawn in the floor's colour.
    t defaults to the final time.
    """
    X = _states(traj, run)
    times = traj.times
    i = len(times) - 1 if t is None else _time_index(times, t)
    Xt = _finite("traj", X[i:i + 1], times[i:i + 1])[0]
    n_heads = len(traj.model.heads)
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or \
            not 0 <= head < n_heads:
        raise fail("head", f"a head index in [0, {n_heads})", repr(head))
    floor = positive("floor", floor)
    if floor >= 1:
        raise fail("floor", "a number in (0, 1)", repr(floor))
    A = traj.model.attention_matrix(Xt, head)
    n, cols = A.shape
    allowed = np.ones((n, cols), dtype=bool)
    allowed[:, :n] = mask_matrix(traj.model.mask, n)
    shown = np.ma.masked_where(~allowed, np.maximum(A, floor))
    if figsize is None:
        figsize = (COLUMN, COLUMN * 0.92)
    with mpl.rc_context(STYLE):
        fig, (a,) = _figure(ax, figsize)
        a.add_patch(mpl.patches.Rectangle((0.5, 0.5), cols, n, facecolor="white",
                                          edgecolor="0.6", hatch="////", lw=0, zorder=0))
        cmap = mpl.colormaps["magma_r"].with_extremes(bad=(0, 0, 0, 0))
        image = a.imshow(shown, cmap=cmap, norm=LogNorm(floor, 1.0), interpolation="nearest",
                         extent=(0.5, cols + 0.5, n + 0.5, 0.5), zorder=1)
        if cols > n:
            a.axvline(n + 0.5, color="k", lw=0.8)
        a.set_xlabel("key token j")
        a.set_ylabel("query token k")
        a.xaxis.set_major_locator(mpl.ticker.MaxNLocator(6, integer=True))
        a.yaxis.set_major_locator(mpl.ticker.MaxNLocator(6, integer=True))
        a.set_title(f"attention weights, {_time_label(times[i])}"
                    + (f", head {head}" if n_heads > 1 else "")
                    + (f"\nright of the line: {cols - n} memory tokens" if cols > n else ""))
        if not allowed.all():
            a.legend(handles=[mpl.patches.Patch(facecolor="white", edgecolor="0.6",
                                                hatch="////", label="masked")],
                     loc="upper right", frameon=True, framealpha=1.0, edgecolor="white")
        cb = fig.colorbar(image, ax=a, extend="min", shrink=0.85)
        cb.set_label(r"$A_{kj}$" + f" (values < {floor:g} at the bottom)")
    return fig


# --------------------------------------------------------------------------- animation
def animate(
    traj: Trajectory,
    path: str | os.PathLike,
    *,
    run: int = 0,
    frames: int | None = None,
    fps: float = 12.0,
    t_range: tuple[float, float] | None = None,
    view: tuple[float, float] = DEFAULT_VIEW,
    basis: Any = None,
    size: int = 400,
    max_bytes: int = 20_000_000,
) -> Path:
    """A movie of the tokens moving, with the time written on each frame.

    d = 2: the circle; d >= 3: the sphere seen from `view` (d > 3: projected onto three
    directions, see `frame`). Frames show saved times evenly spaced in their index (save at
    log-spaced times for a movie in log time). Written atomically.

    path : ``.gif`` (Pillow) or ``.mp4`` (H.264 through the ffmpeg binary of imageio-ffmpeg).
    frames : number of frames, at most the number of selected saved times (default all of
        them, up to 120).
    fps : frames per second.
    size : width and height of a frame in pixels (GIF frames share one 255-colour palette).
    max_bytes : the file may not exceed this; a larger result is an error (use fewer frames
        or a smaller size) and nothing is written.

    Returns the path written.
    """
    path = Path(path)
    if path.suffix not in (".gif", ".mp4"):
        raise fail("path", "a file name ending in .gif or .mp4", str(path))
    X = _states(traj, run)
    times = traj.times
    idx = _time_range(times, t_range)
    if frames is None:
        frames = min(len(idx), 120)
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or \
            not 1 <= frames <= len(idx):
        raise fail("frames", f"a number of frames in [1, {len(idx)}] (the selected saved times)",
                   repr(frames))
    fps = positive("fps", fps)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 64:
        raise fail("size", "a frame width in pixels >= 64", repr(size))
    idx = idx[np.floor(np.linspace(0, len(idx) - 1, frames) + 0.5).astype(int)]
    X = _finite("traj", X[idx], times[idx])
    images = _render(traj, X, times[idx], view, basis, int(size))
    with atomic_path(path) as tmp:
        (_write_gif if path.suffix == ".gif" else _write_mp4)(tmp, images, fps)
        written = os.path.getsize(tmp)
        if written > max_bytes:
            raise fail("max_bytes", f"room for the movie (it takes {written} bytes; use fewer "
                       "frames or a smaller size)", max_bytes)
    return path


def _render(traj: Trajectory, X: np.ndarray, times: np.ndarray, view: Any, basis: Any,
            size: int) -> list[np.ndarray]:
    """RGB frames (size, size, 3) uint8 of the tokens X (F, n, d) at the given times."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    dpi = 100
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(size / dpi, size / dpi), dpi=dpi)
        canvas = FigureCanvasAgg(fig)
        a = fig.add_axes((0.0, 0.0, 1.0, 0.92))
        colors = _token_colors(traj.n)
        if traj.d == 2:
            fr = frame(traj, X, 2, basis)
            _draw_disk(a, fr)
            a.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1))  # no center ring in the movie
            dots = a.scatter(*fr(X[0, ::-1]).T, s=20, c=colors[::-1], alpha=0.7, linewidths=0,
                             zorder=3)

            def place(Xt: np.ndarray) -> None:
                dots.set_offsets(fr(Xt[::-1]))
        else:
            fr = frame(traj, X, 3, basis)
            C = _camera(view)
            _shaded_sphere(a)
            _sphere_grid(a, C, fr)
            a.set_aspect("equal")
            a.set(xlim=(-1.2, 1.2), ylim=(-1.2, 1.2))
            a.set_axis_off()
            back = a.scatter([], [], s=14, alpha=0.3, linewidths=0, zorder=2)
            front = a.scatter([], [], s=22, linewidths=0, zorder=5)

            def place(Xt: np.ndarray) -> None:
                S = fr(Xt[::-1]) @ C.T  # early tokens drawn last, on top
                ahead = S[:, 2] >= 0
                for dots, sel in ((front, ahead), (back, ~ahead)):
                    dots.set_offsets(S[sel, :2])
                    dots.set_facecolors(colors[::-1][sel])
        label = fig.text(0.5, 0.96, "", ha="center", va="center", fontsize=11)
        if fr.note:
            fig.text(0.01, 0.01, fr.note, fontsize=7, color="0.3")
        fmt = _time_format(times)
        images = []
        for Xt, t in zip(X, times):
            place(Xt)
            label.set_text(f"t = {t:{fmt}}")
            canvas.draw()
            images.append(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    return images


def _time_format(times: np.ndarray) -> str:
    """A format spec that writes every time distinctly: as many decimals as the spacing needs."""
    steps = np.diff(times)
    step = steps[steps > 0].min() if np.any(steps > 0) else 1.0
    return f".{int(np.clip(np.ceil(-np.log10(step) - 1e-9), 0, 6))}f"


def _write_gif(path: Path, images: list[np.ndarray], fps: float) -> None:
    """An animated GIF with one palette taken from the first frame and no dithering, so the
    still background is identical in every frame and compresses away."""
    from PIL import Image

    first = Image.fromarray(images[0]).quantize(255, method=Image.Quantize.MAXCOVERAGE)
    frames = [Image.fromarray(im).quantize(palette=first, dither=Image.Dither.NONE)
              for im in images]
    frames[0].save(path, save_all=True, append_images=frames[1:], loop=0,
                   duration=round(1000 / fps), optimize=False)


def _write_mp4(path: Path, images: list[np.ndarray], fps: float) -> None:
    """H.264 (yuv420p, which needs even sides: odd sides get one white pixel) via ffmpeg."""
    try:
        import imageio_ffmpeg
    except ImportError as err:
        raise fail("path", "a .gif, or imageio-ffmpeg installed for .mp4 (pip install "
                   "'attnflow[plot]')", str(path)) from err
    h, w = images[0].shape[:2]
    pad = ((0, h % 2), (0, w % 2), (0, 0))
    writer = imageio_ffmpeg.write_frames(str(path), (w + w % 2, h + h % 2), fps=fps,
                                         codec="libx264", pix_fmt_out="yuv420p",
                                         macro_block_size=1)
    writer.send(None)
    for im in images:
        writer.send(np.ascontiguousarray(np.pad(im, pad, constant_values=255)))
    writer.close()
