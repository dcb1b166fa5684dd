"""Diagnostic for meanfield.first_large_n: the first-phase cluster count over many runs.

The recipe's large-n measurement (attnflow.experiments.meanfield._large_n: n uniform tokens,
full attention with the harmonic kernel, RK4 to t1(n) = `large_t1`), repeated over `--runs`
independent starts per beta, printing per run the single-linkage count (the recipe's
instrument, tolerance beta^-1/2 / 4) and the density count (beta^-1/2 kernel) of the same
tokens, their means, and the largest |mean / k* - 1| of each.

    PYTHONPATH=src python3 scripts/diagnostics/meanfield_count.py --n 4000 --runs 8 \
        --betas 4 16 64 --seed 0
"""

from __future__ import annotations

import argparse

import numpy as np

from attnflow.analysis.closedforms import k_star
from attnflow.analysis.clusters import cluster_count, default_cluster_tol
from attnflow.analysis.modes import density_cluster_count
from attnflow.experiments.meanfield import large_t1
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--betas", type=float, nargs="+", default=[4.0, 16.0, 64.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--t1", type=float, default=10.0, help="the recipe's t1 at n_ref")
    p.add_argument("--n-ref", type=int, default=1000)
    p.add_argument("--dt", type=float, default=0.1)
    a = p.parse_args()
    x0 = uniform((a.runs, a.n), 2, np.random.default_rng(a.seed))
    off = {"single linkage": [], "density": []}
    print(f"n {a.n}, {a.runs} runs per beta, seed {a.seed}, RK4 dt {a.dt:g}, harmonic kernel")
    for beta in a.betas:
        t1 = large_t1(a.t1, a.n, a.n_ref, beta)
        traj = simulate(Attention(beta=beta, mask="full", backend="harmonic:1e-9"), x0, t1,
                        save_at=[0.0, t1], method="rk4", dt=a.dt)
        sl = np.asarray(cluster_count(traj.final, default_cluster_tol(beta)))
        dens = np.asarray(density_cluster_count(traj.final, beta))
        k = k_star(beta)
        off["single linkage"].append(abs(sl.mean() / k - 1))
        off["density"].append(abs(dens.mean() / k - 1))
        print(f"  beta {beta:g} (t1 = {t1:.2f}, k* = {k}): single linkage {sl.tolist()} mean "
              f"{sl.mean():.2f}; density {dens.tolist()} mean {dens.mean():.2f}")
    for name, v in off.items():
        print(f"  largest |mean / k* - 1|, {name}: {max(v):.3f}")


if __name__ == "__main__":
    main()
