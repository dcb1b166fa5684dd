"""Causal vs full attention from the same initial tokens: cluster counts over time.

docs/science.md §1 and §3. n = 200, d = 2, Q = K = V = I, beta = 64: the same initial tokens are
integrated with the causal mask and with full attention, and the number of single-linkage
clusters (tolerance beta^{-1/2} / 4) is followed over time (median and 10-90 % band over runs).
Under the causal mask the first token never moves (V = I) and is the final limit (Theorem 4.1);
full attention has no distinguished token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.clusters import cluster_count, default_cluster_tol
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform

NAME = "causal_vs_full"
TITLE = "Causal vs full attention: meta-stable clusters from the same initial tokens"
# Quick: to t = 150 (fig2's and fig3's horizon; 64 s of CPU time, 125 s to t = 300). Token 1's
# displacement is exact (0 for causal); the cluster-count medians (7 to 8 at t = 150 with seed
# 0) stay far above the claim's threshold (more than one cluster). Fewer runs would not be
# faster (the kernel batches runs in SIMD lanes: 8 runs to t = 300 took 119 s of CPU time, 16
# runs 125 s).
QUICK: dict[str, Any] = {"n": 200, "beta": 64.0, "runs": 16, "t_end": 150.0, "n_times": 31,
                         "method": "rk4", "dt": 0.05}
FULL: dict[str, Any] = {**QUICK, "runs": 200, "t_end": 3000.0, "n_times": 61}
FULL_MINUTES = 30


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    beta, n, runs = params["beta"], params["n"], params["runs"]
    tol = default_cluster_tol(beta)
    times = np.concatenate([[0.0], np.geomspace(1.0, params["t_end"], params["n_times"] - 1)])
    x0 = uniform((runs, n), 2, np.random.default_rng(np.random.SeedSequence(seed)))
    counts, first = {}, {}
    for i, mask in enumerate(("causal", "full")):
        traj = simulate(Attention(beta=beta, mask=mask), x0, params["t_end"], save_at=times,
                        method=params["method"], dt=params["dt"],
                        progress=lambda t, i=i: progress((i + t / params["t_end"]) / 2))
        counts[mask] = cluster_count(traj.states, tol)  # (T, runs)
        first[mask] = geodesic_distance(traj.states[:, :, 0], x0[:, 0]).max(axis=1)  # (T,)
    med = {m: np.median(c, axis=1) for m, c in counts.items()}
    idx = {t: int(np.argmin(np.abs(times - t))) for t in (10, 100, params["t_end"])}
    fewer = float(np.mean(counts["full"][-1] < counts["causal"][-1]))
    claims = [
        claim("causal_vs_full.token1",
              measured=f"max displacement of token 1 over all runs and times: causal "
              f"{first['causal'].max():.1e} rad, full {first['full'].max():.2f} rad",
              values={"token1_causal": first["causal"].max()}),
        claim("causal_vs_full.metastable",
              measured="median cluster count causal / full: " + ", ".join(
                  f"t={times[j]:.0f}: {med['causal'][j]:g} / {med['full'][j]:g}"
                  for j in idx.values()) + f"; full ends with fewer clusters than causal in "
              f"{fewer:.0%} of {runs} runs",
              values={"smallest_median": min(float(med[m][list(idx.values())].min())
                                             for m in med)}),
    ]
    figures = [save_figure(_figure(times, counts, params, tol), out, "causal_vs_full.png")]
    numbers = {"times": times, "cluster_counts": counts, "median": med,
               "token1_max_displacement": first, "cluster_tol": tol}
    return Output(numbers, claims, figures)


def _figure(times, counts, params, tol) -> Figure:
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    for mask, color in (("causal", "tab:blue"), ("full", "tab:orange")):
        lo, med, hi = np.percentile(counts[mask], [10, 50, 90], axis=1)
        ax.fill_between(times[1:], lo[1:], hi[1:], color=color, alpha=0.25, lw=0)
        ax.plot(times[1:], med[1:], color=color, label=f"{mask} (median, 10-90 %)")
    ax.set(xscale="log", yscale="log", xlabel="t (layers)",
           ylabel=f"clusters (single linkage, tol {tol:.3f} rad)",
           title=f"n = {params['n']}, d = 2, beta = {params['beta']:g}, {params['runs']} runs")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    return fig
