"""The dispersion relation of the uniform state on the circle: Fourier mode k grows at the
rate lambda_k, measured by the mean-field solver and by particles (docs/science.md §9;
*Emergence of meta-stable clustering in mean-field transformer models*).

Full attention, Q = K = V = I, d = 2, softmax weights. Linearised about the uniform density,
mode k grows at lambda_k = k^2 I_k(beta) / (beta I_0(beta)) (`dispersion_rate`; unnormalised
weights: no division by I_0), fastest at k* (`k_star`). Measured for k = 1..2 k*, beta in
`betas`:

* Solver: the uniform density plus a cosine of mode k of relative size `solver_eps`, solved
  to T = min(1 / lambda_k, 5 / lambda_k*) (the mode grows at most e-fold, the fastest mode,
  from round-off, at most e^5-fold); lambda = log(|c_k(T)| / |c_k(0)|) / T. Both weightings.
* Particles: n tokens iid uniform, `runs` runs per beta, RK4 with the harmonic kernel. The
  moments M_k(t) = (1/n) sum_j e^{i k theta_j} have E|M_k(0)|^2 = 1/n, and while the dynamics
  stay linear each run's M_k(t) = e^{lambda_k t} M_k(0), so E|M_k(t)|^2 = e^{2 lambda_k t} / n.
  lambda_hat is half the least-squares slope of log of the runs' mean |M_k|^2 against t, with
  a free intercept (the runs' common random start then cancels from the slope: only what is
  not linear scatters it); its standard error is the jackknife's over runs.

The linear window. The quadratic term of the equation drives mode k by pairs of modes j, l
(j +- l = k) with power of order |M_j|^2 |M_l|^2: by the fastest modes, it grows at up to
4 lambda_k* against the mode's own 2 lambda_k, and it is largest, relative to the mode, for
the slow modes near 2 k* (the second harmonic of k*). The fit uses the saves up to the last
one at which the runs' mean |M_j|^2, largest over the measured j, is at most `bound` / sqrt(n):
the forcing's power, of order that squared, is then at most bound^2 = 1 % of 1/n, the smallest
power a mode starts with. (The looser bound max_j E|M_j|^2 <= 0.01 lets the second harmonic
bias mode 2 k* by tens of per cent at n = 1e5.) Particles stop at the first save past it.

The self-weight (a token's own weight e^beta / Z_i, about sqrt(2 pi beta) / n) and the third
moments of the empirical measure shift the particles' rates by O(sqrt(beta) / n) relative:
below 1e-3 at the sizes used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import t as student_t

from attnflow.analysis.closedforms import dispersion_rate, k_star
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.meanfield import solve
from attnflow.simulate import simulate
from attnflow.sphere import uniform

PAPERS = ("2410.23228", "2512.01868")  # arXiv ids of the papers whose claims this recipe checks
NAME = "dispersion"
TITLE = "Dispersion relation of the uniform state: mode k grows at lambda_k (formula, mean " \
        "field, particles)"
QUICK: dict[str, Any] = {
    "n": 10_000, "runs": 8, "betas": [9, 25, 64], "dt": 0.1, "save_every": 0.1,
    "bound": 0.1, "backend": "harmonic:1e-9", "t_max": 20.0,
    "solver_eps": 1e-7, "unnormalised_betas": [9],
}
FULL: dict[str, Any] = {**QUICK, "n": 100_000, "runs": 16}
FULL_MINUTES = 5  # measured: 4.7 min of CPU time, 19 min wall (load up to 14)

TWO_PI = 2 * np.pi


def modes(beta: float) -> np.ndarray:
    """The measured modes k = 1..2 k*(beta)."""
    return np.arange(1, 2 * k_star(beta) + 1)


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    betas = [float(b) for b in params["betas"]]
    solver = [_solver_rates(beta, params) for beta in betas]
    progress(0.05)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(betas))]
    particles = []
    for i, (beta, rng) in enumerate(zip(betas, rngs)):
        particles.append(_particle_rates(beta, params, rng))
        progress(0.05 + 0.95 * (i + 1) / len(betas))
    rows = [{"beta": beta, "k": modes(beta), "formula": dispersion_rate(modes(beta), beta),
             "solver": s, **p} for beta, s, p in zip(betas, solver, particles)]
    claims = [_solver_claim(rows, params), _particle_claim(rows, params)]
    figures = [save_figure(_figure(rows, params), out, "dispersion.png")]
    notes = [f"Particles: n = {params['n']}, {params['runs']} runs per beta, RK4 dt = "
             f"{params['dt']:g} ({params['backend']} kernel), saves every "
             f"{params['save_every']:g}; the fit uses the saves while the runs' mean |M_k|^2, "
             f"largest over k, is at most {params['bound']:g} / sqrt(n). Solver: relative "
             f"perturbation {params['solver_eps']:g}, softmax at every beta, unnormalised at "
             f"beta = {params['unnormalised_betas']}; default step and resolution bound."]
    return Output({"rows": rows}, claims, figures, notes)


def solver_rate(beta: float, k: int, eps: float, attention: str = "softmax") -> float:
    """lambda_k measured by the mean-field solver: the uniform density plus a cosine of mode k
    of relative size eps, solved to T = min(1 / lambda_k, 5 / lambda_k*) (module docstring)."""
    lam = float(dispersion_rate(k, beta, attention=attention))
    K = max(6, 2 * k)
    T = min(1 / lam, 5 / float(np.max(dispersion_rate(np.arange(1, K + 1), beta,
                                                      attention=attention))))
    c = np.zeros(K + 1, dtype=complex)
    c[0], c[k] = 1 / TWO_PI, eps / TWO_PI
    res = solve(Attention(beta=beta, mask="full", attention=attention), c, T, save_at=[0.0, T])
    if res.resolution_lost_at is not None:
        return float("nan")
    return float(np.log(abs(res.coefficients[-1, 0, k]) / abs(c[k])) / T)


def _solver_rates(beta: float, params: dict[str, Any]) -> dict[str, list[float]]:
    """Softmax at every beta, unnormalised at `unnormalised_betas` (its Courant-limited step,
    set by the speed bound e^beta, makes large beta slow)."""
    weightings = ["softmax"] + (["unnormalised"] if beta in params["unnormalised_betas"]
                                else [])
    return {w: [solver_rate(beta, int(k), params["solver_eps"], w) for k in modes(beta)]
            for w in weightings}


def moments(X: np.ndarray, kmax: int) -> np.ndarray:
    """M_k = (1/n) sum_j e^{i k theta_j}, k = 1..kmax, of tokens X (..., n, 2) on the circle:
    (..., kmax)."""
    z = X[..., 0] + 1j * X[..., 1]  # e^{i theta}
    zk, out = z.copy(), []
    for _ in range(kmax):
        out.append(zk.mean(axis=-1))
        zk *= z
    return np.stack(out, axis=-1)


def _particle_rates(beta: float, params: dict[str, Any], rng: np.random.Generator
                    ) -> dict[str, Any]:
    """Simulate the runs save by save until the linear window closes; fit every mode."""
    model = Attention(beta=beta, mask="full", backend=params["backend"])
    x = uniform((int(params["runs"]), int(params["n"])), 2, rng)
    return linear_window_rates(model, x, lambda x: np.abs(moments(x, modes(beta).size)) ** 2,
                               params)


def linear_window_rates(model: Attention, x: np.ndarray, power: Any, params: dict[str, Any]
                        ) -> dict[str, Any]:
    """Rates of the powers of the modes of runs x (runs, n, d) from iid uniform starts:
    `power(x)` (runs, K), each of mean 1/n at the start, is saved every `save_every` (RK4 at
    `dt`) until the runs' mean of some mode exceeds `bound` / sqrt(n) (the linear window,
    module docstring) or t_max, then fitted by `fit_rates`."""
    n, step = x.shape[-2], float(params["save_every"])
    limit = params["bound"] / np.sqrt(n)
    times, saved = [0.0], [power(x)]  # (runs, K) per save
    while saved[-1].mean(axis=0).max() <= limit and times[-1] < params["t_max"]:
        x = simulate(model, x, step, save_at=[0.0, step], method="rk4", dt=params["dt"]).final
        times.append(times[-1] + step)
        saved.append(power(x))
    P = np.stack(saved)  # (T, runs, K)
    inside = P.mean(axis=1).max(axis=1) <= limit
    window = int(np.flatnonzero(~inside)[0]) if not inside.all() else len(times)
    t = np.array(times[:window])
    rate, se = fit_rates(t, P[:window])
    return {"particles": rate, "se": se, "window_end": float(t[-1]), "saves": window,
            "mean_power_end": P[window - 1].mean(axis=0), "n_power0": n * P[0].mean(axis=0)}


def fit_rates(t: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Half the least-squares slope (free intercept) of log mean_runs P against t, and its
    jackknife standard error over the runs: P (T, runs, K) -> two arrays (K,)."""
    def slope(p: np.ndarray) -> np.ndarray:
        y = np.log(p.mean(axis=1))  # (T, K)
        tc = t - t.mean()
        return (tc @ (y - y.mean(axis=0))) / (tc @ tc) / 2

    runs = P.shape[1]
    full = slope(P)
    leave = np.array([slope(np.delete(P, r, axis=1)) for r in range(runs)])
    se = np.sqrt((runs - 1) / runs * np.sum((leave - leave.mean(axis=0)) ** 2, axis=0))
    return full, se


def _solver_claim(rows, params) -> Claim:
    errors = [(r["beta"], w, float(np.max(np.abs(np.array(rates) / dispersion_rate(
        r["k"], r["beta"], attention=w) - 1)))) for r in rows for w, rates in r["solver"].items()]
    return claim(
        "dispersion.solver",
        measured="largest |lambda_solver / lambda_k - 1| over k = 1..2 k*: "
        + ", ".join(f"beta={b:g} {w}: {e:.1e}" for b, w, e in errors),
        values={"largest_rel_error": max(e for _, _, e in errors)})


def _particle_claim(rows, params) -> Claim:
    runs = int(params["runs"])
    z = np.concatenate([(r["particles"] - r["formula"]) / r["se"] for r in rows])
    p = 2 * student_t.sf(np.abs(z), runs - 1)
    off = max(float(np.max(np.abs(r["particles"] - r["formula"]) / np.max(r["formula"])))
              for r in rows)
    worst = int(np.argmax(np.abs(z)))
    at = [(r["beta"], int(k)) for r in rows for k in r["k"]][worst]
    return claim(
        "dispersion.particles",
        measured="; ".join(
            f"beta={r['beta']:g} (k* = {k_star(r['beta'])}, window t <= {r['window_end']:g}): "
            + ", ".join(f"k={k}: {m:.4f} +- {s:.4f} ({f:.4f})" for k, m, s, f in
                        zip(r["k"], r["particles"], r["se"], r["formula"]))
            for r in rows)
        + f" (measured +- se (formula)); largest |z| {abs(z[worst]):.2f} at beta = {at[0]:g}, "
        f"k = {at[1]} over {z.size} comparisons",
        values={"family_p": min(1.0, float(p.min()) * z.size), "largest_off_peak": off},
        n=params["n"], runs=runs)


def _figure(rows, params) -> Figure:
    fig = Figure(figsize=(4.6 * len(rows), 3.8))
    for ax, r in zip(np.atleast_1d(fig.subplots(1, len(rows))), rows):
        k = r["k"]
        ax.plot(k, r["formula"], "k-", lw=1, label="formula k^2 I_k / (beta I_0)")
        ax.plot(k, r["solver"]["softmax"], "x", color="tab:red", ms=7, label="mean-field solver")
        ax.errorbar(k, r["particles"], yerr=r["se"], fmt="o", ms=4, color="tab:blue",
                    capsize=2, label=f"particles, n = {params['n']:g}")
        ax.axvline(k_star(r["beta"]), color="0.7", lw=0.8, ls=":")
        ax.axhline(0.0, color="0.7", lw=0.8)
        ax.set(xlabel="mode k", ylabel="growth rate lambda_k",
               title=f"beta = {r['beta']:g}: k* = {k_star(r['beta'])}, "
               f"fit t <= {r['window_end']:g}")
        ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
