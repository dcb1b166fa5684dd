"""The retrieval profile with ALiBi from the mean-field solver: against the closed form of
*Kinetic theory for Transformers and the lost-in-the-middle phenomenon* (arXiv 2605.09213;
docs/science.md §11.1) and against attnflow's particles (docs/science.md §9).

The model: tokens on the circle, Q = K = V = I, causal mask, the positional weighting with
ALiBi (slope `slope` per unit label: the particles' ALiBi(m) per token at n tokens is slope
m n). Linearised about the uniform state, mode k of the last label s = 1 answers a unit
perturbation of label s with the kernel (sigma'(s) / sigma(1)) psi_{r_k t}(log(sigma(1) /
sigma(s))) (`attnflow.analysis.closedforms.alibi_memory`), the soft accuracy sums it over k = 1..20
with
the weights e^{-pi^2 k^2 / 128}.

* Solver against the closed form: from the uniform state plus a Gaussian bump g in s (width
  `width`, centre in `sources`) of amplitude `amplitude` in every mode k = 1..20 at once (the
  modes are independent to first order), the solver (`labels` Chebyshev labels, `modes`
  modes, step at Courant number 1.5) gives the last label's mode-k response; minus g(1) and
  divided by the bump's mass and the amplitude it is the closed form integrated against the
  bump (quadrature), summed with the weights. At the times `factors` x t_crit.
* Particles against the solver: n tokens, token i at s = i / n with its angle the quantile of
  the start (1 + 0.6 cos(theta - 3 s)) / (2 pi) at the level frac(i phi) (a low-discrepancy
  set), ALiBi(`p_slope` / n) per token, harmonic kernel, RK4 dt = 0.02 to `p_time`; the mean
  of e^{i k theta}, k = 1, 2, 3, over the tokens of s in (1/2, 1] against the solver's
  integral over the same labels at slope `p_slope` and, to show that the comparison can tell,
  at half of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.integrate import quad

from attnflow.analysis.closedforms import alibi_memory, recency_time, soft_weights
from attnflow.analysis.kinetic import SOFT_MODES
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.meanfield import from_coefficients, from_function, solve
from attnflow.meanfield.labels import label_nodes
from attnflow.simulate import simulate

PAPERS = ("2605.09213",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "alibiprofile"
TITLE = "The retrieval profile with ALiBi from the mean-field solver, the closed form and particles"
QUICK: dict[str, Any] = {
    "settings": [[1.0, 1.0]], "factors": [0.5, 1.0, 1.25], "sources": [0.3, 0.6, 0.9],
    "width": 0.08, "labels": 48, "modes": 32, "amplitude": 1e-9, "n": 1000, "p_beta": 1.0,
    "p_slope": 4.0, "p_time": 1.0, "p_labels": 48,
}
FULL: dict[str, Any] = {**QUICK, "settings": [[1.0, 1.0], [1.0, 3.0], [2.0, 1.0]],
                        "factors": [0.5, 0.75, 1.0, 1.25],
                        "sources": [0.15, 0.3, 0.45, 0.6, 0.75, 0.9], "labels": 64,
                        "n": 16000, "p_labels": 64}
FULL_MINUTES = 4  # estimated: 18 solver runs of 64 labels x 32 modes, 16000 particles to t = 1
COURANT = 1.5  # the solver's step: Courant number K |v|max dt (|v|max = e^beta)
P_MODES = 64  # the particle comparison's modes (its start's density is smooth)
WINDOW = 0.5  # the particle comparison averages the tokens of labels s in (WINDOW, 1]


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    settings = [(float(b), float(lam)) for b, lam in params["settings"]]
    results = []
    for i, (beta, lam) in enumerate(settings):
        results.append(_setting(params, beta, lam))
        progress(0.7 * (i + 1) / len(settings))
    particles = _particles(params)
    progress(1.0)
    claims = [_closed_claim(results), _particle_claim(particles, params)]
    figures = [save_figure(_figure(results, params), out, "alibiprofile.png")]
    numbers = {"settings": results, "particles": particles}
    notes = [f"Solver: {params['labels']} Chebyshev labels, {params['modes']} modes, every mode "
             f"k = 1..{SOFT_MODES} perturbed by {params['amplitude']:g} in a Gaussian bump of "
             f"width {params['width']:g} in s; step at Courant number {COURANT:g}. Particles: "
             f"n = {params['n']}, beta {params['p_beta']:g}, slope {params['p_slope']:g} per "
             f"unit label (ALiBi {params['p_slope']:g} / n per token), harmonic kernel, RK4 "
             "dt 0.02, low-discrepancy start; deterministic (the seed is not used)."]
    return Output(numbers, claims, figures, notes)


def _bump(s: Any, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((np.asarray(s) - centre) / width) ** 2)


def _setting(params, beta, lam) -> dict[str, Any]:
    """The soft accuracy of the last label for each bump source (T, B), solver and closed form."""
    t_crit = recency_time(beta, lam)
    times = [f * t_crit for f in params["factors"]]
    S, K, a, width = params["labels"], params["modes"], params["amplitude"], params["width"]
    s = label_nodes("chebyshev", S)
    model = Attention(beta=beta, mask="causal", attention="positional")
    w = soft_weights()
    k = np.arange(1, SOFT_MODES + 1)
    solver = np.zeros((len(times), len(params["sources"])))
    closed = np.zeros_like(solver)
    for b, centre in enumerate(params["sources"]):
        g = _bump(s, centre, width)
        mass = quad(lambda x, c=centre: float(_bump(x, c, width)), 0, 1, epsabs=1e-14)[0]
        c = np.zeros((S, K + 1), dtype=complex)
        c[:, 0] = 1 / (2 * np.pi)
        c[:, 1:SOFT_MODES + 1] = a * g[:, None]
        res = solve(model, from_coefficients(c), times[-1], save_at=times, scheme="chebyshev",
                    alibi=lam, dt=COURANT / (K * np.exp(beta)))
        last = res.coefficients[-len(times):, -1, 1:SOFT_MODES + 1].real / a  # (T, 20)
        solver[:, b] = ((last - g[-1]) / mass) @ w
        for i, t in enumerate(times):
            closed[i, b] = sum(wk * quad(lambda x, kk=kk, c=centre, t=t: float(
                alibi_memory(x, t, beta, lam, int(kk)) * _bump(x, c, width)), 0, 1,
                epsabs=1e-13, epsrel=1e-11, limit=200, points=[centre])[0]
                for kk, wk in zip(k, w)) / mass
    return {"beta": beta, "slope": lam, "t_crit": t_crit, "times": times,
            "sources": list(params["sources"]), "solver": solver, "closed": closed}


def _particles(params) -> dict[str, Any]:
    """The particles' and the solver's mean of e^{i k theta} over s in (1/2, 1]."""
    n, lam, beta, T, amp = params["n"], params["p_slope"], params["p_beta"], params["p_time"], 0.6
    f = lambda s, t: 1 + amp * np.cos(t - 3 * s)  # noqa: E731
    s = np.arange(1, n + 1) / n
    level = 2 * np.pi * np.mod(np.arange(1, n + 1) * (np.sqrt(5) - 1) / 2, 1.0)
    theta = level.copy()  # the quantile: Newton on theta + amp (sin(theta - 3s) + sin 3s)
    for _ in range(40):
        theta -= (theta + amp * np.sin(theta - 3 * s) + amp * np.sin(3 * s) - level) / f(s, theta)
    x0 = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    traj = simulate(Attention(beta=beta, mask="causal", attention="positional", alibi=lam / n,
                              backend="harmonic"), x0, T, save_at=[T], dt=0.02)
    z = traj.states[-1] @ np.array([1, 1j])
    ks = (1, 2, 3)
    measured = np.array([np.mean(z[s > WINDOW] ** k) for k in ks])
    u, wq = np.polynomial.legendre.leggauss(40)
    u, wq = (1 + WINDOW + (1 - WINDOW) * u) / 2, wq / 2
    rho0 = from_function(f, P_MODES, labels=params["p_labels"], scheme="chebyshev")
    model = Attention(beta=beta, mask="causal", attention="positional")

    def mean_field(slope):
        res = solve(model, rho0, T, save_at=[T], scheme="chebyshev", alibi=slope)
        c = res.at_labels(u)[-1]
        return np.array([2 * np.pi * np.sum(wq * np.conj(c[:, k])) for k in ks]), \
            res.resolution_lost_at

    right, lost = mean_field(lam)
    half, lost_half = mean_field(lam / 2)
    pairs = lambda z: np.stack([z.real, z.imag], axis=1)  # noqa: E731  (JSON: no complex)
    return {"n": n, "measured": pairs(measured), "solver": pairs(right),
            "solver_half_slope": pairs(half),
            "off": float(np.abs(measured - right).max() * np.sqrt(n)),
            "separation": float(np.abs(measured - half).max() * np.sqrt(n)),
            "resolution_lost_at": lost if lost is not None else lost_half}


def _closed_claim(results) -> Claim:
    rel = max(float(np.max(np.abs(r["solver"] - r["closed"]) / np.abs(r["closed"])))
              for r in results)
    def near_crit(r):  # the save time nearest t_crit
        return int(np.argmin(np.abs(np.asarray(r["times"]) / r["t_crit"] - 1)))

    per = "; ".join(
        f"beta {r['beta']:g}, slope {r['slope']:g} (t_crit {r['t_crit']:.3f}): largest "
        f"relative {np.max(np.abs(r['solver'] - r['closed']) / np.abs(r['closed'])):.1e}, at "
        f"t = {r['times'][near_crit(r)]:.3f} the source at s = {r['sources'][-1]:g}: solver "
        f"{r['solver'][near_crit(r), -1]:.6f}, closed form {r['closed'][near_crit(r), -1]:.6f}"
        for r in results)
    return claim("alibiprofile.closed", measured=per, values={"largest_relative": rel})


def _particle_claim(p, params) -> Claim:
    return claim(
        "alibiprofile.particles",
        measured=f"n = {p['n']}: largest |particles - solver| over k = 1, 2, 3 "
        f"{p['off'] / np.sqrt(p['n']):.2e} = {p['off']:.3f} / sqrt(n); from the solver at half "
        f"the slope {p['separation'] / np.sqrt(p['n']):.2e} = {p['separation']:.2f} / sqrt(n)"
        + ("" if p["resolution_lost_at"] is None else
           f" (the solver lost resolution at t = {p['resolution_lost_at']:.3f})"),
        values={"off": p["off"] if p["resolution_lost_at"] is None else float("nan"),
                "separation": p["separation"]})


def _figure(results, params) -> Figure:
    fig = Figure(figsize=(4.2 * len(results), 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    fine = np.linspace(0.01, 0.99, 300)
    for ax, r in zip(axes, results):
        for i, t in enumerate(r["times"]):
            color = f"C{i}"
            w = soft_weights()
            point = sum(wk * alibi_memory(fine, t, r["beta"], r["slope"], k)
                        for k, wk in enumerate(w, start=1))
            ax.plot(fine, point, ":", color=color, lw=0.8)
            ax.plot(r["sources"], r["closed"][i], "-", color=color, lw=1.0,
                    label=f"t = {t / r['t_crit']:g} t_crit: closed form (bumps)")
            ax.plot(r["sources"], r["solver"][i], "o", color=color, mfc="none", ms=5)
        ax.set(yscale="log", xlabel="centre of the source bump in s",
               title=f"beta = {r['beta']:g}, ALiBi slope {r['slope']:g} per unit label")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, title="solver: circles; point kernel: dotted", title_fontsize=7)
    axes[0].set_ylabel("soft accuracy of the last token")
    fig.tight_layout()
    return fig
