"""The mean-field density against time and angle, and particles beside it: their histogram
against time on its own panel, and both profiles at one time (`plot_meanfield`); the
particles' Fourier moments (circle) or real spherical-harmonic moments (S^2) against the mean
field's in their 1/sqrt(n) band (`plot_moments`)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnflow._checks import fail
from attnflow.analysis.harmonics import harmonic_basis, harmonic_moments
from attnflow.analysis.moments import fourier_moments
from attnflow.meanfield import MeanFieldResult
from attnflow.meanfield.spectral import to_grid
from attnflow.meanfield.sphere import SphereGrid
from attnflow.plot._input import _states
from attnflow.plot._style import COLUMN, STYLE, _figure, _pi_axis
from attnflow.trajectory import Trajectory


def plot_meanfield(
    result: MeanFieldResult,
    *,
    label: int = -1,
    particles: Trajectory | None = None,
    run: int = 0,
    points: int | None = None,
    bins: int | None = None,
    ax: Axes | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """The density rho(t, theta) of a mean-field run as a colour map over time (x) and angle
    theta in [-pi, pi) (y), grey levels spanning the density's range (white at its minimum,
    or at 0); with particles, two more panels: the particles' own density (a histogram of
    their angles at each saved time, on the same grey levels) and, at the
    last time both have, the profiles side by side: rho, the band rho +- 2 standard errors
    of a histogram of n i.i.d. draws of rho (where the particles' histogram would lie if they
    were such draws), and the particles' histogram. Readable at any n: no marker per token.

    label : the label cell to draw (causal mask; default the last, the last token's label);
        the full mask has the one cell 0 (or -1).

    On S^2 (result.d = 3) two panels: the density averaged over longitude against time and
    polar angle (its zonal part, sum_l c_l0 Y_l0), and the density at the last time on a
    (polar angle, longitude) grid of `points` longitudes; ax: two Axes or None; no
    particles. Zonal results on S^{d-1}, d > 3: the first panel only (the density itself).
    particles : an attnflow `Trajectory` of the same model (d = 2), or None; its saved times
        on the result's time range are drawn (after a loss of resolution the density ends,
        the particles' panel too). For the causal mask the histogram takes the tokens of the
        label cell drawn (token i has the label (i + 1) / n).
    run : the particle run to draw.
    points : the number of angles at which the density is evaluated (> 2 K; default
        max(256, 4 K)).
    bins : the histogram's bins on [-pi, pi) (default: 2 m^(1/3) for the m tokens shown,
        between 16 and `points`: 200 bins for 10^6 tokens, whose counts then err by 1.4 %).
    ax : one Axes to draw the density on (without particles only: with them the figure has
        three panels).
    """
    if not isinstance(result, MeanFieldResult):
        raise fail("result", "an attnflow.meanfield.MeanFieldResult", type(result).__name__)
    S, K = result.coefficients.shape[1], result.coefficients.shape[2] - 1
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not (
            -S <= label < S):
        raise fail("label", f"a label cell index in [-{S}, {S})", repr(label))
    if result.d >= 3:
        if particles is not None:
            raise fail("particles", f"None for a result on S^{result.d - 1} (particles are "
                       "drawn beside densities on the circle)", type(particles).__name__)
        return _sphere(result, label, points or max(128, 4 * K), ax, figsize)
    if points is None:
        points = max(256, 4 * K)
    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or points <= 2 * K:
        raise fail("points", f"an integer > 2 K = {2 * K}", repr(points))
    if particles is not None and (not isinstance(particles, Trajectory) or particles.d != 2):
        raise fail("particles", "None or an attnflow Trajectory on the circle (d = 2)",
                   repr(particles)[:80])
    if particles is not None and ax is not None:
        raise fail("ax", "None when particles are drawn (the figure has three panels)",
                   type(ax).__name__)
    # theta_j = -pi + 2 pi j / points: the coefficients rotated by pi
    c = result.coefficients[:, label] * np.exp(-1j * np.pi * np.arange(K + 1))
    rho = to_grid(c, points)  # (T, points)
    theta = -np.pi + 2 * np.pi * np.arange(points) / points
    top, low = float(rho.max()), float(max(rho.min(), 0.0))  # the mean field's range
    with mpl.rc_context(STYLE):
        if particles is None:
            fig, (a,) = _figure(ax, figsize or (COLUMN, 2.4))
        else:
            fig, axes = _figure(None, figsize or (3 * COLUMN, 2.6), 3)
            a, b, p = axes
        mesh = a.pcolormesh(result.times, theta, rho.T, shading="nearest", cmap="Greys",
                            vmin=low, vmax=top, rasterized=True)
        _angle_time_axes(a, result, "mean field")
        if particles is not None:
            _particles(b, p, particles, run, label % S, S, result, c, points, bins, low, top)
        fig.colorbar(mesh, ax=a if particles is None else [a, b], label=r"density",
                     extend="neither" if particles is None else "both")
        if result.resolution_lost_at is not None:
            fig.suptitle(f"resolution lost at t = {result.resolution_lost_at:.3g}")
    return fig


def _sphere(result: MeanFieldResult, label: int, points: int, ax: Axes | None,
            figsize: tuple[float, float] | None) -> Figure:
    """`plot_meanfield` of a result on S^2 or a zonal one on S^{d-1} (its docstring)."""
    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or points < 8:
        raise fail("points", "an integer >= 8 (longitudes of the map)", repr(points))
    c = result.coefficients[:, label]  # (T, L + 1, L + 1) on S^2, (T, L + 1) zonal
    L = c.shape[-1] - 1
    theta = (np.arange(points // 2) + 0.5) * np.pi / (points // 2)
    if result.d == 3:
        l = np.arange(L + 1)
        y0 = np.sqrt((2 * l + 1) / (4 * np.pi))[:, None] * np.array(
            [np.polynomial.legendre.legval(np.cos(theta), np.eye(L + 1)[k]) for k in l])
        zonal = c[..., 0].real @ y0  # (T, points // 2): the longitude average
        last = result.density(points)[-1, label % result.coefficients.shape[1]]
    else:
        zonal = result.density(points // 2)[:, label]
        last = zonal
    with mpl.rc_context(STYLE):
        count = 2 if result.d == 3 else 1
        fig, axes = _figure(ax, figsize or (count * COLUMN, 2.4), count)
        a = axes[0]
        low = float(max(min(zonal.min(), last.min()), 0.0))
        top = float(max(zonal.max(), last.max()))
        mesh = a.pcolormesh(result.times, theta, zonal.T, shading="nearest", cmap="Greys",
                            vmin=low, vmax=top, rasterized=True)
        a.set_xlim(result.times[0], result.times[-1])
        a.set_ylim(np.pi, 0)
        a.set_xlabel("t")
        a.set_ylabel(r"polar angle $\theta$")
        a.set_title("mean field, averaged over longitude" if count == 2 else
                    f"mean field on $S^{{{result.d - 1}}}$ (zonal)")
        if count == 2:
            b = axes[1]
            phi = (np.arange(points) + 0.5) * 2 * np.pi / points
            b.pcolormesh(phi, theta, last, shading="nearest", cmap="Greys", vmin=low,
                         vmax=top, rasterized=True)
            b.set_ylim(np.pi, 0)
            b.set_xlabel(r"longitude $\varphi$")
            b.set_ylabel(r"$\theta$")
            b.set_title(f"t = {result.times[-1]:.3g}")
        fig.colorbar(mesh, ax=axes, label="density (per unit area)")
        if result.resolution_lost_at is not None:
            fig.suptitle(f"resolution lost at t = {result.resolution_lost_at:.3g}")
    return fig


def _angle_time_axes(a: Axes, result: MeanFieldResult, title: str) -> None:
    a.set_xlim(result.times[0], result.times[-1])
    a.set_ylim(-np.pi, np.pi)
    a.set_xlabel("t")
    a.set_ylabel(r"$\theta$")
    a.set_title(title)
    _pi_axis(a.yaxis)


def _particles(b: Axes, p: Axes, particles: Trajectory, run: int, cell: int, S: int,
               result: MeanFieldResult, c: np.ndarray, points: int, bins: int | None,
               low: float, top: float) -> None:
    """The particles' histogram against time (b) and the profiles at one time (p)."""
    shown = particles.times <= result.times[-1] + 1e-9 * max(1.0, abs(result.times[-1]))
    X = _states(particles, run)[shown]  # (T, n, 2)
    n = X.shape[1]
    if S > 1:  # the tokens of the label cell: labels (i + 1) / n in (cell / S, (cell + 1) / S]
        keep = np.ceil((np.arange(n) + 1) * S / n).astype(int) - 1 == cell
        X = X[:, keep]
    m = X.shape[1]
    if bins is None:
        bins = int(np.clip(round(2 * m ** (1 / 3)), 16, points))
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 2:
        raise fail("bins", "an integer >= 2", repr(bins))
    phi = np.arctan2(X[..., 1], X[..., 0])
    index = np.clip(((phi + np.pi) / (2 * np.pi) * bins).astype(int), 0, bins - 1)
    T = len(phi)
    counts = np.bincount((index + bins * np.arange(T)[:, None]).ravel(),
                         minlength=T * bins).reshape(T, bins)
    width = 2 * np.pi / bins
    hist = counts / (m * width)  # (T, bins), per unit angle
    edges = -np.pi + width * np.arange(bins + 1)
    times = particles.times[shown]
    b.pcolormesh(times, edges[:-1] + width / 2, hist.T, shading="nearest", cmap="Greys",
                 vmin=low, vmax=top, rasterized=True)
    _angle_time_axes(b, result, f"{m:,} particles (histogram, {bins} bins)")
    # the profiles at the last particle time that the result saved (else the nearest)
    match = np.abs(result.times[None, :] - times[:, None])  # (particle times, saves)
    close = np.flatnonzero(match.min(axis=1) <= 1e-9 * max(1.0, result.times[-1]))
    i = int(close[-1]) if close.size else int(np.argmin(match.min(axis=1)))
    j = int(np.argmin(match[i]))
    fine = -np.pi + 2 * np.pi * np.arange(points + 1) / points
    rho = to_grid(c[j], points)
    rho = np.append(rho, rho[0])
    # a histogram bin of n i.i.d. draws: count ~ Binomial(m, P), P = mass of the bin
    F = np.concatenate([[0.0], np.cumsum((rho[1:] + rho[:-1]) / 2 * np.diff(fine))])
    P = np.clip(np.diff(np.interp(edges, fine, F)), 0, 1)  # each bin's mass
    se = np.sqrt(P * (1 - P) / m) / width
    mid = edges[:-1] + width / 2
    p.fill_between(mid, P / width - 2 * se, P / width + 2 * se, step="mid", color="0.85",
                   lw=0, label=r"$\pm 2$ s.e. (i.i.d.)")
    p.plot(fine, rho, color="k", lw=1.2, label=r"$\rho$ (mean field)")
    p.stairs(hist[i], edges, color="tab:red", lw=1.0, baseline=None, label="particles")
    p.set_xlim(-np.pi, np.pi)
    p.set_ylim(0, None)
    p.set_xlabel(r"$\theta$")
    p.set_ylabel("density")
    p.set_title(f"t = {times[i]:.3g}" + ("" if abs(times[i] - result.times[j]) <= 1e-9 else
                                         f" (mean field at t = {result.times[j]:.3g})"))
    _pi_axis(p.xaxis)
    p.legend(loc="best")


def plot_moments(
    result: MeanFieldResult,
    particles: Trajectory,
    *,
    modes: Sequence[int] = (1, 2, 3),
    label: int = -1,
    run: int = 0,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """The particles' Fourier moments M_k(t) = (1/n) sum_j e^{i k theta_j(t)} against the
    mean field's m_k(t) = int e^{i k theta} rho(t, theta) dtheta, one panel per mode k: the
    real and imaginary parts of m_k as lines, each in the band m_k +- 2 sd / sqrt(n) within
    which the moments of n i.i.d. draws of rho(t) fall 95 % of the time (sd^2 = Var cos k
    theta = (1 + Re m_2k) / 2 - (Re m_k)^2, Var sin k theta = (1 - Re m_2k) / 2 - (Im m_k)^2;
    m_2k = 0 beyond K), and the particles' values as markers at their saved times; below,
    the particles' distance from the mean field in units of that standard error, sqrt(n)
    (M_k - m_k) / sd, in the band +-2 (readable at any n, where the top band is too thin to
    see).

    On S^2 (a result and particles with d = 3) the moments are those of the real orthonormal
    spherical harmonics Y_lm of `attnflow.analysis.moments.harmonic_moments` (mean of Y^2 over the
    sphere 1), one panel per degree l with every order m = -l..l as a line in its band
    m_lm +- 2 sd / sqrt(n), sd^2 = int Y_lm^2 rho - m_lm^2 (`sphere_field_moments`: the
    solver's Gauss grid, exact), and the same distance panel below.

    result : a `MeanFieldResult`; label: its label cell (causal mask: the particles of that
        cell are averaged, token i having the label (i + 1) / n).
    particles : an attnflow `Trajectory` on the circle (d = 2) or S^2 (d = 3) of the same
        model; run: which.
    modes : the modes k >= 1 to draw (at most K); on S^2 the degrees l >= 1 (at most L).
    """
    if not isinstance(result, MeanFieldResult):
        raise fail("result", "an attnflow.meanfield.MeanFieldResult", type(result).__name__)
    if not isinstance(particles, Trajectory) or particles.d not in (2, 3) or (
            result.d != particles.d):
        raise fail("particles", "an attnflow Trajectory on the circle (d = 2) or S^2 (d = 3) "
                   "beside a result on the same sphere", repr(particles)[:80])
    S, K = result.coefficients.shape[1], result.coefficients.shape[-1] - 1
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not (
            -S <= label < S):
        raise fail("label", f"a label cell index in [-{S}, {S})", repr(label))
    ks = np.asarray(modes)
    word = "modes" if result.d == 2 else "degrees"
    if ks.ndim != 1 or ks.size == 0 or not np.issubdtype(ks.dtype, np.integer) or np.any(
            ks < 1) or np.any(ks > K):
        raise fail("modes", f"a sequence of {word} in 1..{'K' if result.d == 2 else 'L'} = "
                   f"{K}", repr(modes))
    if result.d == 3:
        return _sphere_moments(result, particles, ks, label, run, figsize)
    X = _cell_tokens(particles, run, label, S)
    m = X.shape[1]
    got = fourier_moments(X, ks).mean  # (T, modes)
    coeffs = result.coefficients[:, label]  # (T, K + 1)
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=figsize or (COLUMN * len(ks), 4.2), layout="constrained")
        grid = fig.subplots(2, len(ks), sharex="col", squeeze=False,
                            gridspec_kw={"height_ratios": [3, 2]})
        inside = particles.times <= result.times[-1] + 1e-9 * max(1.0, abs(result.times[-1]))
        for a, z, k, values in zip(grid[0], grid[1], ks, got.T):
            mk = 2 * np.pi * np.conj(coeffs[:, k])
            m2k = 2 * np.pi * np.conj(coeffs[:, 2 * k]) if 2 * k <= K else 0 * mk
            sd_re = np.sqrt(np.clip((1 + m2k.real) / 2 - mk.real ** 2, 0, None))
            sd_im = np.sqrt(np.clip((1 - m2k.real) / 2 - mk.imag ** 2, 0, None))
            for part, centre, sd, ours, colour in (
                    ("Re", mk.real, sd_re, values.real, "tab:blue"),
                    ("Im", mk.imag, sd_im, values.imag, "tab:orange")):
                band = 2 * sd / np.sqrt(m)
                a.fill_between(result.times, centre - band, centre + band, color=colour,
                               alpha=0.25, lw=0)
                a.plot(result.times, centre, color=colour, lw=1.0,
                       label=f"{part} $m_{k}$ (mean field)")
                a.plot(particles.times, ours, "o", ms=2.5,
                       color=colour, mfc="none", label=f"{part} $M_{k}$ ({m:,} particles)")
                # the same in units of the band: sqrt(n) (M_k - m_k) / sd at the particles'
                # times (the mean field interpolated between its saves)
                t = particles.times[inside]
                scale = np.interp(t, result.times, sd) / np.sqrt(m)
                z.plot(t, (ours[inside] - np.interp(t, result.times, centre))
                       / np.where(scale > 0, scale, np.nan), "o-", ms=2.5, lw=0.6,
                       color=colour, mfc="none")
            z.axhspan(-2, 2, color="0.88", lw=0)
            z.axhline(0, color="k", lw=0.6)
            z.set_xlabel("t")
            a.set_title(rf"mode $k = {k}$: band $\pm 2\,$sd$/\sqrt{{n}}$")
            a.set_xlim(min(result.times[0], particles.times[0]),
                       max(result.times[-1], particles.times[-1]))
        grid[0, 0].set_ylabel("moment")
        grid[1, 0].set_ylabel(r"$\sqrt{n}\,(M_k - m_k)\,/\,$sd")
        grid[0, 0].legend(loc="best", fontsize=6)
    return fig


def _cell_tokens(particles: Trajectory, run: int, label: int, S: int) -> np.ndarray:
    """The states (T, m, d) of the tokens of label cell `label` of S (token i has the label
    (i + 1) / n; all tokens for S = 1)."""
    X = _states(particles, run)
    n = X.shape[1]
    if S > 1:
        X = X[:, np.ceil((np.arange(n) + 1) * S / n).astype(int) - 1 == label % S]
    return X


def sphere_field_moments(coefficients: np.ndarray, degree: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The mean field's moments m = int Y rho and standard deviations sd = (int Y^2 rho -
    m^2)^(1/2) of `harmonic_moments`' real harmonics Y of degrees 1..L' (L' = `degree`) for
    S^2 densities with coefficients (..., L + 1, L + 1) (the solver's): (..., M) each, by the
    solver's Gauss grid of degree max(L, L'), exact for rho Y^2 (degree L + 2 L' <=
    3 max(L, L') + 4)."""
    L = coefficients.shape[-1] - 1
    grid = SphereGrid(max(L, degree))
    c = coefficients
    if degree > L:
        pad = [(0, 0)] * (c.ndim - 2) + [(0, degree - L), (0, degree - L)]
        c = np.pad(c, pad)
    rho = grid.synthesis(c)  # (..., N_theta, N_phi), per unit area
    area = 2 * np.pi * grid.weights[:, None] / grid.n_phi  # the points' areas
    Y = np.stack(harmonic_basis(grid.points, degree)[0], -1)  # (N_theta, N_phi, M)
    mass = rho * area
    m = np.einsum("...jk,jkm->...m", mass, Y)
    second = np.einsum("...jk,jkm->...m", mass, Y * Y)
    return m, np.sqrt(np.clip(second - m * m, 0, None))


def _sphere_moments(result: MeanFieldResult, particles: Trajectory, degrees: np.ndarray,
                    label: int, run: int, figsize: tuple[float, float] | None) -> Figure:
    """`plot_moments` on S^2 (its docstring): one panel per degree, every order in it."""
    S = result.coefficients.shape[1]
    X = _cell_tokens(particles, run, label, S)
    n, top = X.shape[1], int(degrees.max())
    got = harmonic_moments(X, top)  # (T, M)
    field, sd = sphere_field_moments(result.coefficients[:, label], top)  # (T_mf, M)
    inside = particles.times <= result.times[-1] + 1e-9 * max(1.0, abs(result.times[-1]))
    t = particles.times[inside]
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=figsize or (COLUMN * len(degrees), 4.2), layout="constrained")
        grid = fig.subplots(2, len(degrees), sharex="col", squeeze=False,
                            gridspec_kw={"height_ratios": [3, 2]})
        for a, z, l in zip(grid[0], grid[1], degrees):
            columns = np.flatnonzero(got.degree == l)
            colours = mpl.colormaps["viridis"](np.linspace(0, 0.9, len(columns)))
            for i, colour in zip(columns, colours):
                centre, band = field[:, i], 2 * sd[:, i] / np.sqrt(n)
                m = int(got.order[i])
                a.fill_between(result.times, centre - band, centre + band, color=colour,
                               alpha=0.2, lw=0)
                a.plot(result.times, centre, color=colour, lw=1.0, label=f"$m = {m}$")
                a.plot(particles.times, got.mean[:, i], "o", ms=2.5, color=colour, mfc="none")
                scale = np.interp(t, result.times, sd[:, i]) / np.sqrt(n)
                z.plot(t, (got.mean[inside, i] - np.interp(t, result.times, centre))
                       / np.where(scale > 0, scale, np.nan), "o-", ms=2.5, lw=0.6,
                       color=colour, mfc="none")
            z.axhspan(-2, 2, color="0.88", lw=0)
            z.axhline(0, color="k", lw=0.6)
            z.set_xlabel("t")
            a.set_title(rf"degree $l = {l}$: band $\pm 2\,$sd$/\sqrt{{n}}$")
            a.set_xlim(min(result.times[0], particles.times[0]),
                       max(result.times[-1], particles.times[-1]))
            a.legend(loc="best", fontsize=6, ncol=2 if l > 2 else 1,
                     title=f"lines: mean field; o: {n:,} particles", title_fontsize=6)
        grid[0, 0].set_ylabel(r"moment $\langle Y_{lm} \rangle$")
        grid[1, 0].set_ylabel(r"$\sqrt{n}\,(M_{lm} - m_{lm})\,/\,$sd")
        if result.resolution_lost_at is not None:
            fig.suptitle(f"mean field: resolution lost at t = {result.resolution_lost_at:.3g}")
    return fig
