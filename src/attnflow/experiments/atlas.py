"""Fig. 1 and Table 1: the atlas of final configurations, predicted from V's spectrum alone.

docs/science.md §3 and §5. For each atlas row, value matrices V = B diag(lambda) B^{-1} with that
spectral structure in two random eigenbases B (Haar orthonormal, so V is symmetric; and a
non-orthogonal one: unit Gaussian columns, condition number at most `max_cond`), each with
Q = K = I and with random Gaussian Q, K (entries N(0, 1/d), one draw per setting); d = 3,
n = 32 uniform tokens, beta = 9, integrated by dopri5 to t_end (the paper: T = 5000). The same
initial tokens are used in every setting (seed index i has the same x(0) everywhere).

The final configuration is named by `classify_configuration` (single linkage at `tol`; a
cloud lies within pi/4 of L) and compared with `predict_configuration`'s row. A run whose
tokens sit in several clusters where the atlas predicts one point is counted separately as
"meta-stable": clusters far apart merge only after a time like exp(beta (1 - cos theta)).
A V with a complex pair on top (not covered by the atlas) is run too and reported as
observed: its distance to the pair's invariant plane and the final speed of the tokens.

The final configurations themselves (claim atlas.long, with --full): the rows in Fig. 1's
setting (`long_bases`, `long_qk`: the orthonormal eigenbasis, so V is symmetric, and
Q = K = I) at small beta (`long_beta` = 1; the conjecture says beta does not matter) to
`long_t_end` (10^5 at the full size) by an implicit solver (`long_method`, BDF with the exact
Jacobian: attnflow.implicit), with the time from which each run stays in its predicted
configuration. (The other settings need up to 100 times more BDF steps to 10^5: one of them,
cloud-L with random Q, K, took 2.8 million steps for 10 runs; all of them did not finish in
48 minutes on 2 cores.)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import ortho_group

from attnflow.analysis.atlas import (
    classify_configuration,
    distance_to_subspace,
    predict_configuration,
)
from attnflow.experiments._ledger import claim, entry, not_run
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.plot import animate, plot_sphere
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform

NAME = "atlas"
TITLE = "Fig. 1 and Table 1: the atlas of final configurations from the spectrum of V"

#: Eigenvalues (d = 3) realising each atlas row; "complex-top" has a + ib, a - ib, c on top.
SPECTRA: dict[str, list[float]] = {
    "first-token": [1.0, 1.0, 1.0],
    "point-in-L": [1.0, 1.0, 0.3],
    "two-points": [1.0, 0.5, 0.2],
    "cloud-L": [-0.5, -0.5, -1.0],
    "two-clouds": [-0.3, -0.6, -1.0],
}
COMPLEX = (0.5, 1.0, 0.2)  # a, b, c: eigenvalues 0.5 +- 1i and 0.2
COMPLEX_ROW = "complex-top"
_EARLY = 20.0  # saved densely on [0, _EARLY]; the complex-pair panel shows this span
OBSERVED = ("first-token", "point-in-L", "two-points", "cloud-L", "two-clouds", "k-clusters",
            "other")

PAPER_T_END = 5000.0  # the paper's horizon T
# Long horizons (the final configurations; the conjecture says beta does not matter): the
# settings of `long_bases` x `long_qk` at beta = `long_beta` to `long_t_end` by `long_method`,
# saved at `long_saves` log-spaced times; at the full size only (None: not run).
QUICK: dict[str, Any] = {"n": 32, "beta": 9.0, "t_end": 500.0, "seeds": 10,
                         "bases": ["orthonormal", "general"], "qk": ["identity", "random"],
                         "max_cond": 4.0, "tol": 1e-2, "rtol": 1e-6, "n_saves": 300,
                         "long_beta": 1.0, "long_t_end": None, "long_saves": 60,
                         "long_method": "bdf", "long_bases": ["orthonormal"],
                         "long_qk": ["identity"]}
FULL: dict[str, Any] = {**QUICK, "t_end": 5000.0, "seeds": 20, "long_t_end": 1e5}
# Measured (2 shared cores): the T = 5000 part 8.4 min wall, 7.5 min CPU; the
# long horizon in Fig. 1's setting 74 s for 10 runs per row (so about 2.5 min for 20). With
# every setting the long horizon did not finish in 48 min (module docstring).
FULL_MINUTES = 12

# The criteria (the share of runs as predicted; the gap between kinds of Q, K) are the
# ledger's: claims.toml, atlas.*.

def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    n, beta, t_end, seeds = params["n"], params["beta"], params["t_end"], params["seeds"]
    d = 3
    rows = [*SPECTRA, COMPLEX_ROW]
    first = params["bases"][0]
    settings = [(row, basis, qk) for row in rows for basis in params["bases"]
                for qk in params["qk"] if not (row == "first-token" and basis != first)]
    root = np.random.SeedSequence(seed)
    tokens_ss, bases_ss, qk_ss = root.spawn(3)
    x0 = uniform((seeds, n), d, np.random.default_rng(tokens_ss))
    bases = _bases(params["bases"], rows, params["max_cond"], np.random.default_rng(bases_ss))
    qk_streams = dict(zip(settings, qk_ss.spawn(len(settings))))
    early = min(_EARLY, t_end)
    save = np.unique(np.concatenate([np.linspace(0.0, early, 201), [t_end / 2],
                                     np.linspace(early, t_end, params["n_saves"])]))
    i_half = int(np.searchsorted(save, t_end / 2))

    def model_of(row: str, basis: str, qk: str, beta: float) -> tuple[Attention, np.ndarray]:
        V = _value_matrix(row, bases[row, basis])
        Q = K = None
        if qk == "random":  # the same draw at every beta
            rng = np.random.default_rng(qk_streams[row, basis, qk])
            Q, K = rng.standard_normal((2, d, d)) / np.sqrt(d)
        return Attention(Q, K, V, beta=beta), V

    records, shown = [], {}
    for s, (row, basis, qk) in enumerate(settings):
        model, V = model_of(row, basis, qk, beta)
        traj = simulate(model, x0, t_end, save_at=save, method="dopri5", rtol=params["rtol"],
                        atol=params["rtol"] * 1e-3)
        records.append(_observe(row, basis, qk, V, model, traj, x0, i_half, params["tol"]))
        if basis == params["bases"][0] and qk == params["qk"][0]:
            shown[row] = (traj, records[-1])
        progress((s + 1) / len(settings))

    figures = [save_figure(_spheres(shown, params), out, "atlas_trajectories.png"),
               save_figure(_table(records, params), out, "atlas_table.png"),
               _movie(next(iter(shown.values()))[0], out)]
    claims = [_row_claim(row, [r for r in records if r["row"] == row], params)
              for row in SPECTRA]
    claims.append(_qk_claim(records, params))
    for key, among in (("long_bases", "bases"), ("long_qk", "qk")):
        if not set(params[key]) <= set(params[among]):
            raise ValueError(f"atlas.{key}: expected some of atlas.{among} "
                             f"{params[among]}, received {params[key]}")
    long = ([_long_run(*model_of(row, basis, qk, params["long_beta"]), row, basis, qk, x0,
                       params) for row, basis, qk in settings
             if row != COMPLEX_ROW and basis in params["long_bases"] and qk in params["long_qk"]]
            if params["long_t_end"] else [])
    claims.append(_long_claim(long, params))
    stable = np.mean([o == h for r in records for o, h in zip(r["observed"], r["observed_half"])])
    complex_records = [r for r in records if r["row"] == COMPLEX_ROW]
    numbers = {"settings": records, "spectra": SPECTRA, "complex_top": COMPLEX,
               "observed_same_at_half_time": float(stable), "save_times": save,
               "long_horizon": long}
    notes = [
        f"d = 3, n = {n}, beta = {beta:g}, t_end = {t_end:g}, {seeds} seeds per setting, dopri5 "
        f"(rtol {params['rtol']:g}); eigenbases: {', '.join(params['bases'])} (the general one "
        f"has unit Gaussian columns and condition number <= {params['max_cond']:g}); Q, K: "
        f"{', '.join(params['qk'])} (random: N(0, 1/d) entries). V = I is the same in every "
        "basis, so the first-token row uses one basis.",
        f"Classification at t_end with single linkage at tol = {params['tol']:g} rad, clouds "
        f"within pi/4 of L (attnflow.analysis.atlas.classify_configuration). The observed row at "
        f"t_end / 2 = {t_end / 2:g} equals the one at t_end in {stable:.0%} of the runs"
        + (". The paper's T = 5000 is used by --full; the shorter horizon suffices here: a "
           "full run during development (T = 5000, 20 seeds) gave the same picture (Q = K = I: "
           "40/40 as predicted in the two-points, cloud-L and two-clouds rows; the one-point "
           "rows still mostly in 2-3 meta-stable clusters inside L)" if t_end < PAPER_T_END else "")
        + ".",
        _complex_note(complex_records),
    ]
    return Output(numbers, claims, figures, notes)


def _bases(kinds: list[str], rows: list[str], max_cond: float, rng: np.random.Generator
           ) -> dict[tuple[str, str], np.ndarray]:
    """A random eigenbasis of each kind for each row."""
    out = {}
    for row in rows:
        for kind in kinds:
            if kind == "orthonormal":
                out[row, kind] = ortho_group.rvs(3, random_state=rng)
            elif kind == "general":
                while True:
                    B = rng.standard_normal((3, 3))
                    B /= np.linalg.norm(B, axis=0)
                    if np.linalg.cond(B) <= max_cond:
                        break
                out[row, kind] = B
            else:
                raise ValueError(f"bases: expected 'orthonormal' or 'general', received {kind!r}")
    return out


def _value_matrix(row: str, B: np.ndarray) -> np.ndarray:
    if row == COMPLEX_ROW:
        a, b, c = COMPLEX
        core = np.array([[a, -b, 0.0], [b, a, 0.0], [0.0, 0.0, c]])
    else:
        core = np.diag(SPECTRA[row])
    return B @ core @ np.linalg.inv(B)


def _observe(row, basis, qk, V, model, traj, x0, i_half, tol) -> dict[str, Any]:
    """What the final configurations of one setting look like, run by run."""
    final, half = traj.states[-1], traj.states[i_half]
    pred = predict_configuration(V)
    obs = [classify_configuration(final[r], V, x0[r, 0], tol=tol) for r in range(len(x0))]
    rec: dict[str, Any] = {
        "row": row, "basis": basis, "qk": qk, "V": V, "predicted": pred.row,
        "predicted_label": pred.label,
        "eigenvalues_re_im": np.stack([pred.eigenvalues.real, pred.eigenvalues.imag], axis=1),
        "observed": [o.row for o in obs],
        "observed_half": [classify_configuration(half[r], V, x0[r, 0], tol=tol).row
                          for r in range(len(x0))],
        "n_clusters": [o.n_clusters for o in obs], "max_dist_L": [o.max_dist_L for o in obs],
        "n_steps": traj.integrator["n_steps"],
        "final_speed": [float(np.linalg.norm(v, axis=-1).max())
                        for v in model.tangent_field(final)],
    }
    if pred.row in ("first-token", "point-in-L"):
        # meta-stable: several clusters, all in L, token 1 at the predicted point
        points = [predict_configuration(V, x0[r, 0]).point for r in range(len(x0))]
        rec["token1_to_point"] = [float(geodesic_distance(final[r, 0], p)) for r, p in
                                  enumerate(points)]
        rec["metastable"] = [o.row == "k-clusters" and o.max_dist_L <= tol and dist <= tol
                             for o, dist in zip(obs, rec["token1_to_point"])]
    if row == COMPLEX_ROW:
        w, vecs = np.linalg.eig(V)
        top = vecs[:, int(np.argmax(w.real))]
        plane = np.stack([top.real, top.imag], axis=1)
        rec["max_dist_plane"] = [float(distance_to_subspace(final[r], plane).max())
                                 for r in range(len(x0))]
    return rec


def _tally(records: list[dict[str, Any]]) -> tuple[int, int, int, Counter]:
    """(matches, meta-stable, total, Counter of the other observed rows)."""
    match = meta = total = 0
    others: Counter = Counter()
    for r in records:
        for i, o in enumerate(r["observed"]):
            total += 1
            if o == r["predicted"]:
                match += 1
            elif r.get("metastable", [False] * len(r["observed"]))[i]:
                meta += 1
            elif r["predicted"] == "two-points" and o == "point-in-L":
                others["all at one of +-xi"] += 1
            else:
                others[o] += 1
    return match, meta, total, others


def _row_claim(row: str, records: list[dict[str, Any]], params: dict[str, Any]) -> Claim:
    match, meta, total, others = _tally(records)
    by_qk = {qk: _tally([r for r in records if r["qk"] == qk]) for qk in params["qk"]}
    lam = SPECTRA[row]
    rate = match / total
    parts = [f"{match}/{total} runs as predicted at t = {params['t_end']:g} ("
             + ", ".join(f"Q, K {qk}: {m}/{t}" for qk, (m, _, t, _) in by_qk.items()) + ")"]
    if meta:
        parts.append(f"{meta} in meta-stable clusters inside L with token 1 at the predicted "
                     "point (cluster counts " + _counts_text(records) + ")")
    if others:
        parts.append("otherwise " + ", ".join(f"{k} x{v}" for k, v in others.most_common()))
    if row in ("cloud-L", "two-clouds"):
        dist = np.concatenate([r["max_dist_L"] for r in records])
        speed = np.concatenate([r["final_speed"] for r in records])
        parts.append(f"largest distance of a token to L: median {np.median(dist):.2f} rad "
                     f"(max {dist.max():.2f}); fastest token at t_end: median speed "
                     f"{np.median(speed):.1e} (max {speed.max():.1e})")
    notes = []
    if rate < 1 and meta:
        notes.append(f"{meta}/{total} sit in a few clusters inside L with token 1 at the "
                     "predicted point, consistent with the row as the t -> infinity limit but "
                     "not the configuration it names: merging far-apart clusters takes a time "
                     f"like exp(beta (1 - cos theta)), beyond t = {params['t_end']:g}")
    best = max(by_qk.items(), key=lambda kv: kv[1][0] / kv[1][2])
    if rate < best[1][0] / best[1][2]:
        notes.append(f"with Q, K {best[0]} {best[1][0]}/{best[1][2]} as predicted (see the Q, K "
                     "row)")
    return claim(f"atlas.{row.replace('-', '_')}", measured="; ".join(parts),
                 values={"as_predicted": rate}, note="; ".join(notes), eigenvalues=lam)


def _counts_text(records: list[dict[str, Any]]) -> str:
    c = Counter(k for r in records for k in r["n_clusters"])
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))


def _qk_claim(records: list[dict[str, Any]], params: dict[str, Any]) -> Claim:
    if len(params["qk"]) < 2:
        return not_run("atlas.qk", "one kind of Q, K only: not tested at these parameters")
    rates = {}
    for row in SPECTRA:
        mine = [r for r in records if r["row"] == row]
        rates[row] = {qk: _rate(mine, qk) for qk in params["qk"]}
    gaps = {row: max(v.values()) - min(v.values()) for row, v in rates.items()}
    (limit,) = {c.threshold for c in entry("atlas.qk").reproduced}
    differ = [row for row, g in gaps.items() if g > limit]
    return claim(
        "atlas.qk",
        measured="fraction as predicted (incl. meta-stable), " + "; ".join(
            f"{row}: " + ", ".join(f"{qk} {v:.0%}" for qk, v in rates[row].items())
            for row in SPECTRA) + f" (random Q, K: one draw per eigenbasis, "
        f"{len(params['bases'])} per row, {params['seeds']} initial configurations each)",
        values={"largest_gap": max(gaps.values()), "smallest_gap": min(gaps.values())},
        note="" if not differ else f"Q, K matter in rows {', '.join(differ)}: with random "
        "Q, K the tokens end elsewhere")


def _long_run(model: Attention, V: np.ndarray, row: str, basis: str, qk: str, x0: np.ndarray,
              params: dict[str, Any]) -> dict[str, Any]:
    """One setting at the long horizon: the configuration of each run at t_end and the time
    from which it stays the predicted one (inf: not as predicted at t_end)."""
    t_end = float(params["long_t_end"])
    save = np.concatenate([[0.0], np.geomspace(1.0, t_end, params["long_saves"])])
    traj = simulate(model, x0, t_end, save_at=save, method=params["long_method"],
                    rtol=params["rtol"], atol=params["rtol"] * 1e-3)
    pred = predict_configuration(V).row
    obs = [[classify_configuration(traj.states[i, r], V, x0[r, 0], tol=params["tol"])
            for r in range(len(x0))] for i in range(len(save))]  # (T, runs)
    seen = np.array([[o.row == pred for o in at] for at in obs])
    # the first save from which every later one is as predicted
    stays = np.logical_and.accumulate(seen[::-1], axis=0)[::-1]
    reach = [float(save[np.argmax(stays[:, r])]) if stays[-1, r] else float("inf")
             for r in range(len(x0))]
    final = traj.states[-1]
    return {"row": row, "basis": basis, "qk": qk, "predicted": pred,
            "observed": [o.row for o in obs[-1]], "n_clusters": [o.n_clusters for o in obs[-1]],
            "max_dist_L": [o.max_dist_L for o in obs[-1]],
            "final_speed": [float(np.linalg.norm(v, axis=-1).max())
                            for v in model.tangent_field(final)],
            "as_predicted": [bool(v) for v in seen[-1]], "time_to_reach": reach,
            "n_steps": traj.integrator["n_steps"], "wall_time": traj.wall_time}


def _long_claim(long: list[dict[str, Any]], params: dict[str, Any]) -> Claim:
    if not long:
        return not_run("atlas.long", "the long horizon runs at the full size only "
                       "(long_t_end = None)", beta=f"{params['long_beta']:g}", t_end="-")
    parts, share = [], {}
    for row in SPECTRA:
        mine = [r for r in long if r["row"] == row]
        _, _, total, others = _tally(mine)
        ok = [t for r in mine for t in r["time_to_reach"] if np.isfinite(t)]
        share[row] = len(ok) / total
        text = f"{row}: {len(ok)}/{total} as predicted at t = {params['long_t_end']:g}"
        if ok:
            text += f", reached by t = {np.median(ok):.3g} (median; max {max(ok):.3g})"
        if others:
            text += "; otherwise " + ", ".join(f"{k} x{v}" for k, v in others.most_common())
        if row in ("cloud-L", "two-clouds"):
            dist = np.concatenate([r["max_dist_L"] for r in mine])
            speed = np.concatenate([r["final_speed"] for r in mine])
            text += (f"; largest distance of a token to L: median {np.median(dist):.2f} rad; "
                     f"fastest token at t_end: median speed {np.median(speed):.1e}")
        parts.append(text)
    wall = sum(r["wall_time"] for r in long)
    return claim(
        "atlas.long", measured="; ".join(parts)
        + f" (beta = {params['long_beta']:g}, {params['long_method']} with the exact Jacobian, "
        f"{len(long)} settings of {params['seeds']} runs, {wall / 60:.1f} min of integration)",
        values={"smallest_share": min(share.values())},
        beta=f"{params['long_beta']:g}", t_end=f"{params['long_t_end']:g}")


def _rate(records: list[dict[str, Any]], qk: str) -> float:
    m, meta, t, _ = _tally([r for r in records if r["qk"] == qk])
    return (m + meta) / t if t else float("nan")


def _complex_note(records: list[dict[str, Any]]) -> str:
    if not records:
        return ""
    a, b, c = COMPLEX
    dist = max(max(r["max_dist_plane"]) for r in records)
    speed = np.concatenate([r["final_speed"] for r in records])
    by_qk = "; ".join(f"Q, K {qk}: cluster counts "
                      + _counts_text([r for r in records if r["qk"] == qk])
                      for qk in dict.fromkeys(r["qk"] for r in records))
    return (f"Complex pair on top (eigenvalues {a:g} ± {b:g}i and {c:g}; not covered by the "
            f"atlas, reported as observed): every token ends within {dist:.1e} rad of the "
            f"invariant plane of the complex pair and keeps turning in it (final speed "
            f"{speed.min():.2f} to {speed.max():.2f}); {by_qk}. So: rotating clusters in "
            "that plane, not a fixed configuration.")


def _movie(traj, out: Path) -> str:
    """atlas.gif: run 0 of the first atlas row on the sphere (80 frames evenly over the saved
    times: the dense early saves show the first clusters form)."""
    animate(traj, out / "atlas.gif", run=0, frames=min(80, len(traj.times)), fps=10, size=320)
    return "atlas.gif"


def _spheres(shown: dict[str, Any], params: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(3.3 * 3, 3.6 * 2), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    for ax, (row, (traj, rec)) in zip(axes, shown.items()):
        lam = (f"{COMPLEX[0]:g} ± {COMPLEX[1]:g}i, {COMPLEX[2]:g}" if row == COMPLEX_ROW else
               ", ".join(f"{v:g}" for v in SPECTRA[row]))
        if row == COMPLEX_ROW:  # the tokens turn forever: show how they reach the plane
            t_show = min(2 * np.pi / COMPLEX[1], params["t_end"])  # about one turn
            plot_sphere(traj, t=t_show, run=0, ax=ax, colorbar=False)
            ax.set_title(f"complex pair on top: eigenvalues {lam}\nt <= {t_show:.2g} (red: "
                         f"t = {t_show:.2g}); the tokens keep turning in a plane", fontsize=9)
            continue
        plot_sphere(traj, run=0, ax=ax, colorbar=False)
        seen = rec["observed"][0]
        if seen == "k-clusters":
            seen = f"{rec['n_clusters'][0]} clusters"
        ax.set_title(f"{row}: eigenvalues of V {lam}\nobserved (run 0): {seen}", fontsize=9)
    for ax in axes[len(shown):]:
        ax.set_axis_off()
    fig.suptitle(f"Causal attention on S^2, Q = K = I, symmetric V, n = {params['n']}, "
                 f"beta = {params['beta']:g}, t from 0 to {params['t_end']:g} (final points red)")
    return fig


def _table(records: list[dict[str, Any]], params: dict[str, Any]) -> Figure:
    rows = [*SPECTRA, COMPLEX_ROW]
    fig = Figure(figsize=(5.2 * len(params["qk"]), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(params["qk"])))
    for ax, qk in zip(axes, params["qk"]):
        M = np.zeros((len(rows), len(OBSERVED)), dtype=int)
        for r in records:
            if r["qk"] != qk:
                continue
            for o in r["observed"]:
                M[rows.index(r["row"]), OBSERVED.index(o)] += 1
        ax.imshow(M / np.maximum(M.sum(1, keepdims=True), 1), cmap="Blues", vmin=0, vmax=1)
        for i in range(len(rows)):
            for j in range(len(OBSERVED)):
                if M[i, j]:
                    bold = rows[i] == OBSERVED[j] if j < len(SPECTRA) else False
                    ax.text(j, i, str(M[i, j]), ha="center", va="center", fontsize=8,
                            fontweight="bold" if bold else "normal",
                            color="white" if M[i, j] > 0.6 * M[i].sum() else "black")
        ax.set_xticks(range(len(OBSERVED)), OBSERVED, rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), [f"{r} (predicted)" if r != COMPLEX_ROW else
                                         "complex pair (not covered)" for r in rows], fontsize=8)
        ax.set_xlabel(f"observed at t = {params['t_end']:g}")
        ax.set_title("Q = K = I" if qk == "identity" else f"Q, K {qk}", fontsize=10)
    fig.suptitle(f"Atlas: predicted vs observed final configuration (runs; {params['seeds']} "
                 "seeds x eigenbases per row)")
    fig.supxlabel("k-clusters in the first-token and point-in-L rows: meta-stable clusters "
                  "inside L (see the claims); in the complex row: clusters turning in a plane",
                  fontsize=8)
    return fig
