"""Lemma 5.1: strong Rényi centers barely move, for a time given by their separation and index.

docs/science.md §2. Fig. 2 setting: n = 200 tokens uniform on the circle, Q = K = V = I, beta = 64,
strong Rényi centers of the initial tokens with delta = 4 beta^{-1/2}. For the strong center
with 1-based index s_j, separated from every earlier token by sigma_j beta^{-1/2} at t = 0,
the lemma applies with any eps > 0 and c = sigma_j / (1 + 2 eps) (the largest c its
separation allows): the center moves less than D_j = eps c beta^{-1/2} on [0, T_j] whenever
T_j s_j h(c beta^{-1/2}) < D_j. We compare each center's drift |x_{s_j}(t) - x_{s_j}(0)|
(geodesic) with that bound: a violation is a saved time t < T_j with drift >= D_j. The time
the drift first reaches D_j is also measured, to see how conservative the bound is. Token 1
(s = 1) attends only to itself and never moves (V = I); it is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib import colormaps
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from attnflow.analysis.closedforms import lemma51_bound
from attnflow.analysis.renyi import strong_renyi_centers
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, pairwise_geodesic, uniform

NAME = "lemma51"
TITLE = "Lemma 5.1: strong Rényi centers barely move (drift against the bound)"
QUICK: dict[str, Any] = {"n": 200, "beta": 64.0, "runs": 64, "chunk": 64, "t_end": 300.0,
                         "eps": 0.1, "n_saves": 200, "rtol": 1e-6}
FULL: dict[str, Any] = {**QUICK, "runs": 512, "t_end": 3000.0, "n_saves": 300}
FULL_MINUTES = 6


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    n, beta, runs, chunk, eps = (params[k] for k in ("n", "beta", "runs", "chunk", "eps"))
    t_end, r = params["t_end"], beta ** -0.5
    delta = 4 * r
    times = np.concatenate([[0.0], np.geomspace(1e-2, t_end, params["n_saves"])])
    model = Attention(beta=beta)
    streams = np.random.SeedSequence(seed).spawn(-(-runs // chunk))
    centers: list[dict[str, Any]] = []
    drift_run0 = None
    for c, stream in enumerate(streams):
        size = min(chunk, runs - c * chunk)
        x0 = uniform((size, n), 2, np.random.default_rng(stream))
        traj = simulate(model, x0, t_end, save_at=times, method="dopri5", rtol=params["rtol"],
                        atol=params["rtol"] * 1e-3)
        for b in range(size):
            idx = strong_renyi_centers(x0[b], delta)[1:]  # token 1 never moves
            drift = geodesic_distance(traj.states[:, b, idx], x0[b, idx])  # (T, m)
            sep = np.array([pairwise_geodesic(x0[b, i], x0[b, :i]).min() for i in idx]) / r
            for j, i in enumerate(idx):
                centers.append(_check(i + 1, sep[j], drift[:, j], times, beta, eps)
                               | {"run": c * chunk + b})
            if drift_run0 is None:
                drift_run0 = (drift, centers[-len(idx):] if len(idx) else [])
        progress((c + 1) / len(streams))

    s = np.array([k["s"] for k in centers])
    bound_T = np.array([k["bound_time"] for k in centers])
    exit_t = np.array([k["exit_time"] for k in centers])  # inf: never within t_end
    violations = [k for k in centers if k["violated"]]
    left = np.isfinite(exit_t)
    ratio = exit_t[left] / bound_T[left]
    final = np.array([k["final_drift"] for k in centers])
    rank = {name: spearmanr(x, final) for name, x in
            (("s", s), ("separation", [k["separation"] for k in centers]), ("bound_time", bound_T))}
    figures = [save_figure(_figure(times, drift_run0, centers, params), out,
                           "lemma51_drift.png")]
    claims = [
        claim("lemma51.bound",
              measured=f"{len(violations)} violations among {len(centers)} strong centers "
              f"({runs} runs; eps = {eps:g}, c_j = separation / (1 + 2 eps), from "
              f"{min(k['c'] for k in centers):.2f} to {max(k['c'] for k in centers):.2f}); "
              f"bound times T_j from {bound_T.min():.2g} to {bound_T.max():.2g}; the drift "
              f"reaches eps c_j beta^-1/2 at {_quantiles(ratio)} x T_j (median, 10-90 %) for "
              f"the {left.sum()} centers that do by t = {t_end:g}; {(~left).sum()} never do",
              values={"violations": len(violations)},
              note=f"the bound is conservative by a factor {np.median(ratio):.0f} (median)"
              if left.any() else ""),
        claim("lemma51.ordered",
              measured=f"Spearman correlation of the drift at t = {t_end:g} with s_j: "
              f"{rank['s'][0]:+.2f}, with the separation: {rank['separation'][0]:+.2f}, with "
              f"the bound time T_j: {rank['bound_time'][0]:+.2f} ({len(centers)} centers; "
              f"p <= {max(r[1] for r in rank.values()):.0e})",
              values={"rho_s": rank["s"][0], "rho_bound_time": rank["bound_time"][0],
                      "p": max(rank["s"][1], rank["bound_time"][1])}),
    ]
    closed = np.array([k["bound_time_closed_form"] for k in centers])
    numbers = {"centers": centers, "violations": violations,
               "spearman_final_drift": {k: {"rho": v[0], "p": v[1]} for k, v in rank.items()},
               "exit_over_bound_median": float(np.median(ratio))
               if ratio.size else None, "never_left": int((~left).sum()),
               "closed_form_over_exact_max": float(np.max(closed / bound_T)),
               "times": times, "delta": delta}
    notes = [f"delta = 4 beta^-1/2 = {delta:.3f} rad; strong centers of the tokens at t = 0; "
             f"separation sigma_j = distance to the nearest earlier token in units of "
             f"beta^-1/2 (> 4 by definition); eps = {eps:g} and c_j = sigma_j / (1 + 2 eps). "
             "Bound times T_j from the exact hypothesis T_j s_j h(c beta^-1/2) < eps c "
             "beta^-1/2 (attnflow.analysis.closedforms.lemma51_bound); the closed form "
             "eps exp(c^2/2 - c^4/(24 beta)) / s_j is never larger (here at most "
             f"{np.max(closed / bound_T):.2f} times the exact one).",
             f"Drift checked at {len(times)} saved times, geometric from 0.01 to {t_end:g}; "
             "dopri5 with rtol " f"{params['rtol']:g}."]
    return Output(numbers, claims, figures, notes)


def _check(s: int, sigma: float, drift: np.ndarray, times: np.ndarray, beta: float,
           eps: float) -> dict[str, Any]:
    """Lemma 5.1 for one strong center: its bound and what its drift did."""
    c = sigma / (1 + 2 * eps)
    bound = lemma51_bound(beta, c, eps, s)
    over = drift >= bound.displacement
    first = int(np.argmax(over)) if over.any() else None
    exit_time = float(times[first]) if first is not None else np.inf
    return {"s": s, "separation": float(sigma), "c": float(c), "bound_time": bound.time,
            "bound_time_closed_form": bound.time_closed_form,
            "bound_displacement": bound.displacement, "exit_time": exit_time,
            "violated": bool(exit_time < bound.time), "final_drift": float(drift[-1]),
            "max_drift_over_bound": float(drift[times <= bound.time].max()
                                          / bound.displacement)}


def _quantiles(x: np.ndarray) -> str:
    if x.size == 0:
        return "n/a"
    lo, med, hi = np.percentile(x, [10, 50, 90])
    return f"{med:.3g} ({lo:.3g}-{hi:.3g})"


def _figure(times, drift_run0, centers, params) -> Figure:
    fig = Figure(figsize=(11.5, 4.6), layout="constrained")
    fig.suptitle(f"Lemma 5.1, Fig. 2 setting: n = {params['n']}, d = 2, beta = "
                 f"{params['beta']:g}, delta = 4 beta^-1/2, eps = {params['eps']:g}")
    left, right = fig.subplots(1, 2)
    drift, mine = drift_run0
    t_max = 3 * params["t_end"]  # boxes longer than the horizon are drawn to the edge
    smax = max(k["s"] for k in centers)
    norm = LogNorm(2, max(smax, 3))
    cmap = colormaps["viridis"]
    for j, k in enumerate(mine):
        color = cmap(norm(k["s"]))
        left.plot(times[1:], np.maximum(drift[1:, j], 1e-12), color=color, lw=1)
        end = min(k["bound_time"], t_max)
        left.plot([times[1], end], [k["bound_displacement"]] * 2, color=color,
                  lw=2.5, alpha=0.6, solid_capstyle="butt")
        left.plot(end, k["bound_displacement"], "o" if end < t_max else ">", color=color, ms=4,
                  mec="k", mew=0.5)
    left.set(xscale="log", yscale="log", xlabel="t (layers)", ylim=(1e-8, 3),
             xlim=(times[1], t_max), ylabel="drift of the strong center (rad)",
             title="run 0: drift of each strong center (thin, colour: s_j) and its\nLemma 5.1 "
             "bound (thick: eps c_j beta^-1/2 up to T_j, > if beyond the horizon)")
    left.grid(alpha=0.3)

    s = np.array([k["s"] for k in centers])
    sep = np.array([k["separation"] for k in centers])
    floor = 1e-10
    worst = np.maximum([k["max_drift_over_bound"] for k in centers], floor)
    sc = right.scatter(s, worst, c=np.minimum(sep, 12), cmap="plasma", s=10, vmin=4, vmax=12)
    right.axhline(1.0, color="tab:red", ls="--", lw=1, label="the bound (above: violation)")
    right.set(xscale="log", yscale="log", ylim=(floor / 3, 3), xlabel="strong center index s_j",
              ylabel="largest drift before T_j / bound",
              title=f"all {len(centers)} strong centers of {params['runs']} runs: drift on "
              f"[0, min(T_j, t_end)]\nover eps c_j beta^-1/2 (below {floor:g} drawn at it)")
    ticks = [v for v in (2, 5, 10, 20, 50, 100, 200) if v <= s.max() * 1.5]
    right.set_xticks(ticks, [str(v) for v in ticks])
    right.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    right.grid(alpha=0.3)
    right.legend(fontsize=7, loc="lower right")
    fig.colorbar(sc, ax=right, label="separation sigma_j / beta^-1/2 (12 and more: top)")
    return fig
