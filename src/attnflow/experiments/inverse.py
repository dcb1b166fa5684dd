"""Recovering beta Q^T K and V from a noisy trajectory by gradient descent on the misfit
(docs/science.md §11.8; "what gradients make possible").

The truth: causal attention on S^2 (d = 3), B = beta Q^T K with beta = 2 and Q^T K = A, A the
matrix `A_RAW` scaled to |A|_F = sqrt(3) (the identity's norm: the convention that separates
beta from Q^T K, `attnflow.fit.split`), and V = `V_TRUE` (non-symmetric, a rotation part).
Tokens x0: n iid uniform on S^2, known exactly; the n tokens of a smaller run are the first
n of a larger one (the causal mask makes their paths the same). Observed: the tokens at m
save times t_i = i T / m, i = 1..m (T = 2), plus independent N(0, sigma^2) noise in each of
the three coordinates, not projected back to the sphere. RK4 with dt = 0.05 for the data
and for every fit (so the truth is an exact zero of the noiseless misfit).

The fit (`attnflow.fit.fit`): the full-trajectory misfit, which is the maximum-likelihood
estimate for this noise (multiple shooting would restart pieces from noisy states: an
errors-in-variables bias), minimised over the identifiable (B, V) by Levenberg-Marquardt
with the Jacobian from forward-mode autograd through `simulate`, damped in the Fisher
metric at its start (`attnflow.fit.fisher`), until the Gauss-Newton step is below 0.01
standard errors. Noisy fits start at the truth (they measure the estimator's sampling
error, not the optimiser's basin); the noiseless fit starts `start_offset` (relative, a
random direction) away from it, refitting from where it stopped while not converged, at
most `rounds` times.

Sweeps around the base point (sigma0, n0, m0): sigma, n and m one at a time, `seeds` starts,
`draws` noise draws per point. Each point's RMS error is set beside the Cramér-Rao bound
sigma sqrt(tr F^-1) of the same start (F = J^T J, central differences of the numpy engine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.experiments._ledger import claim, without_torch
from attnflow.experiments._recipe import Claim, Output, Progress, mean_se, save_figure
from attnflow.fit import fisher, fit, observe, split, states
from attnflow.sphere import uniform

PAPERS = ("2411.04990",)
CLAIMS = ("inverse.noiseless", "inverse.sigma_slope", "inverse.n_slope", "inverse.m_slope",
          "inverse.efficiency")
NAME = "inverse"
TITLE = "Recovering beta Q^T K and V from a noisy trajectory: error against noise, n and m"
QUICK: dict[str, Any] = {
    "sigma0": 1e-3, "n0": 16, "m0": 10, "sigmas": [1e-3, 1e-2], "ns": [8, 16], "ms": [5, 10],
    "seeds": 2, "draws": 1, "noiseless_n": 16, "noiseless_m": 10, "start_offset": 0.3,
    "rounds": 3,
}
FULL: dict[str, Any] = {**QUICK, "sigmas": [1e-4, 1e-3, 1e-2], "ns": [8, 16, 32, 64, 128],
                        "ms": [5, 10, 20, 40], "seeds": 8, "draws": 2}
FULL_MINUTES = 9  # measured: 491 s of CPU (968 s wall at load 5-18), 160 fits

D, BETA, T_END, DT = 3, 2.0, 2.0, 0.05
A_RAW = np.array([[1.0, 0.4, 0.0], [-0.3, 0.8, 0.5], [0.2, 0.0, 1.2]])
A_TRUE = A_RAW * np.sqrt(D) / np.linalg.norm(A_RAW)
V_TRUE = np.array([[1.0, -0.5, 0.2], [0.5, 0.7, 0.0], [0.0, 0.3, 1.1]])
B_TRUE = BETA * A_TRUE
THETA = np.concatenate([B_TRUE.ravel(), V_TRUE.ravel()])


def times_of(m: int) -> np.ndarray:
    """The m save times i T / m, i = 1..m."""
    return T_END * np.arange(1, m + 1) / m


def errors(B: np.ndarray, V: np.ndarray) -> dict[str, float]:
    """Relative errors of theta = (B, V), B, beta, A = Q^T K (|A|_F = sqrt(d)) and V."""
    beta, A = split(B)
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
    return {"theta": rel(np.concatenate([B.ravel(), V.ravel()]), THETA), "B": rel(B, B_TRUE),
            "beta": abs(beta - BETA) / BETA, "A": rel(A, A_TRUE), "V": rel(V, V_TRUE)}


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    if (skipped := without_torch(CLAIMS)) is not None:
        return skipped
    noiseless = _noiseless(params, seed)
    progress(0.1)
    sweeps = {"sigma": [], "n": [], "m": []}
    seeds = np.random.SeedSequence([seed, 41]).spawn(params["seeds"])
    for s, ss in enumerate(seeds):
        one = _seed(params, ss)
        for axis in sweeps:
            sweeps[axis].append(one[axis])
        progress(0.1 + 0.9 * (s + 1) / len(seeds))
    slopes = {axis: _slopes(rows) for axis, rows in sweeps.items()}
    ratios = [r["ratio"] for one in _unique(sweeps) for r in one]
    claims = [_noiseless_claim(noiseless), *(_slope_claim(a, slopes[a], params)
                                             for a in ("sigma", "n", "m")),
              _efficiency_claim(ratios)]
    figures = [save_figure(_figure(sweeps, slopes), out, "inverse.png")]
    numbers = {"noiseless": noiseless, "slopes": slopes, "sweeps": sweeps,
               "truth": {"beta": BETA, "A": A_TRUE, "V": V_TRUE}}
    notes = [f"Truth: causal attention on S^2, beta = {BETA:g}, Q^T K = A (|A|_F = sqrt 3), "
             f"V non-symmetric (docstring); T = {T_END:g}, RK4 dt = {DT:g} for data and fits; "
             "noise N(0, sigma^2) per coordinate, not projected; x0 known. Fit: "
             "Levenberg-Marquardt on the full-trajectory misfit over (B = beta Q^T K, V), "
             "damped in the Fisher metric; noisy fits start at the truth. Base point sigma0 = "
             f"{params['sigma0']:g}, n0 = {params['n0']}, m0 = {params['m0']}; "
             f"{params['seeds']} seeds x {params['draws']} noise draws per point."]
    return Output(numbers, claims, figures, notes)


def _noiseless(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Fit the exact states from a start `start_offset` away (relative, random direction)."""
    rng = np.random.default_rng([seed, 410])
    x0 = uniform((params["noiseless_n"],), D, seed=rng)
    times = times_of(params["noiseless_m"])
    exact = np.asarray(states(B_TRUE, V_TRUE, x0, times, DT))
    direction = rng.standard_normal(THETA.size)
    theta = THETA + params["start_offset"] * np.linalg.norm(THETA) * direction / np.linalg.norm(
        direction)
    start_errors = errors(*_BV(theta))
    evaluations, jacobians, rounds, converged = 0, 0, 0, False
    while not converged and rounds < params["rounds"]:  # refit from where it stopped
        B, V = _BV(theta)
        result = fit(x0, times, exact, (B, V), DT, metric=fisher(B, V, x0, times, dt=DT))
        theta = np.concatenate([result.B.ravel(), result.V.ravel()])
        evaluations, jacobians = evaluations + result.evaluations, jacobians + result.jacobians
        rounds, converged = rounds + 1, result.converged
    return {"start": start_errors, "errors": errors(result.B, result.V),
            "misfit": result.misfit, "evaluations": evaluations, "jacobians": jacobians,
            "rounds": rounds,
            "converged": result.converged, "n": params["noiseless_n"],
            "m": params["noiseless_m"]}


def _BV(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return theta[:D * D].reshape(D, D), theta[D * D:].reshape(D, D)


def _seed(params: dict[str, Any], ss: np.random.SeedSequence) -> dict[str, list]:
    """One start's sweeps: per point the RMS errors over the draws and the Cramér-Rao bound."""
    rng = np.random.default_rng(ss)
    n_max = max(max(params["ns"]), params["n0"])
    tokens = uniform((n_max,), D, seed=rng)
    cache: dict[tuple[float, int, int], dict[str, Any]] = {}

    def point(sigma: float, n: int, m: int) -> dict[str, Any]:
        key = (sigma, n, m)
        if key not in cache:
            x0, times = tokens[:n], times_of(m)
            exact = np.asarray(states(B_TRUE, V_TRUE, x0, times, DT))
            F = fisher(B_TRUE, V_TRUE, x0, times, dt=DT)
            bound = float(sigma * np.sqrt(np.trace(np.linalg.inv(F))))
            fits = [fit(x0, times, observe(exact, sigma, rng), (B_TRUE, V_TRUE), DT, metric=F)
                    for _ in range(params["draws"])]
            errs = [errors(f.B, f.V) for f in fits]
            sq = np.mean([(e["theta"] * np.linalg.norm(THETA)) ** 2 for e in errs])
            cache[key] = {
                "sigma": sigma, "n": n, "m": m,
                **{k: float(np.sqrt(np.mean([e[k] ** 2 for e in errs]))) for k in errs[0]},
                "bound": bound / float(np.linalg.norm(THETA)),  # relative, as "theta"
                "ratio": float(sq / bound**2), "evaluations": [f.evaluations for f in fits],
                "converged": all(f.converged for f in fits)}
        return cache[key]

    s0, n0, m0 = params["sigma0"], params["n0"], params["m0"]
    return {"sigma": [point(float(s), n0, m0) for s in params["sigmas"]],
            "n": [point(s0, int(n), m0) for n in params["ns"]],
            "m": [point(s0, n0, int(m)) for m in params["ms"]]}


def _slopes(rows: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per seed, the log-log slope of the RMS error and of the bound against the swept
    variable; their means and standard errors over seeds, and of the paired difference."""
    axis = next(k for k in ("sigma", "n", "m") if len({r[k] for r in rows[0]}) > 1)
    x = np.log([r[axis] for r in rows[0]])
    fit_slope = lambda y: float(np.polyfit(x, np.log(y), 1)[0])  # noqa: E731
    measured = [fit_slope([r["theta"] for r in one]) for one in rows]
    bound = [fit_slope([r["bound"] for r in one]) for one in rows]
    (s, se), (b, b_se) = mean_se(measured), mean_se(bound)
    diff, diff_se = mean_se(np.subtract(measured, bound))
    return {"axis": axis, "values": [r[axis] for r in rows[0]], "slope": s, "se": se,
            "fisher_slope": b, "fisher_se": b_se, "difference": diff, "difference_se": diff_se,
            "per_seed": measured, "fisher_per_seed": bound}


def _unique(sweeps: dict[str, list]) -> list[list[dict[str, Any]]]:
    """Per seed, its distinct points (the base point is in every sweep)."""
    out = []
    for s in range(len(sweeps["sigma"])):
        points = {(r["sigma"], r["n"], r["m"]): r for rows in sweeps.values() for r in rows[s]}
        out.append(list(points.values()))
    return out


def _noiseless_claim(r: dict[str, Any]) -> Claim:
    e = r["errors"]
    return claim("inverse.noiseless",
                 measured=f"n = {r['n']}, m = {r['m']}, from {r['start']['theta']:.2f} "
                 f"(relative) away: theta {e['theta']:.1e}, beta {e['beta']:.1e}, "
                 f"Q^T K {e['A']:.1e}, V {e['V']:.1e} after {r['evaluations']} misfit "
                 f"evaluations and {r['jacobians']} Jacobians in {r['rounds']} round(s), "
                 f"misfit {r['misfit']:.1e}",
                 values={"largest_relative": max(e.values())})


AXIS_TEXT = {"sigma": "the noise sigma", "n": "the number of tokens n",
             "m": "the number of saved times m"}
ASYMPTOTIC = {"sigma": 1.0, "n": -0.5, "m": -0.5}


def _slope_claim(axis: str, s: dict[str, Any], params: dict[str, Any]) -> Claim:
    if axis == "sigma":
        z = abs(s["slope"] - 1.0) / s["se"]
        against = "the predicted slope 1"
    else:
        z = abs(s["difference"]) / s["difference_se"]
        against = (f"the Fisher slope {s['fisher_slope']:.3f} +- {s['fisher_se']:.3f} "
                   f"(paired difference {s['difference']:+.3f} +- {s['difference_se']:.3f}); "
                   f"asymptotically {ASYMPTOTIC[axis]:g}")
    return claim(f"inverse.{axis}_slope",
                 measured=f"{AXIS_TEXT[axis]} over {s['values']}: slope {s['slope']:.3f} +- "
                 f"{s['se']:.3f} (standard error over {len(s['per_seed'])} seeds) against "
                 f"{against}",
                 values={"z": z, "se": s["se"], "slope": s["slope"],
                         "fisher_slope": s["fisher_slope"]})


def _efficiency_claim(ratios: list[float]) -> Claim:
    mean, se = mean_se(ratios)
    return claim("inverse.efficiency",
                 measured=f"mean of |theta_hat - theta|^2 / (sigma^2 tr F^-1) over "
                 f"{len(ratios)} points (each the mean over its draws): {mean:.3f} +- {se:.3f}",
                 values={"ratio": mean, "z": abs(mean - 1) / se})


def _figure(sweeps: dict[str, list], slopes: dict[str, dict]) -> Figure:
    fig = Figure(figsize=(13, 4.2))
    axes = fig.subplots(1, 3)
    for ax, axis in zip(axes, ("sigma", "n", "m")):
        rows, s = sweeps[axis], slopes[axis]
        x = np.asarray(s["values"], dtype=float)
        for key, style, label in (("theta", "o-", "theta = (B, V)"), ("beta", "s--", "beta"),
                                  ("A", "^--", "Q^T K"), ("V", "v--", "V")):
            y = np.sqrt(np.mean([[r[key] ** 2 for r in one] for one in rows], axis=0))
            ax.plot(x, y, style, ms=4, lw=1 if key != "theta" else 1.8, label=label,
                    alpha=1 if key == "theta" else 0.6)
        bound = np.sqrt(np.mean([[r["bound"] ** 2 for r in one] for one in rows], axis=0))
        ax.plot(x, bound, "k:", lw=1.5, label="Cramér-Rao bound (Fisher)")
        ref = bound[0] * (x / x[0]) ** ASYMPTOTIC[axis]
        ax.plot(x, ref, color="0.6", lw=3, alpha=0.4,
                label=f"slope {ASYMPTOTIC[axis]:g} (asymptotic)")
        ax.set(xscale="log", yscale="log", xlabel={"sigma": "noise sigma", "n": "tokens n",
                                                    "m": "saved times m"}[axis],
               title=f"slope {s['slope']:.2f} +- {s['se']:.2f} (Fisher {s['fisher_slope']:.2f})")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("relative error (RMS over seeds and draws)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig
