"""Selectivity at long context: the weights of one query over n iid uniform keys on S^{d-1}
(*Scaling Limits of Long-Context Transformers*, docs/science.md §11.4).

At beta_n = gamma n^{2/(d-1)} the nearest keys' points beta_n (1 - <q, k>) converge to a
Poisson process and the weights keep a random limit law, neither uniform nor one-hot
(`attnflow.analysis.closedforms.limit_statistics`); below that scale (beta = gamma log n) the law
of large
numbers makes every weight vanish, above it (beta = gamma n^{2/(d-1)} log n) the nearest key
takes all.

* The grid: for each d, gamma = 2 (c_d / b)^{2/(d-1)} for each b of `keys` (b: the mean number
  of limit points below 1, `limit_keys`).
* Critical and supercritical scales: the `nearest` smallest gaps of n keys, exact
  (`nearest_gaps`), k = min(n, b (ln n + 30)^{(d-1)/2} + 16) of them for the smallest beta;
  the keys left out change the softmax sum by at most (n - k) e^{-beta (delta_k - delta_1)}
  relative (reported: "truncation"). `trials` contexts per n.
* The log scale: all n gaps (`sample_gaps`), `log_trials` contexts per n; the law of large
  numbers' effective number of keys n m(beta)^2 / m(2 beta), m = `mean_kernel`.
* The limit density of the max weight: `limit_draws` draws of the limit process's nearest
  points (`poisson_gaps`, up to x = 24: e^{-24} of a weight left out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.analysis.closedforms import (
    cap_constant,
    limit_keys,
    limit_statistics,
    mean_kernel,
    nearest_gaps,
    poisson_gaps,
    sample_gaps,
    weight_statistics,
)
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, mean_se, save_figure

PAPERS = ("2605.08505",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "selectivity"
TITLE = "Selectivity at long context: the weights' limit law at beta = gamma n^(2/(d-1))"
QUICK: dict[str, Any] = {"d": [2, 3, 5], "keys": [2.0, 0.5, 0.125], "n": [100, 1000, 100_000],
                         "trials": 200, "log_gamma": [1.0, 4.0, 16.0], "log_trials": 10,
                         "limit_draws": 2000, "chunk": 500}
FULL: dict[str, Any] = {**QUICK, "n": [100, 1000, 10_000, 100_000, 1_000_000],
                        "trials": 4000, "log_trials": 40, "limit_draws": 40_000}
FULL_MINUTES = 3  # measured: 66 s of CPU time (3 min wall on the shared 2 cores)

STATS = ("max_weight", "participation", "effective_keys")
# A change of E[max w] between the smallest and the largest n counts as a move when it exceeds
# this many standard errors of the difference (the measures' definition in claims.toml).
MOVE_SE = 3.0
X_LIMIT = 24.0  # the limit process's points kept up to x = 24 for the histograms


def gamma_of(d: int, b: float) -> float:
    """The gamma at which the limit process has mean count b below 1 (`limit_keys`)."""
    return 2.0 * (cap_constant(d) / b) ** (2.0 / (d - 1))


def nearest_count(n: int, d: int, b: float) -> int:
    """Gaps kept per context at the critical scale: the limit's points reach
    x = ln n + 30 (mean count b x^{(d-1)/2}), all n keys for small n."""
    return int(min(n, np.ceil(b * (np.log(n) + 30.0) ** ((d - 1) / 2)) + 16))


def _summary(stats: dict[str, list[np.ndarray]]) -> dict[str, tuple[float, float]]:
    return {k: mean_se(np.concatenate(v)) for k, v in stats.items()}


def sampled(n: int, d: int, gammas: list[float], trials: int, chunk: int,
            rng: np.random.Generator) -> dict[str, Any]:
    """Mean and standard error of each statistic at beta = gamma n^{2/(d-1)} (critical) and
    gamma n^{2/(d-1)} log n (supercritical) from the nearest gaps; the truncation bound; and
    the critical max weights themselves (for the histograms)."""
    scale = n ** (2.0 / (d - 1))
    k = nearest_count(n, d, max(limit_keys(d, g) for g in gammas))
    crit = [{s: [] for s in STATS} for _ in gammas]
    sup = [{s: [] for s in STATS} for _ in gammas]
    trunc = 0.0
    for start in range(0, trials, chunk):
        gaps = nearest_gaps(n, d, k, min(chunk, trials - start), rng)
        for i, g in enumerate(gammas):
            for beta, into in ((g * scale, crit[i]), (g * scale * np.log(n), sup[i])):
                for s, v in weight_statistics(gaps, beta).items():
                    into[s].append(v)
            if k < n:
                spread = g * scale * (gaps[:, -1] - gaps[:, 0])
                trunc = max(trunc, float(np.max((n - k) * np.exp(-spread))))
    return {"n": n, "k": k, "truncation": trunc,
            "critical": [_summary(c) for c in crit], "super": [_summary(c) for c in sup],
            "max_weights": [np.concatenate(c["max_weight"]) for c in crit]}


def sampled_log(n: int, d: int, gammas: list[float], trials: int,
                rng: np.random.Generator) -> dict[str, Any]:
    """Mean and standard error of each statistic at beta = gamma log n from all n gaps, and
    the law of large numbers' effective keys n m(beta)^2 / m(2 beta) per gamma."""
    rows = [{s: [] for s in STATS} for _ in gammas]
    for _ in range(trials):
        gaps = sample_gaps(n, d, 1, rng)
        for i, g in enumerate(gammas):
            for s, v in weight_statistics(gaps, g * np.log(n)).items():
                rows[i][s].append(v)
    betas = np.array(gammas) * np.log(n)
    lln = n * mean_kernel(d, betas) ** 2 / mean_kernel(d, 2 * betas)
    return {"n": n, "stats": [_summary(r) for r in rows], "lln_keys": lln,
            "lln_max_weight": 1.0 / (n * mean_kernel(d, betas))}


def limit_max_weights(d: int, gamma: float, draws: int, chunk: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Max weights of `draws` draws of the limit process (points up to x = X_LIMIT)."""
    k = int(np.ceil(limit_keys(d, gamma) * X_LIMIT ** ((d - 1) / 2))) + 16
    return np.concatenate([weight_statistics(poisson_gaps(d, gamma, k, min(chunk, draws - s),
                                                          rng), 1.0)["max_weight"]
                           for s in range(0, draws, chunk)])


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    dims = [int(d) for d in params["d"]]
    keys = [float(b) for b in params["keys"]]
    ns = [int(n) for n in params["n"]]
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    work = [sum(nearest_count(n, d, max(keys)) * params["trials"]
                + n * params["log_trials"] for n in ns) for d in dims]
    done = 0.0
    rows = []
    for d, w in zip(dims, work):
        gammas = [gamma_of(d, b) for b in keys]
        limit = [limit_statistics(d, g) for g in gammas]
        crit, logs = [], []
        for n in ns:
            crit.append(sampled(n, d, gammas, params["trials"], params["chunk"], rng))
            logs.append(sampled_log(n, d, params["log_gamma"], params["log_trials"], rng))
        hist_limit = [limit_max_weights(d, g, params["limit_draws"], params["chunk"], rng)
                      for g in gammas]
        rows.append({"d": d, "gammas": gammas, "limit": limit, "critical": crit, "log": logs,
                     "limit_max_weights": hist_limit})
        done += w
        progress(done / sum(work))
    claims = [_limit_claim(rows, ns), _offcritical_claim(rows, params)]
    figures = [save_figure(_figure(rows, keys, params), out, "selectivity.png"),
               save_figure(_histograms(rows, keys), out, "selectivity_hist.png")]
    numbers = {"keys": keys, "log_gamma": params["log_gamma"], "n": ns,
               "by_d": [_numbers(r) for r in rows]}
    truncation = max(c["truncation"] for r in rows for c in r["critical"])
    notes = ["gamma per d from the mean count b of limit points below 1 (gamma = 2 (c_d / b)"
             "^{2/(d-1)}): " + "; ".join(f"d = {r['d']}: " + ", ".join(
                 f"{g:.4g}" for g in r["gammas"]) for r in rows),
             "truncation (largest relative change of the softmax sum the keys left out could "
             f"make, over d, b and n): {truncation:.1e}"]
    return Output(numbers, claims, figures, notes)


def _numbers(r: dict[str, Any]) -> dict[str, Any]:
    return {"d": r["d"], "gammas": r["gammas"],
            "limit": [{s: getattr(lim, s) for s in STATS} for lim in r["limit"]],
            "critical": [{k: v for k, v in c.items() if k != "max_weights"}
                         for c in r["critical"]],
            "log": r["log"]}


def _deviations(r: dict[str, Any], c: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """(label, measured - limit, its z, relative) for each b and statistic at one n."""
    out = []
    for b_index, (lim, got) in enumerate(zip(r["limit"], c["critical"])):
        for s in STATS:
            mean, se = got[s]
            off = mean - getattr(lim, s)
            out.append((f"{s}[{b_index}]", off, off / se, off / getattr(lim, s)))
    return out


def _limit_claim(rows: list[dict[str, Any]], ns: list[int]) -> Claim:
    last = [dev for r in rows for dev in _deviations(r, r["critical"][-1])]
    largest_z = max(abs(z) for _, _, z, _ in last)
    largest_rel = max(abs(rel) for _, _, _, rel in last)
    shrink = "; ".join(f"d = {r['d']}: " + ", ".join(
        f"n={c['n']}: {max(abs(rel) for _, _, _, rel in _deviations(r, c)):.3f}"
        for c in r["critical"]) for r in rows)
    table = "; ".join(f"d = {r['d']}: " + ", ".join(
        f"E max w {c['max_weight'][0]:.4f}+-{c['max_weight'][1]:.4f} (limit "
        f"{lim.max_weight:.4f}), E 1/sum w^2 {c['effective_keys'][0]:.3f}+-"
        f"{c['effective_keys'][1]:.3f} (limit {lim.effective_keys:.3f})"
        for lim, c in zip(r["limit"], r["critical"][-1]["critical"])) for r in rows)
    return claim("selectivity.limit",
                 measured=f"at n = {ns[-1]}: {table}; largest relative deviation by n: "
                 f"{shrink}", values={"largest_z": largest_z, "largest_relative": largest_rel})


def _offcritical_claim(rows: list[dict[str, Any]], params: dict[str, Any]) -> Claim:
    not_falling = not_rising = 0
    lln_off = 0.0
    parts = []
    for r in rows:
        first, last = r["log"][0]["stats"], r["log"][-1]["stats"]
        for i, g in enumerate(params["log_gamma"]):
            (m0, s0), (m1, s1) = first[i]["max_weight"], last[i]["max_weight"]
            not_falling += int(m1 - m0 >= -MOVE_SE * np.hypot(s0, s1))
            keys, lln = last[i]["effective_keys"][0], r["log"][-1]["lln_keys"][i]
            lln_off = max(lln_off, abs(keys / lln - 1.0))
            parts.append(f"d={r['d']} log gamma={g:g}: E max w {m0:.3g} -> {m1:.3g}, "
                         f"E 1/sum w^2 / LLN = {keys / lln:.3f}")
        c0, c1 = r["critical"][0]["super"], r["critical"][-1]["super"]
        for i in range(len(r["gammas"])):
            (m0, s0), (m1, s1) = c0[i]["max_weight"], c1[i]["max_weight"]
            not_rising += int(m1 - m0 <= MOVE_SE * np.hypot(s0, s1))
            parts.append(f"d={r['d']} super b[{i}]: E max w {m0:.4f} -> {m1:.4f}")
    n0, n1 = params["n"][0], params["n"][-1]
    return claim("selectivity.offcritical",
                 measured=f"from n = {n0} to {n1}: " + "; ".join(parts),
                 values={"log_not_falling": not_falling, "super_not_rising": not_rising,
                         "lln_off": lln_off})


def _figure(rows: list[dict[str, Any]], keys: list[float], params: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(13.0, 7.6))
    axes = fig.subplots(2, len(rows), squeeze=False)
    ns = np.array(params["n"], dtype=float)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for j, r in enumerate(rows):
        ax, bx = axes[0, j], axes[1, j]
        for i, (b, lim, color) in enumerate(zip(keys, r["limit"], colors)):
            for stat, axis in (("max_weight", ax), ("effective_keys", bx)):
                m = [c["critical"][i][stat] for c in r["critical"]]
                axis.errorbar(ns, [v[0] for v in m], yerr=[v[1] for v in m], fmt="o", ms=4,
                              color=color, label=f"n^(2/(d-1)) scale, b = {b:g}")
                axis.axhline(getattr(lim, stat), color=color, lw=1, ls="--")
            ax.plot(ns, [c["super"][i]["max_weight"][0] for c in r["critical"]], "^", ms=4,
                    color=color, mfc="none", label=f"x log n (supercritical), b = {b:g}")
        for i, (g, color) in enumerate(zip(params["log_gamma"], ["k", "0.45", "0.7"])):
            ax.plot(ns, [c["stats"][i]["max_weight"][0] for c in r["log"]], "s-", ms=3, lw=0.8,
                    color=color, label=f"beta = {g:g} log n")
            bx.plot(ns, [c["stats"][i]["effective_keys"][0] for c in r["log"]], "s", ms=3,
                    color=color, label=f"beta = {g:g} log n")
            bx.plot(ns, [c["lln_keys"][i] for c in r["log"]], "-", lw=0.8, color=color)
        ax.set(xscale="log", yscale="log", xlabel="n keys", ylabel="E[max weight]",
               title=f"d = {r['d']} (dashed: limit law)")
        bx.set(xscale="log", yscale="log", xlabel="n keys", ylabel="E[1 / sum w^2]",
               title=f"d = {r['d']}: effective keys (grey lines: LLN)")
        for axis in (ax, bx):
            axis.grid(alpha=0.3)
        if j == 0:
            ax.legend(fontsize=6, loc="lower left")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.07, top=0.95, wspace=0.25, hspace=0.3)
    return fig


def _histograms(rows: list[dict[str, Any]], keys: list[float]) -> Figure:
    fig = Figure(figsize=(12.0, 8.0))
    axes = fig.subplots(len(rows), len(keys), squeeze=False)
    for j, r in enumerate(rows):
        n = r["critical"][-1]["n"]
        for i, b in enumerate(keys):
            ax = axes[j, i]
            edges = np.linspace(0.0, 1.0, 41)
            got = np.histogram(r["critical"][-1]["max_weights"][i], edges, density=True)[0]
            lim = np.histogram(r["limit_max_weights"][i], edges, density=True)[0]
            ax.stairs(got, edges, fill=True, alpha=0.5, color="tab:blue", label=f"n = {n:,} keys")
            ax.stairs(lim, edges, color="k", lw=1.2, label="limit law (Poisson process)")
            ax.axvline(r["limit"][i].max_weight, color="k", ls="--", lw=1,
                       label="E[max w], quadrature")
            ax.set(title=f"d = {r['d']}, b = {b:g} (gamma = {r['gammas'][i]:.3g})",
                   xlabel="max weight", ylabel="density")
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="upper left")
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.06, top=0.95, wspace=0.25, hspace=0.45)
    return fig
