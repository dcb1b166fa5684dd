"""The influence of each token on the last one: the gradient view of lost in the middle
(docs/science.md §11.7; the model of arXiv 2605.09213 as in the `lostmiddle` recipe, §11.1).

The model: tokens on the circle, Q = K = V = I, causal mask, the positional weighting with
ALiBi slope `slope` / n per token (attnflow time; the source's time is ours divided by beta).
For each of `runs` iid uniform starts of n tokens, `attnflow.influence` runs forward once
on torch tensors (float64, CPU, RK4 at dt = `dt` / beta, the graph kept: a chunk of `chunk`
runs holds about 5 x 4 x steps x chunk x n^2 doubles) and pulls back the covectors of
theta_n(t) = atan2(x_n(t)) at every save time t in one backward pass: the whole row of the
last token's Jacobian read on the tangent of each initial token,
J_j = d theta_n(t) / d theta_j(0) for j = 1..n (the runs of a chunk share the pass: a run's
target does not depend on another run's tokens). On the circle the tangent block of
dx_n(t)/dx_j(0) is this one number, so its operator and Frobenius norms are both |J_j|.

Measured, per run and per label cell (`cells` equal cells of s = j / n, j < n), at the times
`factors` x t_crit (t_crit the retrieval's recency time, `recency_time`):
* the influence n |J_j|, against its linearised expectation `mean_influence` at the same labels;
* the retrieval's two estimators: the direct n S(theta_n(t) - theta_j(0)) and the gradient one
  n J_j S(theta_n(t) - theta_j(0)), S(x) = sum_k w_k cos(k x) the soft accuracy's weights;
  their means are equal at every n (integration by parts in the uniform theta_j(0), §11.7);
* the shape: the cell of the influence profile's minimum against the prediction's.
Standard errors: over runs (independent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import (
    influence_recency_time,
    mean_influence,
    recency_time,
    soft_accuracy,
    soft_weights,
)
from attnflow.analysis.kinetic import SOFT_MODES
from attnflow.experiments._ledger import claim, without_torch
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.sensitivity import influence

PAPERS = ("2605.09213",)  # arXiv ids of the papers whose claims this recipe checks
CLAIMS = ("influence.green", "influence.identity", "influence.shape")
NAME = "influence"
TITLE = "The influence of each token on the last one: the gradient view of lost in the middle"
QUICK: dict[str, Any] = {"settings": [[1.0, 1.0]], "factors": [0.25, 0.5, 1.0], "n": 160,
                         "runs": 32, "cells": 8, "dt": 0.5, "chunk": 8}
FULL: dict[str, Any] = {**QUICK, "factors": [0.25, 0.5, 0.75, 1.0, 1.25], "n": 500,
                        "runs": 192, "cells": 10}
FULL_MINUTES = 3  # measured: 91 s CPU (one torch thread), 6.3 min wall on the shared machine


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    if (skipped := without_torch(CLAIMS)) is not None:
        return skipped
    rng = np.random.default_rng(seed)
    settings = [(float(b), float(lam)) for b, lam in params["settings"]]
    results = []
    for i, (beta, lam) in enumerate(settings):
        results.append(_setting(params, beta, lam, rng, lambda f, i=i: progress(
            (i + f) / len(settings))))
    claims = [_green_claim(results, params), _identity_claim(results, params),
              _shape_claim(results, params)]
    figures = [save_figure(_figure(results), out, "influence.png")]
    notes = [f"n = {params['n']} tokens, {params['runs']} iid uniform starts per setting, torch "
             f"float64 on the CPU, dense kernel (SDPA), positional weighting, ALiBi slope "
             f"lambda / n per token, RK4 dt = {params['dt']:g} / beta; one "
             f"backward pass for all save times for a chunk of {params['chunk']} runs. "
             f"{params['cells']} equal label cells of the tokens j < n; the retrieval weights "
             f"w_k = e^(-pi^2 k^2 / 128), k = 1..{SOFT_MODES}."]
    return Output({"settings": results}, claims, figures, notes)


def _jacobian_rows(model, theta0: np.ndarray, times: list[float], dt: float):
    """J (T, R, n) = d theta_n(t) / d theta_j(0) and theta_n(t) (T, R) for starts theta0 (R, n):
    one forward run and one backward pass (`attnflow.influence`), on one torch thread (many
    small calls, docs/guide/gpu.md)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
        res = influence(model, x0, times[-1], save_at=times, dt=dt)
    finally:
        torch.set_num_threads(threads)
    y = res.target_states  # (T, R, 2), off the circle by rounding
    return res.blocks, np.arctan2(y[..., 1], y[..., 0])


def _setting(params, beta, lam, rng, progress) -> dict[str, Any]:
    """One (beta, slope): per-run cell means of the three statistics, their means and standard
    errors over runs, and the prediction at the tokens' labels."""
    n, R, C = params["n"], params["runs"], params["cells"]
    t_crit = recency_time(beta, lam)
    times = [f * t_crit for f in params["factors"]]
    model = Attention(beta=beta, mask="causal", attention="positional", alibi=lam / n)
    s = np.arange(1, n) / n
    cell = np.minimum((s * C).astype(int), C - 1)  # the cell of each token j < n
    counts = np.bincount(cell, minlength=C)
    w = soft_weights()
    k = np.arange(1, SOFT_MODES + 1)
    stats = np.zeros((3, R, len(times), C))  # influence, direct, gradient retrieval
    for lo in range(0, R, params["chunk"]):
        theta0 = rng.uniform(0, 2 * np.pi, (min(params["chunk"], R - lo), n))
        J, theta_n = _jacobian_rows(model, theta0, times, params["dt"] / beta)
        delta = theta_n[:, :, None] - theta0[None, :, :-1]  # (T, r, n - 1)
        soft = np.cos(delta[..., None] * k) @ w
        per_token = np.stack([n * np.abs(J[..., :-1]), n * soft, n * J[..., :-1] * soft])
        for b in range(C):
            stats[:, lo:lo + len(theta0), :, b] = per_token[..., cell == b].mean(-1).transpose(
                0, 2, 1)
        progress(min(1.0, (lo + len(theta0)) / R))
    mean, se = stats.mean(axis=1), stats.std(axis=1, ddof=1) / np.sqrt(R)
    diff = stats[2] - stats[1]
    predicted = np.stack([np.bincount(cell, mean_influence(s, t, beta, lam), C) / counts
                          for t in times])
    retrieval = np.stack([np.bincount(cell, soft_accuracy(s, t, beta, lam), C) / counts
                          for t in times])
    return {"beta": beta, "slope": lam, "t_crit": t_crit,
            "t_influence": influence_recency_time(beta, lam), "times": times,
            "edges": np.linspace(0, 1, C + 1), "influence": mean[0], "influence_se": se[0],
            "predicted": predicted, "direct": mean[1], "direct_se": se[1],
            "gradient": mean[2], "gradient_se": se[2], "difference": diff.mean(0),
            "difference_se": diff.std(0, ddof=1) / np.sqrt(R), "retrieval_closed": retrieval}


def _green_claim(results, params) -> Claim:
    z = np.concatenate([(np.abs(r["influence"] - r["predicted"]) / r["influence_se"]).ravel()
                        for r in results])
    early = np.concatenate([np.abs(r["influence"][0] - r["predicted"][0]) / r["influence_se"][0]
                            for r in results])
    m = np.concatenate([r["influence"].ravel() for r in results])
    p = np.concatenate([r["predicted"].ravel() for r in results])
    se = np.concatenate([r["influence_se"].ravel() for r in results])
    wt = 1 / se**2
    scale = float(np.sum(wt * m * p) / np.sum(wt * p * p))
    per = "; ".join(
        f"beta {r['beta']:g}, slope {r['slope']:g}: at t / t_crit = "
        + ", ".join(f"{t / r['t_crit']:g} largest z {zz:.2f}, measured / predicted "
                    f"{np.sum(mm) / np.sum(pp):.4f}"
                    for t, zz, mm, pp in zip(r["times"], np.max(
                        np.abs(r["influence"] - r["predicted"]) / r["influence_se"], axis=1),
                        r["influence"], r["predicted"]))
        for r in results)
    return claim(
        "influence.green",
        measured=f"n = {params['n']}, {params['runs']} runs: largest |measured - predicted| / se "
        f"{z.max():.2f} over {z.size} (setting, time, cell); at the earliest time "
        f"{early.max():.2f}; weighted scale measured / predicted {scale:.4f} ({per})",
        values={"largest_z": float(z.max()), "early_z": float(early.max()),
                "scale_off": abs(scale - 1)})


def _identity_claim(results, params) -> Claim:
    z = np.concatenate([(np.abs(r["difference"]) / r["difference_se"]).ravel()
                        for r in results])
    ratio = np.concatenate([(r["direct_se"] / r["gradient_se"]).ravel() for r in results])
    return claim(
        "influence.identity",
        measured=f"n = {params['n']}, {params['runs']} runs: largest |gradient - direct| / se "
        f"{z.max():.2f} over {z.size} (setting, time, cell); standard error of the direct "
        f"estimator / the gradient one: median {np.median(ratio):.1f} (range "
        f"{ratio.min():.1f} to {ratio.max():.1f})",
        values={"largest_z": float(z.max())})


def _shape_claim(results, params) -> Claim:
    off, parts = [], []
    for r in results:
        for t, m, p, c in zip(r["times"], r["influence"], r["predicted"],
                              r["retrieval_closed"]):
            off.append(abs(int(np.argmin(m)) - int(np.argmin(p))))
            parts.append(f"t / t_crit = {t / r['t_crit']:g}: minimum in cell "
                         f"{int(np.argmin(m)) + 1} (predicted {int(np.argmin(p)) + 1}, retrieval "
                         f"{int(np.argmin(c)) + 1})")
    crit = "; ".join(f"beta {r['beta']:g}, slope {r['slope']:g}: t_I = {r['t_influence']:.3f} = "
                     f"{r['t_influence'] / r['t_crit']:.3f} t_crit" for r in results)
    return claim(
        "influence.shape",
        measured=f"{params['cells']} cells: " + "; ".join(parts) + f" (derived: {crit})",
        values={"argmin_off": max(off)})


def _figure(results) -> Figure:
    fig = Figure(figsize=(5.2 * len(results), 5.6))
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    fine = np.linspace(0.004, 0.996, 250)
    for ax, r in zip(axes, results):
        edges = np.asarray(r["edges"])
        centres = (edges[:-1] + edges[1:]) / 2
        for i, t in enumerate(r["times"]):
            color = f"C{i}"
            ax.plot(fine, mean_influence(fine, t, r["beta"], r["slope"]), "-", color=color,
                    lw=1.0, label=f"t = {t / r['t_crit']:g} t_crit")
            ax.plot(fine, soft_accuracy(fine, t, r["beta"], r["slope"]), ":", color=color,
                    lw=0.9)
            ax.stairs(r["predicted"][i], edges, baseline=None, color=color, lw=0.6, alpha=0.6)
            ax.errorbar(centres, r["influence"][i], yerr=2 * r["influence_se"][i], fmt="o",
                        color=color, ms=4, mfc="none", elinewidth=0.8)
            ax.errorbar(centres, r["gradient"][i], yerr=2 * r["gradient_se"][i], fmt="x",
                        color=color, ms=4, elinewidth=0.8)
        ax.set(yscale="log", xlabel="label s = j / n of the influencing token",
               title=f"beta = {r['beta']:g}, ALiBi slope {r['slope']:g}: t_crit = "
               f"{r['t_crit']:.2f}, t_I = {r['t_influence']:.2f}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, title="influence n E|d theta_n(t) / d theta_j(0)|: predicted "
                  "(solid; thin steps: over the cells' tokens),\nmeasured (circles, 2 se); "
                  "retrieval: closed form (dotted),\ngradient estimator n E[J S] (crosses)",
                  title_fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    axes[0].set_ylabel("influence / soft accuracy (times n)")
    fig.tight_layout()
    return fig
