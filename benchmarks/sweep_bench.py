"""Sweep throughput: a 2-worker LocalCluster against the serial in-process loop.

The workload is a 200-run sweep in the paper's circle setting (causal attention, Q = K = V = I,
d = 2): beta in {16, 64} x 100 seeds, n = 64 tokens, RK4 with dt = 0.1 up to t = 20, every
metric at 21 save times, tasks of 10 runs. Both runs write a Zarr store; the cluster's total
time includes starting and stopping it (that is what a user waits for), and "steady" compares
the time per run from the 3rd finished task to the last (startup excluded); CPU seconds count
this process and the cluster's worker processes (contention-free cost). Runs are
interleaved and the best of the repeats is kept (the machine is shared). The two stores must be
equal bit for bit. Prints a Markdown table; run from the repository root:

    python benchmarks/sweep_bench.py [--runs-per-beta 100] [--n 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import xarray as xr

from attnflow.sweeps import sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-beta", type=int, default=100)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved; best kept")
    args = parser.parse_args()
    grid = {"beta": [16.0, 64.0], "n": args.n, "d": 2, "method": "rk4", "dt": 0.1,
            "t_end": 20.0, "save_at": 21, "seeds": args.runs_per_beta}
    runs = 2 * args.runs_per_beta
    walls: dict[str, list[float]] = {"serial": [], "cluster": []}
    steady: dict[str, list[float]] = {"serial": [], "cluster": []}
    cpu: dict[str, list[float]] = {"serial": [], "cluster": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for label, kwargs in (("serial", {"scheduler": "serial"}),
                                  ("cluster", {"workers": 2})):
                stamps: list[tuple[float, int]] = []
                cpu0 = _cpu_seconds()
                start = time.perf_counter()
                sweep(grid, batch=10, out=Path(tmp) / f"{label}{r}.zarr",
                      progress=lambda done, total, log=stamps: log.append(
                          (time.perf_counter(), done)), **kwargs)
                walls[label].append(time.perf_counter() - start)
                cpu[label].append(_cpu_seconds() - cpu0)
                # from the 3rd finished task on: both workers are past their imports
                (t1, done1), (t2, done2) = stamps[3], stamps[-1]
                steady[label].append((t2 - t1) / (done2 - done1))  # seconds per run
            with xr.open_zarr(Path(tmp) / f"serial{r}.zarr", consolidated=False) as a, \
                    xr.open_zarr(Path(tmp) / f"cluster{r}.zarr", consolidated=False) as b:
                xr.testing.assert_identical(a.load(), b.load())
    load = os.getloadavg()[0]
    wall = {k: min(v) for k, v in walls.items()}
    per_run = {k: min(v) for k, v in steady.items()}
    cpu_s = {k: min(v) for k, v in cpu.items()}
    print("| runs | serial s | 2-worker cluster s | ratio | steady ratio | CPU s serial / "
          "cluster | load avg (1 min) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {runs} | {wall['serial']:.1f} | {wall['cluster']:.1f} | "
          f"{wall['serial'] / wall['cluster']:.2f} | {per_run['serial'] / per_run['cluster']:.2f}"
          f" | {cpu_s['serial']:.1f} / {cpu_s['cluster']:.1f} | {load:.1f} |")


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the cluster's workers)."""
    me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    main()
