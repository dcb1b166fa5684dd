"""The mean-field density against time and angle, with particles over it."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnflow._checks import fail
from attnflow.meanfield import MeanFieldResult
from attnflow.meanfield.spectral import to_grid
from attnflow.plot._input import _states
from attnflow.plot._style import COLUMN, STYLE, _figure, _pi_axis, _token_colors
from attnflow.trajectory import Trajectory


def plot_meanfield(
    result: MeanFieldResult,
    *,
    label: int = -1,
    particles: Trajectory | None = None,
    run: int = 0,
    points: int | None = None,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """The density rho(t, theta) of a mean-field run as a colour map over time (x) and angle
    theta in [-pi, pi) (y), with the angles of a particle run (tokens on the circle, coloured
    by index) drawn over it.

    label : the label cell to draw (causal mask; default the last, the last token's label);
        the full mask has the one cell 0 (or -1).
    particles : an attnflow `Trajectory` of the same model (d = 2), or None; its token
        angles at its saved times are drawn as dots (on the result's time range: after a
        loss of resolution the density ends, the particles' dots too).
    run : the particle run to draw.
    points : the number of angles at which the density is evaluated (> 2 K; default
        max(256, 4 K)).
    """
    if not isinstance(result, MeanFieldResult):
        raise fail("result", "an attnflow.meanfield.MeanFieldResult", type(result).__name__)
    S, K = result.coefficients.shape[1], result.coefficients.shape[2] - 1
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not (
            -S <= label < S):
        raise fail("label", f"a label cell index in [-{S}, {S})", repr(label))
    if points is None:
        points = max(256, 4 * K)
    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or points <= 2 * K:
        raise fail("points", f"an integer > 2 K = {2 * K}", repr(points))
    if particles is not None and (not isinstance(particles, Trajectory) or particles.d != 2):
        raise fail("particles", "None or an attnflow Trajectory on the circle (d = 2)",
                   repr(particles)[:80])
    # theta_j = -pi + 2 pi j / points: the coefficients rotated by pi
    rho = to_grid(result.coefficients[:, label] * np.exp(-1j * np.pi * np.arange(K + 1)),
                  points)  # (T, points)
    theta = -np.pi + 2 * np.pi * np.arange(points) / points
    if figsize is None:
        figsize = (COLUMN, 2.4)
    with mpl.rc_context(STYLE):
        fig, (a,) = _figure(ax, figsize)
        mesh = a.pcolormesh(result.times, theta, rho.T, shading="nearest", cmap="Greys",
                            vmin=0.0, rasterized=True)
        if particles is not None:
            shown = particles.times <= result.times[-1]
            X = _states(particles, run)[shown]
            phi = np.arctan2(X[..., 1], X[..., 0])
            t = np.broadcast_to(particles.times[shown, None], phi.shape)
            colors = np.broadcast_to(_token_colors(particles.n), (*phi.shape, 4))
            a.scatter(t.ravel(), phi.ravel(), c=colors.reshape(-1, 4), s=1.5, lw=0)
        a.set_xlim(result.times[0], result.times[-1])
        a.set_ylim(-np.pi, np.pi)
        a.set_xlabel("t")
        a.set_ylabel(r"$\theta$")
        _pi_axis(a.yaxis)
        fig.colorbar(mesh, ax=a, label=r"$\rho(t, \theta)$")
        if result.resolution_lost_at is not None:
            a.set_title(f"resolution lost at t = {result.resolution_lost_at:.3g}")
    return fig
