"""Noise: the order parameter of the noisy Kuramoto model, and whether noise prevents the
single cluster (*Clustering in Deep Stochastic Transformers*, the mean-field survey;
docs/science.md §6).

Tokens on the circle (d = 2), full attention, Q = K = V = I, with independent Brownian motions:
dX_i = P_{X_i}(A_i) dt + sqrt(2/kappa) P_{X_i} dW_i, integrated by the geodesic
Euler-Maruyama step (exact Brownian increments of the angle on the circle).

* beta = 0 (the noisy Kuramoto model with coupling 1 and noise 1/kappa): the order parameter
  R = |mean_j x_j|, averaged over time after a burn-in, against the positive root of
  R = I_1(kappa R) / I_0(kappa R) for kappa > 2 (`kuramoto_order`); below kappa = 2 the
  uniform state is stable and n E[R^2] = 1 / (1 - kappa/2) (`uniform_fluctuation`).
* beta > 0: the uniform state is stable below kappa_c(beta) = beta I_0 / I_1
  (`noise_threshold`; noise stronger than sqrt(2 / kappa_c) prevents clustering, with
  n E[R^2] = 1 / (1 - kappa / kappa_c)); above it, do noisy tokens still end in one cluster?
  Clusters are counted as the modes of the attention-smoothed density
  f(phi) = sum_j exp(beta (cos(phi - phi_j) - 1)) (local maxima above `mode_floor` times the
  highest), which counts a noisy cluster once; deterministic runs are the baseline.

The uniform fluctuations are compared with the linear theory at finite n: a token's softmax
weight on itself, w = e^beta / (e^beta + (n - 1) I_0(beta)) (1/n at beta = 0; 7 % at n = 64,
beta = 4), does not move it, so the others couple with 1 - w and n E[R^2] = 1 / (1 - kappa
(1 - w) / kappa_c) (`finite_n_fluctuation`); the n -> infinity law is reported beside it.

Burn-in and error bars are measured, per series (a kappa): the burn-in is the first time the
runs' mean of the series comes within `settle_band` standard errors of its mean over the
second half (the standard error of a mean over the runs at one time), plus `margin` integrated
autocorrelation times; standard errors of time averages are sqrt(var tau / N) over the N
post-burn-in values of all runs, tau the integrated autocorrelation time (in saves; Sokal's
window: the smallest M with M >= 5 tau(M)).

Why the first arrival in the band, and not the last exit from it. The band is statistical: a
settled mean over the runs lies within 3 standard errors at any one time with probability
99.7 %, so it arrives there as soon as it has settled. But over the W / tau independent
stretches of a stationary series it leaves the band now and then by chance (1 - 0.997^(W/tau):
about 7 % for 25 stretches, more at the full size), so the last exit is a noise-driven time
that may fall anywhere, up to the end of the run, and throws data away at random. The first
arrival can be early, by at most the band: what is left of the transient then is at most
3 standard errors of a one-time mean, and near the stationary state it decays at the rate of
the fluctuations themselves (Onsager's regression: the mean relaxes with the autocorrelation
time tau). After the margin of 2 tau it is at most 3 e^-2 = 0.41 of that error, and averaged
over the remaining window W it biases the time average by at most 0.41 tau / W of it, against
a standard error of sqrt(2 tau / W) of it: below 0.1 standard error for W >= 10 tau. Both
numbers (3 and 2) are fixed by this argument, not by a measured R.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.special import i0e

from attnflow.analysis.closedforms import kuramoto_order, noise_threshold, uniform_fluctuation
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform

PAPERS = ("2601.21942", "2512.01868")  # arXiv ids of the papers whose claims this recipe checks
NAME = "noise"
TITLE = "Noise: the Kuramoto order parameter at beta = 0, clustering with noise at beta > 0"
QUICK: dict[str, Any] = {
    "n": 128, "runs": 8, "kappas": [1.0, 3.0, 4.0, 8.0], "dt": 0.05, "t_end": 50.0,
    "settle_band": 3.0, "margin": 2.0,
    "beta": 4.0, "cluster_n": 64, "cluster_runs": 8, "cluster_kappas": [3.0, 8.0],
    "cluster_dt": 0.1, "cluster_t_end": 150.0, "mode_floor": 0.05,
}
FULL: dict[str, Any] = {**QUICK, "n": 256, "runs": 16,
                        "kappas": [1.0, 1.5, 2.5, 3.0, 4.0, 6.0, 8.0],
                        "t_end": 80.0, "cluster_runs": 16,
                        "cluster_kappas": [2.0, 3.0, 6.0, 8.0, 20.0], "cluster_t_end": 300.0}
FULL_MINUTES = 7  # estimated from the quick size (22 s of CPU time) by the work ratio


KAPPA_C0 = 2.0  # kappa_c(0): the noisy Kuramoto model's uniform state is stable below it


def order_parameter(X: np.ndarray) -> np.ndarray:
    """R = |mean_j x_j| of tokens X (..., n, d): shape (...)."""
    return np.linalg.norm(X.mean(axis=-2), axis=-1)


def circle_modes(X: np.ndarray, beta: float, floor: float, grid: int = 720) -> np.ndarray:
    """Number of local maxima of f(phi) = sum_j exp(beta (cos(phi - phi_j) - 1)) at least
    `floor` times its maximum, for tokens X (..., n, 2) on the circle: shape (...)."""
    phi = np.linspace(0.0, 2 * np.pi, grid, endpoint=False)
    angles = np.arctan2(X[..., 1], X[..., 0])
    f = np.exp(beta * (np.cos(phi[:, None] - angles[..., None, :]) - 1.0)).sum(axis=-1)
    peak = ((f > np.roll(f, 1, axis=-1)) & (f >= np.roll(f, -1, axis=-1))
            & (f >= floor * f.max(axis=-1, keepdims=True)))
    return peak.sum(axis=-1)


def autocorrelation_time(x: np.ndarray) -> float:
    """Integrated autocorrelation time tau = 1 + 2 sum_{k=1}^{M} rho(k), in saves, of series
    x (T, runs) pooled over the runs (each run's mean removed), with Sokal's window: the
    smallest M with M >= 5 tau(M). 1 for an uncorrelated series."""
    x = x - x.mean(axis=0)
    T, var = x.shape[0], float(np.mean(x * x))
    if var == 0 or T < 2:
        return 1.0
    tau = 1.0
    for M in range(1, T):
        tau += 2 * float(np.mean(x[:-M] * x[M:])) / var
        if M >= 5 * tau:
            break
    return max(tau, 1.0)


def burn_in(series: np.ndarray, times: np.ndarray, band: float, margin: float) -> float:
    """The measured burn-in of a (T, runs) series saved at `times`: the first time the mean
    over runs comes within `band` standard errors (over the runs, at one time, pooled over the
    second half) of its second-half mean, plus `margin` autocorrelation times of the second
    half. (The first arrival, not the last departure: over hundreds of saves a stationary mean
    leaves any such band now and then by chance; the module docstring bounds the bias the
    first arrival leaves after the margin.)"""
    late = times > times[-1] / 2
    mean = series.mean(axis=1)
    se = float(series[late].std(axis=1, ddof=1).mean() / np.sqrt(series.shape[1]))
    near = np.abs(mean - mean[late].mean()) <= band * se
    settle = float(times[np.argmax(near)])  # near holds somewhere: the late mean lies inside
    step = float(times[1] - times[0])
    return settle + margin * autocorrelation_time(series[late]) * step


def stationary_mean_se(series: np.ndarray, times: np.ndarray, start: float
                       ) -> tuple[float, float, float]:
    """Mean, standard error and autocorrelation time (saves) of a (T, runs) series after
    `start`: se = sqrt(var tau / N) over its N values."""
    x = series[times > start]
    tau = autocorrelation_time(x)
    return float(x.mean()), float(np.sqrt(x.var(ddof=1) * tau / x.size)), tau


def finite_n_fluctuation(kappa: float, beta: float, n: int) -> float:
    """n E[R^2] of the uniform state of n tokens: 1 / (1 - kappa (1 - w) / kappa_c(beta)),
    w = e^beta / (e^beta + (n - 1) I_0(beta)) the self-weight (inf where unstable)."""
    w = 1.0 / (1.0 + (n - 1) * float(i0e(beta)))  # e^beta cancels: I_0 = e^beta i0e
    ratio = kappa * (1.0 - w) / float(noise_threshold(beta))
    return 1.0 / (1.0 - ratio) if ratio < 1 else float("inf")


def _noisy(model, x0, kappa, t_end, dt, seed) -> Any:
    """A geodesic Euler-Maruyama run at noise sqrt(2 / kappa), saved every 0.5."""
    times = np.arange(0.0, t_end + dt / 2, 0.5)
    return simulate(model, x0, t_end, save_at=times, method="geodesic", dt=dt,
                    noise=float(np.sqrt(2.0 / kappa)), seed=seed)


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    ss = np.random.SeedSequence(seed)
    draw, noise_key = ss.spawn(2)
    rng = np.random.default_rng(draw)
    key = int(noise_key.generate_state(1)[0])  # the Brownian path's seed
    n_jobs = len(params["kappas"]) + len(params["cluster_kappas"]) + 1
    done = 0

    x0 = uniform((params["runs"], params["n"]), 2, rng)
    kuramoto = []
    for kappa in params["kappas"]:
        traj = _noisy(Attention(beta=0.0, mask="full"), x0, kappa, params["t_end"],
                      params["dt"], key)
        R = order_parameter(traj.states)
        start = burn_in(R, traj.times, params["settle_band"], params["margin"])
        mean, se, tau = stationary_mean_se(R, traj.times, start)
        nR2, nR2_se, _ = stationary_mean_se(params["n"] * R**2, traj.times, start)
        kuramoto.append({"kappa": kappa, "R": mean, "R_se": se, "root": float(
            kuramoto_order(kappa)), "nR2": nR2, "nR2_se": nR2_se,
            "nR2_theory": float(uniform_fluctuation(kappa, 0.0)),
            "nR2_theory_finite_n": finite_n_fluctuation(kappa, 0.0, params["n"]),
            "burn_in": start, "autocorrelation_time": tau * 0.5,
            "R_series": R.mean(axis=1)})
        done += 1
        progress(done / n_jobs)

    beta = float(params["beta"])
    kc = float(noise_threshold(beta))
    xc = uniform((params["cluster_runs"], params["cluster_n"]), 2, rng)
    model = Attention(beta=beta, mask="full")
    t_end = params["cluster_t_end"]
    det = simulate(model, xc, t_end, save_at=np.arange(0.0, t_end + 0.25, 0.5),
                   method="lsoda")
    done += 1
    progress(done / n_jobs)
    clustered = [_cluster_row(det, np.inf, beta, kc, params)]
    for kappa in params["cluster_kappas"]:
        traj = _noisy(model, xc, kappa, t_end, params["cluster_dt"], key)
        clustered.append(_cluster_row(traj, kappa, beta, kc, params))
        done += 1
        progress(done / n_jobs)

    claims = [_root_claim(kuramoto, params), _uniform_claim(kuramoto, clustered, kc, params),
              _single_claim(clustered, kc, params)]
    figures = [save_figure(_figure(kuramoto, clustered, kc, params), out, "noise.png")]
    numbers = {"kuramoto": kuramoto, "beta": beta, "kappa_c": kc,
               "clusters": [{k: v for k, v in r.items() if k != "modes"} for r in clustered]}
    notes = [f"beta = 0: n = {params['n']}, {params['runs']} runs, geodesic Euler-Maruyama dt = "
             f"{params['dt']:g} to t = {params['t_end']:g}; measured burn-in "
             + ", ".join(f"kappa={r['kappa']:g}: {r['burn_in']:.1f}" for r in kuramoto)
             + ", autocorrelation time of R " + ", ".join(
                 f"{r['autocorrelation_time']:.2g}" for r in kuramoto)
             + f". beta = {beta:g}: n = {params['cluster_n']}, "
             f"{params['cluster_runs']} runs, dt = {params['cluster_dt']:g} to t = {t_end:g} "
             f"(deterministic baseline: LSODA), kappa_c(beta) = {kc:.3f} (sigma_c = "
             f"{np.sqrt(2 / kc):.3f}); clusters = modes of the attention-smoothed density at "
             f"least {params['mode_floor']:g} of the highest."]
    return Output(numbers, claims, figures, notes)


def _cluster_row(traj, kappa, beta, kc, params) -> dict[str, Any]:
    modes = circle_modes(traj.states, beta, params["mode_floor"])  # (T, runs)
    R = order_parameter(traj.states)
    start = burn_in(R, traj.times, params["settle_band"], params["margin"])
    nR2, nR2_se, _ = stationary_mean_se(params["cluster_n"] * R**2, traj.times, start)
    single = np.flatnonzero(np.all(modes == 1, axis=1))
    return {"kappa": kappa, "times": traj.times, "modes": modes,
            "median_modes": np.median(modes, axis=1),
            "single_share_final": float(np.mean(modes[-1] == 1)),
            "R_mean": float(R[traj.times > start].mean()), "burn_in": start,
            "nR2": nR2, "nR2_se": nR2_se,
            "nR2_theory": float(uniform_fluctuation(kappa, beta)) if np.isfinite(kappa)
            else float("inf"),
            "nR2_theory_finite_n": finite_n_fluctuation(kappa, beta, params["cluster_n"])
            if np.isfinite(kappa) else float("inf"),
            "first_all_single": float(traj.times[single[0]]) if single.size else float("inf")}


def _root_claim(rows, params) -> Claim:
    above = [r for r in rows if r["kappa"] > KAPPA_C0]
    z = [abs(r["R"] - r["root"]) / r["R_se"] for r in above]
    return claim(
        "noise.root",
        measured=", ".join(f"kappa={r['kappa']:g}: {r['R']:.4f} +- {r['R_se']:.4f} (root "
                           f"{r['root']:.4f})" for r in above) or "no kappa > 2 in the grid",
        values={"largest_z": max(z, default=float("nan"))})


def _uniform_claim(rows, clustered, kc, params) -> Claim:
    pairs = [(0.0, r) for r in rows if r["kappa"] < KAPPA_C0]
    pairs += [(params["beta"], r) for r in clustered if r["kappa"] < kc]
    ratio = [r["nR2"] / r["nR2_theory"] for _, r in pairs]
    z = [abs(r["nR2"] - r["nR2_theory_finite_n"]) / r["nR2_se"] for _, r in pairs]
    return claim(
        "noise.uniform",
        measured="n<R^2>: " + ", ".join(
            f"beta={b:g}, kappa={r['kappa']:g}: {r['nR2']:.2f} +- {r['nR2_se']:.2f} (finite-n "
            f"theory {r['nR2_theory_finite_n']:.2f}, n -> inf {r['nR2_theory']:.2f})"
            for b, r in pairs) or "no kappa below the thresholds",
        values={"largest_z": max(z, default=float("nan")),
                "ratio_factor": max((max(v, 1 / v) for v in ratio), default=float("nan"))},
        note="a clustered state gives n<R^2> of order n")


def _single_claim(clustered, kc, params) -> Claim:
    det = clustered[0]
    noisy = [r for r in clustered[1:] if r["kappa"] > kc]
    shares = [r["single_share_final"] for r in noisy]
    return claim(
        "noise.single",
        measured=f"beta = {params['beta']:g}, runs in one cluster at t = "
        f"{params['cluster_t_end']:g}: no noise {det['single_share_final']:.0%}, "
        + ", ".join(f"kappa={r['kappa']:g}: {r['single_share_final']:.0%} (all runs single "
                    f"from t = {r['first_all_single']:g})" for r in noisy),
        values={"single_share": min(shares, default=float("nan")),
                "gain": min(shares, default=float("nan")) - det["single_share_final"]},
        note=f"at every kappa > kappa_c = {kc:.2f}")


def _figure(kuramoto, clustered, kc, params) -> Figure:
    fig = Figure(figsize=(14.0, 4.2))
    ax, bx, cx = fig.subplots(1, 3)
    k = np.array([r["kappa"] for r in kuramoto])
    fine = np.linspace(min(1.0, k.min()), max(8.0, k.max()), 200)
    ax.plot(fine, kuramoto_order(fine), "k-", lw=1, label="root of R = I1(kR)/I0(kR)")
    ax.errorbar(k, [r["R"] for r in kuramoto], yerr=[3 * r["R_se"] for r in kuramoto],
                fmt="o", label=f"measured (n = {params['n']}, 3 SE)")
    low = fine[fine < KAPPA_C0]
    ax.plot(low, np.sqrt(uniform_fluctuation(low) / params["n"]), "k:",
            label="sqrt(1 / (n (1 - kappa/2)))")
    ax.set(xlabel="kappa (noise sqrt(2/kappa))", ylabel="order parameter R",
           title="beta = 0: noisy Kuramoto")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    for r in clustered:
        below = r["kappa"] < kc
        label = ("no noise" if not np.isfinite(r["kappa"]) else f"kappa = {r['kappa']:g}"
                 + (" (< kappa_c: modes of noise)" if below else ""))
        bx.plot(r["times"], r["median_modes"], ls=":" if below else "-", label=label)
    bx.set(xlabel="t", ylabel="clusters (median over runs)", yscale="log",
           title=f"beta = {params['beta']:g}, n = {params['cluster_n']} "
           f"(kappa_c = {kc:.2f})")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3, which="both")
    rows = [r for r in clustered if np.isfinite(r["kappa"])]
    cx.plot([r["kappa"] for r in rows], [r["R_mean"] for r in rows], "o-", label="measured")
    cx.axvline(kc, color="k", ls="--", lw=1, label="kappa_c(beta) = beta I0/I1")
    cx.set(xscale="log", xlabel="kappa", ylabel="time-averaged R",
           title=f"beta = {params['beta']:g}: clustering threshold")
    cx.legend(fontsize=8)
    cx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
