"""The mean field on S^2 (d = 3): the dispersion relation of the uniform state and the
tricritical structure of noisy unnormalised attention, from the spherical-harmonic solver
(`attnflow.meanfield.sphere`; docs/science.md §9, §11.2).

Full attention, Q = K = V = I (times the strength K).

* Rates: the uniform density plus c_lm = `eps` (m = 0 and m = l), solved to T = min(1 /
  gamma_l, 3) at degree max(8, 2 l); gamma_solver = log(|c_lm(T)| / eps) / T against the
  Funk-Hecke rate gamma_l = l (l + 1) i_l(beta) / beta [/ i_0(beta) for softmax]
  (`funk_hecke_rate`).
* Threshold: unnormalised weights, sigma = 1: the l = 1 rate sigma^2 (K / K_# - 1) is
  affine in the strength K; the solver's rates at 0.9 K_# and 1.1 K_# give its zero.
* Continuous (beta = 1 < beta_*): the clustered start e^{2 z} at 1.2 K_# settles on the
  stationary branch r(K) (`attnflow.analysis.closedforms.stationary_order`), r = |int x rho|; at
  0.9 K_#
  it returns to the uniform state.
* Bistable (beta = 2.5 > beta_*): at K = (K_sn + K_#) / 2 the clustered start e^{3.3 z}
  settles on the branch (degree 40: the clustered state at this beta is sharper than a
  von Mises-Fisher bump of the same r) while the uniform state decays at sigma^2 (K / K_# -
  1) < 0. Zonal starts with V = I stay zonal: the solver then computes the orders m = 0 only.
* Particles: n tokens iid uniform on S^2, `runs` runs per beta, RK4 with the harmonic kernel;
  the power p_l (`harmonic_power`, mean 1/n at the start) of degrees l = 1..2 l* fitted over
  the linear window exactly as on the circle (`attnflow.experiments.dispersion`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.special import spherical_in
from scipy.stats import t as student_t

from attnflow.analysis.closedforms import (
    instability_strength,
    stationary_order,
    transition_strengths,
)
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.experiments.dispersion import linear_window_rates
from attnflow.family import Attention
from attnflow.meanfield import from_function, solve
from attnflow.meanfield.sphere import MASS0, empirical, mean_direction
from attnflow.sphere import uniform

PAPERS = ("2410.23228", "2606.05140")
NAME = "funkhecke"
TITLE = "The mean field on S^2: Funk-Hecke rates, K_# and the tricritical structure from the " \
        "spherical-harmonic solver"
QUICK: dict[str, Any] = {
    "betas": [4.0, 9.0], "unnormalised_betas": [3.0], "lmax": 4, "eps": 1e-10,
    "threshold_betas": [1.0, 2.5], "continuous_beta": 1.0, "continuous_degree": 24,
    "hold": 15.0, "bistable_beta": 2.5, "bistable_degree": 40, "bistable_hold": 30.0,
    "clustered": False,
    "particle_betas": [4.0], "n": 10_000, "runs": 8, "dt": 0.1, "save_every": 0.1,
    "bound": 0.1, "backend": "harmonic:1e-9", "t_max": 20.0,
}
FULL: dict[str, Any] = {**QUICK, "betas": [4.0, 9.0, 25.0], "lmax": 6, "hold": 30.0,
                        "clustered": True, "particle_betas": [4.0, 9.0], "n": 100_000,
                        "runs": 16}
FULL_MINUTES = 17  # measured: 991 s of CPU (load 10-17), mostly the particles
SIGMA = 1.0


def funk_hecke_rate(l: Any, beta: float, weighting: str, strength: float = 1.0,
                    sigma: float = 0.0) -> np.ndarray:
    """gamma_l = l (l + 1) (K i_l(beta) / beta [/ i_0(beta)] - sigma^2 / 2) of the uniform
    state on S^2 (docs/science.md §9)."""
    l = np.asarray(l, dtype=float)
    rate = strength * spherical_in(l.astype(int), beta) / beta
    if weighting == "softmax":
        rate = rate / spherical_in(0, beta)
    return l * (l + 1) * (rate - sigma**2 / 2)


def _uniform_plus(degree: int, l: int, m: int, eps: float) -> np.ndarray:
    c = np.zeros((1, degree + 1, degree + 1), dtype=complex)
    c[0, 0, 0] = MASS0
    c[0, l, m] = eps
    return c


def solver_rate(model: Attention, l: int, m: int, eps: float, T: float,
                noise: float | None = None) -> float:
    """The measured growth rate of c_lm from the uniform state plus c_lm = eps."""
    res = solve(model, _uniform_plus(max(8, 2 * l), l, m, eps), T, save_at=[0.0, T],
                noise=noise)
    return float(np.log(abs(res.coefficients[-1, 0, l, m]) / eps) / T)


def _horizon(rate: float) -> float:
    return float(min(1 / abs(rate), 3.0))


def _rates(params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    cases = [(b, "softmax") for b in params["betas"]] + [
        (b, "unnormalised") for b in params["unnormalised_betas"]]
    for beta, weighting in cases:
        model = Attention(beta=beta, mask="full", attention=weighting)
        for l in range(1, params["lmax"] + 1):
            closed = float(funk_hecke_rate(l, beta, weighting))
            for m in (0, l):
                measured = solver_rate(model, l, m, params["eps"], _horizon(closed))
                rows.append({"beta": beta, "weighting": weighting, "l": l, "m": m,
                             "closed": closed, "solver": measured})
    return rows


def _threshold(beta: float, eps: float) -> dict[str, float]:
    K_sharp = instability_strength(beta, 3, SIGMA)
    strengths = (0.9 * K_sharp, 1.1 * K_sharp)
    rates = []
    for K in strengths:
        closed = float(funk_hecke_rate(1, beta, "unnormalised", K, SIGMA))
        model = Attention(beta=beta, mask="full", attention="unnormalised", strength=K)
        rates.append(solver_rate(model, 1, 0, eps, _horizon(closed), noise=SIGMA))
    (K1, K2), (g1, g2) = strengths, rates
    return {"beta": beta, "K_sharp": K_sharp, "K_solver": K1 - g1 * (K2 - K1) / (g2 - g1),
            "rates": rates}


def order_path(beta: float, K: float, a: float, degree: int, hold: float
               ) -> tuple[np.ndarray, np.ndarray, float | None]:
    """(times, r(t), resolution lost at) of the solver from the start e^{a z} (normalised):
    unnormalised weights, strength K, sigma = 1."""
    start = from_function(lambda x: np.exp(a * x[..., 2]), degree, d=3)
    model = Attention(beta=beta, mask="full", attention="unnormalised", strength=K)
    res = solve(model, start, hold, noise=SIGMA, save_at=np.linspace(0.0, hold, 31))
    r = np.linalg.norm(mean_direction(res.coefficients[:, 0]), axis=-1)
    return res.times, r, res.resolution_lost_at


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    rates = _rates(params)
    progress(0.2)
    thresholds = [_threshold(b, params["eps"]) for b in params["threshold_betas"]]
    progress(0.3)
    beta_c, hold = params["continuous_beta"], params["hold"]
    K_c = instability_strength(beta_c, 3, SIGMA)
    above = order_path(beta_c, 1.2 * K_c, 2.0, params["continuous_degree"], hold)
    below = order_path(beta_c, 0.9 * K_c, 2.0, params["continuous_degree"], hold)
    progress(0.5)
    beta_b = params["bistable_beta"]
    ts = transition_strengths(beta_b, 3, SIGMA)
    K_mid = (ts.spinodal + ts.instability) / 2
    closed_decay = float(funk_hecke_rate(1, beta_b, "unnormalised", K_mid, SIGMA))
    decay = solver_rate(Attention(beta=beta_b, mask="full", attention="unnormalised",
                                  strength=K_mid), 1, 0, params["eps"], _horizon(closed_decay),
                        noise=SIGMA)
    clustered = (order_path(beta_b, K_mid, 3.3, params["bistable_degree"],
                            params["bistable_hold"]) if params["clustered"] else None)
    progress(0.6)
    rngs = [np.random.default_rng(s) for s in
            np.random.SeedSequence(seed).spawn(len(params["particle_betas"]))]
    particles = [_particle_rates(b, params, rng)
                 for b, rng in zip(params["particle_betas"], rngs)]
    progress(0.95)
    numbers = {
        "particles": particles,
        "rates": rates, "thresholds": thresholds,
        "continuous": {"beta": beta_c, "K_sharp": K_c,
                       "r_branch": stationary_order(1.2 * K_c, beta_c, 3, SIGMA),
                       "above": _path(above), "below": _path(below)},
        "bistable": {"beta": beta_b, "K": K_mid, "K_sharp": ts.instability,
                     "K_spinodal": ts.spinodal, "r_branch": stationary_order(K_mid, beta_b, 3,
                                                                            SIGMA),
                     "decay": decay, "decay_closed": closed_decay,
                     "clustered": None if clustered is None else _path(clustered)},
    }
    claims = _claims(numbers, params)
    figures = [save_figure(_figure(numbers), out, "funkhecke.png")]
    return Output(numbers, claims, figures)


def degrees_of(beta: float) -> np.ndarray:
    """The measured degrees l = 1..2 l*, l* the fastest softmax degree at beta."""
    l = np.arange(1, 64)
    return np.arange(1, 2 * int(l[np.argmax(funk_hecke_rate(l, beta, "softmax"))]) + 1)


def harmonic_power(x: np.ndarray, lmax: int) -> np.ndarray:
    """p_l = 4 pi / (2 l + 1) sum_{m = -l..l} |M_lm|^2 of the empirical coefficients M_lm
    (`attnflow.meanfield.sphere.empirical`), l = 1..lmax, of tokens x (..., n, 3) on S^2:
    (..., lmax); mean 1/n for iid uniform tokens."""
    M = empirical(x, lmax)[..., 1:, :]
    l = np.arange(1, lmax + 1)
    total = np.abs(M[..., 0]) ** 2 + 2 * np.sum(np.abs(M[..., 1:]) ** 2, axis=-1)
    return 4 * np.pi / (2 * l + 1) * total


def _particle_rates(beta: float, params: dict[str, Any], rng: np.random.Generator
                    ) -> dict[str, Any]:
    model = Attention(beta=beta, mask="full", backend=params["backend"])
    x = uniform((int(params["runs"]), int(params["n"])), 3, rng)
    l = degrees_of(beta)
    fit = linear_window_rates(model, x, lambda y: harmonic_power(y, l.size), params)
    return {"beta": beta, "l": l, "formula": funk_hecke_rate(l, beta, "softmax"), **fit}


def _path(path: tuple[np.ndarray, np.ndarray, float | None]) -> dict[str, Any]:
    t, r, lost = path
    return {"t": t, "r": r, "resolution_lost_at": lost}


def _claims(numbers: dict[str, Any], params: dict[str, Any]) -> list[Claim]:
    rates = numbers["rates"]
    rate_err = max(abs(r["solver"] / r["closed"] - 1) for r in rates)
    th = numbers["thresholds"]
    th_err = max(abs(t["K_solver"] / t["K_sharp"] - 1) for t in th)
    co = numbers["continuous"]
    gap_c = _settled_gap(co["above"], co["r_branch"])
    ratio = float(co["below"]["r"][-1] / co["below"]["r"][0])
    bi = numbers["bistable"]
    gap_b = (float("nan") if bi["clustered"] is None
             else _settled_gap(bi["clustered"], bi["r_branch"]))
    decay_err = abs(bi["decay"] / bi["decay_closed"] - 1)
    hold = params["hold"]
    rows, runs = numbers["particles"], int(params["runs"])
    z = np.concatenate([(r["particles"] - r["formula"]) / r["se"] for r in rows])
    p = 2 * student_t.sf(np.abs(z), runs - 1)
    off = max(float(np.max(np.abs(r["particles"] - r["formula"]) / np.max(r["formula"])))
              for r in rows)
    return [
        claim("funkhecke.rates", f"{len(rates)} solves (beta {params['betas']} softmax, "
              f"{params['unnormalised_betas']} unnormalised; l = 1..{params['lmax']}, m = 0 "
              f"and l): largest relative error {rate_err:.2g}",
              {"largest_rel_error": rate_err}),
        claim("funkhecke.threshold", "; ".join(
            f"beta {t['beta']:g}: K_solver {t['K_solver']:.10g} vs K_# {t['K_sharp']:.10g}"
            for t in th), {"largest_rel_error": th_err}),
        claim("funkhecke.continuous",
              f"beta {co['beta']:g}: r({hold:g}) = {co['above']['r'][-1]:.6f} at 1.2 K_# vs "
              f"branch {co['r_branch']:.6f}; at 0.9 K_# r fell from "
              f"{co['below']['r'][0]:.3f} to {co['below']['r'][-1]:.2e}",
              {"branch_gap": gap_c, "below_ratio": ratio}),
        claim("funkhecke.bistable",
              f"beta {bi['beta']:g}, K = {bi['K']:.6g} (K_sn {bi['K_spinodal']:.6g}, K_# "
              f"{bi['K_sharp']:.6g}): uniform decay rate {bi['decay']:.8g} vs "
              f"{bi['decay_closed']:.8g}; " + (
                  "clustered start not solved at this size" if bi["clustered"] is None else
                  f"clustered r({bi['clustered']['t'][-1]:g}) = "
                  f"{bi['clustered']['r'][-1]:.6f} vs branch {bi['r_branch']:.6f}"),
              {"branch_gap": gap_b, "uniform_rate_error": decay_err}),
        claim("funkhecke.particles", "; ".join(
            f"beta={r['beta']:g} (window t <= {r['window_end']:g}): " + ", ".join(
                f"l={l}: {m:.4f} +- {s:.4f} ({f:.4f})"
                for l, m, s, f in zip(r["l"], r["particles"], r["se"], r["formula"]))
            for r in rows) + f" (measured +- se (formula)); largest |z| "
              f"{float(np.abs(z).max()):.2f} over {z.size} comparisons",
              {"family_p": min(1.0, float(p.min()) * z.size), "largest_off_peak": off},
              n=params["n"], runs=runs),
    ]


def _settled_gap(path: dict[str, Any], r_branch: float) -> float:
    """|r(end) - r_branch|, NaN if the run lost resolution (it never reached the hold)."""
    if path["resolution_lost_at"] is not None:
        return float("nan")
    return float(abs(path["r"][-1] - r_branch))


def _figure(numbers: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(15, 4))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    rows = numbers["rates"]
    for beta, weighting in sorted({(r["beta"], r["weighting"]) for r in rows}):
        sel = [r for r in rows if r["beta"] == beta and r["weighting"] == weighting]
        l = np.arange(1, max(r["l"] for r in sel) + 1)
        line, = ax1.plot(l, funk_hecke_rate(l, beta, weighting), lw=1)
        ax1.plot([r["l"] for r in sel], [r["solver"] for r in sel], "o",
                 color=line.get_color(), ms=4, label=f"beta {beta:g} ({weighting})")
    ax1.set(xlabel="degree l", ylabel="growth rate gamma_l", yscale="log",
            title="Funk-Hecke rates: solver (dots), closed form (lines)")
    ax1.legend(fontsize=7)
    co, bi = numbers["continuous"], numbers["bistable"]
    for path, label in ((co["above"], f"beta {co['beta']:g}, 1.2 K_#"),
                        (co["below"], f"beta {co['beta']:g}, 0.9 K_#"),
                        (bi["clustered"], f"beta {bi['beta']:g}, (K_sn + K_#)/2")):
        if path is not None:
            ax2.plot(path["t"], path["r"], label=label)
    ax2.axhline(co["r_branch"], ls="--", lw=0.8, color="grey")
    ax2.axhline(bi["r_branch"], ls=":", lw=0.8, color="grey")
    ax2.set(xlabel="t", ylabel="r = |int x rho|", title="Order parameter (branches dashed)")
    ax2.legend(fontsize=7)
    for r in numbers["particles"]:
        line, = ax3.plot(r["l"], r["formula"], lw=1, label=f"beta {r['beta']:g}: Funk-Hecke")
        ax3.errorbar(r["l"], r["particles"], yerr=2 * np.asarray(r["se"]), fmt="o", ms=4,
                     color=line.get_color(), label=f"particles (t <= {r['window_end']:g})")
    ax3.set(xlabel="degree l", ylabel="growth rate",
            title="Particles from uniform starts (+- 2 se)")
    ax3.legend(fontsize=7)
    fig.tight_layout()
    return fig
