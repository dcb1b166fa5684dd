"""Long context: one attention layer at beta = gamma log n, collapse or identity
(*Critical attention scaling in long-context transformers*, docs/science.md §6).

One layer of full attention with Q = K = V = I on n tokens of pairwise correlation rho; the
claim is about the attention output y_i = sum_j w_ij theta_j itself (`attention_output`). At
beta = gamma log n the self-weight is n^{gamma(1-rho)} / (n^{gamma(1-rho)} + n - 1), and the
output correlation corr(y_i, y_k) tends as n -> infinity to 1 (collapse) for
gamma < gamma_c = 1/(1 - rho), to 4 rho / (1 + 3 rho) at gamma_c and to rho (identity) above;
the transition sharpens as n grows (its width in gamma shrinks like 1 / log n).

Measured: on exact equiangular inputs (d = n, `equiangular_start`) the engine's output
correlation against the exact finite-n formula (`output_correlation`) over a grid of gamma,
its distance to the three limits as n grows, and the width of the transition (the gamma
interval where the correlation falls from rho + 0.9 (1 - rho) to rho + 0.1 (1 - rho), read
off the measured curve by linear interpolation) against n. On random high-dimensional inputs
(theta_i = sqrt(rho) u + sqrt(1 - rho) z_i, z_i uniform on the unit sphere of u^perp in R^d,
pairwise correlations rho +- (1 - rho) d^{-1/2}) the mean output correlation against the
equiangular formula.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.optimize import brentq

from attnflow.analysis.closedforms import (
    equiangular_start,
    output_correlation,
    output_correlation_limit,
)
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.sphere import normalize

PAPERS = ("2510.05554",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "longcontext"
TITLE = "Long context: output correlation of one layer at beta = gamma log n"
QUICK: dict[str, Any] = {"rho": 0.5, "n_exact": [100, 316, 1000], "n_random": [100, 1000],
                         "d_random": 256, "gamma_over_critical": [0.25, 2.5, 31]}
FULL: dict[str, Any] = {**QUICK, "n_exact": [100, 316, 1000, 3162],
                        "n_random": [100, 1000, 10000], "gamma_over_critical": [0.25, 2.5, 46]}
FULL_MINUTES = 8  # estimated from the quick size (7 s of CPU time) by the work ratio

# The limits are checked at these multiples of the critical gamma (always on the grid).
CHECKS = (0.5, 1.0, 2.0)
LEVELS = (0.9, 0.1)  # the transition runs between rho + 0.9 (1 - rho) and rho + 0.1 (1 - rho)


def gamma_grid(params: dict[str, Any]) -> np.ndarray:
    """gamma / gamma_c on the grid: linspace(start, stop, num) together with CHECKS."""
    start, stop, num = params["gamma_over_critical"]
    return np.union1d(np.linspace(start, stop, int(num)), CHECKS)


def random_inputs(n: int, d: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """theta_i = sqrt(rho) e_0 + sqrt(1 - rho) z_i, z_i uniform on the unit sphere of e_0^perp:
    (n, d) unit vectors of pairwise correlation rho on average."""
    z = normalize(rng.standard_normal((n, d - 1)))
    return np.hstack([np.full((n, 1), np.sqrt(rho)), np.sqrt(1.0 - rho) * z])


def mean_correlation(theta: np.ndarray) -> float:
    """The mean of <y_i, y_k> / (|y_i| |y_k|) over pairs i != k of the rows of theta (n, d)."""
    n = theta.shape[0]
    s = normalize(theta).sum(axis=0)
    return float((s @ s - n) / (n * (n - 1)))


def output_correlations(theta: np.ndarray, rho_c: float, ratios: np.ndarray) -> np.ndarray:
    """The engine's mean output correlation of one full-attention layer (Q = K = V = I) at
    beta = gamma log n, gamma = ratio / (1 - rho_c), for each ratio: shape (len(ratios),)."""
    n = theta.shape[0]
    out = np.empty(len(ratios))
    for i, ratio in enumerate(ratios):
        beta = ratio / (1.0 - rho_c) * np.log(n)
        out[i] = mean_correlation(Attention(beta=beta, mask="full").attention_output(theta))
    return out


def transition_width(ratios: np.ndarray, corr: np.ndarray, rho: float) -> float:
    """Width in gamma / gamma_c of the fall of a decreasing correlation curve from
    rho + 0.9 (1 - rho) to rho + 0.1 (1 - rho), by linear interpolation (NaN if not crossed)."""
    levels = [rho + level * (1.0 - rho) for level in LEVELS]
    if not corr[0] > levels[0] or not corr[-1] < levels[1]:
        return float("nan")
    # np.interp needs increasing x: the curve decreases in gamma.
    cross = [float(np.interp(level, corr[::-1], ratios[::-1])) for level in levels]
    return cross[1] - cross[0]


def formula_width(n: float, rho: float) -> float:
    """The same width from the exact finite-n formula (root finding)."""
    gc = 1.0 / (1.0 - rho)
    cross = [brentq(lambda r, y: output_correlation(n, r * gc, rho) - y, 1e-3, 50.0,
                    args=(rho + level * (1.0 - rho),), xtol=1e-13) for level in LEVELS]
    return cross[1] - cross[0]


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    rho = float(params["rho"])
    gc = 1.0 / (1.0 - rho)
    ratios = gamma_grid(params)
    checks = [int(np.flatnonzero(np.isclose(ratios, c))[0]) for c in CHECKS]
    work = [n**2 * n for n in params["n_exact"]] + [n**2 * params["d_random"]
                                                   for n in params["n_random"]]
    done = 0.0

    exact = []
    for n in params["n_exact"]:
        theta = equiangular_start(n, n, rho)
        corr = output_correlations(theta, rho, ratios)
        formula = output_correlation(n, ratios * gc, rho)
        exact.append({"n": n, "corr": corr, "formula": formula,
                      "max_error": float(np.max(np.abs(corr - formula))),
                      "width": transition_width(ratios, corr, rho),
                      "width_formula": formula_width(n, rho),
                      "at_checks": corr[checks]})
        done += n**3
        progress(done / sum(work))
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    rand = []
    for n in params["n_random"]:
        theta = random_inputs(n, params["d_random"], rho, rng)
        rho_in = mean_correlation(theta)
        corr = output_correlations(theta, rho, ratios)
        formula = output_correlation(n, ratios * gc, rho)
        rand.append({"n": n, "d": params["d_random"], "input_correlation": rho_in,
                     "corr": corr, "formula": formula,
                     "max_deviation": float(np.max(np.abs(corr - formula)))})
        done += n**2 * params["d_random"]
        progress(done / sum(work))

    limits = output_correlation_limit(np.array(CHECKS) * gc, rho)
    claims = [_formula_claim(exact, params), _limits_claim(exact, limits, params),
              _width_claim(exact, params), _random_claim(rand, params)]
    figures = [save_figure(_figure(ratios, exact, rand, limits, rho), out, "longcontext.png")]
    numbers = {"rho": rho, "gamma_critical": gc, "gamma_over_critical": ratios,
               "checks": CHECKS, "limits": limits, "exact": exact, "random": rand}
    notes = [f"rho = {rho:g}, gamma_c = 1/(1 - rho) = {gc:g}; one layer, full attention, "
             "Q = K = V = I; correlations are means over all pairs i != k of the outputs y_i "
             "(exact inputs: all pairs equal). Width: the gamma / gamma_c interval where the "
             f"correlation falls from rho + {LEVELS[0]:g} (1 - rho) to rho + {LEVELS[1]:g} "
             "(1 - rho)."]
    return Output(numbers, claims, figures, notes)


def _formula_claim(exact, params) -> Claim:
    worst = max(r["max_error"] for r in exact)
    return claim("longcontext.formula",
                 measured=f"max |engine - formula| over gamma and n = {params['n_exact']}: "
                 f"{worst:.1e}", values={"max_error": worst})


def _limits_claim(exact, limits, params) -> Claim:
    dist = np.array([np.abs(r["at_checks"] - limits) for r in exact])  # (n, 3)
    names = ("gamma_c/2 -> 1", "gamma_c -> 4rho/(1+3rho)", "2 gamma_c -> rho")
    return claim(
        "longcontext.limits",
        measured="; ".join(f"{name} ({lim:.4f}): " + ", ".join(
            f"n={r['n']}: {r['at_checks'][j]:.4f}" for r in exact)
            for j, (name, lim) in enumerate(zip(names, limits))),
        values={"not_approaching": int(np.sum(np.diff(dist, axis=0) >= 0)),
                "limit_distance": float(dist[-1].max())}, n=exact[-1]["n"])


def _width_claim(exact, params) -> Claim:
    n = np.array([r["n"] for r in exact], dtype=float)
    width = np.array([r["width"] for r in exact])
    wf = np.array([r["width_formula"] for r in exact])
    steps = np.diff(width)
    law = width * np.log(n)
    return claim(
        "longcontext.width",
        measured="width in gamma/gamma_c: " + ", ".join(
            f"n={int(k)}: {w:.3f} (formula {f:.3f})" for k, w, f in zip(n, width, wf))
        + "; width x ln n: " + ", ".join(f"{v:.2f}" for v in law),
        values={"not_shrinking": int(np.sum(~(steps < 0))) + int(np.sum(~np.isfinite(width))),
                "width_off": float(np.max(np.abs(width / wf - 1.0)))})


def _random_claim(rand, params) -> Claim:
    worst = max(r["max_deviation"] for r in rand)
    return claim(
        "longcontext.random",
        measured=f"d = {params['d_random']}, input correlation " + ", ".join(
            f"n={r['n']}: {r['input_correlation']:.4f}" for r in rand)
        + "; max |mean output correlation - formula| over gamma: " + ", ".join(
            f"n={r['n']}: {r['max_deviation']:.4f}" for r in rand),
        values={"max_deviation": worst})


def _figure(ratios, exact, rand, limits, rho) -> Figure:
    fig = Figure(figsize=(11.0, 4.2))
    ax, bx = fig.subplots(1, 2)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for r, color in zip(exact, colors):
        ax.plot(ratios, r["formula"], color=color, lw=1)
        ax.plot(ratios, r["corr"], "o", ms=3, color=color, label=f"n = {r['n']} (equiangular)")
    for r, color in zip(rand, colors[::-1]):
        ax.plot(ratios, r["corr"], "x", ms=4, color=color,
                label=f"n = {r['n']} (random, d = {r['d']})")
    ax.hlines([1.0, rho], [ratios[0], 1.0], [1.0, ratios[-1]], color="k", ls="--", lw=1,
              label="n -> inf limits")
    ax.plot([1.0], [limits[1]], "k*", ms=9)
    ax.set(xlabel="gamma / gamma_c", ylabel="output correlation",
           title=f"one layer, beta = gamma log n, rho = {rho:g} (lines: formula)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    n = np.array([r["n"] for r in exact], dtype=float)
    bx.plot(n, [r["width"] for r in exact], "o", label="measured")
    fine = np.geomspace(n[0], n[-1] * 10, 40)
    bx.plot(fine, [formula_width(k, rho) for k in fine], "-", label="finite-n formula")
    bx.set(xscale="log", xlabel="n", ylabel="transition width (gamma / gamma_c)",
           title="width of the fall from 90 % to 10 %")
    bx.legend()
    bx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
