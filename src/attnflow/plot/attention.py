"""Attention maps: the weights A_kj of one head of one layer at one time."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from attnflow._checks import fail, positive
from attnflow.kernels.masks import mask_matrix
from attnflow.plot._input import _finite, _layer, _states, _time_index
from attnflow.plot._style import COLUMN, STYLE, _figure, _time_label
from attnflow.trajectory import Trajectory


def plot_attention(
    traj: Trajectory,
    t: float | None = None,
    *,
    run: int = 0,
    layer: int | None = None,
    head: int = 0,
    floor: float = 1e-6,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """The attention matrix A_kj of one head at a time (docs/science.md §1), on a log colour scale.

    Row k is query token k, column j key token j (memory tokens, if any, are the last
    columns, after a line). Pairs the mask forbids (j > k for causal attention) are hatched,
    so the causal triangle shows; weights below `floor` are drawn in the floor's colour.
    t defaults to the final time. The weights are those of the layer acting at the time
    shown (`model.layer_at(t)`: layer L acts on [L, L + 1); for tied weights, the model
    itself), or of `layer` (an index into ``traj.model.layers``), at the state saved at
    that time; `head` indexes that layer's heads.
    """
    X = _states(traj, run, raw=True)
    times = traj.times
    i = len(times) - 1 if t is None else _time_index(times, t)
    Xt = _finite("traj", X[i:i + 1], times[i:i + 1])[0]
    i_layer, model = _layer(traj, layer, times[i])
    n_heads = len(model.heads)
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or \
            not 0 <= head < n_heads:
        raise fail("head", f"a head index in [0, {n_heads})", repr(head))
    floor = positive("floor", floor)
    if floor >= 1:
        raise fail("floor", "a number in (0, 1)", repr(floor))
    A = model.attention_matrix(Xt, head)
    n, cols = A.shape
    allowed = np.ones((n, cols), dtype=bool)
    allowed[:, :n] = mask_matrix(model.mask, n)
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
                    + (f", layer {i_layer}" if len(traj.model.layers) > 1 else "")
                    + (f", head {head}" if n_heads > 1 else "")
                    + (f"\nright of the line: {cols - n} memory tokens" if cols > n else ""))
        if not allowed.all():
            a.legend(handles=[mpl.patches.Patch(facecolor="white", edgecolor="0.6",
                                                hatch="////", label="masked")],
                     loc="upper right", frameon=True, framealpha=1.0, edgecolor="white")
        cb = fig.colorbar(image, ax=a, extend="min", shrink=0.85)
        cb.set_label(r"$A_{kj}$" + f" (values < {floor:g} at the bottom)")
    return fig
