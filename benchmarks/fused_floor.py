"""The fused kernel alone against its floor, one thread, per instruction set (a minute).

    python benchmarks/fused_floor.py                  # native, then AVX2 (a child process)
    python benchmarks/fused_floor.py --target native  # one of them

One causal field evaluation of W1's ensemble (n = 200, d = 2, beta = 64, Q = K = V = I) on
256 runs, one thread, in this thread's CPU time (time.thread_time: what other processes take
of the machine counts less than in wall time), per causal pair, against the exp floor of the
same dtype (`run.exp_floor`: the fastest of numpy's and torch's exp, one thread, same clock).
Kernel and floors alternate for `--rounds` rounds; the fastest of each is reported, with the
median beside it. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import AVX2_ENV, describe  # noqa: E402
from run import BETA, PAIRS, D, N, exp_floor  # noqa: E402

from attnflow.kernels import fused  # noqa: E402
from attnflow.sphere import uniform  # noqa: E402

RUNS = 256


def measure(rounds: int) -> list[str]:
    """Table rows for this process's target, the kernel on one thread."""
    threads = os.environ.get("ATTNFLOW_THREADS")
    os.environ["ATTNFLOW_THREADS"] = "1"
    try:
        return _measure(rounds)
    finally:
        if threads is None:
            del os.environ["ATTNFLOW_THREADS"]
        else:
            os.environ["ATTNFLOW_THREADS"] = threads


def _measure(rounds: int) -> list[str]:
    x0 = uniform((RUNS, N), D, seed=0)
    seen: dict = {}
    for dtype in (np.float64, np.float32):  # compile
        x = x0.astype(dtype)
        fused.attend(x, x, x, BETA, "causal")
    for _ in range(rounds):
        for dtype in (np.float64, np.float32):
            x = x0.astype(dtype)
            ns, whose = exp_floor(dtype, time.thread_time)
            seen.setdefault(("floor", dtype), []).append(ns)
            seen[("whose", dtype)] = whose
            start = time.thread_time()
            fused.attend(x, x, x, BETA, "causal")
            seen.setdefault(("kernel", dtype), []).append(
                (time.thread_time() - start) / (RUNS * PAIRS) * 1e9)
    best = {key: min(v) for key, v in seen.items() if key[0] != "whose"}
    rows = []
    for dtype in (np.float64, np.float32):
        kernel, floor = best[("kernel", dtype)], best[("floor", dtype)]
        rows.append(f"| {np.dtype(dtype).name} | {fused.tile_runs(dtype, RUNS)} | "
                    f"{kernel:.3f} (median {np.median(seen[('kernel', dtype)]):.3f}) | "
                    f"{floor:.3f} ({seen[('whose', dtype)]}) | **{floor / kernel:.2f}** | "
                    + (f"**{best[('kernel', np.float64)] / kernel:.2f}x**" if dtype == np.float32
                       else "") + " |")
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("both", "native", "avx2"), default="both")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: expected an integer >= 1, got {args.rounds}")
    if args.target in ("both", "avx2") and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        texts = [main(["--target", "native", "--rounds", str(args.rounds)])] \
            if args.target == "both" else []
        child = subprocess.run([sys.executable, __file__, "--target", "avx2", "--rounds",
                                str(args.rounds)], env={**os.environ, **AVX2_ENV},
                               capture_output=True, text=True)
        if child.returncode != 0:
            raise RuntimeError(child.stderr[-2000:])
        return "\n".join(texts + [child.stdout])
    lines = [f"{describe()}.", "", "| dtype | tile (runs) | kernel ns per causal pair | "
             "exp floor ns per element | fraction of the floor | float32 speed over float64 |",
             "|---|---|---|---|---|---|", *measure(args.rounds)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main())
