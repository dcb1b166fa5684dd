"""Particles to mean field: the rate at which n tokens' Fourier moments approach the solution
of the mean-field equation (docs/science.md §9, "Particles"; the mean-field survey).

Full softmax attention, Q = K = V = I, d = 2, from the smooth density
rho_0 ∝ exp(cos theta + 0.5 cos(2 theta - 1)) (`rho0`). The solver (`attnflow.meanfield`)
gives the moments M_k(t) = int e^{ik theta} rho_t, k = 1..`moments`, at the horizon t_end
(its run must stay resolved to t_end); particles (harmonic kernel, RK4) give
(1/n) sum_j e^{ik theta_j(t_end)}. Two placements of the tokens:

* iid draws from rho_0 (inverse distribution function of uniform levels): the empirical
  measure fluctuates by n^{-1/2}, and over a fixed horizon the flow keeps that order, so the
  root-mean-square error over runs and moments should fall as n^{-1/2}. Fitted: the exponent
  of RMS error against n (weighted least squares on the logs; the weight of each n from the
  spread of its runs' mean squared errors).
* quantiles theta_i = F^{-1}((i + 1/2)/n): the moments are the midpoint rule in u = F(theta)
  of u -> e^{ik Phi_t(F^{-1}(u))}, Phi_t the flow (which keeps the order of the tokens), a
  periodic analytic function while the density is smooth, so the error falls geometrically,
  e^{-c n}, down to the time-stepping floor (RK4 at dt against dt/2, at the smallest of the
  large n). Measured: the error at small n (geometric regime; the steepest local log-log
  slope) and at large n against the floor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import inverse_cdf
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.meanfield import from_function, solve
from attnflow.simulate import simulate

PAPERS = ("2512.01868", "2305.05465")  # arXiv ids of the papers whose claims this recipe checks
NAME = "convergence"
TITLE = "Particles to mean field: n^-1/2 from iid starts, geometric from quantile starts"
QUICK: dict[str, Any] = {
    "beta": 4.0, "t_end": 1.0, "mf_modes": 128, "moments": 5, "dt": 0.05, "iid_dt": 0.1,
    "iid_ns": [500, 2000, 8000], "iid_runs": [6, 6, 6],
    "small_ns": [8, 16, 32, 64, 128, 256], "quantile_ns": [1000, 8000], "above_floor": 100.0,
}
FULL: dict[str, Any] = {**QUICK, "iid_ns": [1000, 10_000, 100_000, 1_000_000],
                        "iid_runs": [16, 16, 16, 4],
                        "quantile_ns": [1000, 10_000, 100_000, 1_000_000]}
FULL_MINUTES = 6  # estimated: ~200 RK4 evaluations of 1e6 tokens at ~0.8 s, the rest smaller


def rho0(theta: np.ndarray) -> np.ndarray:
    """The initial density up to normalisation: exp(cos theta + 0.5 cos(2 theta - 1))."""
    return np.exp(np.cos(theta) + 0.5 * np.cos(2 * theta - 1.0))


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    c0 = from_function(rho0, modes=params["mf_modes"])[0]
    model = Attention(beta=float(params["beta"]), mask="full", backend="harmonic")
    t_end, K = float(params["t_end"]), params["moments"]
    mf = solve(Attention(beta=float(params["beta"]), mask="full"), c0, t_end,
               save_at=[t_end])
    target = np.array([mf.moments(k)[-1, 0] for k in range(1, K + 1)])  # (K,)

    def errors(theta0: np.ndarray, dt: float) -> np.ndarray:
        """|particle moments - mean field| (..., K) at t_end from angles theta0 (..., n)."""
        x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
        xt = simulate(model, x0, t_end, save_at=[t_end], method="rk4", dt=dt).final
        th = np.arctan2(xt[..., 1], xt[..., 0])
        moments = np.stack([np.exp(1j * k * th).mean(axis=-1) for k in range(1, K + 1)],
                           axis=-1)
        return np.abs(moments - target)

    def quantiles(n: int) -> np.ndarray:
        return inverse_cdf(c0, (np.arange(n) + 0.5) / n)

    small = [float(errors(quantiles(n), params["dt"]).max()) for n in params["small_ns"]]
    progress(0.1)
    large, first = [], None
    for i, n in enumerate(params["quantile_ns"]):
        err = errors(quantiles(n), params["dt"])
        first = err if first is None else first
        large.append(float(err.max()))
        progress(0.1 + 0.3 * (i + 1) / len(params["quantile_ns"]))
    n0 = params["quantile_ns"][0]
    floor = float(np.max(np.abs(errors(quantiles(n0), params["dt"] / 2) - first))) + 1e-12
    rng = np.random.default_rng(seed)
    rms, rms_se = [], []
    for i, (n, runs) in enumerate(zip(params["iid_ns"], params["iid_runs"])):
        err = errors(inverse_cdf(c0, rng.random((runs, n))), params["iid_dt"])  # (runs, K)
        per_run = np.mean(err**2, axis=-1)
        ms = float(per_run.mean())
        rms.append(np.sqrt(ms))
        rms_se.append(0.5 * float(per_run.std(ddof=1)) / np.sqrt(runs) / ms)  # se of log RMS
        progress(0.4 + 0.6 * (i + 1) / len(params["iid_ns"]))
    slope, slope_se, intercept = _weighted_fit(np.log(params["iid_ns"]), np.log(rms),
                                               np.array(rms_se))
    numbers = {"target_moments": np.stack([target.real, target.imag], axis=-1),  # (K, re/im)
               "resolution_lost_at": mf.resolution_lost_at,
               "small_ns": params["small_ns"], "small_errors": small,
               "quantile_ns": params["quantile_ns"], "quantile_errors": large, "floor": floor,
               "iid_ns": params["iid_ns"], "iid_rms": rms, "iid_log_rms_se": rms_se,
               "iid_slope": slope, "iid_slope_se": slope_se, "iid_intercept": intercept}
    claims = [_iid_claim(numbers),
              _quantile_claim(numbers, mf.resolution_lost_at is None, params)]
    figures = [save_figure(_figure(numbers, params), out, "convergence.png")]
    notes = [f"beta = {params['beta']:g}, horizon t = {t_end:g} (solver: {params['mf_modes']} "
             f"modes, resolved to the horizon: {mf.resolution_lost_at is None}); moments k = "
             f"1..{K}. Quantile starts: RK4 dt = {params['dt']:g}, floor (dt against dt/2 at "
             f"n = {n0}) {floor:.2g}. iid starts: RK4 dt = {params['iid_dt']:g}, runs "
             + ", ".join(f"{r} at n = {n}" for n, r in zip(params["iid_ns"],
                                                          params["iid_runs"])) + "."]
    return Output(numbers, claims, figures, notes)


def _weighted_fit(x: np.ndarray, y: np.ndarray, se: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares y = a + b x with weights 1 / se^2: (b, se of b, a)."""
    w = 1 / se**2
    xm = np.sum(w * x) / np.sum(w)
    sxx = np.sum(w * (x - xm) ** 2)
    b = float(np.sum(w * (x - xm) * y) / sxx)
    a = float(np.sum(w * (y - b * x)) / np.sum(w))
    return b, float(1 / np.sqrt(sxx)), a


def _iid_claim(nums) -> Claim:
    b, se = nums["iid_slope"], nums["iid_slope_se"]
    return claim(
        "convergence.iid",
        measured=f"fitted exponent {b:.4f} +- {se:.4f} over n = "
        + ", ".join(f"{n:g}" for n in nums["iid_ns"]) + "; RMS errors "
        + ", ".join(f"{r:.3g}" for r in nums["iid_rms"]),
        values={"z": abs(b + 0.5) / se, "off": abs(b + 0.5)})


def _quantile_claim(nums, resolved: bool, params) -> Claim:
    floor = nums["floor"]
    e = np.array(nums["small_errors"])
    logn = np.log(np.array(nums["small_ns"], dtype=float))
    ok = np.minimum(e[:-1], e[1:]) > params["above_floor"] * floor
    slopes = np.diff(np.log(e)) / np.diff(logn)
    steepest = float(slopes[ok].min()) if ok.any() else float("nan")
    return claim(
        "convergence.quantile",
        measured="largest moment error at n = "
        + ", ".join(f"{n:g}: {v:.2e}" for n, v in zip(nums["small_ns"] + nums["quantile_ns"],
                                                      nums["small_errors"]
                                                      + nums["quantile_errors"]))
        + f"; time-stepping floor {floor:.2e}; local slopes "
        + ", ".join(f"{s:.1f}" for s in slopes),
        values={"floor_ratio": max(nums["quantile_errors"]) / floor, "steepest_slope": steepest,
                "resolved": int(resolved)})


def _figure(nums, params) -> Figure:
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    n_iid = np.array(nums["iid_ns"], dtype=float)
    ax.errorbar(n_iid, nums["iid_rms"], yerr=2 * np.array(nums["iid_log_rms_se"])
                * np.array(nums["iid_rms"]), fmt="o", label="iid starts: RMS error (2 se)")
    ax.plot(n_iid, np.exp(nums["iid_intercept"]) * n_iid ** nums["iid_slope"], "C0-", lw=1,
            label=f"fit: n^({nums['iid_slope']:.3f} +- {nums['iid_slope_se']:.3f})")
    ns = np.array(nums["small_ns"] + nums["quantile_ns"], dtype=float)
    ax.plot(ns, nums["small_errors"] + nums["quantile_errors"], "s-", color="C1",
            label="quantile starts: largest error")
    ax.axhline(nums["floor"], color="C1", ls=":", lw=1, label="time-stepping floor")
    ax.set(xscale="log", yscale="log", xlabel="tokens n",
           ylabel="|particle moments - mean field| (k = 1.." + f"{params['moments']})",
           title=f"particles to mean field: beta = {params['beta']:g}, t = "
           f"{params['t_end']:g}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
