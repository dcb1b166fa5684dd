"""Sweep throughput: a 2-worker LocalCluster against the serial in-process loop.

The workload is a 200-run sweep in the paper's circle setting (causal attention, Q = K = V = I,
d = 2): beta in {16, 64} x 100 seeds, n = 64 tokens, RK4 with dt = 0.1 up to t = 20, every
metric at 21 save times, tasks of 10 runs. Both runs write a Zarr store; the cluster's total
time includes starting and stopping it (that is what a user waits for), and "steady" compares
the time from the first finished task to the last (startup excluded). The two stores must be
equal bit for bit. Prints a Markdown table; run from the repository root:

    python benchmarks/sweep_bench.py [--runs-per-beta 100] [--n 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import xarray as xr

from attnflow.sweep import sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-beta", type=int, default=100)
    parser.add_argument("--n", type=int, default=64)
    args = parser.parse_args()
    grid = {"beta": [16.0, 64.0], "n": args.n, "d": 2, "method": "rk4", "dt": 0.1,
            "t_end": 20.0, "save_at": 21, "seeds": args.runs_per_beta}
    runs = 2 * args.runs_per_beta
    with tempfile.TemporaryDirectory() as tmp:
        walls, steady = {}, {}
        for label, kwargs in (("serial", {"scheduler": "serial"}), ("cluster", {"workers": 2})):
            stamps: list[tuple[float, int]] = []
            start = time.perf_counter()
            sweep(grid, batch=10, out=Path(tmp) / f"{label}.zarr",
                  progress=lambda done, total, log=stamps: log.append((time.perf_counter(), done)),
                  **kwargs)
            walls[label] = time.perf_counter() - start
            (t1, done1), (t2, done2) = stamps[1], stamps[-1]
            steady[label] = (t2 - t1) / (done2 - done1)  # seconds per run
        with xr.open_zarr(Path(tmp) / "serial.zarr", consolidated=False) as a, \
                xr.open_zarr(Path(tmp) / "cluster.zarr", consolidated=False) as b:
            xr.testing.assert_identical(a.load(), b.load())
    load = os.getloadavg()[0]
    print("| runs | serial s | 2-worker cluster s | ratio | steady ratio | load avg (1 min) |")
    print("|---|---|---|---|---|---|")
    print(f"| {runs} | {walls['serial']:.1f} | {walls['cluster']:.1f} | "
          f"{walls['serial'] / walls['cluster']:.2f} | {steady['serial'] / steady['cluster']:.2f}"
          f" | {load:.1f} |")


if __name__ == "__main__":
    main()
