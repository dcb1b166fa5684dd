"""Theorem 4.1: with V = I, every token converges to the first token x_1(0), for any Q, K.

docs/science.md §2. For each kind of (Q, K), dimension d and number of tokens n, several seeds
are integrated with the adaptive method to a horizon T, and a run counts as converged when
every token is within `tol` (geodesic) of x_1(0) at T. The max distance to x_1(0) is also
followed along the way (median and 10-90 % band over seeds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from scipy.stats import ortho_group

from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform

NAME = "thm41"
TITLE = "Theorem 4.1: one cluster at the first token when V = I, for any Q, K"
KINDS = ("gaussian", "orthogonal", "lowrank", "indefinite")
# Quick: 10 seeds per setting, 120 runs: a failure rate of 2.5 % or more would show (at least
# one unconverged run) with probability 95 %; the full size (1200 runs) one of 0.25 %.
QUICK: dict[str, Any] = {"kinds": list(KINDS), "d": [2, 3, 16], "n": [32], "seeds": 10,
                         "beta": 1.0, "t_end": 300.0, "tol": 1e-3, "rtol": 1e-8}
FULL: dict[str, Any] = {**QUICK, "n": [32, 128], "seeds": 50, "t_end": 1000.0}
FULL_MINUTES = 15


def query_key(kind: str, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random (Q, K) of a kind: Gaussian entries of variance 1/d; Haar orthogonal; low rank
    (rank max(1, d // 4) Gaussian factors); or Q = I and K = O diag(+-1) O^T (so Q^T K is
    symmetric indefinite, with both signs present)."""
    if kind == "gaussian":
        return rng.standard_normal((d, d)) / np.sqrt(d), rng.standard_normal((d, d)) / np.sqrt(d)
    if kind == "orthogonal":
        return ortho_group.rvs(d, random_state=rng), ortho_group.rvs(d, random_state=rng)
    if kind == "lowrank":
        r = max(1, d // 4)
        factors = [rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / np.sqrt(d * r)
                   for _ in range(2)]
        return factors[0], factors[1]
    if kind == "indefinite":
        signs = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
        O = ortho_group.rvs(d, random_state=rng)
        return np.eye(d), (O * signs) @ O.T
    raise ValueError(f"kind: expected one of {KINDS}, received {kind!r}")


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    t_end, tol = params["t_end"], params["tol"]
    save = np.concatenate([[0.0], np.geomspace(0.1, t_end, 50)])
    configs = [(kind, d, n) for kind in params["kinds"] for d in params["d"] for n in params["n"]]
    streams = np.random.SeedSequence(seed).spawn(len(configs))
    total, done = len(configs) * params["seeds"], 0
    curves: dict[str, np.ndarray] = {}
    table, failures = [], []
    for (kind, d, n), stream in zip(configs, streams):
        dist = np.empty((params["seeds"], len(save)))
        for s, sub in enumerate(stream.spawn(params["seeds"])):
            rng = np.random.default_rng(sub)
            Q, K = query_key(kind, d, rng)
            x0 = uniform(n, d, rng)
            traj = simulate(Attention(Q, K, beta=params["beta"]), x0, t_end, save_at=save,
                            method="dopri5", rtol=params["rtol"], atol=params["rtol"] * 1e-2)
            dist[s] = geodesic_distance(traj.states, x0[0]).max(axis=-1)
            if dist[s, -1] >= tol:
                failures.append({"kind": kind, "d": d, "n": n, "seed_index": s,
                                 "final_max_distance": float(dist[s, -1])})
            done += 1
            progress(done / total)
        key = f"{kind} d={d} n={n}"
        curves[key] = dist
        table.append({"kind": kind, "d": d, "n": n,
                      "fraction_converged": float(np.mean(dist[:, -1] < tol)),
                      "median_final_distance": float(np.median(dist[:, -1])),
                      "worst_final_distance": float(dist[:, -1].max())})
    fraction = float(np.mean([r["fraction_converged"] for r in table]))
    figures = [save_figure(_figure(save, curves, params), out, "thm41_distance.png")]
    worst = max(r["worst_final_distance"] for r in table)
    claims = [claim(
        "thm41.converged",
        measured=(f"{fraction:.1%} of {total} runs have every token within {tol:g} of x_1(0) "
                  f"at t = {t_end:g} ({len(configs)} settings: kinds {params['kinds']}, "
                  f"d {params['d']}, n {params['n']}); worst final distance {worst:.2e}"),
        values={"converged": fraction},
        note="" if fraction == 1 else "slow runs listed in result.json (a limit, not a "
        "rate: a token that attends mostly to itself converges slowly)",
    )]
    numbers = {"settings": table, "unconverged_runs": failures, "fraction_converged": fraction,
               "save_times": save}
    notes = [f"The distances level off near {params['rtol']:g} rad: the tolerance of the adaptive "
             "integrator (rtol), not a limit of the dynamics."]
    return Output(numbers, claims, figures, notes)


def _figure(times: np.ndarray, curves: dict[str, np.ndarray], params: dict[str, Any]):
    kinds = params["kinds"]
    fig = Figure(figsize=(4.2 * len(kinds), 3.6))
    axes = fig.subplots(1, len(kinds), sharey=True, squeeze=False)
    colors = colormaps["viridis"](np.linspace(0, 0.85, len(params["d"]) * len(params["n"])))
    for ax, kind in zip(axes[0], kinds):
        keys = [k for k in curves if k.startswith(kind + " ")]
        for key, color in zip(keys, colors):
            dist = np.maximum(curves[key], 1e-16)
            lo, med, hi = np.percentile(dist, [10, 50, 90], axis=0)
            ax.fill_between(times[1:], lo[1:], hi[1:], color=color, alpha=0.25, lw=0)
            ax.plot(times[1:], med[1:], color=color, label=key.split(" ", 1)[1])
        ax.axhline(params["tol"], color="k", ls=":", lw=1)
        ax.set(xscale="log", yscale="log", title=f"Q, K {kind}", xlabel="t (layers)")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("max_k dist(x_k(t), x_1(0)) [rad]")
    axes[0, 0].legend(fontsize=8, title="median, 10-90 %", title_fontsize=8)
    fig.suptitle(f"Theorem 4.1: V = I, beta = {params['beta']:g}, {params['seeds']} seeds each")
    fig.tight_layout()
    return fig
