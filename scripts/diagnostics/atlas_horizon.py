"""Diagnostic for the atlas claims: one row's runs, continued past the recipe's horizon.

Rebuilds the atlas recipe's initial tokens, eigenbases and Q, K from its seed (the same
SeedSequence spawning as attnflow.experiments.atlas.run), integrates one setting (row,
eigenbasis, kind of Q, K) at a chosen beta to `--t-end` by `--method`, and prints at each
of `--at` times: the observed configurations (classify_configuration, the recipe's tol), the
cluster counts, the largest distance of a token to L, the fastest token's speed, and for
the runs left in two clusters the angle between the clusters' centroids.

    PYTHONPATH=src python3 scripts/diagnostics/atlas_horizon.py --row first-token \
        --beta 9 --t-end 1e5 --at 5e3 2e4 1e5 --seeds 20 --seed 0
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from attnflow.analysis.atlas import classify_configuration, predict_configuration
from attnflow.analysis.clusters import clusters
from attnflow.experiments.atlas import SPECTRA, _bases, _value_matrix
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--row", choices=list(SPECTRA), default="first-token")
    p.add_argument("--basis", choices=["orthonormal", "general"], default="orthonormal")
    p.add_argument("--qk", choices=["identity", "random"], default="identity")
    p.add_argument("--beta", type=float, default=9.0)
    p.add_argument("--t-end", type=float, default=1e5)
    p.add_argument("--at", type=float, nargs="+", default=[5e3, 2e4, 1e5])
    p.add_argument("--method", default="bdf")
    p.add_argument("--seeds", type=int, default=20, help="initial configurations (runs)")
    p.add_argument("--seed", type=int, default=0, help="the recipe's seed")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--rtol", type=float, default=1e-6)
    p.add_argument("--tol", type=float, default=1e-2)
    a = p.parse_args()
    d, rows = 3, [*SPECTRA, "complex-top"]
    bases_of = ["orthonormal", "general"]
    settings = [(row, b, qk) for row in rows for b in bases_of for qk in ("identity", "random")
                if not (row == "first-token" and b != bases_of[0])]
    tokens_ss, bases_ss, qk_ss = np.random.SeedSequence(a.seed).spawn(3)
    x0 = uniform((a.seeds, a.n), d, np.random.default_rng(tokens_ss))
    bases = _bases(bases_of, rows, 4.0, np.random.default_rng(bases_ss))
    streams = dict(zip(settings, qk_ss.spawn(len(settings))))
    V = _value_matrix(a.row, bases[a.row, a.basis])
    Q = K = None
    if a.qk == "random":
        rng = np.random.default_rng(streams[a.row, a.basis, a.qk])
        Q, K = rng.standard_normal((2, d, d)) / np.sqrt(d)
    model = Attention(Q, K, V, beta=a.beta)
    save = np.array(sorted({0.0, *a.at, a.t_end}))
    traj = simulate(model, x0, a.t_end, save_at=save, method=a.method, rtol=a.rtol,
                    atol=a.rtol * 1e-3)
    pred = predict_configuration(V).row
    print(f"{a.row} ({a.basis}, Q, K {a.qk}), beta {a.beta:g}, n {a.n}, {a.seeds} runs, "
          f"seed {a.seed}, {a.method} rtol {a.rtol:g}: {traj.integrator.get('n_steps')} steps, "
          f"{traj.wall_time:.0f} s; predicted {pred}")
    for i, t in enumerate(save[1:], start=1):
        obs = [classify_configuration(traj.states[i, r], V, x0[r, 0], tol=a.tol)
               for r in range(a.seeds)]
        speed = [float(np.linalg.norm(v, axis=-1).max())
                 for v in model.tangent_field(traj.states[i])]
        print(f"  t = {t:g}: as predicted {sum(o.row == pred for o in obs)}/{a.seeds}; "
              f"observed {dict(Counter(o.row for o in obs))}; clusters "
              f"{dict(sorted(Counter(o.n_clusters for o in obs).items()))}; max distance to L "
              f"median {np.median([o.max_dist_L for o in obs]):.3f}; speed median "
              f"{np.median(speed):.1e} max {max(speed):.1e}")
        pairs = [clusters(traj.states[i, r], a.tol).centroids for r in range(a.seeds)]
        angles = [float(geodesic_distance(c[0], c[1])) for c in pairs if len(c) == 2]
        if angles:
            print(f"    two clusters apart by (rad): {np.round(sorted(angles), 3).tolist()}")


if __name__ == "__main__":
    main()
