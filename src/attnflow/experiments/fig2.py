"""Fig. 2: causal attention on the circle, meta-stable clusters and Rényi centers.

docs/science.md §3 and §5. n = 200 tokens uniform on the circle, Q = K = V = I_2, beta = 64,
delta = 4 beta^{-1/2}. Snapshots at t = 0, 10, 75, 150 and later. "A Rényi center
disappears between t = 75 and t = 150" is measured two ways, over many seeds:

* recomputed: the number of Rényi centers of the configuration at each time;
* followed: the centers chosen at t = 0, followed by index; a center has disappeared when it
  has joined the cluster (single linkage at `tol`) of an earlier center.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.clusters import cluster_count, clusters, default_cluster_tol
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Z95, Output, Progress, save_figure, wilson
from attnflow.family import Attention
from attnflow.plot import animate, plot_circle
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform

NAME = "fig2"
TITLE = "Fig. 2: meta-stable clusters on the circle and their Rényi centers"
QUICK: dict[str, Any] = {"n": 200, "beta": 64.0, "runs": 16, "snapshots": [0, 10, 75, 150, 300],
                         "t_end": 300.0, "method": "rk4", "dt": 0.05}
FULL: dict[str, Any] = {**QUICK, "runs": 100, "snapshots": [0, 10, 75, 150, 300, 1000, 3000],
                        "t_end": 3000.0}
FULL_MINUTES = 20


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    beta, n, runs = params["beta"], params["n"], params["runs"]
    delta, tol = 4 * beta ** -0.5, default_cluster_tol(beta)
    snaps = np.asarray(params["snapshots"], dtype=float)
    x0 = uniform((runs, n), 2, np.random.default_rng(np.random.SeedSequence(seed)))
    traj = simulate(Attention(beta=beta), x0, params["t_end"], save_at=snaps,
                    method=params["method"], dt=params["dt"], seed=seed,
                    progress=lambda t: progress(0.9 * t / params["t_end"]))
    S = traj.states  # (T, runs, n, 2)
    renyi = np.array([[len(renyi_centers(S[i, r], delta)) for r in range(runs)]
                      for i in range(len(snaps))])
    strong = np.array([[len(strong_renyi_centers(S[i, r], delta)) for r in range(runs)]
                       for i in range(len(snaps))])
    followed = np.array([[_surviving(S[i, r], renyi_centers(S[0, r], delta), tol)
                          for r in range(runs)] for i in range(len(snaps))])
    counts = cluster_count(S, tol)  # (T, runs)
    strong_drift = np.array([geodesic_distance(S[:, r, strong_renyi_centers(S[0, r], delta)],
                                               S[0, r, strong_renyi_centers(S[0, r], delta)])
                             .max(axis=-1) for r in range(runs)]).T  # (T, runs)
    i75, i150 = int(np.argmin(np.abs(snaps - 75))), int(np.argmin(np.abs(snaps - 150)))
    drop_recomputed = float(np.mean(renyi[i150] < renyi[i75]))
    drop_followed = float(np.mean(followed[i150] < followed[i75]))
    one_lost = float(np.mean(followed[i75] - followed[i150] == 1))
    figures = [save_figure(_snapshots(traj, snaps, delta), out, "fig2_snapshots.png"),
               save_figure(_counts(snaps, renyi, strong, followed, counts), out,
                           "fig2_counts.png"),
               _movie(x0[0], params, out)]
    table = {f"t={t:g}": {"renyi_recomputed_mean": float(renyi[i].mean()),
                          "strong_recomputed_mean": float(strong[i].mean()),
                          "renyi_followed_surviving_mean": float(followed[i].mean()),
                          "clusters_mean": float(counts[i].mean()),
                          "strong_center_max_drift_median": float(np.median(strong_drift[i]))}
             for i, t in enumerate(snaps)}
    k_drop = int(np.sum(followed[i150] < followed[i75]))
    lo, hi = wilson(k_drop, runs, Z95)
    drift150 = float(np.median(strong_drift[i150]))
    claims = [
        claim("fig2.disappears",
              measured=f"t=0 centers followed by index: in {k_drop} of {runs} runs "
              f"({drop_followed:.0%}; 95 % Wilson interval {lo:.2f}-{hi:.2f}) at least one "
              f"merges into an earlier center's cluster between 75 and 150 (exactly one in "
              f"{one_lost:.0%}); recomputed centers: the count drops in {drop_recomputed:.0%}",
              values={"share_low": lo, "share": drop_followed},
              note="the paper's figure is one run: it is compared with the distribution over "
              "runs"),
        claim("fig2.stationary",
              measured=f"median over runs of the largest strong-center drift by t = 150: "
              f"{drift150:.3f} rad = {drift150 * beta ** 0.5:.2f} beta^-1/2 (delta = 4 "
              "beta^-1/2)",
              values={"drift_over_delta": drift150 / delta}),
        claim("fig2.persist",
              measured=f"mean cluster count (tol {tol:.3f} rad): " + ", ".join(
                  f"t={t:g}: {counts[i].mean():.1f}" for i, t in enumerate(snaps)),
              values={"single_share": float(np.mean(counts[-1] == 1))}),
    ]
    progress(1.0)
    numbers = {"per_snapshot": table, "renyi_recomputed": renyi, "strong_recomputed": strong,
               "renyi_followed_surviving": followed, "cluster_counts": counts,
               "delta": delta, "cluster_tol": tol, "snapshots": snaps}
    notes = [f"delta = 4 beta^-1/2 = {delta:.3f} rad; clusters by single linkage at "
             f"beta^-1/2 / 4 = {tol:.4f} rad. Snapshots show run 0 with centers recomputed at "
             "each time (red: strong Rényi centers, black rings: Rényi centers)."]
    return Output(numbers, claims, figures, notes)


def _surviving(X: np.ndarray, centers: np.ndarray, tol: float) -> int:
    """How many of the centers lie in distinct clusters of X (a center that joined an earlier
    center's cluster has disappeared)."""
    labels = clusters(X, tol).labels
    return len(set(labels[centers].tolist()))


def _movie(x0: np.ndarray, params: dict[str, Any], out: Path) -> str:
    """fig2.gif: run 0 on the circle, one frame per log-spaced time (clusters form fast and
    merge slowly, so log time shows both)."""
    save = np.concatenate([[0.0], np.geomspace(0.5, params["t_end"], 79)])
    traj = simulate(Attention(beta=params["beta"]), x0, params["t_end"], save_at=save,
                    method=params["method"], dt=params["dt"])
    animate(traj, out / "fig2.gif", fps=10, size=320)
    return "fig2.gif"


def _snapshots(traj, snaps: np.ndarray, delta: float) -> Figure:
    return plot_circle(traj, t=list(snaps), run=0, delta=delta, centers_from=None,
                       figsize=(3.2 * len(snaps), 3.6))


def _counts(snaps, renyi, strong, followed, counts) -> Figure:
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    x = np.arange(len(snaps))
    for values, label, style in ((renyi, "Rényi centers (recomputed)", "ko-"),
                                 (followed, "t=0 Rényi centers still apart", "ks--"),
                                 (strong, "strong Rényi centers (recomputed)", "ro-"),
                                 (counts, "clusters", "b^-")):
        lo, med, hi = np.percentile(values, [10, 50, 90], axis=1)
        ax.errorbar(x, med, yerr=[med - lo, hi - med], fmt=style, capsize=3, label=label)
    ax.set_xticks(x, [f"{t:g}" for t in snaps])
    ax.set(xlabel="t (layers)", ylabel="count (median, 10-90 %)",
           title="Fig. 2 setting: n = 200, d = 2, beta = 64")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
