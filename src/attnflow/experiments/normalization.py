"""Normalisation schemes: how fast tokens collapse under post-, pre-, peri-LN and nGPT
(*Normalization in Attention Dynamics*, docs/science.md §6).

* Equiangular starts (n tokens with common inner product rho_0, full attention,
  Q = K = V = I): the common inner product rho(t) of the directions obeys the equiangular ODE
  (`equiangular_rhs`), and 1 - rho(t) decays exponentially with rate 2 under post-LN and like
  1/t^2 under pre-LN (the radius grows linearly and slows the angular motion). The same ODE
  gives (derived here) 1/t^2 for peri-LN (dr/dt -> 1) and rate 2 alpha for nGPT (speed
  factor |A| / alpha -> 1 / alpha). Measured: rho(t) by the engine (dopri5, tight
  tolerances) against the ODE by scipy, and the decay law fitted on the window
  `fit_window` of 1 - rho: exponential (log(1 - rho) linear in t) or power (linear in log t),
  whichever fits better, with its rate or exponent.
* Random starts (uniform on S^{d-1}), full attention: the single-linkage cluster count of
  the directions at t_end under each scheme, with Q = K = V = I and with random query/key
  heads as in the first author's simulator defaults (d = 16, n = 64, several heads,
  Q^T K = G1 G2 / sqrt(d) with standard Gaussian G1, G2 per head, V = I; here the heads are
  averaged). At a larger beta the clusters are meta-stable, and pre-LN's growing radius slows
  their formation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.integrate import solve_ivp

from attnflow.analysis.closedforms import equiangular_rhs, equiangular_start
from attnflow.analysis.clusters import cluster_count, default_cluster_tol
from attnflow.analysis.family import NORMS
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform

PAPERS = ("2510.22026",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "normalization"
TITLE = "Normalisation schemes: collapse rates of post-, pre-, peri-LN and nGPT"
QUICK: dict[str, Any] = {
    "n": 5, "d": 8, "rho0": 0.0, "beta": 1.0, "alpha": 0.2,
    "t_end": {"post": 20.0, "pre": 1e5, "peri": 1e5, "ngpt": 80.0}, "rtol": 1e-10,
    "fit_window": [1e-10, 1e-3],
    "random_d": 16, "random_n": 64, "random_runs": 4, "heads": 4, "random_beta": 1.0,
    "random_t_end": 40.0, "random_dt": 0.2,
    "slow_beta": 9.0, "slow_t_end": 50.0, "slow_norms": ["post", "pre"],
}
FULL: dict[str, Any] = {**QUICK, "random_runs": 16, "slow_t_end": 100.0,
                        "slow_norms": list(NORMS)}
FULL_MINUTES = 3  # measured: 2.4 min of CPU time (shared machine)

# The decay laws the equiangular ODE gives near rho = 1 (module docstring).
EXPECTED = {"post": ("exponential", 2.0), "pre": ("power", 2.0), "peri": ("power", 2.0),
            "ngpt": ("exponential", None)}  # nGPT: rate 2 alpha


def fit_decay(times: np.ndarray, gap: np.ndarray, window: tuple[float, float]
              ) -> dict[str, Any]:
    """Fit gap = 1 - rho on the saves with window[0] < gap < window[1] (and t > 0) by
    log gap = a - r t (exponential) and log gap = a - p log t (power); the better fit (smaller
    residual sum of squares) is the law. Returns law, rate (r or p) and both residuals."""
    keep = (gap > window[0]) & (gap < window[1]) & (times > 0)
    t, y = times[keep], np.log(gap[keep])
    if t.size < 3:
        return {"law": "none", "rate": float("nan"), "points": int(t.size)}
    fits = {}
    for law, x in (("exponential", t), ("power", np.log(t))):
        coef, res, *_ = np.polyfit(x, y, 1, full=True)
        fits[law] = (-float(coef[0]), float(res[0]) if res.size else 0.0)
    law = min(fits, key=lambda k: fits[k][1])
    return {"law": law, "rate": fits[law][0], "points": int(t.size),
            "residual_exponential": fits["exponential"][1], "residual_power": fits["power"][1]}


def _equiangular(params, norm) -> dict[str, Any]:
    n, beta, alpha, rho0 = params["n"], params["beta"], params["alpha"], params["rho0"]
    t_end = float(params["t_end"][norm])
    times = np.unique(np.concatenate([np.linspace(0.0, t_end, 201),
                                      np.geomspace(1e-2, t_end, 201)]))
    model = Attention(beta=beta, mask="full", norm=norm, alpha=alpha)
    traj = simulate(model, equiangular_start(n, params["d"], rho0), t_end, save_at=times,
                    method="dopri5", rtol=params["rtol"], atol=params["rtol"] * 1e-3)
    theta = traj.directions
    rho = (theta[:, 0] * theta[:, 1]).sum(axis=-1)
    ode = solve_ivp(lambda t, y: np.array(equiangular_rhs(y[0], beta, n, norm=norm, r=y[1],
                                                          alpha=alpha)),
                    (0.0, t_end), [rho0, 1.0], t_eval=times, method="DOP853", rtol=1e-12,
                    atol=1e-15)
    gap, gap_ode = 1.0 - rho, 1.0 - ode.y[0]
    err = float(np.max(np.abs(gap - gap_ode)))  # = max |rho - rho_ode|
    law, rate = EXPECTED[norm]
    return {"norm": norm, "times": times, "gap": gap, "gap_ode": gap_ode, "ode_error": err,
            "fit": fit_decay(times, gap, params["fit_window"]), "expected_law": law,
            "expected_rate": 2 * alpha if rate is None else rate}


def _random_heads(d: int, heads: int, rng: np.random.Generator) -> list[tuple]:
    """Heads with Q^T K = G1 G2 / sqrt(d) (Gaussian G1, G2) and V = I."""
    out = []
    for _ in range(heads):
        G1, G2 = rng.standard_normal((d, d)), rng.standard_normal((d, d))
        out.append((G1.T / d**0.25, G2 / d**0.25, None))
    return out


def _clusters(params, x0, beta, t_end, norms, weights) -> dict[str, Any]:
    times = np.linspace(0.0, t_end, 11)
    out = {}
    for norm in norms:
        kw = {} if weights is None else {"heads": weights, "combine": "mean"}
        model = Attention(beta=beta, mask="full", norm=norm, alpha=params["alpha"], **kw)
        traj = simulate(model, x0, t_end, save_at=times, method="rk4", dt=params["random_dt"])
        out[norm] = cluster_count(traj.directions, default_cluster_tol(beta))  # (T, runs)
    return {"times": times, "counts": out}


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    equi = []
    for i, norm in enumerate(NORMS):
        equi.append(_equiangular(params, norm))
        progress(0.3 * (i + 1) / len(NORMS))
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    d, n = params["random_d"], params["random_n"]
    x0 = uniform((params["random_runs"], n), d, rng)
    weights = {"identity": None, "random": _random_heads(d, params["heads"], rng)}
    random = {}
    for i, (name, w) in enumerate(weights.items()):
        random[name] = _clusters(params, x0, params["random_beta"], params["random_t_end"],
                                 NORMS, w)
        progress(0.3 + 0.25 * (i + 1))
    slow = _clusters(params, x0, params["slow_beta"], params["slow_t_end"],
                     params["slow_norms"], None)
    progress(1.0)
    claims = [_law_claim(equi, "post", params), _law_claim(equi, "pre", params),
              _others_claim(equi, params), _one_cluster_claim(random, params),
              _slow_claim(slow, params)]
    figures = [save_figure(_figure(equi, random, slow, params), out, "normalization.png")]
    numbers = {"equiangular": equi, "random": random, "slow": slow}
    notes = [f"Equiangular: n = {params['n']}, d = {params['d']}, rho0 = {params['rho0']:g}, "
             f"beta = {params['beta']:g}, nGPT alpha = {params['alpha']:g}, dopri5 rtol "
             f"{params['rtol']:g}; fits on 1 - rho in {params['fit_window']}. Random starts: "
             f"d = {d}, n = {n}, {params['random_runs']} runs, RK4 dt = {params['random_dt']:g};"
             f" random weights: {params['heads']} heads averaged, Q^T K = G1 G2 / sqrt(d), "
             "V = I; clusters by single linkage at beta^-1/2 / 4 on the directions.",
             "ODE agreement (max |rho - rho_ODE|): " + ", ".join(
                 f"{e['norm']}: {e['ode_error']:.1e}" for e in equi)]
    return Output(numbers, claims, figures, notes)


def _law_values(rows) -> dict[str, float]:
    """The measures of the decay-law claims over equiangular results `rows`: how many fit the
    wrong law, the largest relative error of the rate, the largest distance to the ODE."""
    return {"wrong_law": sum(e["fit"]["law"] != e["expected_law"] for e in rows),
            "rate_off": max(abs(e["fit"]["rate"] / e["expected_rate"] - 1.0) for e in rows),
            "ode_error": max(e["ode_error"] for e in rows)}


def _describe(e) -> str:
    unit = "rate" if e["fit"]["law"] == "exponential" else "exponent"
    return (f"{e['norm']}: {e['fit']['law']}, {unit} {e['fit']['rate']:.4f} "
            f"(max |rho - rho_ODE| {e['ode_error']:.1e})")


def _law_claim(equi, norm, params) -> Claim:
    e = next(x for x in equi if x["norm"] == norm)
    return claim(f"normalization.{norm}", measured=_describe(e), values=_law_values([e]))


def _others_claim(equi, params) -> Claim:
    rows = [e for e in equi if e["norm"] in ("peri", "ngpt")]
    return claim(
        "normalization.others",
        measured="; ".join(_describe(e) for e in rows) + f" (2 alpha = {2 * params['alpha']:g})",
        values=_law_values(rows))


def _one_cluster_claim(random, params) -> Claim:
    final = {(w, s): c[-1] for w, r in random.items() for s, c in r["counts"].items()}
    single = {w: float(np.mean([np.mean(c == 1) for (v, _), c in final.items() if v == w]))
              for w in random}
    return claim(
        "normalization.one_cluster",
        measured=f"runs in one cluster at t = {params['random_t_end']:g} (beta = "
        f"{params['random_beta']:g}): " + "; ".join(
            f"{w} {s}: {int(np.sum(c == 1))}/{c.size}" + (f" (max {int(c.max())})"
                                                          if c.max() > 1 else "")
            for (w, s), c in final.items()),
        values={"single_share": float(np.mean([np.mean(c == 1) for c in final.values()])),
                "single_share_identity": single.get("identity", float("nan"))})


def _slow_claim(slow, params) -> Claim:
    med = {s: float(np.median(c[-1])) for s, c in slow["counts"].items()}
    return claim(
        "normalization.slow",
        measured=f"median clusters at t = {params['slow_t_end']:g}, beta = "
        f"{params['slow_beta']:g} (identity weights): " + ", ".join(
            f"{s}: {m:g}" for s, m in med.items()),
        values={"pre_minus_post": med.get("pre", float("nan")) - med.get("post", float("nan"))})


def _figure(equi, random, slow, params) -> Figure:
    fig = Figure(figsize=(14.0, 4.2))
    ax, bx, cx = fig.subplots(1, 3)
    for e in equi:
        keep = e["times"] > 0
        line, = ax.plot(e["times"][keep], e["gap"][keep], label=e["norm"])
        ax.plot(e["times"][keep], e["gap_ode"][keep], ":", color=line.get_color())
        bx.plot(e["times"][keep], e["gap"][keep], color=line.get_color(), label=e["norm"])
    ax.set(xscale="linear", yscale="log", xlim=(0, 80), ylim=(1e-16, 2),
           xlabel="t", ylabel="1 - rho", title="equiangular: exponential laws (dotted: ODE)")
    bx.set(xscale="log", yscale="log", ylim=(1e-16, 2), xlabel="t", ylabel="1 - rho",
           title="power laws (pre, peri: 1/t^2)")
    fine = np.geomspace(10, 1e5, 20)
    bx.plot(fine, 3e1 / fine**2, "k--", lw=1, label="~ 1/t^2")
    for axis in (ax, bx):
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3, which="both")
    for s, c in slow["counts"].items():
        cx.plot(slow["times"], np.median(c, axis=1), "o-", label=f"{s} (beta = "
                f"{params['slow_beta']:g})")
    for s, c in random["identity"]["counts"].items():
        cx.plot(random["identity"]["times"], np.median(c, axis=1), ":", label=f"{s} (beta = "
                f"{params['random_beta']:g})")
    cx.set(yscale="log", xlabel="t", ylabel="clusters (median)",
           title=f"random starts, d = {params['random_d']}, n = {params['random_n']}")
    cx.legend(fontsize=7)
    cx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
