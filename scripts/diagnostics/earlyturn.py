"""Why the particles' right end of the lostmiddle profile turns early (docs/science.md §11.1):
the numbers behind the section, rerunnable.

    PYTHONPATH=$PWD/src python3 scripts/diagnostics/earlyturn.py [RUNS.npz[+MORE.npz] ...]

(a+b: the runs of several files of the same setting and n pooled.)

1. The finite-n linear theory (`attnflow.analysis.closedforms.token_memory`: the label equation on n
   discrete tokens, with attnflow's self-inclusive normaliser and with the source's strict
   one) against the closed form on the recipe's full-size cells: the crossing of the
   recipe's statistic and the deficit of the first and of the last source cell. (Seconds.)
2. For each file of particle runs written by earlyturn_runs.py (the recipe's own cell
   moments): the recipe's crossing and its jackknife error; the right-end slopes against
   the closed form's in standard errors; the slopes' jackknife correlation across the four
   times; Fieller's 95 % interval for the crossing alpha / gamma (the ratio's exact interval
   for Gaussian (alpha, gamma), where the jackknife's linearisation fails); the z of
   alpha - T gamma at T = the closed form's crossing (a linear statistic); the crossing's
   distribution when the closed form's slopes carry Gaussian noise of the measured
   covariance; the fitted level of the profile against the closed form and against the
   finite-n linear theory.
3. The committed full-size run (docs/results/full/lostmiddle), reread with the correlation
   of the slopes measured in 2 for the same setting (the se's are the run's own).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.signal import lfilter
from scipy.special import gammaln

from attnflow.analysis.closedforms import (
    dispersion_rate,
    hardy_label,
    recency_time,
    soft_weights,
    token_memory,
)
from attnflow.analysis.kinetic import SOFT_MODES
from attnflow.experiments import lostmiddle as lm
from attnflow.experiments._cells import CellMoments

PARAMS = {**lm.FULL}
EDGES = lm._edges(PARAMS)
SETTINGS = [(1.0, 1.0), (1.0, 3.0), (2.0, 1.0)]
FULL = Path(__file__).resolve().parents[2] / "docs/results/full/lostmiddle/result.json"


def times_of(beta: float, lam: float) -> np.ndarray:
    return np.array([f * recency_time(beta, lam) for f in PARAMS["factors"]])


def linear_cells(n: int, beta: float, lam: float, self_key: bool = True) -> np.ndarray:
    """The finite-n linear theory's soft accuracy on the recipe's cells (T, S - 1)."""
    r = dispersion_rate(np.arange(1, SOFT_MODES + 1), beta, attention="unnormalised")
    t = times_of(beta, lam)
    tau = (t[:, None] * r[None]).ravel()
    mem = token_memory(n, EDGES, tau, lam, self_key=self_key).reshape(len(t), len(r), -1)
    return np.einsum("k,tkb->tb", soft_weights(), mem)


def _series() -> np.ndarray:
    """g_N = N! sum_{a+b=N} 1 / (a! (a+1)! b! (b+1)!), N < 120: int_0^inf psi_tau(y)^2 e^-y dy
    = sum_N g_N tau^{N+2} (psi_tau(y) = sum_a tau^{a+1} y^a / (a! (a+1)!))."""
    g = np.zeros(120)
    for N in range(120):
        a = np.arange(N + 1)
        g[N] = np.exp(gammaln(N + 1) - gammaln(a + 1) - gammaln(a + 2) - gammaln(N - a + 1)
                      - gammaln(N - a + 2)).sum()
    return g


SERIES = _series()
POWERS = np.arange(120)


def spreading(n: int, beta: float, lam: float, t: float, u: np.ndarray) -> np.ndarray:
    """V(u, t) (len(u),): the variance of the linear displacement of the token at label u."""
    m = np.arange(1, SOFT_MODES + 1)
    tau = dispersion_rate(m, beta, attention="unnormalised")[:, None] * t
    j0 = np.sum(SERIES * tau ** (POWERS + 2), axis=1)
    j1 = np.sum(SERIES / 2.0 ** (POWERS + 1) * tau ** (POWERS + 2), axis=1)
    sig = hardy_label(u, lam)
    return 2 * (np.sum(j0 / m**2) + lam * sig * np.sum(j1 / m**2)) / (n * sig)


def spread_cells(n: int, beta: float, lam: float, step: float = 0.02,
                 cap: float = 50.0) -> np.ndarray:
    """The closure's soft accuracy on the recipe's cells (T, S - 1) (module docstring)."""
    a, labels = np.exp(-lam / n), np.arange(1, n + 1)
    P = (1 - a**labels) / (1 - a)  # attnflow's self-inclusive normaliser
    u = labels / n
    cell = np.searchsorted(EDGES, u * (1 - 1e-12)) - 1
    S = len(EDGES) - 1
    k = np.arange(1, SOFT_MODES + 1)[:, None]
    r = dispersion_rate(k[:, 0], beta, attention="unnormalised")[:, None]

    def log_damping(s: float) -> np.ndarray:  # (modes, n)
        return -np.minimum(k**2 / 2 * spreading(n, beta, lam, s, u)[None], cap)

    def rhs(s: float, x: np.ndarray) -> np.ndarray:  # d/ds of the adjoint, -r D W^T D^-1 x
        ld = log_damping(s)
        back = lfilter([0.0, a], [1.0, -a], (x * np.exp(-ld) / P)[:, ::-1], axis=-1)
        return -r * np.exp(ld) * back[:, ::-1]

    out = []
    for T in times_of(beta, lam):
        m = max(1, int(np.ceil(T / step)))
        h = T / m
        x = np.exp(log_damping(T)) * ((cell == S - 1) / np.sum(cell == S - 1))[None]
        for i in range(m):
            s = T - i * h
            k1 = rhs(s, x)
            k2 = rhs(s - h / 2, x - h / 2 * k1)
            k3 = rhs(s - h / 2, x - h / 2 * k2)
            x = x - h / 6 * (k1 + 2 * k2 + 2 * k3 + rhs(s - h, x - h * k3))
        out.append([n * x[:, cell == b].mean(axis=1) for b in range(S - 1)])
    return np.einsum("k,tbk->tb", soft_weights(), np.array(out))


def fit(times: np.ndarray, slope: np.ndarray, se: np.ndarray) -> np.ndarray:
    """(alpha, gamma) of the recipe's weighted fit slope(t) = t (alpha - gamma t)."""
    X = np.stack([times, -times**2], axis=1) / se[:, None]
    return np.linalg.lstsq(X, slope / se, rcond=None)[0]


def fieller(ag: np.ndarray, cov: np.ndarray, z: float = 1.96) -> str:
    """Fieller's interval for alpha / gamma: the T with (alpha - T gamma)^2 <= z^2
    Var(alpha - T gamma)."""
    (a, g), ((vaa, vag), (_, vgg)) = ag, cov
    A, B, C = g * g - z * z * vgg, -2 * (a * g - z * z * vag), a * a - z * z * vaa
    disc = B * B - 4 * A * C
    if A > 0 and disc >= 0:
        lo, hi = sorted([(-B - np.sqrt(disc)) / (2 * A), (-B + np.sqrt(disc)) / (2 * A)])
        return f"[{lo:.3f}, {hi:.3f}]"
    return "unbounded (gamma not distinguished from 0)"


def part_linear() -> None:
    print("1. finite-n linear theory (token_memory) on the recipe's cells, last time 1.25 t_crit")
    for beta, lam in SETTINGS:
        t = times_of(beta, lam)
        closed = lm._closed_cells(list(t), beta, lam, EDGES)
        cross = lm._crossing(t, lm._slopes(closed, EDGES, PARAMS), np.ones(len(t)))
        print(f"  ({beta:g}, {lam:g}): closed form on the cells crosses at {cross:.4f}")
        for n in (2500, 10_000, 40_000):
            for self_key in (True, False):
                d = linear_cells(n, beta, lam, self_key)
                x = lm._crossing(t, lm._slopes(d, EDGES, PARAMS), np.ones(len(t)))
                print(f"    n {n:6d}, {'self-inclusive' if self_key else 'strict        '}: "
                      f"crossing {x:.4f}, first cell / closed {d[-1, 0] / closed[-1, 0]:.4f}, "
                      f"last source cell / closed {d[-1, -1] / closed[-1, -1]:.5f}")
    beta, lam = 2.0, 1.0
    t = times_of(beta, lam)
    closed = lm._closed_cells(list(t), beta, lam, EDGES)
    print(f"  the tokens' spreading (second-order closure), ({beta:g}, {lam:g}):")
    for n in (2500, 10_000, 40_000):
        d = spread_cells(n, beta, lam)
        x = lm._crossing(t, lm._slopes(d, EDGES, PARAMS), np.ones(len(t)))
        print(f"    n {n:6d}: crossing {x:.4f}; first cell / closed at the four times "
              + ", ".join(f"{v:.3f}" for v in d[:, 0] / closed[:, 0])
              + f"; last source cell at 1.25 t_crit {d[-1, -1] / closed[-1, -1]:.3f}")


def jack(m: CellMoments, groups: int):
    """The recipe's estimates and their leave-one-group-out replicates: soft (T, S-1) and
    slopes (T,), replicates (G, T, S-1) and (G, T)."""
    R = m.A.shape[0]
    soft = lm._soft(m)
    parts = np.array_split(np.arange(R), groups)
    soft_j = np.stack([lm._soft(m.take(np.setdiff1d(np.arange(R), g))) for g in parts])
    slope = lm._slopes(soft, EDGES, PARAMS)
    slope_j = np.stack([lm._slopes(s, EDGES, PARAMS) for s in soft_j])
    return soft, slope, soft_j, slope_j


def jcov(x: np.ndarray) -> np.ndarray:
    G = x.shape[0]
    d = x - x.mean(axis=0)
    return (G - 1) / G * np.einsum("gi,gj->ij", d.reshape(G, -1), d.reshape(G, -1))


def crossing_report(t, slope, slope_se, cov_slope, closed_slope) -> None:
    X = np.stack([t, -t**2], axis=1) / slope_se[:, None]
    L = np.linalg.pinv(X) / slope_se[None, :]  # (alpha, gamma) = L @ slope
    ag, cov = L @ slope, L @ cov_slope @ L.T
    T = lm._crossing(t, closed_slope, np.ones(len(t)))
    w = np.array([1.0, -T])
    zlin = (w @ ag) / np.sqrt(w @ cov @ w)
    print(f"    Fieller 95 % interval for the crossing {fieller(ag, cov)}; "
          f"alpha - T gamma at T = {T:.3f} (closed form's cells): {zlin:+.2f} se")
    draws = np.random.default_rng(7).multivariate_normal(closed_slope, cov_slope, size=20_000)
    cross = (L @ draws.T)
    cross = cross[0] / cross[1]
    q = np.quantile(cross, [0.025, 0.16, 0.5, 0.84, 0.975])
    print(f"    closed-form slopes + Gaussian noise of this covariance: crossing quantiles "
          f"2.5/16/50/84/97.5 % = {', '.join(f'{v:.3f}' for v in q)}; "
          f"P(crossing <= 0.5 T) = {np.mean(cross <= 0.5 * T):.3f}")


def part_runs(files: list[str], corr_of: dict) -> None:
    print("2. particle runs (the recipe's cells, times and estimators)")
    for f in files:
        parts = [np.load(g) for g in f.split("+")]  # a+b+c: the runs of several files pooled
        z = {**parts[0], "seed": np.array([int(p["seed"]) for p in parts]),
             "cpu": sum(float(p["cpu"]) for p in parts)}
        m = CellMoments(np.concatenate([p["A"] for p in parts]),
                        np.concatenate([p["B"] for p in parts]), z["sizes"])
        beta, lam, n = float(z["beta"]), float(z["slope"]), int(z["n"])
        t = times_of(beta, lam)
        closed = lm._closed_cells(list(t), beta, lam, EDGES)
        closed_slope = lm._slopes(closed, EDGES, PARAMS)
        soft, slope, soft_j, slope_j = jack(m, PARAMS["groups"])
        se_soft = np.sqrt(np.diag(jcov(soft_j))).reshape(soft.shape)
        cov_slope = jcov(slope_j)
        se = np.sqrt(np.diag(cov_slope))
        corr = cov_slope / np.outer(se, se)
        corr_of[(beta, lam)] = corr
        t_hat = lm._crossing(t, slope, se)
        t_j = np.array([lm._crossing(t, s, se) for s in slope_j])
        G = len(t_j)
        t_se = np.sqrt((G - 1) / G * np.sum((t_j - t_j.mean()) ** 2))
        print(f"  {Path(f).name}: ({beta:g}, {lam:g}), n {n}, {m.A.shape[0]} runs, seeds "
              f"{z['seed'].tolist()}, {z['cpu']:.0f} s CPU")
        print(f"    crossing {t_hat:.3f} +- {t_se:.3f} (jackknife) against the cells' "
              f"{lm._crossing(t, closed_slope, np.ones(len(t))):.3f}, t_crit "
              f"{recency_time(beta, lam):.3f}")
        print("    right-end slopes (particles - closed) / se at 0.5..1.25 t_crit: "
              + ", ".join(f"{(a - c) / s:+.2f}" for a, c, s in zip(slope, closed_slope, se))
              + f"; se {', '.join(f'{s:.2f}' for s in se)}; closed "
              + ", ".join(f"{c:.2f}" for c in closed_slope))
        print("    correlation of the slopes across the times:\n      "
              + "\n      ".join(" ".join(f"{c:+.2f}" for c in row) for row in corr))
        crossing_report(t, slope, se, cov_slope, closed_slope)
        lin = linear_cells(n, beta, lam)
        for name, ref in (("closed form", closed), ("finite-n linear theory", lin)):
            w = 1 / se_soft**2
            r = np.sum(w * soft * ref) / np.sum(w * ref**2)
            r_j = [np.sum(w * s * ref) / np.sum(w * ref**2) for s in soft_j]
            r_se = np.sqrt((G - 1) / G * np.sum((np.array(r_j) - np.mean(r_j)) ** 2))
            print(f"    level: particles / {name} {r:.4f} +- {r_se:.4f}; first cell at 1.25 "
                  f"t_crit {soft[-1, 0] / ref[-1, 0]:.3f} +- {se_soft[-1, 0] / ref[-1, 0]:.3f}, "
                  f"last source cell {soft[-1, -1] / ref[-1, -1]:.3f} +- "
                  f"{se_soft[-1, -1] / ref[-1, -1]:.3f}")


def part_full(corr_of: dict) -> None:
    if not FULL.exists() or not corr_of:
        return
    print("3. the committed full-size run (n = 1e4, 1024 runs) with the slopes' correlation "
          "from 2")
    for r in json.loads(FULL.read_text())["numbers"]["settings"]:
        key = (r["beta"], r["slope"])
        if key not in corr_of:
            continue
        se = np.asarray(r["right_slope_se"])
        cov = corr_of[key] * np.outer(se, se)
        t = np.asarray(r["times"])
        print(f"  ({key[0]:g}, {key[1]:g}): crossing {r['t_hat']:.3f} +- {r['t_hat_se']:.3f} "
              "(jackknife, as committed)")
        crossing_report(t, np.asarray(r["right_slope"]), se, cov,
                        np.asarray(r["right_slope_closed"]))


if __name__ == "__main__":
    part_linear()
    corr: dict = {}
    part_runs(sys.argv[1:], corr)
    part_full(corr)
