"""Diagnostic for kuramoto.particles: the step bias left after Richardson extrapolation.

The recipe runs geodesic Euler-Maruyama at dt and dt/2 on one Brownian path and takes
2 R_{dt/2} - R_dt (weak order 1). This script adds dt/4 on the same path and prints, for one
sigma: the time-averaged order parameter at each step, the two Richardson pairs, the
second-level (Romberg) value (8 R_{h/4} - 6 R_{h/2} + R_h) / 3 that also removes an O(h^2)
term, each with its standard error, against the theory the recipe uses. Same functions as the
recipe (simulate, burn_in, stationary_mean_se, the solver's stationary start).

    PYTHONPATH=src python3 scripts/diagnostics/kuramoto_step.py --sigma 0.85 --n 100000
"""

from __future__ import annotations

import argparse

import numpy as np

from attnflow.analysis.closedforms import inverse_cdf, kuramoto_order
from attnflow.experiments.kuramoto import SIGMA_C
from attnflow.experiments.noise import (
    burn_in,
    finite_n_fluctuation,
    order_parameter,
    stationary_mean_se,
)
from attnflow.family import Attention
from attnflow.meanfield import from_function, solve
from attnflow.simulate import simulate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sigma", type=float, default=0.85)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--dt", type=float, default=0.1, help="coarsest step (the recipe's dt)")
    p.add_argument("--levels", type=int, default=3, help="steps dt, dt/2, ... (2 or 3)")
    p.add_argument("--t-end", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    key = int(np.random.SeedSequence(a.seed).generate_state(1)[0])
    mf = solve(Attention(beta=0.0, mask="full"), from_function(lambda t: np.exp(np.cos(t)),
                                                                 modes=32),
               200.0, save_at=[200.0], noise=a.sigma)
    theta0 = inverse_cdf(mf.coefficients[-1, 0], rng.random((a.runs, a.n)))
    x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
    times = np.arange(0.0, a.t_end + 1e-9, 0.5)
    model = Attention(beta=0.0, mask="full", backend="harmonic")
    steps = [a.dt / 2**k for k in range(a.levels)]
    R = [order_parameter(simulate(model, x0, a.t_end, save_at=times, method="geodesic",
                                  dt=h, noise=a.sigma, seed=key, brownian_dt=a.dt).states)
         for h in steps]
    kappa = 2 / a.sigma**2
    theory = (float(kuramoto_order(kappa)) if a.sigma < SIGMA_C else
              float(np.sqrt(np.pi * finite_n_fluctuation(kappa, 0.0, a.n) / a.n) / 2))
    series = {f"R at dt {h:g}": r for h, r in zip(steps, R)}
    for k in range(a.levels - 1):
        series[f"Richardson dt {steps[k]:g}, {steps[k + 1]:g}"] = 2 * R[k + 1] - R[k]
    if a.levels >= 3:
        series[f"Romberg dt {steps[0]:g}..{steps[2]:g}"] = (8 * R[2] - 6 * R[1] + R[0]) / 3
    start = burn_in(2 * R[1] - R[0], times, 3.0, 2.0)  # the recipe's burn-in series
    print(f"sigma {a.sigma:g}, n {a.n}, {a.runs} runs, t_end {a.t_end:g}, seed {a.seed}, "
          f"burn-in {start:.1f}; theory {theory:.5f} (solver r "
          f"{abs(mf.moments(1)[-1, 0]):.5f})")
    for name, s in series.items():
        mean, se, _ = stationary_mean_se(s, times, start)
        print(f"  {name:28s} {mean:.5f} +- {se:.5f}  off {mean - theory:+.5f} "
              f"z {(mean - theory) / se:+.2f}")


if __name__ == "__main__":
    main()
