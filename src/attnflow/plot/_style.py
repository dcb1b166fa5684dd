"""The look shared by every picture: sizes, fonts, token colours, figures and axes helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure

from attnflow._checks import fail

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
# Pixel budgets, checked before drawing: one image (a frame of a movie, or a figure saved at
# its dpi) at most 2^26 pixels (8192 x 8192; 256 MB as RGBA), a movie at most 2^28 in all
# (its frames are held in memory: 1 GB).
MAX_IMAGE_PIXELS = 2**26
MAX_MOVIE_PIXELS = 2**28


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


def _token_colorbar(fig: Figure, axes: list[Axes], n: int, label: str = "",
                    causal: bool = True) -> None:
    """A colour bar under the axes that explains the token colours; the index is an arrival
    order only under a causal mask (a full-attention run's tokens have no order)."""
    sm = mpl.cm.ScalarMappable(Normalize(1, max(n, 2)), TOKEN_CMAP)
    cb = fig.colorbar(sm, ax=axes, location="bottom", shrink=0.6, aspect=30, pad=0.02)
    cb.set_label(label or ("token index k (arrival order)" if causal else "token index k"))
    cb.ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(5, integer=True))


def _time_label(t: float) -> str:
    return f"t = {t:.4g}"


def _blank(a: Axes, lim: float) -> None:
    """Equal aspect on [-lim, lim]^2 without ticks or spines; the x label stays usable."""
    a.set_aspect("equal")
    a.set(xlim=(-lim, lim), ylim=(-lim, lim), xticks=[], yticks=[])
    for spine in a.spines.values():
        spine.set_visible(False)


def _plain_log(axis: Any, subs: tuple[float, ...] = (1, 2, 5)) -> None:
    """Log-axis ticks at `subs` times powers of ten, written as plain numbers."""
    axis.set_major_locator(mpl.ticker.LogLocator(subs=subs))
    axis.set_major_formatter(mpl.ticker.StrMethodFormatter("{x:g}"))
    axis.set_minor_formatter(mpl.ticker.NullFormatter())


def _pi_axis(axis: Any) -> None:
    """Ticks at multiples of pi/2, written with π."""
    def label(v: float, _pos: int) -> str:
        k = int(round(2 * v / np.pi))
        text = {0: "0", 1: "π/2", 2: "π"}.get(abs(k), f"{k // 2}π" if k % 2 == 0 else
                                                  f"{abs(k)}π/2")
        return ("−" if k < 0 else "") + text.lstrip("-")

    axis.set_major_locator(mpl.ticker.MultipleLocator(np.pi / 2))
    axis.set_major_formatter(mpl.ticker.FuncFormatter(label))
