"""Lemma C.1 and Rényi's parking constant: how many (strong) Rényi centers i.i.d. tokens have.

docs/science.md §2 and §4. Tokens are i.i.d. uniform on S^{d-1} (no dynamics: the centers are
those of the initial configuration).

* Strong centers (Lemma C.1): Monte Carlo counts of `strong_renyi_centers` for n tokens
  against the exact expectation E_n = (1 - (1 - p)^n) / p, p the normalised mass of a cap of
  geodesic radius delta (p = delta / pi on the circle, sin^2(delta / 2) on S^2; the paper
  prints (3 sin^2(delta/2))^{-1} for E_inf on S^2, a typo that is tested too).
* Ordinary centers on the circle: with enough tokens the circle is jammed and the count tends
  to 1 + M(2 pi / delta - 1) = c_R 2 pi / delta (Rényi's constant c_R = 0.7476...). With n
  tokens the count falls short of the jammed one, asymptotically by e^{-2 gamma}
  (2 pi / delta)^2 / n (the 1/t approach to jamming of random sequential adsorption in one
  dimension) and by a few times more for few centers (delta = 1: 0.013 ± 0.006 at
  n = 63 (2 pi / delta)^2, measured with 8000 draws). Each draw has n = K (2 pi / delta)^2
  tokens, K = `jamming_k` (default 300: a shortfall of a few thousandths of a center).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import norm

from attnflow.analysis.closedforms import (
    RENYI_PARKING_CONSTANT,
    expected_renyi_centers_circle,
    expected_strong_centers,
)
from attnflow.analysis.renyi import renyi_centers, strong_renyi_centers
from attnflow.experiments._ledger import claim, entry
from attnflow.experiments._recipe import Claim, Output, Progress, mean_se, save_figure
from attnflow.sphere import uniform

NAME = "parking"
TITLE = "Lemma C.1 and Rényi's constant: the number of (strong) Rényi centers"
QUICK: dict[str, Any] = {"d": [2, 3], "deltas": [0.25, 0.5, 1.0], "n": [200], "runs": 3000,
                         "renyi_deltas": [0.5, 1.0], "renyi_runs": 1000, "jamming_k": 300}
FULL: dict[str, Any] = {**QUICK, "deltas": [0.125, 0.25, 0.5, 1.0], "n": [200, 600],
                        "runs": 10000, "renyi_deltas": [0.25, 0.5, 1.0], "renyi_runs": 4000}
FULL_MINUTES = 12

# e^{-2 gamma}: the constant of the 1/t approach to jamming in one dimension.
_JAMMING_RATE = float(np.exp(-2 * np.euler_gamma))
# A family of k Monte Carlo means agrees with exact values when its Bonferroni p-value,
# k times the two-sided p of the largest |z|, clears the ledger's family-wise error rate
# (claims.toml, parking.*).
# The printed n = inf formula is tested on the settings whose exact E_n is at least this
# fraction of E_inf, where n tokens stand for the infinite sequence.
_NEAR_LIMIT = 0.99


def family_p(z: list[float]) -> float:
    """Bonferroni p-value of a family of z-scores: min(1, k x the two-sided p of max |z|)."""
    return float(min(1.0, 2 * len(z) * norm.sf(max(abs(v) for v in z))))


def _z_crit(k: int) -> float:
    """|z| at which a family of k z-scores reaches the ledger's family-wise error rate."""
    return float(norm.isf(_family_error() / (2 * max(k, 1))))


def _family_error() -> float:
    return entry("parking.strong_d2").reproduced[0].threshold


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    dims, deltas, sizes = params["d"], params["deltas"], params["n"]
    runs, renyi_runs = params["runs"], params["renyi_runs"]
    strong_cfg = [(d, n, delta) for d in dims for n in sizes for delta in deltas]
    renyi_deltas = list(params["renyi_deltas"])
    streams = np.random.SeedSequence(seed).spawn(len(strong_cfg) + len(renyi_deltas))
    steps, done = len(strong_cfg) + len(renyi_deltas), 0

    strong = []
    for (d, n, delta), stream in zip(strong_cfg, streams):
        counts = _strong_counts(d, n, delta, runs, np.random.default_rng(stream))
        mean, se = mean_se(counts)
        exact = float(expected_strong_centers(n, delta, d))
        strong.append({"d": d, "n": n, "delta": delta, "mc_mean": mean, "mc_se": se,
                       "exact_E_n": exact,
                       "E_inf": float(expected_strong_centers(np.inf, delta, d)),
                       "z": (mean - exact) / se, "printed_paper_E_inf":
                       float(1 / (3 * np.sin(delta / 2) ** 2)) if d == 3 else None})
        done += 1
        progress(done / steps)

    renyi = []
    for delta, stream in zip(renyi_deltas, streams[len(strong_cfg):]):
        n = int(np.ceil(params["jamming_k"] * (2 * np.pi / delta) ** 2))
        rng = np.random.default_rng(stream)
        counts = [len(renyi_centers(uniform(n, 2, rng), delta)) for _ in range(renyi_runs)]
        mean, se = mean_se(counts)
        jammed = float(expected_renyi_centers_circle(delta))
        renyi.append({"delta": delta, "n": n, "mc_mean": mean, "mc_se": se, "jammed": jammed,
                      "shortfall_estimate": _JAMMING_RATE * (2 * np.pi / delta) ** 2 / n,
                      "c_R_times_2pi_over_delta": RENYI_PARKING_CONSTANT * 2 * np.pi / delta,
                      "density": mean * delta / (2 * np.pi),
                      "density_se": se * delta / (2 * np.pi), "z": (mean - jammed) / se})
        done += 1
        progress(done / steps)

    figures = [save_figure(_figure(strong, renyi, params), out, "parking_counts.png")]
    claims = [_strong_claim(strong, d, runs) for d in dims]
    if 3 in dims:
        claims.append(_printed_claim([r for r in strong if r["d"] == 3]))
    claims.append(_renyi_claim(renyi, renyi_runs))
    numbers = {"strong": strong, "renyi_circle": renyi,
               "renyi_parking_constant": RENYI_PARKING_CONSTANT,
               "family_error_rate": _family_error()}
    notes = [
        "Tokens i.i.d. uniform; distances geodesic; delta in radians. Strong centers: "
        f"{runs} draws of n tokens per (d, n, delta), against the exact finite-n expectation "
        "E_n = (1 - (1 - p)^n) / p (Lemma C.1 summed over k <= n); E_inf = 1 / p is the "
        "lemma's infinite-sequence value.",
        "Ordinary centers on the circle: n = K (2 pi / delta)^2 tokens per draw, "
        f"K = {params['jamming_k']:g}, so that the circle is jammed up to a few thousandths of "
        "a center (asymptotic shortfall e^(-2 gamma) / K; module docstring). n per delta: "
        + ", ".join(f"{r['delta']:g}: {r['n']}" for r in renyi) + ".",
        "'Agrees': each of a claim's k Monte Carlo means within z_k standard errors of the "
        f"exact value, z_k such that k true comparisons all pass with probability "
        f"{1 - _family_error():.0%} (Bonferroni; z = {_z_crit(1):.2f} for k = 1, "
        f"{_z_crit(8):.2f} for k = 8).",
    ]
    return Output(numbers, claims, figures, notes)


def _strong_counts(d: int, n: int, delta: float, runs: int, rng: np.random.Generator
                   ) -> np.ndarray:
    """Strong-center counts of `runs` independent draws of n uniform tokens on S^{d-1}."""
    counts = np.empty(runs, dtype=int)
    chunk = max(1, 200_000 // (n * d))
    for lo in range(0, runs, chunk):
        X = uniform((min(chunk, runs - lo), n), d, rng)
        counts[lo:lo + len(X)] = [len(strong_renyi_centers(x, delta)) for x in X]
    return counts


def _strong_claim(rows: list[dict[str, Any]], d: int, runs: int) -> Claim:
    mine = [r for r in rows if r["d"] == d]
    worst, z = max(abs(r["z"]) for r in mine), _z_crit(len(mine))
    law = "pi / delta" if d == 2 else "1 / sin^2(delta/2)" if d == 3 else "1 / p_d(delta)"
    where = "the circle" if d == 2 else f"S^{d - 1}"
    return claim(
        f"parking.strong_d{d}",
        measured="; ".join(f"n={r['n']}, delta={r['delta']:g}: {r['mc_mean']:.3f} ± "
                           f"{r['mc_se']:.3f} vs exact {r['exact_E_n']:.3f} (z = {r['z']:+.1f})"
                           for r in mine) + f" ({runs} draws each)",
        values={"family_p": family_p([r["z"] for r in mine])},
        note=f"largest |z| {worst:.1f} ({z:.2f} for {len(mine)} comparisons at the family-wise "
        "rate)", where=where, law=law)


def _printed_claim(rows: list[dict[str, Any]]) -> Claim:
    """The printed E_inf on S^2, tested where n tokens nearly reach the n = inf limit: if the
    printed formula were right, E_n would lie in [_NEAR_LIMIT, 1] x printed there, so each
    such Monte Carlo mean must fall in that interval widened by z_k standard errors."""
    near = [r for r in rows if r["exact_E_n"] >= _NEAR_LIMIT * r["E_inf"]] or \
        [max(rows, key=lambda r: r["exact_E_n"] / r["E_inf"])]
    z = _z_crit(len(near))
    misses = [max(_NEAR_LIMIT * r["printed_paper_E_inf"] - r["mc_mean"],
                  r["mc_mean"] - r["printed_paper_E_inf"], 0.0) / r["mc_se"] for r in near]
    big = max(near, key=lambda r: r["mc_mean"])
    ratios = [r["mc_mean"] / r["printed_paper_E_inf"] for r in near]
    corrected = [r["mc_mean"] / r["E_inf"] for r in near]
    span = f"{min(ratios):.2f}" + (f" to {max(ratios):.2f}" if f"{min(ratios):.2f}" !=
                                   f"{max(ratios):.2f}" else "")
    p = family_p(misses)
    return claim(
        "parking.printed",
        measured=f"Monte Carlo / printed formula = {span} where E_n is within "
        f"{1 - _NEAR_LIMIT:.0%} of E_inf ({len(near)} settings); at n={big['n']}, "
        f"delta={big['delta']:g}: {big['mc_mean']:.3f} ± {big['mc_se']:.3f} vs printed "
        f"{big['printed_paper_E_inf']:.3f}, corrected 1/sin^2(delta/2) = {big['E_inf']:.3f}",
        values={"family_p": p},
        note=f"each mean against [{_NEAR_LIMIT:g}, 1] x the printed value (what the printed "
        f"formula implies where E_n is within {1 - _NEAR_LIMIT:.0%} of E_inf): "
        + (f"missed by up to {max(misses):.0f} standard errors ({z:.2f} allowed): the counts "
           f"are {span} times the printed value and {min(corrected):.3f} to "
           f"{max(corrected):.3f} times the corrected 1/sin^2(delta/2) (the cap of radius "
           "delta has normalised area sin^2(delta/2), so the printed 3 is a typo)"
           if max(misses) > z else "within the allowed standard errors"))


def _renyi_claim(rows: list[dict[str, Any]], runs: int) -> Claim:
    worst, z = max(abs(r["z"]) for r in rows), _z_crit(len(rows))
    gap = max(abs(r["jammed"] - r["c_R_times_2pi_over_delta"]) for r in rows)
    return claim(
        "parking.renyi",
        measured="; ".join(f"delta={r['delta']:g}: {r['mc_mean']:.3f} ± {r['mc_se']:.3f} vs "
                           f"{r['jammed']:.3f} (count delta / 2pi = {r['density']:.4f} ± "
                           f"{r['density_se']:.4f}, z = {r['z']:+.1f})" for r in rows)
        + f" ({runs} draws each, n up to {max(r['n'] for r in rows)} tokens)",
        values={"family_p": family_p([r["z"] for r in rows])},
        note=f"largest |z| {worst:.1f} ({z:.2f} at the family-wise rate) against the jammed "
        f"count 1 + M(2 pi/delta - 1), which differs from c_R 2 pi / delta by at most "
        f"{gap:.1e} here")


def _figure(strong: list[dict[str, Any]], renyi: list[dict[str, Any]],
            params: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(11.0, 4.2))
    left, right = fig.subplots(1, 2)
    all_d = sorted({r["delta"] for r in strong} | {r["delta"] for r in renyi})
    grid = np.geomspace(min(all_d) / 1.3, min(np.pi, max(all_d) * 1.3), 200)
    colors = {2: "tab:blue", 3: "tab:red"}
    for d in params["d"]:
        color = colors.get(d, "k")
        left.plot(grid, expected_strong_centers(np.inf, grid, d), color=color, ls="--", lw=1,
                  label=f"d = {d}: exact E_inf = 1/p")
        for n, ls in zip(params["n"], ("-", "-.", ":")):
            left.plot(grid, expected_strong_centers(n, grid, d), color=color, ls=ls, lw=1.2,
                      label=f"d = {d}: exact E_n, n = {n}")
            mine = [r for r in strong if r["d"] == d and r["n"] == n]
            left.errorbar([r["delta"] for r in mine], [r["mc_mean"] for r in mine],
                          yerr=[2 * r["mc_se"] for r in mine], fmt="o", color=color, ms=4,
                          capsize=3)
    if 3 in params["d"]:
        left.plot(grid, 1 / (3 * np.sin(grid / 2) ** 2), color="0.5", ls=":", lw=1.2,
                  label="d = 3: printed (3 sin^2(delta/2))^-1")
    left.plot([], [], "ko", ms=4, label=f"Monte Carlo, ± 2 s.e. ({params['runs']} draws)")
    left.set(xscale="log", yscale="log", xlabel="delta (rad)",
             ylabel="expected number of strong Rényi centers",
             title="Lemma C.1: strong Rényi centers of i.i.d. uniform tokens")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)

    fine = np.geomspace(min(r["delta"] for r in renyi) / 1.3, 1.3, 300)
    right.plot(fine, expected_renyi_centers_circle(fine) * fine / (2 * np.pi), "k-", lw=1.2,
               label="jammed: (1 + M(2 pi/delta - 1)) delta / 2 pi")
    right.axhline(RENYI_PARKING_CONSTANT, color="tab:green", ls="--", lw=1,
                  label=f"Rényi's constant c_R = {RENYI_PARKING_CONSTANT:.4f}")
    right.errorbar([r["delta"] for r in renyi], [r["density"] for r in renyi],
                   yerr=[2 * r["density_se"] for r in renyi], fmt="o", color="tab:purple",
                   ms=4, capsize=3, label=f"Monte Carlo, ± 2 s.e. ({params['renyi_runs']} "
                   "draws, n for jamming)")
    right.set(xscale="log", xlabel="delta (rad)", ylabel="count x delta / (2 pi)",
              ylim=(RENYI_PARKING_CONSTANT - 0.03, RENYI_PARKING_CONSTANT + 0.03),
              title="Rényi centers on the circle: Rényi's parking constant")
    for ax, ds in ((left, all_d), (right, [r["delta"] for r in renyi])):
        ax.set_xticks(ds, [f"{v:g}" for v in ds])
        ax.minorticks_off()
    right.grid(alpha=0.3)
    right.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig
