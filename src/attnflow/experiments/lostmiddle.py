"""Lost in the middle: the U-shaped retrieval profile of causal attention with ALiBi and the
critical time of recency (*Kinetic theory for Transformers and the lost-in-the-middle
phenomenon*, arXiv 2605.09213; docs/science.md §11.1).

The source's model in attnflow's terms: tokens on the circle, Q = K = V = I, causal mask,
the positional weighting (exp(beta <x_i, x_j>) times ALiBi's position weights e^{-slope (i -
j) / n} normalised over the keys a row sees), ALiBi slope `slope` / n per token; the source's
velocity carries a factor beta, so its time is attnflow's divided by beta (and its t_crit is
ours divided by beta). For n iid uniform tokens (`attnflow.analysis.kinetic`):

    n E[cos k(theta_n(t) - theta_j(0))] -> (sigma'(s) / sigma(1)) psi_{r_k t}(log(sigma(1) /
    sigma(s))),  sigma(s) = (e^{slope s} - 1) / slope,  r_k = k^2 I_k(beta) / beta,

and the soft accuracy S_t(s) sums it with the weights w_k = e^{-pi^2 k^2 / (2 M^2)}, k = 1..20,
M = 8 (the source's). Its slope at the right end s -> 1 is a t (t_crit - t) with t_crit =
2 (1 - e^{-slope}) sum w_k r_k / sum w_k r_k^2: the profile rises towards the last tokens
(recency, with primacy: a U) before t_crit and falls after.

Measured for each (beta, slope) in `settings` at the times `factors` x t_crit, on label
cells (`cells` equal ones on [0, e], then `fine` cells of width `fine_width`, the last cell
of width `last` standing for the last tokens): particles (harmonic kernel, `runs` iid uniform
starts of n tokens, RK4 at dt = `dt` / beta) regressed as in causalprofile
(`attnflow.experiments._cells`) for every mode k = 1..20 and summed with the w_k; the closed
form averaged over the same cells (`cell_memory`). Standard errors: jackknife over `groups`
groups of runs (the modes, cells and times share runs). The right-end slope: the least-squares
line through the fine cells at each time; t(alpha - gamma t) fitted to it over the times gives
the measured crossing alpha / gamma, set against the same fit of the closed form's cells and
against t_crit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import (
    cell_memory,
    dispersion_rate,
    recency_time,
    soft_accuracy,
    soft_weights,
)
from attnflow.analysis.kinetic import SOFT_MODES
from attnflow.experiments._cells import CellMoments, cell_moments, regress
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention

PAPERS = ("2605.09213",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "lostmiddle"
TITLE = "Lost in the middle: the U-shaped retrieval profile with ALiBi and its critical time"
QUICK: dict[str, Any] = {
    "settings": [[1.0, 1.0]], "factors": [0.5, 1.0, 1.25], "n": 2000, "runs": 32,
    "cells": 8, "fine": 4, "fine_width": 0.025, "last": 0.02, "dt": 0.5, "groups": 12,
    "chunk": 16,
}
FULL: dict[str, Any] = {**QUICK, "settings": [[1.0, 1.0], [1.0, 3.0], [2.0, 1.0]],
                        "factors": [0.5, 0.75, 1.0, 1.25], "n": 10_000, "runs": 1024,
                        "cells": 12, "groups": 48}
FULL_MINUTES = 12  # estimated: 92 RK4 evaluations of 1024 x 1e4 tokens at ~0.6 us per token


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    rng = np.random.default_rng(seed)
    edges = _edges(params)
    settings = [(float(b), float(lam)) for b, lam in params["settings"]]
    results = []
    for i, (beta, lam) in enumerate(settings):
        results.append(_setting(params, beta, lam, edges, rng, lambda f, i=i: progress(
            (i + f) / len(settings))))
    claims = [_profile_claim(results, params), _crit_claim(results, params)]
    figures = [save_figure(_profile_figure(results, edges), out, "lostmiddle.png"),
               save_figure(_crit_figure(results), out, "lostmiddle_tcrit.png")]
    numbers = {"edges": edges, "settings": [{k: v for k, v in r.items() if k != "moments"}
                                            for r in results]}
    notes = [f"Particles: n = {params['n']}, {params['runs']} iid uniform starts per setting, "
             f"harmonic kernel, positional weighting, ALiBi slope lambda / n per token, RK4 "
             f"dt = {params['dt']:g} / beta; the source's time is t / beta. Cells: "
             f"{params['cells']} equal ones, {params['fine']} of width {params['fine_width']:g}, "
             f"the last {params['last']:g} the receivers; modes 1..{SOFT_MODES} with weights "
             f"e^(-pi^2 k^2 / 128); jackknife over {params['groups']} groups of runs. attnflow's "
             "causal mask lets a token see itself (the source: strictly earlier tokens), which "
             "changes the position normaliser by O(1/n)."]
    return Output(numbers, claims, figures, notes)


def _edges(params: dict[str, Any]) -> np.ndarray:
    """The label edges (S + 1,): `cells` equal cells, then `fine` of width `fine_width`, then
    the last cell of width `last`."""
    top = 1.0 - params["last"] - params["fine"] * params["fine_width"]
    coarse = np.linspace(0.0, top, params["cells"] + 1)
    fine = top + params["fine_width"] * np.arange(1, params["fine"] + 1)
    return np.concatenate([coarse, fine, [1.0]])


def _setting(params, beta, lam, edges, rng, progress) -> dict[str, Any]:
    """One (beta, slope): closed form and particles on the cells at the times factors x
    t_crit."""
    t_crit = recency_time(beta, lam)
    times = [f * t_crit for f in params["factors"]]
    model = Attention(beta=beta, mask="causal", backend="harmonic", attention="positional",
                      alibi=lam / params["n"])
    modes = list(range(1, SOFT_MODES + 1))
    moments = cell_moments(model, params["n"], params["runs"], edges, modes, times,
                           params["dt"] / beta, params["chunk"], rng, progress)
    closed = _closed_cells(times, beta, lam, edges)
    soft, se, slope, slope_se, t_hat, t_hat_se = _measure(moments, params, edges, times)
    slope_closed = _slopes(closed, edges, params)
    t_fit = _crossing(np.asarray(times), slope_closed, np.ones_like(slope_closed))
    return {"beta": beta, "slope": lam, "t_crit": t_crit, "times": times, "closed": closed,
            "particles": soft, "particles_se": se, "right_slope": slope,
            "right_slope_se": slope_se, "right_slope_closed": slope_closed, "t_hat": t_hat,
            "t_hat_se": t_hat_se, "t_fit_closed": t_fit}


def _closed_cells(times, beta, lam, edges) -> np.ndarray:
    """The soft accuracy averaged over the cells (source cell b, the last cell as receivers)
    (T, S - 1)."""
    w = soft_weights()
    r = dispersion_rate(np.arange(1, SOFT_MODES + 1), beta, attention="unnormalised")
    last = (edges[-2], edges[-1])
    return np.array([[sum(wk * cell_memory((edges[b], edges[b + 1]), last, rk * t, slope=lam)
                          for wk, rk in zip(w, r))
                      for b in range(len(edges) - 2)] for t in times])


def _soft(moments: CellMoments) -> np.ndarray:
    """The particles' soft accuracy on the cells (T, S - 1): the modes' memories summed with
    the weights w_k."""
    est, _ = regress(moments)
    return np.tensordot(soft_weights(), est, axes=1)


def _slopes(profile: np.ndarray, edges: np.ndarray, params) -> np.ndarray:
    """The least-squares slope (T,) of the profile (T, S - 1) over the fine cells' centres."""
    centres = (edges[:-1] + edges[1:])[:-1] / 2
    pick = slice(len(centres) - params["fine"], len(centres))
    return np.polyfit(centres[pick], profile[:, pick].T, 1)[0]


def _crossing(times: np.ndarray, slope: np.ndarray, se: np.ndarray) -> float:
    """alpha / gamma of the weighted least-squares fit slope(t) = t (alpha - gamma t): the
    time at which the right-end slope changes sign."""
    X = np.stack([times, -times**2], axis=1) / se[:, None]
    alpha, gamma = np.linalg.lstsq(X, slope / se, rcond=None)[0]
    return float(alpha / gamma)


def _measure(moments: CellMoments, params, edges, times):
    """Soft accuracy, right-end slopes and crossing time from particles, each with its
    jackknife standard error over groups of runs."""
    times = np.asarray(times)
    R, G = moments.A.shape[0], params["groups"]
    soft = _soft(moments)
    slope = _slopes(soft, edges, params)
    groups = np.array_split(np.arange(R), G)
    leave = [_soft(moments.take(np.setdiff1d(np.arange(R), g))) for g in groups]
    soft_j = np.stack(leave)  # (G, T, S - 1)
    slope_j = np.stack([_slopes(s, edges, params) for s in leave])

    def spread(x):
        return np.sqrt((G - 1) / G * np.sum((x - x.mean(axis=0)) ** 2, axis=0))

    soft_se, slope_se = spread(soft_j), spread(slope_j)
    t_hat = _crossing(times, slope, slope_se)
    t_j = np.array([_crossing(times, s, slope_se) for s in slope_j])
    return soft, soft_se, slope, slope_se, t_hat, float(spread(t_j))


def _profile_claim(results, params) -> Claim:
    p = np.concatenate([r["particles"].ravel() for r in results])
    c = np.concatenate([r["closed"].ravel() for r in results])
    se = np.concatenate([r["particles_se"].ravel() for r in results])
    z = np.abs(p - c) / se
    w = 1 / se**2
    ratio = float(np.sum(w * p * c) / np.sum(w * c**2))  # least-squares scale
    ratio_se = float(1 / np.sqrt(np.sum(w * c**2)))
    per = "; ".join(
        f"beta {r['beta']:g}, slope {r['slope']:g}: largest z "
        f"{np.max(np.abs(r['particles'] - r['closed']) / r['particles_se']):.2f}"
        for r in results)
    return claim(
        "lostmiddle.profile",
        measured=f"n = {params['n']}, {params['runs']} runs per setting: largest |particles - "
        f"closed form| / se {z.max():.2f} over {z.size} (setting, time, cell) triples ({per}); "
        f"finite-n deficit: fitted scale particles / closed form {ratio:.4f} +- {ratio_se:.4f}",
        values={"largest_z": float(z.max()), "scale_off": abs(ratio - 1.0)})


def _crit_claim(results, params) -> Claim:
    z = [abs(r["t_hat"] - r["t_fit_closed"]) / r["t_hat_se"] for r in results]
    resolution = [abs(r["t_fit_closed"] / r["t_crit"] - 1) for r in results]
    off = [abs(r["t_hat"] / r["t_crit"] - 1) for r in results]
    per = "; ".join(
        f"beta {r['beta']:g}, slope {r['slope']:g}: particles {r['t_hat']:.3f} +- "
        f"{r['t_hat_se']:.3f}, closed form on the cells {r['t_fit_closed']:.3f}, t_crit "
        f"{r['t_crit']:.3f} (source's time "
        f"{r['t_crit'] / r['beta']:.3f})" for r in results)
    return claim(
        "lostmiddle.recency",
        measured=f"time at which the right-end slope changes sign (attnflow time): {per}",
        values={"largest_z": float(max(z)), "resolution": float(max(resolution)),
                "largest_off": float(max(off)),
                "precision": float(max(r["t_hat_se"] / r["t_crit"] for r in results))})


def _profile_figure(results, edges) -> Figure:
    fig = Figure(figsize=(4.2 * len(results), 4.4))
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    centres = (edges[:-1] + edges[1:])[:-1] / 2
    fine = np.linspace(0.004, 0.996, 400)
    for ax, r in zip(axes, results):
        for i, t in enumerate(r["times"]):
            color = f"C{i}"
            ax.plot(fine, soft_accuracy(fine, t, r["beta"], r["slope"]), color=color, lw=0.8,
                    ls=":")
            ax.stairs(r["closed"][i], edges[:-1], baseline=None, color=color, lw=1.1,
                      label=f"t = {t / r['t_crit']:g} t_crit")
            ax.errorbar(centres, r["particles"][i], yerr=2 * r["particles_se"][i], fmt="o",
                        color=color, ms=3, mfc="none", elinewidth=0.8)
        ax.set(yscale="log", xlabel="label s of the retrieved token",
               title=f"beta = {r['beta']:g}, ALiBi slope {r['slope']:g}: "
               f"t_crit = {r['t_crit']:.2f}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, title="closed form: cells (steps), point (dotted);\n"
                  "particles: circles, 2 se", title_fontsize=7)
    axes[0].set_ylabel("soft accuracy n E[sum_k w_k cos k(theta_n(t) - theta_j(0))]")
    fig.tight_layout()
    return fig


def _crit_figure(results) -> Figure:
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    for i, r in enumerate(results):
        color = f"C{i}"
        x = np.asarray(r["times"]) / r["t_crit"]
        scale = np.max(np.abs(r["right_slope_closed"]))
        ax.plot(x, r["right_slope_closed"] / scale, "-", color=color, lw=1.1,
                label=f"beta {r['beta']:g}, slope {r['slope']:g}: closed form (cells)")
        ax.errorbar(x, r["right_slope"] / scale, yerr=2 * r["right_slope_se"] / scale, fmt="o",
                    color=color, ms=4, mfc="none",
                    label=f"particles: crossing {r['t_hat'] / r['t_crit']:.3f} +- "
                    f"{r['t_hat_se'] / r['t_crit']:.3f} t_crit")
    ax.set_ylim(-2.5, 2.5)  # the closed form's range: error bars beyond it are cut
    ax.axhline(0, color="k", lw=0.6)
    ax.axvline(1, color="k", lw=0.8, ls="--", label="derived t_crit")
    ax.set(xlabel="t / t_crit", ylabel="right-end slope over the last cells / closed form's max",
           title="recency until t_crit: the slope of the profile over the last cells")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
