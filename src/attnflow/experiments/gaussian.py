"""The Gaussian closure of unnormalised attention: particles against the moment ODE and the
closed-form blow-up (*A Unified Perspective on the Dynamics of Deep Transformers*, Castin,
Ablin, Carrillo, Peyre; docs/science.md §11.5).

Tokens in R^d under full softmax attention with no normalisation (the flat scheme,
`attnflow.family.Flat`): in the mean-field limit a Gaussian law N(m, Sigma) stays Gaussian,
dm/dt = V (m + Sigma A m), dSigma/dt = V Sigma A Sigma + Sigma A^T Sigma V^T, A = beta K^T Q
(`attnflow.analysis.closedforms.gaussian_moments`). Two claims, d = 2, `runs` independent runs of n
iid
tokens each, integrated by dopri5:

* moments: for each configuration (Q, K, V, among them non-symmetric Q^T K and V), the
  run-averaged empirical mean and covariance (unbiased, ddof 1) at the `check_times` against
  the ODE from the sampled law N(m0, Sigma0); standard errors from the spread over runs (the
  O(n^{-1/2}) sampling fluctuation, which dominates the O(1/n) bias of the particles'
  softmax normaliser, a sample mean, at these n); z per entry and time. The configurations
  keep the ODE's tilt tau(t) = |Sigma^{1/2} A m| + 2 ||Sigma^{1/2} A Sigma^{1/2}|| (how
  many standard deviations of the law the softmax moves the mean of a token two standard
  deviations out) at most 2 over the horizon (`tilt`, recorded): beyond, the softmax puts
  its mass on the sample's extremes and the particles approach the closure only like
  log n.
* blowup: V = I, Q = K = I, m0 = 0, Sigma0 = diag(lambda0, lambda0 / 2): the closed form
  Sigma(t) = Sigma0 (I - 2 beta t Sigma0)^{-1} blows up at t* = 1 / (2 beta lambda0). Starts
  are antithetic (x and -x), so the empirical mean is 0 and stays 0 by symmetry (the mean
  would otherwise grow like e^t). Particles cannot blow up (each velocity is a convex
  combination of the tokens, so max |x| grows at most like e^t): what is measured is the
  particles' lambda_max(t) against the closed form from each run's own empirical
  covariance (exact for any initial covariance; removes the sampling fluctuation, which the
  flow amplifies lambda / lambda0-fold) until lambda_max reaches the `levels` (multiples
  of lambda0); the times at which it crosses them; and t* from a straight-line fit of
  1 / lambda_max(t) (each run up to its own highest level), which the closed form makes
  1 / lambda0 - 2 beta t. Every run is integrated to its own closed form's `show_level`
  (and to `until` times t*).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import gaussian_blowup_time, gaussian_moments
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, mean_se, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate

PAPERS = ("2501.18322",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "gaussian"
TITLE = "Gaussian closure without normalisation: moment ODE and blow-up against particles"
CONFIGS = [  # (name, Q, K, V) in d = 2; the score of (x, y) is beta x^T Q^T K y
    {"name": "symmetric Q^T K, V = I", "Q": [[1.0, 0.0], [0.0, 1.0]],
     "K": [[0.5, 0.15], [0.15, 0.3]], "V": [[1.0, 0.0], [0.0, 1.0]]},
    {"name": "non-symmetric Q^T K and V", "Q": [[1.0, 0.8], [-0.4, 0.7]],
     "K": [[1.0, 0.0], [0.0, 1.0]], "V": [[0.6, -0.8], [0.5, 0.4]]},
    {"name": "contracting V", "Q": [[0.9, 0.0], [0.5, 1.2]], "K": [[1.0, -0.3], [0.2, 0.8]],
     "V": [[-1.0, -0.2], [0.1, -0.7]]},
]
QUICK: dict[str, Any] = {
    "beta": 1.0, "m0": [0.4, -0.2], "Sigma0": [[0.20, 0.06], [0.06, 0.12]],
    "configs": CONFIGS, "n": 250, "runs": 16, "t_end": 1.5, "save_every": 0.25,
    "check_times": [0.5, 1.0, 1.5], "rtol": 1e-8, "atol": 1e-10,
    "blowup_beta": 1.0, "lambda0": 0.1, "blowup_n": 200, "blowup_runs": 8,
    "levels": [2.0, 4.0, 8.0], "show_level": 16.0, "blowup_saves": 96, "until": 0.0,
}
FULL: dict[str, Any] = {**QUICK, "n": 4000, "blowup_n": 4000, "until": 1.2}
FULL_MINUTES = 8  # estimated: 3 x 16 runs of 4000 tokens, 8 runs of 4000 on past t*


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    rng = np.random.default_rng(seed)
    moments = [_moment_rows(cfg, params, rng) for cfg in params["configs"]]
    progress(0.5)
    blow = _blowup(params, rng)
    progress(1.0)
    claims = [_moment_claim(moments, params), _blowup_claim(blow, params)]
    figures = [save_figure(_moment_figure(moments, params), out, "gaussian_moments.png"),
               save_figure(_blowup_figure(blow, params), out, "gaussian_blowup.png")]
    numbers = {"moments": [{k: v for k, v in r.items() if k not in ("emp_m", "emp_S")}
                           for r in moments],
               "blowup": {k: v for k, v in blow.items() if k not in ("lam", "times")}}
    notes = [f"d = 2, full softmax attention, flat scheme, beta = {params['beta']:g}; "
             f"moments: n = {params['n']}, {params['runs']} runs per configuration, m0 = "
             f"{params['m0']}, Sigma0 = {params['Sigma0']}; blow-up: beta = "
             f"{params['blowup_beta']:g}, Sigma0 = diag({params['lambda0']:g}, "
             f"{params['lambda0'] / 2:g}), n = {params['blowup_n']} (antithetic), "
             f"{params['blowup_runs']} runs; dopri5 rtol {params['rtol']:g}.",
             "The own-start residual (particles minus the ODE from each run's empirical "
             "initial moments) measures the finite-n field error alone: RMS "
             + ", ".join(f"{r['name']}: {r['own_rms']:.2g}" for r in moments)
             + " (covariance units), against the total deviation's RMS "
             + ", ".join(f"{r['total_rms']:.2g}" for r in moments) + "."]
    return Output(numbers, claims, figures, notes)


# ---------------------------------------------------------------------- claim (a)
def _empirical(X: np.ndarray, ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Mean (..., d) and covariance (..., d, d) of tokens X (..., n, d): unbiased (ddof 1),
    or the empirical measure's own (ddof 0, the one the particles' field sees)."""
    mu = X.mean(-2)
    c = X - mu[..., None, :]
    return mu, np.einsum("...na,...nb->...ab", c, c) / (X.shape[-2] - ddof)


def _moment_rows(cfg: dict[str, Any], params: dict[str, Any], rng: np.random.Generator
                 ) -> dict[str, Any]:
    """One configuration: particles' moments against the ODE, z per entry and time."""
    beta = float(params["beta"])
    Q, K, V = (np.array(cfg[k], dtype=float) for k in "QKV")
    m0, S0 = np.array(params["m0"]), np.array(params["Sigma0"])
    n, runs, d = params["n"], params["runs"], m0.size
    x0 = m0 + rng.standard_normal((runs, n, d)) @ np.linalg.cholesky(S0).T
    times = np.arange(0.0, params["t_end"] + 1e-9, params["save_every"])
    model = Attention(Q, K, V, beta=beta, mask="full", norm="flat")
    traj = simulate(model, x0, float(times[-1]), save_at=times, method="dopri5",
                    rtol=params["rtol"], atol=params["atol"])
    emp_m, emp_S = _empirical(traj.states)  # (T, runs, d), (T, runs, d, d)
    ode_m, ode_S = gaussian_moments(m0, S0, times, beta, Q, K, V)
    iu = np.triu_indices(d)
    dev = np.concatenate([emp_m - ode_m[:, None], (emp_S - ode_S[:, None])[..., iu[0], iu[1]]],
                         axis=-1)  # (T, runs, d + d(d+1)/2)
    se = dev.std(axis=1, ddof=1) / np.sqrt(runs)
    z = dev.mean(axis=1) / se
    check = [int(np.argmin(np.abs(times - t))) for t in params["check_times"]]
    scale = np.linalg.norm(ode_S, ord=2, axis=(-2, -1))  # ||Sigma(t)||, (T,)
    rel = np.concatenate([np.abs(dev.mean(1)[:, :d]) / np.sqrt(scale)[:, None],
                          np.abs(dev.mean(1)[:, d:]) / scale[:, None]], axis=-1)
    own_S = emp_S * (n - 1) / n  # the empirical measures' own covariances (ddof 0)
    own = np.array([gaussian_moments(emp_m[0, r], own_S[0, r], times, beta, Q, K, V)[1]
                    for r in range(runs)]).swapaxes(0, 1)  # (T, runs, d, d)
    return {"name": cfg["name"], "times": times, "check": check, "ode_m": ode_m,
            "tilt": float(max(tilt(ode_m[i], ode_S[i], beta, Q, K) for i in range(times.size))),
            "ode_S": ode_S, "emp_m": emp_m, "emp_S": emp_S, "z": z[check],
            "largest_z": float(np.abs(z[check]).max()),
            "largest_rel": float(rel[check].max()),
            "own_rms": float(np.sqrt(np.mean((own_S - own)[check] ** 2))),
            "total_rms": float(np.sqrt(np.mean((emp_S - ode_S[:, None])[check] ** 2))),
            "n_evals": traj.n_evals}


def tilt(m: np.ndarray, Sigma: np.ndarray, beta: float, Q: np.ndarray, K: np.ndarray
         ) -> float:
    """tau = |Sigma^{1/2} A m| + 2 ||Sigma^{1/2} A Sigma^{1/2}||, A = beta K^T Q: in standard
    deviations of N(m, Sigma), how far the softmax tilt moves the mean of a token two
    standard deviations from m (module docstring)."""
    lam, U = np.linalg.eigh(Sigma)
    root = (U * np.sqrt(np.clip(lam, 0, None))) @ U.T
    A = beta * K.T @ Q
    return float(np.linalg.norm(root @ A @ m) + 2 * np.linalg.norm(root @ A @ root, 2))


def _moment_claim(rows, params) -> Claim:
    return claim(
        "gaussian.moments",
        measured=f"n = {params['n']}, {params['runs']} runs, times {params['check_times']}: "
        + "; ".join(f"{r['name']} (tilt <= {r['tilt']:.2f}): largest |z| "
                    f"{r['largest_z']:.2f}, largest relative deviation {r['largest_rel']:.3g}"
                    for r in rows),
        values={"largest_z": max(r["largest_z"] for r in rows),
                "largest_rel": max(r["largest_rel"] for r in rows)})


# ---------------------------------------------------------------------- claim (b)
def _blowup(params: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    beta, lam0 = float(params["blowup_beta"]), float(params["lambda0"])
    S0 = np.diag([lam0, lam0 / 2])
    t_star = gaussian_blowup_time(S0, beta)
    n, runs = params["blowup_n"], params["blowup_runs"]
    half = rng.standard_normal((runs, n // 2, 2)) @ np.sqrt(S0)
    x0 = np.concatenate([half, -half], axis=1)  # antithetic: mean exactly 0
    lam_own0 = np.linalg.eigvalsh(_empirical(x0, ddof=0)[1])[:, -1]  # each run's own

    def own_time(level: float) -> np.ndarray:
        """When each run's own closed form reaches lambda_max = level (1 / lambda is
        1 / lambda0 - 2 beta t)."""
        return (1 / lam_own0 - 1 / level) / (2 * beta)

    # every run on to its own show level, and to `until` t* (past t* when > 1)
    t_end = max(float(own_time(params["show_level"] * lam0).max()), t_star * params["until"])
    times = np.linspace(0.0, t_end, params["blowup_saves"] + 1)
    traj = simulate(Attention(beta=beta, mask="full", norm="flat"), x0, t_end, save_at=times,
                    method="dopri5", rtol=params["rtol"], atol=params["atol"])
    emp_m, emp_S = _empirical(traj.states, ddof=0)  # what the particles' field sees
    lam = np.linalg.eigvalsh(emp_S)[..., -1]  # (T, runs)
    levels = np.array(params["levels"], dtype=float) * lam0
    t_levels = t_star * (1 - lam0 / levels)  # the population's closed-form crossing times
    lam_rel, cross_dev, lam_rows = [], [], []
    for L, tL in zip(levels, t_levels):
        t_own = own_time(L)
        at = np.array([np.interp(t_own[r], times, lam[:, r]) for r in range(runs)])
        rel = at / L - 1
        # crossing time: 1 / lambda is linear in t under the closed form; interpolate it
        t_cross = np.array([np.interp(-1 / L, -1 / lam[:, r], times) for r in range(runs)])
        lam_rel.append(rel)
        cross_dev.append(t_cross - t_own)
        lam_rows.append({"level": float(L), "t_closed_form": float(tL),
                         "lambda_rel": mean_se(rel), "t_cross": mean_se(t_cross),
                         "t_cross_minus_own": mean_se(t_cross - t_own)})
    top = own_time(levels[-1])  # each run fitted up to its own highest level
    slopes, roots = [], []
    for r in range(runs):
        fit = times <= top[r]
        b, a = np.polyfit(times[fit], 1 / lam[fit, r], 1)
        slopes.append(b)
        roots.append(-a / b)
    roots = np.array(roots)
    own_star = 1 / (2 * beta * lam_own0)
    zs = [mean_se(x)[0] / mean_se(x)[1] for x in (*lam_rel, *cross_dev, roots - own_star)]
    t_fit, t_fit_se = mean_se(roots)
    at_star = [np.interp(t_star, times, lam[:, r]) for r in range(runs)] if times[-1] >= t_star \
        else []
    return {"t_star": t_star, "levels": lam_rows, "t_star_fit": t_fit, "t_star_fit_se": t_fit_se,
            "t_star_own": mean_se(own_star), "slope": mean_se(slopes), "largest_z":
            float(np.max(np.abs(zs))), "t_star_rel": abs(mean_se(roots - own_star)[0]) / t_star,
            "largest_mean": float(np.abs(emp_m).max()),
            "lambda_at_t_star": mean_se(at_star) if at_star else None,
            "times": times, "lam": lam, "n_evals": traj.n_evals}


def _blowup_claim(b, params) -> Claim:
    rows = "; ".join(f"level {r['level']:g}: lambda_max / closed form - 1 = "
                     f"{r['lambda_rel'][0]:+.2g} +- {r['lambda_rel'][1]:.2g}, crossing "
                     f"{r['t_cross'][0]:.4f} (closed form {r['t_closed_form']:.4f}; minus own "
                     f"{r['t_cross_minus_own'][0]:+.2g} +- {r['t_cross_minus_own'][1]:.2g})"
                     for r in b["levels"])
    return claim(
        "gaussian.blowup",
        measured=f"n = {params['blowup_n']}, {params['blowup_runs']} runs: t* closed form "
        f"{b['t_star']:.4f}, fitted {b['t_star_fit']:.4f} +- {b['t_star_fit_se']:.4f}; {rows}",
        values={"largest_z": b["largest_z"], "t_star_rel": b["t_star_rel"]})


# ---------------------------------------------------------------------- figures
def _moment_figure(rows, params) -> Figure:
    fig = Figure(figsize=(11.0, 6.2))
    axes = fig.subplots(2, len(rows), squeeze=False)
    labels_m = ["m_1", "m_2"]
    labels_S = [("Sigma_11", 0, 0), ("Sigma_12", 0, 1), ("Sigma_22", 1, 1)]
    colours = ["C0", "C1", "C2"]
    for j, r in enumerate(rows):
        t = r["times"]
        fine = np.linspace(0, t[-1], 121)
        cfg = params["configs"][j]
        ode_m, ode_S = gaussian_moments(params["m0"], params["Sigma0"], fine, params["beta"],
                                        cfg["Q"], cfg["K"], cfg["V"])
        ax = axes[0, j]
        for a, lab in enumerate(labels_m):
            mean = r["emp_m"][:, :, a].mean(1)
            se = r["emp_m"][:, :, a].std(1, ddof=1) / np.sqrt(r["emp_m"].shape[1])
            ax.plot(fine, ode_m[:, a], "-", color=colours[a], lw=1, label=f"{lab} ODE")
            ax.errorbar(t, mean, yerr=3 * se, fmt="o", ms=3, mfc="none", color=colours[a],
                        label=f"{lab} particles")
        ax.set(title=r["name"], xlabel="t")
        ax = axes[1, j]
        for c, (lab, a, b) in enumerate(labels_S):
            vals = r["emp_S"][:, :, a, b]
            ax.plot(fine, ode_S[:, a, b], "-", color=colours[c], lw=1, label=f"{lab} ODE")
            ax.errorbar(t, vals.mean(1), yerr=3 * vals.std(1, ddof=1) / np.sqrt(vals.shape[1]),
                        fmt="o", ms=3, mfc="none", color=colours[c], label=f"{lab} particles")
        ax.set(xlabel="t")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("mean")
    axes[1, 0].set_ylabel("covariance")
    axes[0, 0].legend(fontsize=7)
    axes[1, 0].legend(fontsize=7)
    fig.suptitle(f"Gaussian closure: particles (n = {params['n']}, {params['runs']} runs, "
                 "3 se) against the moment ODE", fontsize=11)
    fig.tight_layout()
    return fig


def _blowup_figure(b, params) -> Figure:
    beta, lam0 = float(params["blowup_beta"]), float(params["lambda0"])
    t_star, times, lam = b["t_star"], b["times"], b["lam"]
    own_star = 1 / (2 * beta * lam[0])  # each run's closed-form t* from its own Sigma_0
    fig = Figure(figsize=(11.0, 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    for r in range(lam.shape[1]):
        before = times < own_star[r]
        label = f"particles ({lam.shape[1]} runs)" if r == 0 else None
        ax1.plot(own_star[r] - times[before], lam[before, r], "-", color="C0", lw=0.8,
                 alpha=0.7, label=label)
        ax2.plot(times, 1 / lam[:, r], "-", color="C0", lw=0.8, alpha=0.7, label=label)
    s = np.geomspace(1e-3 * t_star, t_star, 100)
    ax1.plot(s, 1 / (2 * beta * s), "k--", lw=1.2, label="closed form 1 / (2 beta (t* - t))")
    for lvl in b["levels"]:
        ax1.axhline(lvl["level"], color="0.6", lw=0.7)
    ax1.set(xscale="log", yscale="log", xlabel="t* - t (t* of each run's own Sigma_0)",
            ylabel="lambda_max of the covariance", title="approach to the blow-up "
            "(grey: the levels)")
    ax1.invert_xaxis()
    fine = np.linspace(0, t_star, 50)
    ax2.plot(fine, 1 / lam0 - 2 * beta * fine, "k--", lw=1.2,
             label="closed form 1 / lambda0 - 2 beta t")
    ax2.axvline(t_star, color="C3", lw=1, ls=":", label=f"t* = {t_star:.3g}")
    ax2.set(xlabel="t", ylabel="1 / lambda_max", ylim=(0, 1.1 / lam0),
            title=f"1 / lambda_max (fitted t* = {b['t_star_fit']:.3f} +- "
            f"{b['t_star_fit_se']:.3f})")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"V = I, Q = K = I, beta = {beta:g}, Sigma_0 = diag({lam0:g}, {lam0 / 2:g}): "
                 f"blow-up at t* = 1 / (2 beta lambda_max(Sigma_0)) (n = {params['blowup_n']})",
                 fontsize=11)
    fig.tight_layout()
    return fig
