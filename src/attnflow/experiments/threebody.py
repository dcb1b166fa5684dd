"""Three tokens on the circle, beta of either sign (Polyanskiy, Rigollet, Yao, *Synchronization
of mean-field models on the circle*, arXiv 2507.22857; docs/science.md §11.3).

Full attention, Q = K = V = I, softmax and unnormalised weights.

* Rates: the equilateral triangle perturbed by eps (1, -1, 0) / sqrt(2) (a mode of zero sum),
  RK4 at `rate_dt` to T = min(`rate_t`, log(1e3) / |lambda|) (the perturbation changes by at
  most a factor 1e3: linear throughout), eps = 1e-6 where the closed form says it decays and
  1e-8 where it grows; the rate is the least-squares slope of log |gaps - 2 pi / 3| against
  t, held to `attnflow.analysis.closedforms.triangle_rates`. The betas include -2/3 -+ `rate_h`,
  where
  the closed form changes sign.
* Shares: `runs` iid uniform starts (the same for every beta and weighting), dopri5 to
  `t_end`, each final configuration classified (`attnflow.analysis.closedforms.three_token_state`,
  tol
  `tol` rad) as synchronised, triangle or other. t_end: the synchronised state attracts at
  rate 1 (softmax) or e^beta >= e^-2 (unnormalised, beta >= -2), the triangle below -2/3 at
  |lambda| >= 0.13 (beta <= -0.8), and a start 1e-3 from the unstable triangle leaves it
  within log(1e3) / lambda: 110 at beta = -0.6 (full grid; 400 leaves a factor e^-50 or
  less), 35 at beta = -0.5 (quick grid, down to -0.5 above -2/3; 150 leaves e^-20).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow._checks import fail
from attnflow.analysis.closedforms import three_token_state, triangle_rates, triangle_threshold
from attnflow.analysis.threebody import OTHER, SYNCHRONISED, TRIANGLE
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Z95, Claim, Output, Progress, save_figure, wilson
from attnflow.family import Attention
from attnflow.simulate import simulate

PAPERS = ("2507.22857",)
NAME = "threebody"
TITLE = "Three tokens on the circle, beta of either sign: the triangle and synchronisation"
WEIGHTINGS = ("softmax", "unnormalised")
PAPER_SYNC = -0.16  # the paper's bound: synchronisation for every beta >= -0.16
QUICK: dict[str, Any] = {
    "rate_betas": [-1.0, 0.0], "rate_h": 0.01, "rate_dt": 0.05, "rate_t": 10.0,
    "betas": [-0.1, -0.16, -0.5, -1.0, -2.0], "runs": 100, "t_end": 150.0,
    "tol": 1e-3, "paths_t": 30.0,
}
FULL: dict[str, Any] = {
    **QUICK, "rate_betas": [-2.0, -1.5, -1.0, -0.8, -0.5, -0.3, 0.0, 0.5, 1.0, 2.0],
    "rate_dt": 0.01, "rate_t": 20.0,
    "betas": [-0.1, -0.16, -0.3, -0.5, -0.6, -2 / 3, -0.8, -1.0, -2.0], "runs": 5000,
    "t_end": 400.0,
}
FULL_MINUTES = 4  # estimated: 18 batches of 5000 runs by dopri5 to t = 400 on 2 cores

_TRIANGLE = np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3])


def _tokens(theta: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def _angles(x: np.ndarray) -> np.ndarray:
    return np.arctan2(x[..., 1], x[..., 0])


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    h = float(params["rate_h"])
    c = triangle_threshold()
    betas = [float(b) for b in params["betas"]]
    if not (max(betas) >= PAPER_SYNC and min(betas) < c
            and any(c < b < PAPER_SYNC for b in betas)):
        raise fail("betas", "values in each band of the claims: >= -0.16, in (-2/3, -0.16) "
                   "and < -2/3", repr(betas))
    betas_r = sorted([*map(float, params["rate_betas"]), c - h, c + h])
    rates = []
    for w in WEIGHTINGS:
        rates.append([_measured_rate(b, w, params) for b in betas_r])
        progress(len(rates) / (2 * len(WEIGHTINGS)))
    rates = np.array(rates)  # (weightings, betas)
    theory = np.array([triangle_rates(betas_r, w) for w in WEIGHTINGS])

    rng = np.random.default_rng(seed)
    theta0 = rng.uniform(0.0, 2 * np.pi, (params["runs"], 3))
    states = np.zeros((len(WEIGHTINGS), len(betas), params["runs"]), dtype=int)
    for i, w in enumerate(WEIGHTINGS):
        for j, b in enumerate(betas):
            tr = simulate(Attention(beta=b, mask="full", attention=w), _tokens(theta0),
                          params["t_end"], save_at=[0.0, params["t_end"]], method="dopri5",
                          rtol=1e-8, atol=1e-10)
            states[i, j] = three_token_state(_angles(tr.states[-1]), params["tol"])
            progress(0.5 + 0.5 * (i * len(betas) + j + 1) / (len(WEIGHTINGS) * len(betas)))
    shares = _shares(states)
    claims = [_rate_claim(betas_r, rates, theory), _threshold_claim(betas_r, rates, c, h),
              *_share_claims(betas, states, shares, c)]
    figures = [save_figure(_rates_figure(betas_r, rates), out, "threebody_rates.png"),
               save_figure(_share_figure(betas, shares, c), out, "threebody_share.png"),
               save_figure(_paths_figure(theta0, states, betas, params), out,
                           "threebody_paths.png")]
    others = [f"{w} beta={b:.3g}: {int(np.sum(states[i, j] == OTHER))}"
              for i, w in enumerate(WEIGHTINGS) for j, b in enumerate(betas)
              if np.any(states[i, j] == OTHER)]
    notes = [f"Rates: RK4 dt = {params['rate_dt']:g} up to t = {params['rate_t']:g} from the "
             "triangle perturbed by 1e-6 (decaying) or 1e-8 (growing). Shares: "
             f"{params['runs']} iid uniform starts, dopri5 (rtol 1e-8) to t = "
             f"{params['t_end']:g}, tol {params['tol']:g} rad; runs neither synchronised nor at "
             "the triangle at t_end: " + (", ".join(others) or "none") + "."]
    numbers = {"rate_betas": betas_r, "rates_measured": rates, "rates_closed_form": theory,
               "betas": betas, "runs": params["runs"], **shares}
    return Output(numbers, claims, figures, notes)


def _measured_rate(beta: float, attention: str, params: dict[str, Any]) -> float:
    """The growth rate of a zero-sum perturbation of the triangle, measured by RK4."""
    lam = float(triangle_rates(beta, attention))
    t = min(params["rate_t"], np.log(1e3) / max(abs(lam), 1e-12))
    eps = 1e-8 if lam > 0 else 1e-6
    theta = _TRIANGLE + eps * np.array([1.0, -1.0, 0.0]) / np.sqrt(2)
    times = np.linspace(0.0, t, 41)
    tr = simulate(Attention(beta=beta, mask="full", attention=attention), _tokens(theta)[None],
                  t, save_at=times, method="rk4", dt=params["rate_dt"])
    x = tr.states[:, 0]  # (T, 3, 2)
    z = x[..., 0] + 1j * x[..., 1]
    gaps = np.angle(np.roll(z, -1, axis=-1) * np.conj(z)) % (2 * np.pi)  # theta_{i+1} - theta_i
    size = np.linalg.norm(gaps - 2 * np.pi / 3, axis=-1)
    return float(np.polyfit(times, np.log(size), 1)[0])


def _shares(states: np.ndarray) -> dict[str, Any]:
    """Per weighting and beta: the share synchronised (with its Wilson 95 % interval) and the
    share at the triangle (with its Wilson lower bound)."""
    runs = states.shape[-1]
    sync = np.sum(states == SYNCHRONISED, axis=-1)
    tri = np.sum(states == TRIANGLE, axis=-1)
    return {"synchronised": sync / runs, "triangle": tri / runs,
            "other": np.sum(states == OTHER, axis=-1) / runs,
            "synchronised_wilson": [[wilson(int(k), runs, Z95) for k in row] for row in sync],
            "triangle_wilson": [[wilson(int(k), runs, Z95) for k in row] for row in tri]}


def _rate_claim(betas, rates, theory) -> Claim:
    err = np.abs(rates - theory) / np.maximum(np.abs(theory), 0.01)
    return claim(
        "threebody.rates",
        measured="; ".join(f"{w}: " + ", ".join(f"beta={b:.3g}: {m:.6f} ({t:.6f})"
                                               for b, m, t in zip(betas, rates[i], theory[i]))
                           for i, w in enumerate(WEIGHTINGS)) + " (measured (closed form))",
        values={"largest_error": float(err.max())})


def _threshold_claim(betas, rates, c, h) -> Claim:
    below, above = betas.index(c - h), betas.index(c + h)
    flips = [bool(r[below] < 0 < r[above]) for r in rates]
    return claim(
        "threebody.threshold",
        measured="; ".join(f"{w}: lambda(-2/3 - {h:g}) = {r[below]:.3e}, lambda(-2/3 + {h:g}) "
                           f"= {r[above]:.3e}" for w, r in zip(WEIGHTINGS, rates)),
        values={"sign_change": float(np.mean(flips))})


def _share_claims(betas, states, shares, c) -> list[Claim]:
    b = np.array(betas)
    runs = states.shape[-1]
    sync = shares["synchronised"]

    def pooled(sel):
        k = int(np.sum(states[:, sel] == SYNCHRONISED))
        n = int(states[:, sel].size)
        return k / n, wilson(k, n, Z95), n

    def text(sel):
        return "; ".join(f"{w}: " + ", ".join(
            f"beta={bb:.3g}: {sync[i, j]:.4f} (triangle {shares['triangle'][i, j]:.4f})"
            for j, bb in enumerate(betas) if sel[j]) for i, w in enumerate(WEIGHTINGS))

    above, between, below = b >= PAPER_SYNC, (b > c) & (b < PAPER_SYNC), b < c
    share, (lo, _), n = pooled(above)
    out = [claim("threebody.sync_above", measured=f"{runs} runs per beta and weighting, "
                 f"synchronised share {text(above)}; pooled {share:.4f} of {n} (95 % Wilson "
                 f"lower bound {lo:.4f})", values={"share": share})]
    share, (lo, _), n = pooled(between)
    out.append(claim("threebody.between", measured=f"{runs} runs per beta and weighting, "
                     f"synchronised share {text(between)}; pooled {share:.4f} of {n} (95 % "
                     f"Wilson lower bound {lo:.4f})", values={"share": share}))
    tri_lo = [shares["triangle_wilson"][i][j][0] for i in range(len(WEIGHTINGS))
              for j in np.flatnonzero(below)]
    out.append(claim("threebody.nosync_below", measured=f"{runs} runs per beta and weighting, "
                     f"synchronised share {text(below)}",
                     values={"triangle_lower": float(min(tri_lo))}))
    return out


def _rates_figure(betas, rates) -> Figure:
    fig = Figure(figsize=(7.0, 4.5))
    ax = fig.subplots()
    fine = np.linspace(min(betas) - 0.1, max(betas) + 0.1, 400)
    for i, (w, style) in enumerate(zip(WEIGHTINGS, ("C0", "C1"))):
        ax.plot(fine, triangle_rates(fine, w), color=style, lw=1, label=f"{w}: closed form")
        ax.plot(betas, rates[i], "o", mfc="none", color=style, ms=7,
                label=f"{w}: measured (RK4)")
    ax.axhline(0.0, color="0.4", lw=0.8)
    ax.axvline(triangle_threshold(), color="0.5", ls="--", lw=1, label="beta = -2/3")
    ax.set(xlabel="beta", ylabel="rate lambda of a perturbation of the triangle",
           title="Three tokens: linear stability of the equilateral triangle",
           ylim=(max(-4.0, ax.get_ylim()[0]), None))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _share_figure(betas, shares, c) -> Figure:
    fig = Figure(figsize=(7.0, 4.5))
    ax = fig.subplots()
    for i, (w, m, dx) in enumerate(zip(WEIGHTINGS, ("o", "s"), (-0.01, 0.01))):
        lo, hi = np.array(shares["synchronised_wilson"][i]).T
        s = shares["synchronised"][i]
        err = np.maximum(0.0, [s - lo, hi - s])  # Wilson's ends round past s at 0 and 1
        ax.errorbar(np.array(betas) + dx, s, yerr=err, fmt=m, mfc="none",
                    capsize=3, label=f"{w} (95 % Wilson)")
    ax.axvline(PAPER_SYNC, color="C2", ls="--", lw=1, label="-0.16: synchronisation proved above")
    ax.axvline(c, color="C3", ls="--", lw=1, label="-2/3: not every start synchronises below")
    ax.set(xlabel="beta", ylabel="share of iid uniform starts synchronising",
           title="Three tokens: share synchronising against beta")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _paths_figure(theta0, states, betas, params) -> Figure:
    """Softmax paths in polar form (radius 0.4 + 0.6 log(1 + t) / log(1 + T)): at the lowest
    beta one start that synchronises and one that ends at the triangle, and that second start
    at beta = -0.5 (above the threshold), where it synchronises."""
    low = int(np.argmin(betas))
    tri = np.flatnonzero(states[0, low] == TRIANGLE)
    syn = np.flatnonzero(states[0, low] == SYNCHRONISED)
    picks = [(betas[low], syn[0] if syn.size else 0), (betas[low], tri[0] if tri.size else 0),
             (-0.5, tri[0] if tri.size else 0)]
    fig = Figure(figsize=(9.0, 3.4))
    axes = fig.subplots(1, 3, subplot_kw={"aspect": "equal"})
    times = np.linspace(0.0, params["paths_t"], 301)
    circle = np.linspace(0.0, 2 * np.pi, 200)
    for ax, (b, k) in zip(axes, picks):
        tr = simulate(Attention(beta=b, mask="full"), _tokens(theta0[k])[None],
                      params["paths_t"], save_at=times, method="dopri5", rtol=1e-8, atol=1e-10)
        th = np.unwrap(_angles(tr.states[:, 0]), axis=0)  # (T, 3)
        r = 0.4 + 0.6 * np.log1p(times) / np.log1p(times[-1])
        for radius in (0.4, 1.0):
            ax.plot(radius * np.cos(circle), radius * np.sin(circle), color="0.8", lw=0.8)
        for i in range(3):
            ax.plot(r * np.cos(th[:, i]), r * np.sin(th[:, i]), lw=1.2, color=f"C{i}")
            ax.plot(np.cos(th[-1, i]), np.sin(th[-1, i]), "o", color=f"C{i}")
            ax.plot(0.4 * np.cos(th[0, i]), 0.4 * np.sin(th[0, i]), "o", mfc="none", ms=4,
                    color=f"C{i}")
        ax.set_title(f"softmax, beta = {b:.3g}", fontsize=9)
        ax.set(xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), xticks=[], yticks=[])
    fig.suptitle(f"Paths of three tokens to t = {params['paths_t']:g} (radius 0.4 at t = 0 "
                 "to 1 at the end, growing like log(1 + t))", fontsize=10)
    fig.tight_layout()
    return fig
