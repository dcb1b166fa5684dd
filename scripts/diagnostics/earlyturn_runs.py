"""Particle runs for the early-turn diagnostic (docs/science.md §11.1): the lostmiddle recipe's
cell moments (its own functions, full-size cells and times) for one (beta, slope) at one n,
saved to an .npz for scripts/diagnostics/earlyturn.py.

    PYTHONPATH=$PWD/src python3 scripts/diagnostics/earlyturn_runs.py --n 10000 --runs 1024 \
        --seed 101 --beta 2 --slope 1 --out /tmp/et_2_1_1e4.npz
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnflow.analysis.closedforms import recency_time
from attnflow.analysis.kinetic import SOFT_MODES
from attnflow.experiments import lostmiddle as lm
from attnflow.experiments._cells import cell_moments
from attnflow.family import Attention


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--beta", type=float, default=2.0)
    p.add_argument("--slope", type=float, default=1.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    params = {**lm.FULL, "n": a.n, "runs": a.runs}
    edges = lm._edges(params)
    times = [f * recency_time(a.beta, a.slope) for f in params["factors"]]
    model = Attention(beta=a.beta, mask="causal", backend="harmonic", attention="positional",
                      alibi=a.slope / a.n)
    start = time.process_time()
    m = cell_moments(model, a.n, a.runs, edges, list(range(1, SOFT_MODES + 1)), times,
                     params["dt"] / a.beta, params["chunk"], np.random.default_rng(a.seed),
                     lambda f: None)
    np.savez(a.out, A=m.A, B=m.B, sizes=m.sizes, n=a.n, beta=a.beta, slope=a.slope,
             seed=a.seed, cpu=time.process_time() - start)
    print(f"{a.out}: n {a.n}, {a.runs} runs, seed {a.seed}, "
          f"{time.process_time() - start:.0f} s CPU")


if __name__ == "__main__":
    main()
