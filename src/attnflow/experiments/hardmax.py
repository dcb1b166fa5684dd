"""Hardmax attention (beta = inf) on the sphere: leaders, events, the limit of large beta
(Alcalde, Geshkovski, Ruiz-Balet, arXiv 2508.09628; Alcalde, Fantuzzi, Zuazua, arXiv
2407.01602; docs/science.md §11.6).

Post-LN, V = I: token i moves along the great circle towards its leader (velocity P_{x_i}
x_L, so the angle psi to a fixed leader obeys psi' = -sin psi). Integrated by the events
method (`attnflow.events`): RK4 at dt with every leader change located.

* vertices: full mask on the circle, Q = R(phi) (B = R(phi), whose symmetric part cos(phi) I
  is positive definite), K = V = I. A vertex is a token that leads itself (argmax_j <B x_v,
  x_j> = v: no other token within (theta_v, theta_v + 2 phi)); a cell token is one whose
  leader is a vertex. Derived (§11.6): a vertex without events never moves; a cell token
  following a fixed vertex keeps that leader against every other fixed key (its path is a
  positive combination of its start and the vertex) and its angle to it follows
  tan(psi/2) = tan(psi_0/2) e^{-t}. (With a symmetric B = M^T M on S^2 a token's own score
  can overtake its leader's and the flow slides along that tie: another picture than the
  papers', docs/science.md §11.6.)
* rate: causal mask on the circle, Q = R(phi) (a rotation, B = R(phi) with positive definite
  symmetric part cos(phi) I), K = V = I: softmax at beta against hardmax at a fixed time t,
  dopri5 at tight tolerances for finite beta.
* causal: V = I, causal. Q = K = I: every token leads itself (<x_k, x_k> = 1 is the
  largest score), so nothing moves at beta = inf. Q = R(phi): a token follows the earlier
  token nearest to theta_k + phi when one lies within phi of that point, else stays; token 1
  never moves; every token ends on the start of a token that never moved.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.events import SlidingError
from attnflow.experiments._ledger import claim
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure
from attnflow.family import Attention
from attnflow.kernels.hardmax import leaders
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform

PAPERS = ("2508.09628", "2407.01602")
NAME = "hardmax"
TITLE = "Hardmax attention (beta = inf): leaders, events and the limit of large beta"
QUICK: dict[str, Any] = {
    "vertices": {"n": 10, "runs": 4, "t_end": 8.0, "dt": 0.02, "phi": 0.6},
    "rate": {"n": 6, "runs": 2, "t": 2.0, "phi": 0.8, "betas": [10.0, 100.0, 1000.0],
             "dt": 0.01, "rtol": 1e-10},
    "causal": {"n": 10, "runs": 4, "t_end": 15.0, "dt": 0.05, "phi": 0.8},
}
FULL: dict[str, Any] = {
    "vertices": {**QUICK["vertices"], "n": 12, "runs": 40, "t_end": 15.0},
    "rate": {**QUICK["rate"], "n": 8, "runs": 8, "dt": 0.005,
             "betas": [10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0]},
    "causal": {**QUICK["causal"], "n": 32, "runs": 40, "t_end": 25.0, "dt": 0.02},
}
FULL_MINUTES = 6
STILL = 1e-12  # rad: a token that moved less never left its start (rounding per step ~1e-16)
AT_FIRST = 1e-3  # rad: a run counted as ending at x_1(0) (a reported count, not a criterion)


def rotation(phi: float) -> np.ndarray:
    """R(phi), the rotation of the plane by phi."""
    return np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    rng = np.random.default_rng(seed)
    vert = _vertices(params["vertices"], rng)
    progress(0.3)
    rate = _rate(params["rate"], rng)
    progress(0.7)
    causal = _causal(params["causal"], rng)
    progress(1.0)
    claims = [_vertices_claim(vert), _rate_claim(rate), _causal_claim(causal)]
    figures = [save_figure(_vertices_figure(vert), out, "hardmax_vertices.png"),
               save_figure(_rate_figure(rate), out, "hardmax_rate.png"),
               save_figure(_causal_figure(causal), out, "hardmax_causal.png")]
    v, r, c = params["vertices"], params["rate"], params["causal"]
    notes = [f"vertices: n = {v['n']} on the circle, {v['runs']} runs, full mask, Q = "
             f"R({v['phi']:g}), events method dt = {v['dt']:g} to t = {v['t_end']:g}; "
             f"{vert['events']} events in all, {vert['stops']} of them cell tokens stopping "
             "short of their vertex.",
             f"rate: n = {r['n']} on the circle, causal, Q = R({r['phi']:g}), {r['runs']} runs, "
             f"hardmax by events (dt = {r['dt']:g}), softmax by dopri5 (rtol = {r['rtol']:g}) "
             f"at t = {r['t']:g}.",
             f"causal: n = {c['n']} on the circle, {c['runs']} runs to t = {c['t_end']:g}; "
             f"first-token picture in {causal['one_cluster']} of "
             f"{c['runs'] - causal['sliding']} runs integrated, "
             f"{causal['mean_clusters']:.2f} final points per run on average."]
    numbers = {"vertices": {k: vert[k] for k in ("vertex_motion", "closed_form_error",
                                                  "switches_to_other", "events", "stops",
                                                  "cell_tokens", "checked_tokens")},
               "rate": {k: rate[k] for k in ("betas", "distance", "slope")},
               "causal": {k: causal[k] for k in ("identity_motion", "token1_motion",
                                                 "final_off", "one_cluster", "mean_clusters")}}
    return Output(numbers, claims, figures, notes)


# ---------------------------------------------------------------------------- vertices
def _vertices(p: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    model = Attention(rotation(p["phi"]), None, None, beta=np.inf, mask="full")
    x0 = _cells_only(model, p["n"], p["runs"], rng)
    times = np.linspace(0.0, p["t_end"], 41)
    tr = simulate(model, x0, p["t_end"], save_at=times, method="events", dt=p["dt"])
    lead = leaders(*model.hardmax_scores(x0))  # (runs, n, n)
    own = np.arange(p["n"])
    vertex = lead[:, own, own] & (lead.sum(axis=-1) == 1)
    moved_by_event = np.zeros((p["runs"], p["n"]), bool)
    events = tr.integrator["events"]
    for _t, run, token, _old, _new in events:
        moved_by_event[run, token] = True
    fixed = vertex & ~moved_by_event
    motion = geodesic_distance(tr.states, x0[None])  # (T, runs, n)
    vertex_motion = float(motion[:, fixed].max()) if fixed.any() else 0.0
    leader = np.argmax(lead, axis=-1)
    cell = ~vertex & (lead.sum(axis=-1) == 1) & np.take_along_axis(vertex, leader, axis=-1)
    target = np.take_along_axis(x0, leader[..., None], axis=-2)
    psi0 = geodesic_distance(x0, target)
    psi = geodesic_distance(tr.states, target[None])
    want = 2 * np.arctan(np.tan(psi0 / 2)[None] * np.exp(-times)[:, None, None])
    leader_fixed = np.take_along_axis(fixed, leader, axis=-1)
    checked = cell & ~moved_by_event & leader_fixed
    error = float(np.abs(psi - want)[:, checked].max()) if checked.any() else float("nan")
    switches = stops = 0
    for _t, run, token, _old, new in events:
        if cell[run, token]:
            stops += new == [token]
            switches += new != [token]
    return {"times": times, "psi": psi, "want": want, "checked": checked,
            "vertex_motion": vertex_motion, "closed_form_error": error,
            "switches_to_other": switches, "events": len(events), "stops": stops,
            "cell_tokens": int(cell.sum()), "checked_tokens": int(checked.sum())}


def _cells_only(model: Attention, n: int, runs: int, rng: np.random.Generator,
                batch: int = 2048, tries: int = 100) -> np.ndarray:
    """`runs` draws of n uniform tokens on the circle in which every token is a vertex (leads
    itself) or follows one (the self-inclusion condition under which arXiv 2508.09628's code
    draws its examples): chains of moving leaders, where the flow may slide, are left out.
    Drawn `batch` at a time, kept in the order drawn."""
    own = np.arange(n)
    kept: list[np.ndarray] = []
    for _ in range(tries):
        x = uniform((batch, n), 2, rng)
        lead = leaders(*model.hardmax_scores(x))
        single = lead.sum(axis=-1) == 1
        vertex = single & lead[:, own, own]
        ok = np.all(single & np.take_along_axis(vertex, np.argmax(lead, axis=-1), axis=-1),
                    axis=-1)
        kept.extend(x[ok])
        if len(kept) >= runs:
            return np.stack(kept[:runs])
    raise RuntimeError(f"fewer than {runs} starts with vertices and cells only in "
                       f"{tries * batch} draws of {n} tokens")


def _vertices_claim(v: dict[str, Any]) -> Claim:
    return claim(
        "hardmax.vertices",
        measured=f"{v['cell_tokens']} cell tokens ({v['checked_tokens']} without events, "
                 f"checked against the closed form), {v['events']} events ({v['stops']} "
                 f"stops); vertices moved by at most {v['vertex_motion']:.2g} rad, the closed "
                 f"form held to {v['closed_form_error']:.2g} rad, "
                 f"{v['switches_to_other']} switches of a cell token to another token",
        values={"vertex_motion": v["vertex_motion"],
                "closed_form_error": v["closed_form_error"],
                "switches_to_other": v["switches_to_other"]})


def _vertices_figure(v: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    t = v["times"]
    idx = np.argwhere(v["checked"])[:12]
    for k, (run, token) in enumerate(idx):
        ax.semilogy(t, v["psi"][:, run, token], "o", ms=3, color=f"C{k % 10}")
        ax.semilogy(t, v["want"][:, run, token], "-", lw=0.8, color=f"C{k % 10}")
    ax.set(xlabel="time t", ylabel="angle psi to the leader (rad)",
           title="beta = inf, full mask, Q = R(phi): tokens approach their vertex")
    ax.plot([], [], "ko", ms=3, label="events method")
    ax.plot([], [], "k-", lw=0.8, label="2 arctan(tan(psi0/2) e^-t)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- rate
def _rate(p: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    R = rotation(p["phi"])
    x0 = uniform((p["runs"], p["n"]), 2, rng)
    save = [0.0, p["t"]]
    hard, x0, sliding = _per_run(Attention(R, None, None, beta=np.inf, mask="causal"), x0,
                                 p["t"], save, p["dt"])
    distance = []
    for beta in p["betas"]:
        soft = simulate(Attention(R, None, None, beta=beta, mask="causal"), x0, p["t"],
                        save_at=save, method="dopri5", rtol=p["rtol"], atol=p["rtol"] / 100)
        distance.append(float(geodesic_distance(soft.states[-1], hard["states"][-1]).max()))
    positive = np.asarray(distance) > 0  # 0: softmax equal to hardmax in float64
    slope = float(np.polyfit(np.log(np.asarray(p["betas"])[positive]),
                             np.log(np.asarray(distance)[positive]), 1)[0]) \
        if positive.sum() >= 2 else float("nan")
    return {"betas": list(p["betas"]), "distance": distance, "slope": slope, "t": p["t"],
            "events": hard["events"], "sliding": sliding, "runs": p["runs"]}


def _rate_claim(r: dict[str, Any]) -> Claim:
    d = r["distance"]
    falls = all(b < a for a, b in zip(d, d[1:]))
    return claim(
        "hardmax.rate",
        measured=", ".join(f"beta={b:g}: {x:.3g} rad" for b, x in zip(r["betas"], d))
                 + f"; fitted exponent {r['slope']:.2f}; {r['events']} events in the "
                   f"hardmax runs; {r['sliding']} of {r['runs']} runs left out (unresolved "
                   "sliding)",
        values={"monotone": falls, "ratio": d[0] / d[-1] if d[-1] > 0 else np.inf,
                "slope": r["slope"]})


def _rate_figure(r: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(5.0, 3.8))
    ax = fig.subplots()
    b = np.asarray(r["betas"])
    ax.loglog(b, r["distance"], "o-", label=f"max distance to beta = inf at t = {r['t']:g}")
    for order, style in ((1, ":"), (2, "--")):
        ax.loglog(b, r["distance"][0] * (b / b[0]) ** -order, "k" + style, lw=0.8,
                  label=f"beta^-{order}")
    ax.set(xlabel="beta", ylabel="geodesic distance (rad)",
           title=f"softmax -> hardmax (fitted exponent {r['slope']:.2f})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- causal
def _causal(p: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    x0 = uniform((p["runs"], p["n"]), 2, rng)
    times = np.linspace(0.0, p["t_end"], 61)
    with _still_expected():  # the claim measures it: Q = K = I moves nothing
        ident = simulate(Attention(beta=np.inf, mask="causal"), x0, p["t_end"],
                         save_at=[0.0, p["t_end"]], method="events", dt=0.25)
    identity_motion = float(geodesic_distance(ident.states[-1], x0).max())
    tr, x0, sliding = _per_run(Attention(rotation(p["phi"]), None, None, beta=np.inf,
                                         mask="causal"), x0, p["t_end"], times, p["dt"])
    states = tr["states"]
    moved = geodesic_distance(states, x0[None]).max(axis=0)  # (runs, n)
    still = moved <= STILL  # rounding: P_x(x) = x - <x, x> x is ~1e-16, not 0
    end = states[-1]
    off = geodesic_distance(end[:, :, None], x0[:, None, :])  # (runs, n, n): to each start
    final_off = float(np.where(still[:, None, :], off, np.inf).min(axis=-1).max())
    clusters = still.sum(axis=-1)  # every final point is a still token's start
    one = int(np.sum(geodesic_distance(end, x0[:, :1]).max(axis=-1) < AT_FIRST))
    return {"times": times, "theta": np.arctan2(states[..., 1], states[..., 0]),
            "still": still, "identity_motion": identity_motion,
            "token1_motion": float(moved[:, 0].max()), "final_off": final_off,
            "one_cluster": one, "mean_clusters": float(clusters.mean()),
            "events": tr["events"], "sliding": sliding, "runs": len(x0) + sliding}


@contextlib.contextmanager
def _still_expected() -> Iterator[None]:
    """simulate's warning that hardmax left every token still, silenced where the recipe
    measures the motion itself."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="hardmax attention left every token still")
        yield


def _per_run(model: Attention, x0: np.ndarray, t_end: float, times: Any, dt: float
             ) -> tuple[dict[str, Any], np.ndarray, int]:
    """The events method run by run: the states of the runs that did not slide (T, runs, n,
    d) and their event count, their starts, and how many runs slid (`SlidingError`)."""
    states, starts, events = [], [], 0
    for x in x0:
        try:
            with _still_expected():  # a run whose tokens all lead themselves is counted
                tr = simulate(model, x, t_end, save_at=times, method="events", dt=dt)
        except SlidingError:
            continue
        states.append(tr.states)
        starts.append(x)
        events += len(tr.integrator["events"])
    if not states:
        raise SlidingError(f"runs: expected one run without sliding, received {len(x0)} "
                           "that slid")
    return ({"states": np.stack(states, axis=1), "events": events}, np.stack(starts),
            len(x0) - len(states))


def _causal_claim(c: dict[str, Any]) -> Claim:
    return claim(
        "hardmax.causal",
        measured=f"Q = K = I: largest motion {c['identity_motion']:.2g} rad; Q = R(phi): "
                 f"token 1 moved {c['token1_motion']:.2g} rad, every token ends within "
                 f"{c['final_off']:.2g} rad of a still token's start; {c['events']} events; "
                 f"{c['sliding']} of {c['runs']} runs left out (unresolved sliding); "
                 f"one cluster at x_1(0) in {c['one_cluster']} runs, "
                 f"{c['mean_clusters']:.2f} final points per run",
        values={"identity_motion": c["identity_motion"], "token1_motion": c["token1_motion"],
                "final_off": c["final_off"]})


def _causal_figure(c: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    theta = np.unwrap(c["theta"][:, 0], axis=0)  # run 0: (T, n)
    n = theta.shape[1]
    colors = [_token_color(k, n) for k in range(n)]
    for k in range(n):
        ax.plot(c["times"], theta[:, k], color=colors[k], lw=1.0)
    still = theta[0, np.flatnonzero(c["still"][0])]
    lo, hi = theta.min() - 0.1, theta.max() + 0.1
    rings = [a + k * 2 * np.pi for a in still for k in (-1, 0, 1) if lo <= a + k * 2 * np.pi <= hi]
    ax.plot(np.zeros(len(rings)), rings, "o", mfc="none", mec="red", ms=7,
            label="starts of tokens that never move (and +-2 pi)")
    ax.set(xlabel="time t", ylabel="angle theta_k (rad)",
           title="beta = inf, causal, Q = R(phi): one run (colour = token index)")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _token_color(k: int, n: int) -> tuple[float, ...]:
    from matplotlib import colormaps

    return colormaps["viridis"](0.875 * k / max(1, n - 1))
