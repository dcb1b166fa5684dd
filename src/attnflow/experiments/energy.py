"""The interaction energy along trajectories: a Lyapunov function of full attention, not of
causal attention (docs/science.md §6; the paper's "no gradient flow" made visible).

E_beta(X) = (1 / (2 beta n^2)) sum_{i,j} exp(beta <x_i, x_j>) (`energy`, Q = K = V = I).
Unnormalised full attention is its gradient ascent on the sphere and softmax full attention
its gradient ascent in another metric, so E_beta never decreases along their trajectories.
The causal mask breaks the symmetry of the interaction: E_beta can decrease.

Measured: from random starts (uniform on S^{d-1}), the smallest increment of log E_beta
between saves along full-attention trajectories (softmax and unnormalised), against the
integration error (unnormalised attention, whose weights sum to up to e^beta, over
t_end e^{-beta} in steps of dt e^{-beta}); along causal trajectories from the same starts, the
share of runs in which log E_beta falls by more than `drop_tol` at some time, and the largest
relative fall below the running maximum. The run with the largest fall is plotted beside full
attention from the same start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import norm

from attnflow.analysis.energy import log_energy
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure, wilson
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform

PAPERS = ("2312.10794", "2512.01868")  # arXiv ids of the papers whose claims this recipe checks
NAME = "energy"
TITLE = "The interaction energy: non-decreasing under full attention, not under causal masks"
QUICK: dict[str, Any] = {"settings": [[2, 6], [2, 16], [3, 16]], "betas": [1.0, 4.0, 9.0],
                         "runs": 32, "t_end": 10.0, "dt": 0.02, "n_saves": 101,
                         "drop_tol": 1e-6}
FULL: dict[str, Any] = {**QUICK, "settings": [[2, 6], [2, 16], [2, 32], [3, 16], [3, 32]],
                        "runs": 128}
FULL_MINUTES = 3  # measured: 2.5 min of CPU time (shared machine)

ATTENTIONS = ("softmax", "unnormalised")


def running_fall(log_e: np.ndarray) -> np.ndarray:
    """Largest relative fall of E below its running maximum, per run: 1 - E / max_{s<=t} E
    maximised over t, from log E of shape (T, ...); 0 for a non-decreasing E."""
    return 1.0 - np.exp(np.min(log_e - np.maximum.accumulate(log_e, axis=0), axis=0))


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    jobs = [(int(d), int(n), float(beta)) for d, n in params["settings"]
            for beta in params["betas"]]
    streams = np.random.SeedSequence(seed).spawn(len(jobs))
    times = np.linspace(0.0, params["t_end"], params["n_saves"])
    rows, worst = [], None
    for j, ((d, n, beta), stream) in enumerate(zip(jobs, streams)):
        x0 = uniform((params["runs"], n), d, np.random.default_rng(stream))
        row: dict[str, Any] = {"d": d, "n": n, "beta": beta}
        for attention in ATTENTIONS:
            # Unnormalised weights sum to up to e^beta: its clock runs e^beta times faster.
            unit = 1.0 if attention == "softmax" else float(np.exp(-beta))
            for mask in ("full", "causal"):
                traj = simulate(Attention(beta=beta, mask=mask, attention=attention), x0,
                                params["t_end"] * unit, save_at=times * unit, method="rk4",
                                dt=params["dt"] * unit)
                log_e = log_energy(traj.states, beta)  # (T, runs)
                step = np.diff(log_e, axis=0)
                fall = running_fall(log_e)
                key = f"{mask}_{attention}"
                row[key] = {"min_step": float(step.min()),
                            "share_falling": float(np.mean(step.min(axis=0) < -params[
                                "drop_tol"])),
                            "max_fall": float(fall.max())}
                if mask == "causal" and attention == "softmax" and (
                        worst is None or fall.max() > worst["fall"]):
                    r = int(np.argmax(fall))
                    full = simulate(Attention(beta=beta, mask="full"), x0[r], params["t_end"],
                                    save_at=times, method="rk4", dt=params["dt"])
                    worst = {"d": d, "n": n, "beta": beta, "run": r, "fall": float(fall[r]),
                             "times": times, "causal": log_e[:, r],
                             "full": log_energy(full.states, beta),
                             "x0": x0[r], "causal_final": traj.final[r]}
        rows.append(row)
        progress((j + 1) / len(jobs))
    claims = [_full_claim(rows, params), _causal_claim(rows, params)]
    figures = [save_figure(_figure(worst, rows), out, "energy.png")] if worst else []
    numbers = {"rows": rows, "counterexample": worst, "times": times}
    notes = [f"Q = K = V = I, {params['runs']} runs per (d, n, beta), RK4 dt = {params['dt']:g} "
             f"to t = {params['t_end']:g}, {params['n_saves']} saves; a run 'falls' when log E "
             f"drops by more than {params['drop_tol']:g} between two saves."]
    return Output(numbers, claims, figures, notes)


def _full_claim(rows, params) -> Claim:
    worst = {a: min(r[f"full_{a}"]["min_step"] for r in rows) for a in ATTENTIONS}
    return claim(
        "energy.full",
        measured="smallest step of log E over all runs, (d, n) and beta: " + ", ".join(
            f"{a}: {v:.1e}" for a, v in worst.items()),
        values={"smallest_step": min(worst.values())})


def _causal_claim(rows, params) -> Claim:
    """The share of causal softmax runs where E falls, per setting, with Wilson intervals at a
    family-wise 95 % over the settings (Bonferroni): the best setting's lower end."""
    share = {a: np.array([r[f"causal_{a}"]["share_falling"] for r in rows]) for a in ATTENTIONS}
    fall = {a: max(r[f"causal_{a}"]["max_fall"] for r in rows) for a in ATTENTIONS}
    runs = params["runs"]
    falling = np.rint(share["softmax"] * runs).astype(int)
    z = float(norm.isf(0.05 / (2 * len(rows))))
    low = [wilson(int(k), runs, z)[0] for k in falling]
    best = int(np.argmax(low))
    return claim(
        "energy.causal",
        measured="share of runs where log E falls, softmax: " + ", ".join(
            f"(d={r['d']}, n={r['n']}, beta={r['beta']:g}): {s:.0%}"
            for r, s in zip(rows, share["softmax"]))
        + f" ({runs} runs each; best: (d={rows[best]['d']}, n={rows[best]['n']}, "
        f"beta={rows[best]['beta']:g}), {falling[best]}/{runs}, family-wise 95 % interval "
        f"from {low[best]:.4f}); largest relative fall below the running maximum: " + ", ".join(
            f"{a} {v:.2%}" for a, v in fall.items())
        + f"; unnormalised: falls in {np.mean(share['unnormalised'] > 0):.0%} of the settings",
        values={"best_share_low": low[best], "falling_runs": int(falling.sum())},
        note=f"a run falls when log E drops by more than {params['drop_tol']:g} between saves "
        "(full attention never does)")


def _figure(worst, rows) -> Figure:
    fig = Figure(figsize=(11.0, 4.2))
    ax, bx = fig.subplots(1, 2)
    t = worst["times"]
    ax.plot(t, worst["causal"] - worst["causal"][0], label="causal")
    ax.plot(t, worst["full"] - worst["full"][0], label="full (same start)")
    ax.set(xlabel="t", ylabel="log E(t) - log E(0)",
           title=f"counterexample: d = {worst['d']}, n = {worst['n']}, beta = "
           f"{worst['beta']:g} (fall {worst['fall']:.2%})")
    ax.legend()
    ax.grid(alpha=0.3)
    labels = [f"d={r['d']},n={r['n']},b={r['beta']:g}" for r in rows]
    x = np.arange(len(rows))
    for k, attention in enumerate(ATTENTIONS):
        bx.bar(x + 0.4 * k - 0.2, [r[f"causal_{attention}"]["share_falling"] for r in rows],
               width=0.4, label=f"causal, {attention}")
    bx.set_xticks(x, labels, rotation=60, fontsize=7)
    bx.set(ylabel="share of runs where E falls", title="causal masks (full: never)")
    bx.legend()
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig
