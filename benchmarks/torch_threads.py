"""torch's intra-op threads on CPU tensors: one field evaluation of causal softmax attention
(Q, K, V heads, SDPA) timed with one thread and with two, at sizes from a few to 10^10
multiply-adds, the ratio printed beside the work `attnflow.torchthreads.field_work` assigns
(the rule's measurement: `MIN_WORK_PER_THREAD`). Both thread counts run in the same process,
interleaved, best of several repeats, with the load average.

    python benchmarks/torch_threads.py
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch

import attnflow as af
from attnflow.sphere import uniform
from attnflow.torchthreads import field_work

SIZES = [(1, 32, 4), (4, 64, 8), (8, 200, 16), (32, 200, 64), (4, 1024, 64), (1, 4096, 64)]


def best(f, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    print(f"# {platform.processor() or platform.machine()}, CPUs usable "
          f"{len(os.sched_getaffinity(0))}, torch {torch.__version__}, load {os.getloadavg()}")
    rng = np.random.default_rng(0)
    for runs, n, d in SIZES:
        Q, K, V = (torch.from_numpy(rng.standard_normal((d, d)) / np.sqrt(d)) for _ in range(3))
        model = af.Attention(Q, K, V, beta=1.0, mask="causal")
        x = torch.from_numpy(uniform((runs, n), d, seed=1))
        kernel = model.kernel_for(x)

        def field(model=model, x=x, kernel=kernel):
            return model.tangent_field(x, kernel=kernel)

        work = field_work(model, x)
        repeats = max(3, min(50, int(2e8 / max(work, 1))))
        one, two = [], []
        for _ in range(3):  # interleaved: load changes during the run
            one.append(best(field, 1, repeats))
            two.append(best(field, 2, repeats))
        one_t, two_t = min(one), min(two)
        print(f"runs {runs:3d} n {n:5d} d {d:3d}: work {work:.2e}, 1 thread {one_t * 1e3:9.3f} "
              f"ms, 2 threads {two_t * 1e3:9.3f} ms, 2/1 = {two_t / one_t:.2f}")
    print(f"# load {os.getloadavg()}")


if __name__ == "__main__":
    main()
