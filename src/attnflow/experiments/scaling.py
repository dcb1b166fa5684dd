"""How many meta-stable clusters: the count at a fixed time against beta, beside Rényi counts.

docs/science.md §2-3. Causal attention with Q = K = V = I on S^{d-1}, d = 2 and 3, n tokens uniform,
beta from 4 to 256. The number of clusters (single linkage at `default_cluster_tol`(beta) =
beta^{-1/2} / 4, as in fig2) at
a fixed intermediate time t* is fitted against beta on log-log axes (beta >= `fit_min_beta`,
where the count is well above 1) and its slope compared with (d - 1) / 2, the growth of the
Rényi center counts with delta = 4 beta^{-1/2}. Those counts are drawn on the same axes: strong
centers exactly (Lemma C.1, E_n) and by Monte Carlo, ordinary centers by Monte Carlo, of the
initial tokens. n tokens do not jam S^2 at large beta, so the law of the Rényi counts
themselves is tested on long sequences (`long_tokens` i.i.d. tokens, and E_inf exactly for
strong centers). Slope uncertainties are bootstrap standard errors over runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import expected_strong_centers
from attnflow.analysis.clusters import cluster_count, default_cluster_tol
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform

NAME = "scaling"
TITLE = "Meta-stable cluster counts against beta: the beta^((d-1)/2) law"
QUICK: dict[str, Any] = {"d": [2, 3], "n": [200, 400], "runs": [32, 16],
                         "betas": [[4, 8, 16, 32, 64, 128, 256], [4, 16, 64, 256]],
                         "t_star": 100.0, "times": [10.0, 30.0, 100.0], "fit_min_beta": 16,
                         "rtol": 1e-5, "bootstrap": 400,
                         "long_tokens": 6400, "long_draws": 40}
FULL: dict[str, Any] = {**QUICK, "n": [400, 800], "runs": [128, 32],
                        "betas": [[4, 8, 16, 32, 64, 128, 256]] * 2,
                        "times": [10.0, 30.0, 100.0, 300.0]}
FULL_MINUTES = 7


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    t_star = params["t_star"]
    times = np.unique(np.concatenate([[0.0], params["times"], [t_star]]))
    i_star = int(np.searchsorted(times, t_star))
    jobs = [(d, n, runs, float(beta)) for d, n, runs, betas in
            zip(params["d"], params["n"], params["runs"], params["betas"]) for beta in betas]
    streams = np.random.SeedSequence(seed).spawn(len(jobs))
    weights = np.array([runs * n ** 2 * d for d, n, runs, _ in jobs], dtype=float)
    done = 0.0
    table = []
    for (d, n, runs, beta), stream in zip(jobs, streams):
        rng = np.random.default_rng(stream)
        x0 = uniform((runs, n), d, rng)
        traj = simulate(Attention(beta=beta), x0, t_star if times[-1] <= t_star else times[-1],
                        save_at=times, method="dopri5", rtol=params["rtol"],
                        atol=params["rtol"] * 1e-3)
        delta = 4 * beta ** -0.5
        counts = cluster_count(traj.states, default_cluster_tol(beta))  # (T, runs)
        table.append({
            "d": d, "n": n, "beta": beta, "runs": runs, "delta": delta,
            "clusters": counts, "clusters_mean": counts.mean(axis=1),
            "renyi": np.array([len(renyi_centers(x, delta)) for x in x0]),
            "strong": np.array([len(strong_renyi_centers(x, delta)) for x in x0]),
            "strong_exact": float(expected_strong_centers(n, delta, d)),
            "strong_exact_inf": float(expected_strong_centers(np.inf, delta, d)),
            "renyi_long": np.array([len(renyi_centers(uniform(params["long_tokens"], d, rng),
                                                      delta))
                                    for _ in range(params["long_draws"])]),
        })
        done += weights[len(table) - 1]
        progress(done / weights.sum())

    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(len(jobs) + 1)[-1])
    fits = {d: _fits(d, [r for r in table if r["d"] == d], i_star, times, params, rng)
            for d in params["d"]}
    figures = [save_figure(_figure(table, fits, params, i_star), out, "scaling_counts.png")]
    claims = [_slope_claim(d, fits[d], params) for d in params["d"]]
    claims.append(_renyi_claim(fits, params))
    claims.append(_between_claim(table, i_star, params))
    numbers = {"per_beta": [{k: v for k, v in r.items() if k != "clusters"}
                            | {"clusters_at_times": r["clusters"].mean(axis=1),
                               "renyi_mean": r["renyi"].mean(),
                               "strong_mean": r["strong"].mean()} for r in table],
               "fits": fits, "times": times, "t_star": t_star}
    notes = [f"Clusters: single linkage at beta^-1/2 / 4 at t* = {t_star:g}; Rényi centers of "
             "the initial tokens with delta = 4 beta^-1/2; slopes by least squares on log mean "
             f"count against log beta for beta >= {params['fit_min_beta']:g}, standard errors "
             f"from {params['bootstrap']} bootstrap resamples of the runs. n = "
             + ", ".join(f"{n} (d = {d})" for d, n in zip(params["d"], params["n"]))
             + ". The cluster counts are not limited by n: during development, n = 800 gave "
             "the same counts at t = 100 as n = 400 for d = 3 (beta = 64: 22.2 vs 22.4; "
             "beta = 256: 83.1 vs 84.5).",
             "Slopes of the cluster count at the other saved times: " + "; ".join(
                 f"d = {d}: " + ", ".join(f"t = {t:g}: {s:.2f}" for t, s in
                                          zip(times[1:], fits[d]["slope_by_time"][1:]))
                 for d in params["d"])]
    return Output(numbers, claims, figures, notes)


def _slope(beta: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(np.log(beta), np.log(y), 1)[0])


def _fits(d: int, rows: list[dict[str, Any]], i_star: int, times: np.ndarray,
          params: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Log-log slopes (with bootstrap errors) of the cluster and center counts against beta."""
    use = [r for r in rows if r["beta"] >= params["fit_min_beta"]]
    beta = np.array([r["beta"] for r in use])
    out: dict[str, Any] = {"betas": beta, "target": (d - 1) / 2}
    samples = {"clusters": [r["clusters"][i_star] for r in use],
               "renyi": [r["renyi"] for r in use], "strong": [r["strong"] for r in use],
               "renyi_long": [r["renyi_long"] for r in use]}
    for key, per_beta in samples.items():
        slope = _slope(beta, [v.mean() for v in per_beta])
        boot = [_slope(beta, [rng.choice(v, v.size).mean() for v in per_beta])
                for _ in range(params["bootstrap"])]
        out[key] = {"slope": slope, "se": float(np.std(boot, ddof=1)),
                    "intercept": float(np.log(np.mean(per_beta[0])) - slope * np.log(beta[0]))}
    out["strong_exact"] = {"slope": _slope(beta, [r["strong_exact"] for r in use])}
    out["strong_exact_inf"] = {"slope": _slope(beta, [r["strong_exact_inf"] for r in use])}
    out["slope_by_time"] = [_slope(beta, [max(r["clusters"][i].mean(), 1e-12) for r in use])
                            for i in range(len(times))]
    return out


def _slope_claim(d: int, fit: dict[str, Any], params: dict[str, Any]) -> Claim:
    s, se, target = fit["clusters"]["slope"], fit["clusters"]["se"], fit["target"]
    return claim(
        f"scaling.slope_d{d}",
        measured=f"log-log slope of the cluster count at t = {params['t_star']:g} over beta "
        f"{fit['betas'].min():g}-{fit['betas'].max():g}: {s:.3f} ± {se:.3f} (bootstrap s.e.) vs "
        f"{target:g}",
        values={"slope_off": abs(s - target)}, d=d, target=f"{target:g}")


def _renyi_claim(fits: dict[int, dict[str, Any]], params: dict[str, Any]) -> Claim:
    parts, offs = [], []
    for d, fit in fits.items():
        parts.append(f"d = {d} (target {fit['target']:g}): Rényi "
                     f"{fit['renyi_long']['slope']:.3f} ± {fit['renyi_long']['se']:.3f}, strong "
                     f"(exact E_inf) {fit['strong_exact_inf']['slope']:.3f}; with the n tokens of "
                     f"the runs: Rényi {fit['renyi']['slope']:.3f}, strong "
                     f"{fit['strong']['slope']:.3f}")
        offs += [abs(fit["renyi_long"]["slope"] - fit["target"]),
                 abs(fit["strong_exact_inf"]["slope"] - fit["target"])]
    return claim(
        "scaling.renyi",
        measured="; ".join(parts) + f" (beta >= {params['fit_min_beta']:g}; long sequences of "
        f"{params['long_tokens']} tokens, {params['long_draws']} draws per beta)",
        values={"slope_off": max(offs)},
        note="the law is asymptotic in delta -> 0; finite n flattens the counts of the runs' "
        "own tokens on S^2 at large beta")


def _between_claim(table: list[dict[str, Any]], i_star: int, params: dict[str, Any]) -> Claim:
    use = [r for r in table if r["beta"] >= params["fit_min_beta"]]
    ratios = [(r["d"], r["beta"], r["clusters"][i_star].mean() / r["strong"].mean(),
               r["clusters"][i_star].mean() / r["renyi"].mean()) for r in use]
    between = [lo >= 1 >= hi for _, _, lo, hi in ratios]
    return claim(
        "scaling.between",
        measured=f"at t = {params['t_star']:g}, clusters / strong and clusters / Rényi: "
        + "; ".join(f"d={d}, beta={b:g}: {lo:.2f}, {hi:.2f}" for d, b, lo, hi in ratios),
        values={"share_between": float(np.mean(between))})


def _figure(table, fits, params, i_star) -> Figure:
    dims = params["d"]
    fig = Figure(figsize=(5.6 * len(dims), 4.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(dims)))
    for ax, d in zip(axes, dims):
        rows = [r for r in table if r["d"] == d]
        beta = np.array([r["beta"] for r in rows])
        fit = fits[d]
        for key, color, marker, label in (
                ("clusters", "tab:blue", "o", f"clusters at t = {params['t_star']:g}"),
                ("renyi", "k", "s", "Rényi centers of the runs' x(0)"),
                ("strong", "tab:red", "^", "strong Rényi centers of x(0)")):
            vals = [r["clusters"][i_star] if key == "clusters" else r[key] for r in rows]
            mean = np.array([v.mean() for v in vals])
            lo, hi = (np.array([np.percentile(v, q) for v in vals]) for q in (10, 90))
            ax.errorbar(beta, mean, yerr=[mean - lo, hi - mean], fmt=marker, color=color,
                        ms=5, capsize=3, label=f"{label}: slope {fit[key]['slope']:.2f} ± "
                        f"{fit[key]['se']:.2f}")
            b = fit["betas"]
            ax.plot(b, np.exp(fit[key]["intercept"]) * b ** fit[key]["slope"], color=color,
                    lw=1, alpha=0.7)
        ax.plot(beta, [r["strong_exact"] for r in rows], color="tab:red", ls=":", lw=1,
                label="strong, exact E_n (Lemma C.1)")
        ax.plot(beta, [r["renyi_long"].mean() for r in rows], "s", mfc="none", color="0.4",
                ms=5, label=f"Rényi centers of {params['long_tokens']} tokens: slope "
                f"{fit['renyi_long']['slope']:.2f}")
        ref = fit["target"]
        b0 = fit["betas"].min()
        y0 = np.mean(rows[[r["beta"] for r in rows].index(b0)]["clusters"][i_star])
        ax.plot(beta, y0 * (beta / b0) ** ref, color="0.5", ls="--", lw=1,
                label=f"slope (d-1)/2 = {ref:g}")
        ax.axvspan(beta.min() / 1.2, params["fit_min_beta"] / 1.1, color="0.9", lw=0)
        ax.set(xscale="log", yscale="log", xlabel="beta", ylabel="count (mean, 10-90 %)",
               title=f"d = {d}, n = {rows[0]['n']}, {rows[0]['runs']} runs per beta "
               f"(grey: not fitted)")
        ax.set_xticks(beta, [f"{b:g}" for b in beta])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Meta-stable clusters and Rényi centers (delta = 4 beta^-1/2) against beta, "
                 "Q = K = V = I")
    return fig
