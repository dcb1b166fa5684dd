"""Noisy unnormalised attention: the uniform state's instability K_#(beta), the tricritical
beta_* and the first-order transition above it (Mun and Rosenzweig, arXiv 2604.16288,
2606.05140; Balasubramanian, Banerjee and Rigollet, arXiv 2510.20094; docs/science.md §11.2).

Full attention, unnormalised weights, Q = K = V = I, noise sigma (attnflow's SDE
dX = K F dt + sigma P_X dW) and the interaction strength K (`attnflow.family.Strength`); the
theory (`attnflow.analysis.tricritical`) depends on K / sigma^2, the papers' coupling.

* Threshold on the circle: the mean-field solver from 1/(2 pi)(1 + eps cos theta) at
  K = K_#(1 -+ delta); the measured rate of mode 1 against K I_1(beta)/beta - sigma^2/2 and
  its zero against K_#.
* Threshold on S^2: particles from iid uniform tokens; n E[R^2](t) (R = |mean x|) against the
  linear fluctuation theory S + (1 - S) e^{-2 a t} (claims.toml).
* Sweeps: the strength stepped up from the uniform state and back down, each strength held
  for a while, the state carried over; on the circle the solver (a kick of mode 1 at the
  start of each hold, the finite-n fluctuations' stand-in), on S^2 particles. The order
  parameter against the self-consistency's branch, the switching strengths against K_#
  (up) and the saddle-node K_sn (down); K_c (equal free energies) lies between.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import (
    dispersion_rate,
    instability_strength,
    linear_fluctuation,
    stationary_branch,
    stationary_order,
    transition_strengths,
    tricritical_beta,
)
from attnflow.experiments._ledger import claim, entry, not_run
from attnflow.experiments._recipe import Claim, Output, Progress, mean_se, save_figure
from attnflow.family import Attention
from attnflow.meanfield import from_function, solve
from attnflow.simulate import simulate
from attnflow.sphere import uniform

PAPERS = ("2606.05140", "2604.16288", "2510.20094")
NAME = "tricritical"
TITLE = "Noisy unnormalised attention: the threshold K_#, the tricritical beta_* and hysteresis"
SIGMA = 1.0  # the papers' noise: their K is attnflow's strength at sigma = 1
QUICK: dict[str, Any] = {
    "rate_betas": [1.5, 4.0], "rate_delta": 0.1, "rate_modes": 8, "rate_eps": 1e-6,
    "fluct_betas": [1.0, 4.0], "fluct_ratios": [0.7, 1.3], "fluct_n": 200, "fluct_runs": 24,
    "fluct_t": 2.0, "fluct_dt": 0.1, "phase_betas": 2, "sweeps": False,
}
# The sweeps (full size only): betas below and above beta_*, strengths as multiples of the
# theory's K_# ("sharp") and K_sn ("sn"), holds, the solver's and the particles' sizes.
SWEEPS: dict[str, Any] = {
    "circle_low": 1.5, "circle_high": 4.0, "sphere_low": 1.0, "sphere_high": 4.0,
    "low_ratios": [0.8, 1.15, 1.3, 1.5], "courant": 1.9,
    "circle_low_modes": 32, "circle_hold_low": 120.0, "kick_low": 1e-2, "tol_low": 1e-6,
    "circle_high_modes": 40, "circle_hold_high": 150.0, "kick_high": 1e-2, "tol_high": 1e-5,
    "circle_up": ["0.9 sn", "1.02 sn", "0.98 sharp", "1.1 sharp", "1.15 sharp"],
    "circle_down": ["1.1 sharp", "0.98 sharp", "1.02 sn", "0.95 sn", "0.9 sn"],
    "sphere_up": ["0.85 sn", "1.05 sn", "0.92 sharp", "1.1 sharp", "1.2 sharp"],
    "sphere_down": ["1.1 sharp", "0.92 sharp", "1.05 sn", "0.95 sn", "0.85 sn"],
    "sweep_n": 1000, "sweep_runs": 2, "sweep_dt": 0.025, "sweep_hold": 60.0,
}
# The S^2 holds (measured, scripts/diagnostics/tricritical_sphere.py): at beta = 1, 1.15 K_#
# even the S^2 solver from the particles' start reaches the branch (to 0.01) only at t = 28,
# so a hold of 30 averages the growth (r 0.514 against the branch's 0.582); at beta = 4,
# 1.05 K_sn, Euler-Maruyama at dt = 0.05 leaves the branch (R 0.85 -> 0.15 in 30, n = 1000
# and 4000 alike) where dt = 0.025 holds it (0.76) and the solver too (0.865).
FULL: dict[str, Any] = {
    **QUICK, **SWEEPS, "rate_betas": [0.5, 1.5, 3.0, 5.0, 8.0],
    "fluct_ratios": [0.7, 1.0, 1.3], "fluct_n": 300, "fluct_runs": 100, "fluct_t": 3.0,
    "phase_betas": 12, "sweeps": True,
}
FULL_MINUTES = 20  # estimated: the solver's sweeps at beta = 4 (CFL-bound steps) and the S^2
# holds (about 13 s of CPU each) dominate


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    key = int(np.random.SeedSequence(seed).generate_state(1)[0])
    rates = _rates(params)
    progress(0.05)
    fluct = _fluctuations(params, seed, key)
    progress(0.2)
    sweeps = {}
    if params["sweeps"]:
        for i, (d, kind) in enumerate(((2, "low"), (3, "low"), (2, "high"), (3, "high"))):
            sweeps[(d, kind)] = _sweep(params, d, kind, seed + i, key + i)
            progress(0.2 + 0.15 * (i + 1))
    phase = _phase(params)
    claims = [_threshold_circle_claim(rates), _threshold_sphere_claim(fluct)]
    figures = [save_figure(_threshold_figure(rates, fluct, params), out,
                           "tricritical_threshold.png")]
    if sweeps:
        claims += [_continuous_claim("circle", sweeps[(2, "low")]),
                   _continuous_claim("sphere", sweeps[(3, "low")]),
                   _first_order_claim("circle", sweeps[(2, "high")]),
                   _first_order_claim("sphere", sweeps[(3, "high")])]
        figures += [save_figure(_sweep_figure(sweeps, 2), out, "tricritical_circle.png"),
                    save_figure(_sweep_figure(sweeps, 3), out, "tricritical_sphere.png")]
    else:
        claims += [not_run(f"tricritical.{c}", _quick_reason(f"tricritical.{c}"), beta="-",
                           beta_star="-")
                   for c in ("continuous_circle", "continuous_sphere", "first_order_circle",
                             "first_order_sphere")]
    figures.append(save_figure(_phase_figure(phase, sweeps), out, "tricritical_phase.png"))
    progress(1.0)
    notes = [f"sigma = {SIGMA:g} throughout, so the strength K is the papers' coupling. "
             f"beta_* = {tricritical_beta(2):.6f} (d = 2), {tricritical_beta(3):.6f} (d = 3). "
             + ("Switching strengths: " if sweeps else "") + "; ".join(
                 f"d = {s['d']}, beta = {s['beta']:g}: K_# = {s['K_sharp']:.5f}, K_sn = "
                 f"{s['K_sn']:.5f}, K_c = {s['K_c']:.5f}" for s in sweeps.values()
                 if s["kind"] == "high")]
    numbers = {"rates": rates, "fluctuations": fluct, "phase": phase,
               "sweeps": {f"d{d}_{kind}": s for (d, kind), s in sweeps.items()}}
    return Output(numbers, claims, figures, notes)


# ---------------------------------------------------------------------------- threshold

def _quick_reason(id: str) -> str:
    """Why a sweep claim is not run at the quick size: its ledger `quick` field (the measured
    reason, without the full size's description)."""
    text = entry(id).quick.removeprefix("not run at the quick size (").removesuffix(")")
    return "the sweeps run at the full size only: " + text.split("; full:")[0]

def _rates(params) -> list[dict[str, Any]]:
    """Mode 1's measured rate at K_# (1 -+ delta) on the circle, per beta."""
    rows = []
    eps, delta = params["rate_eps"], params["rate_delta"]
    rho0 = from_function(lambda t: 1 + eps * np.cos(t), modes=params["rate_modes"])
    for beta in params["rate_betas"]:
        K_sharp = instability_strength(beta, 2, SIGMA)
        Ks = [K_sharp * (1 - delta), K_sharp * (1 + delta)]
        measured = []
        for K in Ks:
            res = solve(_circle_model(beta, K), rho0, 1.0, save_at=[1.0], noise=SIGMA)
            measured.append(float(np.log(np.abs(res.coefficients[-1, 0, 1]
                                                / res.coefficients[0, 0, 1]))))
        zero = Ks[0] - measured[0] * (Ks[1] - Ks[0]) / (measured[1] - measured[0])
        theory = [float(dispersion_rate(1, beta, 2, SIGMA, "unnormalised", K)) for K in Ks]
        rows.append({"beta": beta, "K_sharp": K_sharp, "strengths": Ks, "rates": measured,
                     "theory": theory, "K_zero": zero})
    return rows


def _fluctuations(params, seed: int, key: int) -> list[dict[str, Any]]:
    """n E[R^2](t_obs) of particles on S^2 from iid uniform tokens, per (beta, K / K_#):
    geodesic Euler-Maruyama at dt and dt / 2 on one Brownian path, Richardson-extrapolated
    run by run (2 v_{dt/2} - v_dt: the scheme's weak order 1 biased v_dt by -15 % at dt = 0.1,
    K = 1.3 K_#, t = 2)."""
    n, runs, T, dt = (params[k] for k in ("fluct_n", "fluct_runs", "fluct_t", "fluct_dt"))
    rows = []
    for i, beta in enumerate(params["fluct_betas"]):
        K_sharp = instability_strength(beta, 3, SIGMA)
        for j, ratio in enumerate(params["fluct_ratios"]):
            x0 = uniform((runs, n), 3, seed=seed + 100 * i + j)
            v = [n * np.sum(simulate(_sphere_model(beta, ratio * K_sharp), x0, T, save_at=[T],
                                     method="geodesic", dt=h, noise=SIGMA,
                                     seed=key + 100 * i + j, brownian_dt=dt
                                     ).states[-1].mean(axis=-2) ** 2, axis=-1)
                 for h in (dt, dt / 2)]
            mean, se = mean_se(2 * v[1] - v[0])
            rows.append({"beta": beta, "ratio": ratio, "K_sharp": K_sharp, "mean": mean,
                         "se": se, "coarse": float(v[0].mean()), "fine": float(v[1].mean()),
                         "theory": float(linear_fluctuation(ratio * (1 - 1 / n), T, 3, SIGMA))})
    return rows


# ---------------------------------------------------------------------------- sweeps
def _strength(spec: str, K_sharp: float, K_sn: float) -> float:
    """A strength from its text "F sharp" or "F sn": F times K_# or K_sn (the theory's)."""
    factor, base = spec.split()
    return float(factor) * (K_sharp if base == "sharp" else K_sn)


def _sweep(params, d: int, kind: str, seed: int, key: int) -> dict[str, Any]:
    """Sweep the strength up and back down at beta below (kind "low") or above ("high")
    beta_*: the solver on the circle (d = 2), particles on S^2 (d = 3)."""
    beta = params[f"{'circle' if d == 2 else 'sphere'}_{kind}"]
    tr = transition_strengths(beta, d, SIGMA)
    if kind == "low":
        up = [r * tr.instability for r in params["low_ratios"]]
        down = up[-2::-1]
    else:
        domain = "circle" if d == 2 else "sphere"
        up = [_strength(s, tr.instability, tr.spinodal) for s in params[f"{domain}_up"]]
        down = [_strength(s, tr.instability, tr.spinodal) for s in params[f"{domain}_down"]]
    hold = _CircleHold(params, beta, kind) if d == 2 else _SphereHold(params, beta, seed, key)
    r_up = [hold(K) for K in up]
    r_down = [hold(K) for K in down]
    strengths = sorted(set(up) | set(down))
    theory = stationary_order(strengths, beta, d, SIGMA)
    branch = stationary_branch(beta, d, np.linspace(0.02, 0.98, 49), SIGMA)
    return {"d": d, "kind": kind, "beta": beta, "beta_star": tricritical_beta(d),
            "K_sharp": tr.instability, "K_sn": tr.spinodal, "K_c": tr.critical,
            "up": up, "r_up": r_up, "down": down, "r_down": r_down,
            "theory": dict(zip(map(float, strengths), map(float, theory))),
            "uniform_R": {float(K): _uniform_R(K / tr.instability, hold.n)
                          for K in strengths if K < tr.instability},
            "branch_r": branch.r, "branch_K": branch.strength,
            "r_sn": float(branch.r[int(np.argmin(branch.strength))]),
            "hold_info": hold.info()}


def _uniform_R(ratio: float, n: int | None) -> float:
    """E R of the uniform state of n particles on S^2 (linear theory), 0 for the solver."""
    if n is None:
        return 0.0
    return float(np.sqrt(8 / (1 - ratio) / (3 * np.pi * n)))


class _CircleHold:
    """Holds of the mean-field solver on the circle: the state carried over, a kick of mode 1
    added at the start of each hold."""

    n = None

    def __init__(self, params, beta: float, kind: str) -> None:
        self.beta, self.kick = beta, params[f"kick_{kind}"]
        self.modes = params[f"circle_{kind}_modes"]
        self.T = params[f"circle_hold_{kind}"]
        self.courant, self.tol = params["courant"], params[f"tol_{kind}"]
        self.c = from_function(lambda t: np.ones_like(t), modes=self.modes)
        self.steps = 0
        self.lost: list[float] = []

    def __call__(self, K: float) -> float:
        c = self.c.copy()
        c[0, 1] += self.kick / (4 * np.pi)  # rho + kick cos(theta) / (2 pi)
        dt = self.courant / (self.modes * K * np.exp(self.beta))  # the speed bound K e^beta
        res = solve(_circle_model(self.beta, K), c, self.T, save_at=[self.T], noise=SIGMA,
                    dt=dt, tol=self.tol)
        self.steps += res.settings["steps"]
        if res.resolution_lost_at is not None:
            self.lost.append(float(K))
        self.c = res.coefficients[-1]
        return float(np.abs(res.moments(1)[-1, 0]))

    def info(self) -> dict[str, Any]:
        return {"modes": self.modes, "hold": self.T, "kick": self.kick, "tol": self.tol,
                "steps": self.steps,
                "resolution_lost_at_K": self.lost}


class _SphereHold:
    """Holds of particles on S^2: the tokens carried over, fresh noise for each hold."""

    def __init__(self, params, beta: float, seed: int, key: int) -> None:
        self.beta, self.key = beta, key
        self.n, self.dt, self.T = params["sweep_n"], params["sweep_dt"], params["sweep_hold"]
        self.x = uniform((params["sweep_runs"], self.n), 3, seed=seed)
        self.count = 0

    def __call__(self, K: float) -> float:
        times = np.linspace(0.0, self.T, int(round(self.T / self.dt)) // 4 + 1)
        tr = simulate(_sphere_model(self.beta, K), self.x, self.T, save_at=times,
                      method="geodesic", dt=self.dt, noise=SIGMA, seed=self.key + self.count)
        self.count += 1
        self.x = tr.states[-1]
        R = np.linalg.norm(tr.states.mean(axis=-2), axis=-1)  # (T, runs)
        return float(R[times >= self.T / 2].mean())

    def info(self) -> dict[str, Any]:
        return {"n": self.n, "dt": self.dt, "hold": self.T, "holds": self.count}


def _circle_model(beta: float, K: float) -> dict[str, Any]:
    return {"beta": beta, "mask": "full", "attention": "unnormalised", "strength": K}


def _sphere_model(beta: float, K: float) -> Attention:
    return Attention(beta=beta, mask="full", attention="unnormalised", backend="harmonic",
                     strength=K)


def _phase(params) -> dict[str, Any]:
    """K_#(beta), and K_sn, K_c above beta_*, for d = 2, 3 (sigma = 1)."""
    out = {}
    for d in (2, 3):
        bs = tricritical_beta(d)
        fine = np.linspace(0.05, 6.0, 120)
        above = np.linspace(bs * 1.05, 6.0, params["phase_betas"])  # (0: K_# only)
        strengths = [transition_strengths(b, d, SIGMA) for b in above]
        out[d] = {"beta_star": bs, "beta": fine,
                  "K_sharp": [instability_strength(b, d, SIGMA) for b in fine],
                  "beta_first_order": above, "K_sn": [s.spinodal for s in strengths],
                  "K_c": [s.critical for s in strengths]}
    return out


# ---------------------------------------------------------------------------- claims
def _threshold_circle_claim(rows) -> Claim:
    return claim(
        "tricritical.threshold_circle",
        measured=", ".join(f"beta={r['beta']:g}: K_# {r['K_sharp']:.8f}, zero of the measured "
                           f"rate {r['K_zero']:.8f}" for r in rows),
        values={"largest_zero_error": max(abs(r["K_zero"] / r["K_sharp"] - 1) for r in rows),
                "largest_rate_error": max(abs(m - t) for r in rows
                                          for m, t in zip(r["rates"], r["theory"]))})


def _threshold_sphere_claim(rows) -> Claim:
    return claim(
        "tricritical.threshold_sphere",
        measured=", ".join(f"beta={r['beta']:g} K/K_#={r['ratio']:g}: n E[R^2] = "
                           f"{r['mean']:.3f} +- {r['se']:.3f} (dt alone {r['coarse']:.3f}, "
                           f"dt/2 {r['fine']:.3f}; theory {r['theory']:.3f})" for r in rows),
        values={"largest_z": max(abs(r["mean"] - r["theory"]) / r["se"] for r in rows),
                "largest_relative_off": max(abs(r["mean"] / r["theory"] - 1) for r in rows)})


def _expected(s: dict[str, Any], K: float) -> float:
    """The theory's r at K for a sweep: the branch's root, else the uniform state's."""
    r = s["theory"][float(K)]
    return r if r > 0 else s["uniform_R"].get(float(K), 0.0)


def _continuous_claim(domain: str, s: dict[str, Any]) -> Claim:
    r_down = dict(zip(s["down"], s["r_down"]))
    hysteresis = max(abs(r - r_down[K]) for K, r in zip(s["up"], s["r_up"]) if K in r_down)
    off = max(abs(r - _expected(s, K)) for K, r in
              (*zip(s["up"], s["r_up"]), *zip(s["down"], s["r_down"])))
    return claim(
        f"tricritical.continuous_{domain}",
        measured=f"d = {s['d']}, beta = {s['beta']:g}, K_# = {s['K_sharp']:.5f}: " + ", ".join(
            f"K/K_#={K / s['K_sharp']:.3f}: up {r:.4f}" + (
                f", down {r_down[K]:.4f}" if K in r_down else "")
            + f" (theory {_expected(s, K):.4f})" for K, r in zip(s["up"], s["r_up"])),
        values={"hysteresis": hysteresis, "off_theory": off},
        beta=f"{s['beta']:g}", beta_star=f"{s['beta_star']:.4f}")


def _first_order_claim(domain: str, s: dict[str, Any]) -> Claim:
    values = _first_order_measures(s)
    return claim(
        f"tricritical.first_order_{domain}",
        measured=f"d = {s['d']}, beta = {s['beta']:g}: K_sn {s['K_sn']:.5f} < K_c "
                 f"{s['K_c']:.5f} < K_# {s['K_sharp']:.5f}; up " + ", ".join(
                     f"{K:.5f}: {r:.4f}" for K, r in zip(s["up"], s["r_up"]))
                 + "; down " + ", ".join(f"{K:.5f}: {r:.4f}"
                                         for K, r in zip(s["down"], s["r_down"])),
        values=values, beta=f"{s['beta']:g}", beta_star=f"{s['beta_star']:.4f}")


def _first_order_measures(s: dict[str, Any]) -> dict[str, float]:
    """loop, switch_off and branch_off of a sweep above beta_* (claims.toml)."""
    threshold = s["r_sn"] / 2
    up = list(zip(s["up"], s["r_up"]))
    down = list(zip(s["down"], s["r_down"]))
    r_up = dict(up)
    loop = max((r - r_up[K] for K, r in down if K in r_up), default=0.0)
    off = max(_outside(s["K_sharp"], up, threshold, rising=True),
              _outside(s["K_sn"], down, threshold, rising=False)) / s["K_sharp"]
    on_branch = [(K, r) for K, r in up + down if r > threshold and s["theory"][float(K)] > 0]
    branch_off = max((abs(r - s["theory"][float(K)]) for K, r in on_branch), default=np.inf)
    return {"loop": float(loop), "switch_off": float(off), "branch_off": float(branch_off)}


def _outside(K_theory: float, sweep: list[tuple[float, float]], threshold: float,
             rising: bool) -> float:
    """How far K_theory lies outside the bracket where the sweep switches (up: from r below
    the threshold to above; down: from above to below), 0 inside; inf without a switch."""
    for (K0, r0), (K1, r1) in zip(sweep, sweep[1:]):
        if (r0 <= threshold < r1) if rising else (r0 > threshold >= r1):
            lo, hi = min(K0, K1), max(K0, K1)
            return max(0.0, lo - K_theory, K_theory - hi)
    return float("inf")


# ---------------------------------------------------------------------------- figures
def _sweep_figure(sweeps, d: int) -> Figure:
    fig = Figure(figsize=(10.0, 4.2))
    axes = fig.subplots(1, 2)
    for ax, kind in zip(axes, ("low", "high")):
        s = sweeps[(d, kind)]
        Ks = s["K_sharp"]
        k_b, r_b = np.asarray(s["branch_K"]), np.asarray(s["branch_r"])
        i = int(np.argmin(k_b))
        ax.plot(k_b[i:] / Ks, r_b[i:], "k-", lw=1, label="stationary branch (stable)")
        if i > 0:
            ax.plot(k_b[:i + 1] / Ks, r_b[:i + 1], "k--", lw=1, label="branch (unstable)")
        lo = min(min(s["up"]), min(s["down"])) / Ks
        hi = max(max(s["up"]), max(s["down"])) / Ks
        ax.plot([lo, 1.0], [0, 0], "k:", lw=1, label="uniform state")
        ax.plot(np.asarray(s["up"]) / Ks, s["r_up"], "^-", color="C0", ms=7, mfc="none",
                label="swept up")
        ax.plot(np.asarray(s["down"]) / Ks, s["r_down"], "v-", color="C3", ms=7, mfc="none",
                label="swept down")
        ax.axvline(1.0, color="0.5", ls="--", lw=1)
        ax.text(1.0, 0.3, "K_# ", color="0.3", fontsize=8, rotation=90, ha="right")
        if kind == "high":
            for K, name, side in ((s["K_sn"], "K_sn ", "right"), (s["K_c"], " K_c", "left")):
                ax.axvline(K / Ks, color="0.7", ls=":", lw=1)
                ax.text(K / Ks, 0.3, name, color="0.3", fontsize=8, rotation=90, ha=side)
        ax.set(xlim=(lo - 0.03, hi + 0.03), ylim=(-0.03, 1.05), xlabel="strength K / K_#",
               ylabel="order parameter r = |mean x|",
               title=f"beta = {s['beta']:g} {'<' if kind == 'low' else '>'} beta_* = "
                     f"{s['beta_star']:.3f}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    what = "mean-field solver on the circle" if d == 2 else "particles on S^2"
    fig.suptitle(f"Noisy unnormalised attention, sigma = 1: {what}", fontsize=10)
    fig.tight_layout()
    return fig


def _threshold_figure(rates, fluct, params) -> Figure:
    fig = Figure(figsize=(10.0, 4.2))
    a, b = fig.subplots(1, 2)
    for i, r in enumerate(rates):
        color = f"C{i}"
        line = np.linspace(0.8, 1.2, 10) * r["K_sharp"]
        a.plot(line, [dispersion_rate(1, r["beta"], 2, SIGMA, "unnormalised", K)
                      for K in line], "-", lw=1, color=color, label=f"beta = {r['beta']:g}")
        a.plot(r["strengths"], r["rates"], "o", mfc="none", color=color)
        a.axvline(r["K_sharp"], color=color, ls="--", lw=0.8)
    a.axhline(0, color="0.5", lw=1)
    a.set(xscale="log", xlabel="strength K (dashed: K_# of each beta)",
          ylabel="growth rate of mode 1", title="circle: the solver's rate (o) and the formula")
    a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.14, 1.0),
             title="K I_1(beta)/beta - 1/2", title_fontsize=7)
    a.grid(alpha=0.3, which="both")
    t = np.linspace(0, params["fluct_t"], 50)
    for ratio in sorted({r["ratio"] for r in fluct}):
        b.plot(t, linear_fluctuation(ratio, t, 3, SIGMA), "k-", lw=1)
        b.text(t[-1] * 1.02, float(linear_fluctuation(ratio, t[-1], 3, SIGMA)),
               f"K/K_# = {ratio:g}", fontsize=7, va="center")
    for i, beta in enumerate(sorted({r["beta"] for r in fluct})):
        rows = [r for r in fluct if r["beta"] == beta]
        b.errorbar([params["fluct_t"] * (1 - 0.02 * (i + 1))] * len(rows),
                   [r["mean"] for r in rows], yerr=[3 * r["se"] for r in rows], fmt="o",
                   mfc="none", color=f"C{i}", label=f"particles, beta = {beta:g}")
    b.plot([], [], "k-", lw=1, label="linear theory")
    b.set(xlabel="time t", ylabel="n E[R^2]", yscale="log", xlim=(0, params["fluct_t"] * 1.3),
          title=f"S^2: n = {params['fluct_n']}, {params['fluct_runs']} runs (3 se), from uniform")
    b.legend(fontsize=7, loc="upper left")
    b.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _phase_figure(phase, sweeps) -> Figure:
    """K_sn and K_c relative to K_#(beta) (1: the uniform state's instability) against beta
    (on an absolute scale the three fall together, like beta^{(d+1)/2} e^{-beta})."""
    fig = Figure(figsize=(10.0, 4.2))
    for ax, d in zip(fig.subplots(1, 2), (2, 3)):
        p = phase[d]
        bs = p["beta_star"]
        ks = instability_strength(bs, d, SIGMA)
        ax.plot(p["beta"], np.ones(len(p["beta"])), "k-", lw=1.2,
                label="K_#: the uniform state unstable above")
        beta_fo = np.concatenate([[bs], p["beta_first_order"]])
        ratio = [instability_strength(b, d, SIGMA) for b in beta_fo]
        ax.plot(beta_fo, np.concatenate([[ks], p["K_c"]]) / ratio, "-", color="C3", lw=1.2,
                marker=".", label="K_c: equal free energies")
        ax.plot(beta_fo, np.concatenate([[ks], p["K_sn"]]) / ratio, "--", color="C0", lw=1.2,
                marker=".", label="K_sn: the clustered branch ends")
        ax.axvline(bs, color="0.5", ls=":", lw=1)
        ax.text(bs, 1.01, f" beta_* = {bs:.3f}", fontsize=8, va="bottom")
        for kind in ("low", "high") if sweeps else ():
            s = sweeps[(d, kind)]
            K_sharp = instability_strength(s["beta"], d, SIGMA)
            ax.plot([s["beta"]] * 2, [min(s["up"]) / K_sharp, max(s["up"]) / K_sharp], "-",
                    color="0.6", lw=4, alpha=0.5)
        ax.set(xlabel="beta", ylabel="strength K / K_#(beta)  (sigma = 1)",
               title=f"d = {d}: first order above beta_*" + (" (grey: swept)" if sweeps
                                                             else ""), ylim=(0.6, 1.1))
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
