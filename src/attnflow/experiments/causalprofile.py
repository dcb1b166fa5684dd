"""Causal memory profile: how strongly the last tokens at time t remember the initial state of
the token at position s (*Kinetic theory for Transformers and the lost-in-the-middle
phenomenon*; docs/science.md §9, "Memory of the initial state").

Causal softmax attention, Q = K = V = I, d = 2. Linearised about the uniform state, Fourier
mode k of label s grows by the Hardy operator (the average of the labels before it), and for
n iid uniform tokens (`attnflow.analysis.kinetic.causal_memory`)

    C(s, t) = n E[cos k(theta_i(t) - theta_j(0))] -> (1/u) psi_{lambda_k t}(log(u / s)),

token i at label u = i/n, j at s = j/n < u, psi_tau(y) = sqrt(tau/y) I_1(2 sqrt(tau y)).

Measured three ways, on S label cells ((b - 1)/S, b/S] and the last cell as "the last
tokens" (u in ((S - 1)/S, 1]), mode k:
* closed form: C averaged over the two cells (`cell_memory`);
* the mean-field solver (`attnflow.meanfield.solve`, causal, `mf_sub` solver cells per
  label cell): the last cell's mode-k response to a small perturbation `amplitude` of cell
  b's mode k, times S (the cell's width), since the response is linear;
* particles (harmonic kernel, `runs` iid uniform starts of n tokens): the real least-squares
  coefficients G_b of B = (1/M_S) sum_{i in last cell} e^{ik theta_i(t)} on the cells'
  initial moments A_b = (1/M_b) sum_{j in b} e^{ik theta_j(0)} (both parts of every run:
  2 runs equations, S unknowns); C_b = n G_b / M_b (`attnflow.experiments._cells`). This is
  the covariance C(s, t) (the A_b are uncorrelated and of equal variance), with the other
  cells' contributions regressed out instead of left as noise. Standard errors: ordinary
  least squares (residual variance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import causal_memory, cell_memory, dispersion_rate
from attnflow.experiments._cells import cell_moments, regress
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.meanfield import from_coefficients, solve

PAPERS = ("2605.09213",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "causalprofile"
TITLE = "Causal memory profile: the Hardy-operator closed form against the solver and particles"
QUICK: dict[str, Any] = {
    "beta": 1.0, "k": 1, "n": 4000, "runs": 12, "cells": 20, "times": [2.0, 4.0], "dt": 1.0,
    "mf_sub": 4, "mf_modes": 4, "amplitude": 1e-6, "chunk": 12,
}
FULL: dict[str, Any] = {**QUICK, "n": 100_000, "runs": 96, "times": [2.0, 4.0, 6.0],
                        "mf_sub": 8}
FULL_MINUTES = 7  # estimated: 24 RK4 evaluations of 96 x 1e5 tokens at ~1.5 us per token


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    S, k, beta = params["cells"], params["k"], float(params["beta"])
    times = [float(t) for t in params["times"]]
    lam = float(dispersion_rate(k, beta))
    closed = np.array([[cell_memory(((b - 1) / S, b / S), ((S - 1) / S, 1.0), lam * t)
                        for b in range(1, S)] for t in times])  # (times, S - 1)
    solver = _solver(params, times)
    progress(0.2)
    particles, se = _particles(params, times, np.random.default_rng(seed),
                               lambda f: progress(0.2 + 0.8 * f))
    claims = [_solver_claim(solver, closed, params), _particle_claim(particles, se, closed,
                                                                     params)]
    figures = [save_figure(_figure(closed, solver, particles, se, lam, params), out,
                           "causalprofile.png")]
    numbers = {"lambda_k": lam, "labels": (np.arange(1, S) - 0.5) / S, "times": times,
               "closed_form": closed, "solver": solver, "particles": particles,
               "particles_se": se}
    notes = [f"beta = {beta:g}, mode k = {k} (lambda_k = {lam:.5f}), {S} label cells, the "
             f"last one the late tokens. Solver: {S * params['mf_sub']} cells, "
             f"{params['mf_modes']} modes, perturbation {params['amplitude']:g}. Particles: "
             f"n = {params['n']}, {params['runs']} iid uniform starts, harmonic kernel, RK4 "
             f"dt = {params['dt']:g}."]
    return Output(numbers, claims, figures, notes)


def _solver(params, times) -> np.ndarray:
    """S times the last cell's mode-k response to a unit perturbation of cell b's mode k
    (times, S - 1), from the mean-field solver."""
    S, sub, K, a, k = (params[x] for x in ("cells", "mf_sub", "mf_modes", "amplitude", "k"))
    model = Attention(beta=float(params["beta"]), mask="causal")
    out = np.zeros((len(times), S - 1))
    for b in range(S - 1):
        c = np.zeros((S * sub, K + 1), dtype=complex)
        c[:, 0] = 1 / (2 * np.pi)
        c[b * sub:(b + 1) * sub, k] = a
        res = solve(model, from_coefficients(c), times[-1], save_at=times)
        late = res.coefficients[:, -sub:, k].mean(axis=1)  # (T,) with T = 1 + len(times)
        out[:, b] = S * late[-len(times):].real / a
    return out


def _particles(params, times, rng, progress) -> tuple[np.ndarray, np.ndarray]:
    """C_b from particles and its standard errors, both (times, S - 1) (module docstring)."""
    model = Attention(beta=float(params["beta"]), mask="causal", backend="harmonic")
    edges = np.arange(params["cells"] + 1) / params["cells"]
    moments = cell_moments(model, params["n"], params["runs"], edges, [params["k"]], times,
                           params["dt"], params["chunk"], rng, progress)
    est, se = regress(moments)
    return est[0], se[0]


def _solver_claim(solver, closed, params) -> Claim:
    rel = np.abs(solver - closed) / np.abs(closed)
    return claim(
        "causalprofile.solver",
        measured=f"largest relative difference solver / closed form {rel.max():.2e} over "
        f"{closed.size} (cell, time) pairs; first cell at the last time: solver "
        f"{solver[-1, 0]:.4f}, closed form {closed[-1, 0]:.4f}",
        values={"largest_relative": float(rel.max())})


def _particle_claim(particles, se, closed, params) -> Claim:
    z = np.abs(particles - closed) / se
    w = 1 / se**2
    ratio = float(np.sum(w * particles * closed) / np.sum(w * closed**2))  # least-squares scale
    ratio_se = float(1 / np.sqrt(np.sum(w * closed**2)))
    return claim(
        "causalprofile.particles",
        measured=f"n = {params['n']}, {params['runs']} runs: largest |particles - closed form| "
        f"/ se {z.max():.2f} over {z.size} (cell, time) pairs; fitted scale particles / closed "
        f"form {ratio:.3f} +- {ratio_se:.3f}; first cell at the last time "
        f"{particles[-1, 0]:.2f} +- {se[-1, 0]:.2f} (closed form {closed[-1, 0]:.2f})",
        values={"largest_z": float(z.max()), "scale_off": abs(ratio - 1.0)})


def _figure(closed, solver, particles, se, lam, params) -> Figure:
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    S = params["cells"]
    s = (np.arange(1, S) - 0.5) / S
    fine = np.linspace(0.2 / S, 1 - 1 / S, 300)
    for i, t in enumerate(params["times"]):
        color = f"C{i}"
        ax.plot(fine, causal_memory(fine, t, params["beta"], params["k"]), color=color, lw=0.8,
                ls=":")
        ax.plot(s, closed[i], "-", color=color, lw=1.2, label=f"t = {t:g}: closed form (cells)")
        ax.plot(s, solver[i], "x", color=color, ms=6, label="solver")
        ax.errorbar(s, particles[i], yerr=2 * se[i], fmt="o", color=color, ms=3, mfc="none",
                    label="particles (2 se)")
    ax.set(yscale="log", xlabel="label s = j / n of the remembered token",
           ylabel="n E[cos k(theta_last(t) - theta_j(0))]",
           title=f"causal memory, beta = {params['beta']:g}, k = {params['k']} "
           f"(lambda_k = {lam:.3f}); dotted: psi(log 1/s) at u = 1")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
