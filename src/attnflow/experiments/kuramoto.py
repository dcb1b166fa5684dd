"""Noise at beta = 0: the mean-field solver and many particles against the Kuramoto root
(*Clustering in Deep Stochastic Transformers*, the mean-field survey; docs/science.md §9,
"Noise at beta = 0").

At beta = 0 every weight is 1/n and with attnflow's noise sigma (d theta = v dt + sigma dB)
the stationary density is the von Mises law of concentration kappa r, kappa = 2 / sigma^2,
whose order parameter r solves r = I_1(kappa r) / I_0(kappa r): a root r > 0 iff sigma < 1
(`attnflow.analysis.closedforms.kuramoto_order`), the uniform state (r = 0) above.

* Solver (`attnflow.meanfield.solve` with noise): from exp(cos theta) to `mf_t_end`; r the
  modulus of the first moment at the end.
* Particles: n tokens, full attention with the harmonic kernel, geodesic Euler-Maruyama at
  dt and dt / 2 on one Brownian path (`brownian_dt` = dt), the order parameter R(t)
  Richardson-extrapolated, 2 R_{dt/2} - R_dt (the scheme is of weak order 1, so this removes
  the O(dt) bias of the stationary law). `runs` runs start from iid draws of the solver's
  stationary density (the particles must keep it if it is theirs, and relax away from it
  otherwise within 1 / |rate| = 2 / |1 - sigma^2| or less). Burn-in and standard errors as in
  the noise recipe (`attnflow.experiments.noise.burn_in`, `stationary_mean_se`: the mean over
  runs settled, plus two integrated autocorrelation times; sqrt(var tau / N)).
  Theory at finite n: the root for sigma < 1 (bias O(1/n)); for sigma > 1 the uniform state's
  fluctuations, n E[R^2] = 1 / (1 - kappa (1 - 1/n) / 2) (`noise.finite_n_fluctuation`), so
  E R = sqrt(pi E[R^2]) / 2 (R the modulus of a complex Gaussian).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import inverse_cdf, kuramoto_order, noise_threshold
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.experiments.noise import (
    burn_in,
    finite_n_fluctuation,
    order_parameter,
    stationary_mean_se,
)
from attnflow.family import Attention
from attnflow.meanfield import from_function, solve
from attnflow.simulate import simulate

PAPERS = ("2601.21942", "2512.01868")  # arXiv ids of the papers whose claims this recipe checks
# The uniform state's threshold at beta = 0: kappa = 2 / sigma^2 = kappa_c(0) = 2, sigma = 1
# (a root r > 0 below it); the theory's, not a criterion.
SIGMA_C = float(np.sqrt(2 / noise_threshold(0.0)))
NAME = "kuramoto"
TITLE = "Noise at beta = 0: solver and particles against the Kuramoto root"
QUICK: dict[str, Any] = {
    "sigmas": [0.6, 1.2], "mf_modes": 24, "mf_t_end": 80.0, "n": 10_000, "runs": 2,
    "dt": 0.1, "t_end": 15.0, "save_every": 0.5, "settle_band": 3.0, "margin": 2.0,
}
FULL: dict[str, Any] = {**QUICK, "sigmas": [0.5, 0.7, 0.85, 1.2, 1.5], "n": 100_000,
                        "t_end": 25.0, "mf_modes": 32, "mf_t_end": 200.0}
FULL_MINUTES = 12  # estimated: 750 noisy steps of 2 x 1e5 tokens at ~0.1 s, per sigma


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    sigmas = [float(s) for s in params["sigmas"]]
    key = int(np.random.SeedSequence(seed).generate_state(1)[0])
    rng = np.random.default_rng(seed)
    model = Attention(beta=0.0, mask="full", backend="harmonic")
    rows = []
    for i, sigma in enumerate(sigmas):
        kappa = 2 / sigma**2
        mf = solve(Attention(beta=0.0, mask="full"),
                   from_function(lambda t: np.exp(np.cos(t)), modes=params["mf_modes"]),
                   params["mf_t_end"], save_at=[params["mf_t_end"]], noise=sigma)
        r_mf = float(np.abs(mf.moments(1)[-1, 0]))
        theta0 = inverse_cdf(mf.coefficients[-1, 0], rng.random((params["runs"], params["n"])))
        x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
        times = np.arange(0.0, params["t_end"] + 1e-9, params["save_every"])
        R = [order_parameter(simulate(model, x0, params["t_end"], save_at=times,
                                      method="geodesic", dt=h, noise=sigma, seed=key,
                                      brownian_dt=params["dt"]).states)
             for h in (params["dt"], params["dt"] / 2)]
        extrapolated = 2 * R[1] - R[0]  # (T, runs)
        start = burn_in(extrapolated, times, params["settle_band"], params["margin"])
        mean, se, tau = stationary_mean_se(extrapolated, times, start)
        coarse = stationary_mean_se(R[0], times, start)[0]
        root = float(kuramoto_order(kappa))
        nR2 = finite_n_fluctuation(kappa, 0.0, params["n"])
        theory = root if sigma < SIGMA_C else float(np.sqrt(np.pi * nR2 / params["n"]) / 2)
        rows.append({"sigma": sigma, "kappa": kappa, "root": root, "theory": theory,
                     "solver": r_mf, "particles": mean, "particles_se": se,
                     "particles_dt": coarse, "burn_in": start,
                     "autocorrelation_time": tau * params["save_every"]})
        progress((i + 1) / len(sigmas))
    claims = [_solver_claim(rows), _particle_claim(rows, params)]
    figures = [save_figure(_figure(rows, params), out, "kuramoto.png")]
    notes = [f"Solver: {params['mf_modes']} modes to t = {params['mf_t_end']:g}. Particles: "
             f"n = {params['n']}, {params['runs']} runs, harmonic kernel, geodesic "
             f"Euler-Maruyama dt = {params['dt']:g} and {params['dt'] / 2:g}, Richardson, to "
             f"t = {params['t_end']:g}; measured burn-in "
             + ", ".join(f"sigma={r['sigma']:g}: {r['burn_in']:.1f}" for r in rows) + "."]
    return Output({"rows": rows}, claims, figures, notes)


def _solver_claim(rows) -> Claim:
    err = [abs(r["solver"] - (r["root"] if r["sigma"] < SIGMA_C else 0.0)) for r in rows]
    return claim(
        "kuramoto.solver",
        measured=", ".join(f"sigma={r['sigma']:g}: r = {r['solver']:.10f} (root "
                           f"{r['root']:.10f})" for r in rows),
        values={"largest_error": max(err)})


def _particle_claim(rows, params) -> Claim:
    off = [abs(r["particles"] - r["theory"]) for r in rows]
    z = [o / r["particles_se"] for o, r in zip(off, rows)]
    return claim(
        "kuramoto.particles",
        measured=f"n = {params['n']}: " + ", ".join(
            f"sigma={r['sigma']:g}: R = {r['particles']:.5f} +- {r['particles_se']:.5f} "
            f"(dt {params['dt']:g} alone {r['particles_dt']:.5f}; theory {r['theory']:.5f})"
            for r in rows),
        values={"largest_z": max(z), "largest_off": max(off)})


def _figure(rows, params) -> Figure:
    fig = Figure(figsize=(7.0, 4.5))
    ax = fig.subplots()
    fine = np.linspace(0.3, max(1.6, max(r["sigma"] for r in rows)), 300)
    ax.plot(fine, kuramoto_order(2 / fine**2), "k-", lw=1,
            label="root of r = I1(kappa r)/I0(kappa r)")
    above = fine[fine > SIGMA_C]
    ax.plot(above, [np.sqrt(np.pi * finite_n_fluctuation(2 / s**2, 0.0, params["n"])
                            / params["n"]) / 2 for s in above], "k:", lw=1,
            label=f"E R of the uniform state, n = {params['n']}")
    s = [r["sigma"] for r in rows]
    ax.plot(s, [r["solver"] for r in rows], "x", ms=9, label="solver (stationary)")
    ax.errorbar(s, [r["particles"] for r in rows], yerr=[3 * r["particles_se"] for r in rows],
                fmt="o", mfc="none", label=f"particles, n = {params['n']} (3 se)")
    ax.axvline(1.0, color="0.6", ls="--", lw=1)
    ax.set(xlabel="noise sigma (kappa = 2 / sigma^2)", ylabel="order parameter r",
           title="beta = 0: noisy Kuramoto")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
