"""Mean-field meta-stability on the circle: how many clusters form first, and how they merge
(*Emergence of meta-stable clustering in mean-field transformer models*, *Dynamic
metastability in the self-attention model*; docs/science.md §6).

Full attention, Q = K = V = I, d = 2, n tokens uniform at random. From a near-uniform start,
Fourier mode k of the density grows at a rate proportional to k^2 I_k(beta), so the first
clusters number about k* = argmax_k k^2 I_k(beta) (`k_star`, about sqrt(2 beta)). Measured:
the single-linkage cluster count (tolerance beta^{-1/2} / 4) at the end of the first phase,
t1, against k* for beta from 4 to 100 (RK4). The same count at large n (`large_n`, up to 1e5,
with the harmonic kernel, O(n K) per step), taken at t1(n) = t1 + log(n / 1000) / (2 lambda_k*)
(`large_t1`): the linear growth of the fastest mode from |M_k|^2 ~ 1/n (`dispersion_rate`)
lasts log(n) / (2 lambda_k*), so the first phase ends that much later than at n = 1000, where
t1 was set.

Afterwards clusters merge one pair at a time, after waiting times that grow like e^{c beta},
and the interaction energy E_beta (`energy`) is a staircase: plateaus at saddles, jumps at
merges. Measured on fewer tokens over long times (LSODA with the exact Jacobian): the share
of the energy's increase after t1 that falls in the windows of the merges (the save interval
where the cluster count drops, the `merge_window` = (before, after) intervals around it: the
two clusters' final approach; saves are log-spaced), and the time T_1 at which one cluster
remains, against beta (fit log T_1 = a + c beta).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import dispersion_rate, k_star
from attnflow.analysis.clusters import cluster_count, default_cluster_tol
from attnflow.analysis.energy import log_energy
from attnflow.analysis.modes import density_cluster_count, density_peak_count
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.meanfield import from_coefficients, sample, solve
from attnflow.simulate import simulate
from attnflow.sphere import uniform

PAPERS = ("2410.23228", "2410.06833")  # arXiv ids of the papers whose claims this recipe checks
NAME = "meanfield"
TITLE = "Mean-field meta-stability on the circle: k* first clusters, then saddle-to-saddle merges"
QUICK: dict[str, Any] = {
    "n": 200, "runs": 4, "betas": [4, 9, 16, 25, 49, 100], "t1": 10.0, "dt": 0.05,
    "merge_n": 32, "merge_runs": 6, "merge_betas": [3, 4, 5, 6], "merge_t_end": 1e6,
    "merge_saves": 240, "merge_window": [2, 1], "bootstrap": 2000,
    "large_n": 4000, "large_runs": 1, "large_betas": [4, 16, 64], "large_dt": 0.1,
    "large_n_ref": 1000, "large_backend": "harmonic:1e-9",
    "bridge_n": 4000, "bridge_betas": [4, 16, 64], "bridge_modes": 64, "bridge_refine": 1024,
}
FULL: dict[str, Any] = {**QUICK, "n": 1000, "runs": 8, "merge_runs": 24,
                        "merge_betas": [3, 4, 5, 6, 7], "large_n": 100_000, "large_runs": 2,
                        "large_betas": [4, 9, 16, 25, 49, 100], "bridge_n": 100_000}
# measured: 8.4 min of CPU time, 20 min wall with the large-n count (a shared
# machine at load up to 14); 5.7 min of CPU time before it. The bridge at n = 1e5 (beta 4,
# 16, 64) adds 7.7 min wall (a machine at load 10-17; CPU time not measured)
FULL_MINUTES = 12


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    streams = np.random.SeedSequence(seed).spawn(4)
    first = _first_phase(params, np.random.default_rng(streams[0]),
                         lambda f: progress(0.4 * f))
    merging = _merging(params, np.random.default_rng(streams[1]),
                       lambda f: progress(0.4 + 0.4 * f))
    large = _large_n(params, np.random.default_rng(streams[2]),
                     lambda f: progress(0.8 + 0.1 * f))
    bridge = _bridge(params, np.random.default_rng(streams[3]),
                     lambda f: progress(0.9 + 0.1 * f))
    claims = [_first_claim(first, params), _staircase_claim(merging, params),
              _waiting_claim(merging, params), _large_claim(large, params),
              _bridge_claim(bridge, params)]
    figures = [save_figure(_figure(first, merging, params, large, bridge), out,
                           "meanfield.png")]
    numbers = {"first_phase": first, "merging": {k: v for k, v in merging.items()
                                                 if k != "example"},
               "example": merging["example"], "large_n": large, "bridge": bridge}
    notes = [f"First phase: n = {params['n']}, {params['runs']} runs per beta, RK4 dt = "
             f"{params['dt']:g} to t1 = {params['t1']:g}; clusters by single linkage at "
             "beta^-1/2 / 4. Merging: n = "
             f"{params['merge_n']}, {params['merge_runs']} runs per beta, LSODA (rtol 1e-6) "
             f"to t = {params['merge_t_end']:g}, {params['merge_saves']} log-spaced saves; a "
             "run that never reaches one cluster counts as T_1 = inf (medians stay finite "
             "while fewer than half the runs are censored). Large n: n = "
             f"{params['large_n']}, {params['large_runs']} runs per beta, RK4 dt = "
             f"{params['large_dt']:g} with the {params['large_backend']} kernel to t1(n) = "
             f"t1 + log(n / {params['large_n_ref']}) / (2 lambda_k*). Bridge: n = "
             f"{params['bridge_n']} tokens at the quantiles of the uniform density plus the "
             "fluctuations of as many iid tokens in the modes 1..2 k*, against the mean-field "
             f"solver from that density ({params['bridge_modes']} modes, refined up to "
             f"{params['bridge_refine']}); both counted by analysis.density_cluster_count / "
             "density_peak_count (von Mises kernel of width beta^-1/2, mass 1 %, depth 30 %)."]
    return Output(numbers, claims, figures, notes)


def _first_phase(params, rng, progress) -> dict[str, Any]:
    betas = [float(b) for b in params["betas"]]
    x0 = uniform((params["runs"], params["n"]), 2, rng)
    counts = []
    for i, beta in enumerate(betas):
        traj = simulate(Attention(beta=beta, mask="full"), x0, params["t1"],
                        save_at=[0.0, params["t1"]], method="rk4", dt=params["dt"])
        counts.append(cluster_count(traj.final, default_cluster_tol(beta)))
        progress((i + 1) / len(betas))
    counts = np.array(counts)  # (betas, runs)
    mean = counts.mean(axis=1)
    kstar = np.array([k_star(b) for b in betas])
    log_b = np.log(betas)
    return {"betas": betas, "counts": counts, "mean": mean,
            "se": counts.std(axis=1, ddof=1) / np.sqrt(counts.shape[1]), "k_star": kstar,
            "slope": float(np.polyfit(log_b, np.log(mean), 1)[0]),
            "slope_k_star": float(np.polyfit(log_b, np.log(kstar), 1)[0])}


def large_t1(t1: float, n: int, n_ref: int, beta: float) -> float:
    """t1(n) = t1 + log(n / n_ref) / (2 lambda_k*(beta)): the end of the first phase moved by
    the longer linear growth of the fastest mode from |M_k|^2 ~ 1/n (module docstring)."""
    return t1 + np.log(n / n_ref) / (2 * float(dispersion_rate(k_star(beta), beta)))


def _large_n(params, rng, progress) -> dict[str, Any]:
    """The first-phase count at n = large_n, each beta at its own t1(n) (`large_t1`)."""
    betas = [float(b) for b in params["large_betas"]]
    x0 = uniform((params["large_runs"], params["large_n"]), 2, rng)
    counts, density, times = [], [], []
    for i, beta in enumerate(betas):
        t1 = large_t1(params["t1"], params["large_n"], params["large_n_ref"], beta)
        model = Attention(beta=beta, mask="full", backend=params["large_backend"])
        traj = simulate(model, x0, t1, save_at=[0.0, t1], method="rk4", dt=params["large_dt"])
        counts.append(cluster_count(traj.final, default_cluster_tol(beta)))
        density.append(density_cluster_count(traj.final, beta))
        times.append(t1)
        progress((i + 1) / len(betas))
    counts = np.array(counts)  # (betas, runs)
    mean, kstar, log_b = counts.mean(axis=1), np.array([k_star(b) for b in betas]), np.log(betas)
    return {"betas": betas, "n": params["large_n"], "t1": times, "counts": counts,
            "density_counts": np.array(density),
            "mean": mean, "k_star": kstar,
            "slope": float(np.polyfit(log_b, np.log(mean), 1)[0]),
            "slope_k_star": float(np.polyfit(log_b, np.log(kstar), 1)[0])}


def _bridge(params, rng, progress) -> dict[str, Any]:
    """Tokens against the mean field, counted by one instrument (`density_cluster_count`,
    `density_peak_count`): for each beta, rho0 = uniform plus the fluctuations of n iid tokens
    in the modes 1..2 k* (mode k's coefficient g / (2 pi sqrt(n)), g complex standard normal:
    E|M_k|^2 = 1/n as for iid tokens), the solver to t1(n) (refined up to bridge_refine modes;
    t_c its last resolved time), the n tokens at the quantiles of rho0 simulated to t_c."""
    betas = [float(b) for b in params["bridge_betas"]]
    n, K = params["bridge_n"], params["bridge_modes"]
    peaks, counts, t_c, t_one, lost = [], [], [], [], []
    for i, beta in enumerate(betas):
        top = min(2 * k_star(beta), K)
        c = np.zeros(K + 1, dtype=complex)
        c[0] = 1 / (2 * np.pi)
        c[1:top + 1] = (rng.standard_normal(top) + 1j * rng.standard_normal(top)) / (
            np.sqrt(2 * n) * 2 * np.pi)
        rho0 = from_coefficients(c)
        t1 = large_t1(params["t1"], n, params["large_n_ref"], beta)
        model = Attention(beta=beta, mask="full")
        field = solve(model, rho0, t1, save_at=[0.0, t1], refine_to=params["bridge_refine"])
        tc = float(field.times[-1])
        traj = simulate(Attention(beta=beta, mask="full", backend=params["large_backend"]),
                        sample(rho0, n, method="quantile"), tc, save_at=[0.0, tc],
                        method="rk4", dt=params["large_dt"])
        peaks.append(density_peak_count(field.coefficients[-1], beta).count)
        counts.append(int(density_cluster_count(traj.final, beta)))
        t_c.append(tc)
        t_one.append(t1)
        lost.append(field.resolution_lost_at)
        progress((i + 1) / len(betas))
    return {"betas": betas, "n": n, "t_c": t_c, "t1": t_one, "resolution_lost_at": lost,
            "solver_peaks": peaks, "token_counts": counts,
            "k_star": [k_star(b) for b in betas]}


def _merging(params, rng, progress) -> dict[str, Any]:
    n, runs, t_end = params["merge_n"], params["merge_runs"], float(params["merge_t_end"])
    times = np.concatenate([[0.0], np.geomspace(0.1, t_end, params["merge_saves"])])
    after = times > params["t1"]
    betas = [float(b) for b in params["merge_betas"]]
    x0 = uniform((runs, n), 2, rng)
    t_one, plateaus, share, covered, example = [], [], [], [], None
    for i, beta in enumerate(betas):
        model = Attention(beta=beta, mask="full")
        T1, durations, rises, in_merges, in_window = [], [], 0.0, 0.0, 0
        for r in range(runs):
            traj = simulate(model, x0[r], t_end, save_at=times, method="lsoda")
            count = cluster_count(traj.states, default_cluster_tol(beta))
            logE = log_energy(traj.states, beta)
            step = np.diff(logE)[after[1:]]
            merge = _windows(np.diff(count) < 0, *params["merge_window"])[after[1:]]
            rises += float(np.clip(step, 0, None).sum())
            in_merges += float(np.clip(step[merge], 0, None).sum())
            in_window += int(merge.sum())
            single = np.flatnonzero((count == 1) & after)
            T1.append(float(times[single[0]]) if single.size else float("inf"))
            drops = times[1:][(np.diff(count) < 0) & after[1:]]
            durations.extend(np.diff(np.concatenate([[params["t1"]], drops])).tolist())
            if example is None and i == len(betas) // 2 and np.sum(np.diff(count) < 0) >= 2:
                example = {"beta": beta, "times": times, "count": count, "log_energy": logE}
            progress((i * runs + r + 1) / (len(betas) * runs))
        t_one.append(T1)
        plateaus.append(durations)
        share.append(in_merges / rises if rises > 0 else float("nan"))
        covered.append(in_window / (runs * int(after[1:].sum())))
    t_one_arr = np.array(t_one)
    median = np.median(t_one_arr, axis=1)
    finite = np.isfinite(median)
    fit = (np.polyfit(np.array(betas)[finite], np.log(median[finite]), 1)
           if finite.sum() >= 2 else np.array([np.nan, np.nan]))
    return {"betas": betas, "t_one": t_one_arr, "t_one_median": median,
            "plateau_durations": plateaus, "energy_share_in_merges": share,
            "window_share_of_intervals": covered,
            "fit_c": float(fit[0]), "fit_a": float(fit[1]), "example": example,
            **_growth_fits(np.array(betas), t_one_arr, params["bootstrap"], rng)}


def _growth_fits(betas: np.ndarray, t_one: np.ndarray, resamples: int,
                 rng: np.random.Generator) -> dict[str, Any]:
    """The exponential law log T_1 = a + c beta against the power law log T_1 = a + p log beta,
    both fitted by least squares to the log medians over runs of T_1 (betas,) x (runs,): the
    residual sums of squares ("rss_exponential", "rss_power"), and a 95 % percentile-bootstrap
    interval of c ("fit_c_interval"; runs resampled within each beta; resamples whose median is
    censored, T_1 = inf, count as NaN and widen nothing)."""
    def rss(x: np.ndarray, y: np.ndarray) -> float:
        coef = np.polyfit(x, y, 1)
        return float(np.sum((y - np.polyval(coef, x)) ** 2))

    med = np.median(t_one, axis=1)
    if not np.all(np.isfinite(med)) or len(betas) < 3:
        nan = float("nan")
        return {"rss_exponential": nan, "rss_power": nan, "fit_c_interval": [nan, nan]}
    y = np.log(med)
    pick = rng.integers(0, t_one.shape[1], size=(resamples, *t_one.shape))
    boot = np.log(np.median(np.take_along_axis(t_one[None], pick, axis=2), axis=2))
    cs = np.array([np.polyfit(betas, b, 1)[0] if np.all(np.isfinite(b)) else np.nan
                   for b in boot])
    return {"rss_exponential": rss(betas, y), "rss_power": rss(np.log(betas), y),
            "fit_c_interval": [float(v) for v in np.nanpercentile(cs, [2.5, 97.5])],
            "bootstrap_censored": int(np.sum(np.isnan(cs)))}


def _windows(drops: np.ndarray, before: int, after: int) -> np.ndarray:
    """Boolean mask of the save intervals within (before, after) intervals of a drop."""
    out = drops.copy()
    for i in np.flatnonzero(drops):
        out[max(i - before, 0):i + after + 1] = True
    return out


def _first_claim(first, params) -> Claim:
    ratio = first["mean"] / first["k_star"]
    return claim(
        "meanfield.first",
        measured="mean clusters at t1 / k*: " + ", ".join(
            f"beta={b:g}: {m:.1f}/{k}" for b, m, k in
            zip(first["betas"], first["mean"], first["k_star"]))
        + f"; log-log slope {first['slope']:.3f} vs k*'s {first['slope_k_star']:.3f}",
        values={"count_off": float(np.max(np.abs(ratio - 1.0))),
                "slope_off": abs(first["slope"] - first["slope_k_star"])})


def _large_claim(large, params) -> Claim:
    ratio = large["mean"] / large["k_star"]
    return claim(
        "meanfield.first_large_n",
        measured=f"n = {large['n']}: mean clusters at t1(n) / k*: " + ", ".join(
            f"beta={b:g} (t1 = {t:.1f}): {m:.1f}/{k}" for b, t, m, k in
            zip(large["betas"], large["t1"], large["mean"], large["k_star"]))
        + f"; log-log slope {large['slope']:.3f} vs k*'s {large['slope_k_star']:.3f}",
        values={"count_off": float(np.max(np.abs(ratio - 1.0))),
                "slope_off": abs(large["slope"] - large["slope_k_star"])},
        note="the instrument: single linkage chains through dense tokens (consecutive tokens "
        "about 2 pi / n apart); the density count (beta^-1/2 kernel) of the same tokens: "
        + ", ".join(f"beta={b:g}: {np.mean(d):.1f}" for b, d in
                    zip(large["betas"], large["density_counts"])),
        n=large["n"], runs=params["large_runs"])


def _bridge_claim(bridge, params) -> Claim:
    tokens, peaks = np.array(bridge["token_counts"]), np.array(bridge["solver_peaks"])
    return claim(
        "meanfield.bridge_large_n",
        measured=f"n = {bridge['n']}: tokens' density count / solver's peaks at t_c: " + ", ".join(
            f"beta={b:g} (t_c = {t:.2f}{'' if lost is None else ', resolution lost'}): "
            f"{c}/{p} (k* = {k})" for b, t, lost, c, p, k in
            zip(bridge["betas"], bridge["t_c"], bridge["resolution_lost_at"], tokens, peaks,
                bridge["k_star"])),
        values={"mismatches": int(np.sum(tokens != peaks)),
                "largest_off": float(np.max(np.abs(tokens - peaks) / peaks))},
        n=bridge["n"])


def _staircase_claim(merging, params) -> Claim:
    share = np.array(merging["energy_share_in_merges"])
    return claim(
        "meanfield.staircase",
        measured="share of the energy's rise after t1 in the windows of the merges: "
        + ", ".join(f"beta={b:g}: {s:.3f}" for b, s in zip(merging["betas"], share))
        + " (the windows cover " + ", ".join(
            f"{c:.0%}" for c in merging["window_share_of_intervals"]) + " of the intervals)",
        values={"smallest_share": float(np.min(share))},
        note=f"window: the drop's save interval, {params['merge_window'][0]} before, "
        f"{params['merge_window'][1]} after")


def _waiting_claim(merging, params) -> Claim:
    med = merging["t_one_median"]
    lo, hi = merging["fit_c_interval"]
    ratio = merging["rss_exponential"] / merging["rss_power"]
    return claim(
        "meanfield.waiting",
        measured="median time to one cluster: " + ", ".join(
            f"beta={b:g}: {m:.3g}" for b, m in zip(merging["betas"], med))
        + f" ({params['merge_runs']} runs each); fit log T_1 = a + c beta: c = "
        f"{merging['fit_c']:.2f} (95 % bootstrap interval {lo:.2f} to {hi:.2f}); residual sum "
        f"of squares {merging['rss_exponential']:.3g} against {merging['rss_power']:.3g} for "
        "log T_1 = a + p log beta",
        values={"censored_betas": int(np.sum(~np.isfinite(med))), "c_low": lo,
                "rss_ratio": ratio})


def _figure(first, merging, params, large, bridge) -> Figure:
    fig = Figure(figsize=(14.0, 4.2))
    ax, bx, cx = fig.subplots(1, 3)
    betas = np.array(first["betas"])
    ax.errorbar(betas, first["mean"], yerr=first["se"], fmt="o", label="clusters at t1")
    ax.plot(large["betas"], large["mean"], "^", color="tab:green",
            label=f"clusters at t1(n), n = {large['n']:g}")
    ax.plot(large["betas"], large["density_counts"].mean(axis=1), "v", color="tab:olive",
            label=f"density count at t1(n), n = {large['n']:g}")
    ax.plot(bridge["betas"], bridge["solver_peaks"], "P", color="tab:purple", mfc="none",
            ms=9, label="mean-field peaks at t_c")
    ax.plot(bridge["betas"], bridge["token_counts"], "x", color="tab:purple",
            label=f"density count at t_c, n = {bridge['n']:g} (quantile start)")
    ax.plot(betas, first["k_star"], "s", mfc="none", label="k* = argmax k^2 I_k(beta)")
    fine = np.geomspace(betas[0], betas[-1], 50)
    ax.plot(fine, np.sqrt(2 * fine), "k--", lw=1, label="sqrt(2 beta)")
    ax.set(xscale="log", yscale="log", xlabel="beta", ylabel="clusters",
           title=f"first phase: n = {params['n']}, t1 = {params['t1']:g}")
    ax.legend(loc="upper left", fontsize=7)
    ax.grid(alpha=0.3, which="both")
    ex = merging["example"]
    if ex is not None:
        t = ex["times"][1:]
        bx.plot(t, ex["log_energy"][1:] - ex["log_energy"][0], color="tab:red")
        bx.set(xscale="log", xlabel="t", ylabel="log E(t) - log E(0)",
               title=f"one run, n = {params['merge_n']}, beta = {ex['beta']:g}")
        twin = bx.twinx()
        twin.step(t, ex["count"][1:], where="post", color="tab:blue")
        twin.set_ylabel("clusters", color="tab:blue")
        bx.grid(alpha=0.3)
    mb = np.array(merging["betas"])
    for b, T in zip(mb, merging["t_one"]):
        cx.plot(np.full(len(T), b), np.where(np.isfinite(T), T, np.nan), "o", color="0.6",
                ms=3)
    cx.plot(mb, merging["t_one_median"], "D", color="tab:blue", label="median")
    if np.isfinite(merging["fit_c"]):
        cx.plot(mb, np.exp(merging["fit_a"] + merging["fit_c"] * mb), "k--", lw=1,
                label=f"exp(a + c beta), c = {merging['fit_c']:.2f}")
    cx.set(yscale="log", xlabel="beta", ylabel="time to one cluster T_1",
           title=f"merging: n = {params['merge_n']}, {params['merge_runs']} runs")
    cx.legend()
    cx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
