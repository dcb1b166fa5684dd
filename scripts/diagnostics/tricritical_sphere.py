"""Why the S^2 sweeps of recipe tricritical miss (issue 43): the particles' hold at one
strength against the S^2 mean-field solver at the same strength, and against a longer hold,
a smaller step and a larger n.

    PYTHONPATH=src python3 scripts/diagnostics/tricritical_sphere.py [continuous|first_order]

continuous (beta = 1 < beta_*, about 25 s of CPU): the up sweep's hold at 1.15 K_#, from the
state the 0.8 K_# hold leaves (n = 1000 x 2 runs, dt = 0.05, the recipe's sizes), held for
60 instead of 30; the recipe's r (R averaged over the second half of a hold) at hold 30 and
60; the solver (degree 24) from e^{a z} with the particles' starting r, same strength.

first_order (beta = 4 > beta_*, about 4 minutes): the down sweep's hold at 1.05 K_sn from a
clustered state (relaxed for 30 at 0.92 K_#), for n = 1000 at dt = 0.05 (the recipe's),
n = 1000 at dt = 0.025 and n = 4000 at dt = 0.05; the solver (degree 56) from e^{5 z} at the
same strength.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from attnflow.analysis.closedforms import stationary_order, transition_strengths
from attnflow.experiments.funkhecke import order_path
from attnflow.experiments.tricritical import SIGMA, _sphere_model
from attnflow.simulate import simulate
from attnflow.sphere import normalize, uniform


def hold(beta: float, K: float, x: np.ndarray, T: float, dt: float, seed: int
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, run-mean R(t), final tokens) of particles held at strength K for T (the
    recipe's _SphereHold, with R saved every 4 steps)."""
    times = np.linspace(0.0, T, int(round(T / dt)) // 4 + 1)
    tr = simulate(_sphere_model(beta, K), x, T, save_at=times, method="geodesic", dt=dt,
                  noise=SIGMA, seed=seed)
    R = np.linalg.norm(tr.states.mean(axis=-2), axis=-1).mean(axis=-1)
    return times, R, tr.states[-1]


def half_mean(t: np.ndarray, R: np.ndarray, T: float) -> float:
    """The recipe's r of a hold of length T: R averaged over [T / 2, T]."""
    return float(R[(t >= T / 2) & (t <= T)].mean())


def continuous() -> None:
    beta, n, runs, dt = 1.0, 1000, 2, 0.05
    tr = transition_strengths(beta, 3, SIGMA)
    K = 1.15 * tr.instability
    r_theory = float(stationary_order([K], beta, 3, SIGMA)[0])
    t0 = time.process_time()
    _, R0, x = hold(beta, 0.8 * tr.instability, uniform((runs, n), 3, seed=1), 30.0, dt, 2)
    t, R, _ = hold(beta, K, x, 60.0, dt, 3)
    print(f"beta = 1, K = 1.15 K_# = {K:.5f}, branch r = {r_theory:.4f}; particles n = {n} x "
          f"{runs}, dt = {dt}: R at the start {R[0]:.4f}; r(hold 30) = "
          f"{half_mean(t, R, 30.0):.4f}, r(hold 60) = {half_mean(t, R, 60.0):.4f}; "
          f"R(t) at t = 0, 10, ..., 60: "
          + ", ".join(f"{R[np.argmin(abs(t - s))]:.3f}" for s in range(0, 61, 10))
          + f" ({time.process_time() - t0:.1f} s CPU)")
    a = 3 * R[0]  # e^{a z}: r = coth a - 1 / a = a / 3 + O(a^3)
    t0 = time.process_time()
    ts, r, lost = order_path(beta, K, a, 24, 60.0)
    assert lost is None
    print(f"solver (degree 24) from r = {r[0]:.4f}: r(hold 30) = {half_mean(ts, r, 30.0):.4f}, "
          f"r(hold 60) = {half_mean(ts, r, 60.0):.4f}, r(30) = {r[15]:.4f}, r(60) = "
          f"{r[-1]:.4f}; first within 0.01 of the branch at t = "
          f"{ts[np.argmax(abs(r - r_theory) < 0.01)]:g} ({time.process_time() - t0:.1f} s CPU)")


def first_order() -> None:
    beta = 4.0
    tr = transition_strengths(beta, 3, SIGMA)
    K = 1.05 * tr.spinodal
    r_theory = float(stationary_order([K], beta, 3, SIGMA)[0])
    print(f"beta = 4, K = 1.05 K_sn = {K:.5f} (K_sn {tr.spinodal:.5f}, K_# "
          f"{tr.instability:.5f}), branch r = {r_theory:.4f}")
    for n, dt in ((1000, 0.05), (1000, 0.025), (4000, 0.05)):
        t0 = time.process_time()
        rng = np.random.default_rng(7)
        x = normalize(np.array([0.0, 0.0, 1.0]) + 0.3 * rng.standard_normal((2, n, 3)))
        _, R0, x = hold(beta, 0.92 * tr.instability, x, 30.0, dt, 11)
        t, R, _ = hold(beta, K, x, 30.0, dt, 12)
        print(f"particles n = {n} x 2, dt = {dt}: R after 30 at 0.92 K_# {R0[-1]:.4f}; at "
              f"1.05 K_sn R(t) at t = 0, 5, ..., 30: "
              + ", ".join(f"{R[np.argmin(abs(t - s))]:.3f}" for s in range(0, 31, 5))
              + f"; r(hold 30) = {half_mean(t, R, 30.0):.4f} "
              f"({time.process_time() - t0:.1f} s CPU)", flush=True)
    t0 = time.process_time()
    ts, r, lost = order_path(beta, K, 5.0, 56, 30.0)
    print(f"solver (degree 56) from e^(5 z): r = {r[0]:.4f} at 0, {r[15]:.4f} at 15, "
          f"{r[-1]:.4f} at 30, resolution lost at {lost} ({time.process_time() - t0:.1f} s CPU)")


if __name__ == "__main__":
    parts = sys.argv[1:] or ["continuous", "first_order"]
    for part in parts:
        {"continuous": continuous, "first_order": first_order}[part]()
