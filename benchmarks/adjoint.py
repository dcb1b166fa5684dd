"""Reverse mode through a run: `gradients="adjoint"` against `gradients="backprop"` (peak memory
above the start and time of forward + backward, in the same invocation).

The problem of the gradients issue: d = 64, 32 runs of n = 200 tokens, causal softmax attention
with Gaussian Q, K, V tensors (requiring grad, as x0), RK4 with dt = 0.05, the default save
times, the loss a weighted sum of the final state. Each measurement runs in a fresh process
(the peak is that process's maximum resident set minus its resident set just before the run,
after a warm-up run on a few tokens), with one torch thread.

    python benchmarks/adjoint.py                  # backprop and adjoint to t = 1, adjoint to 5
    python benchmarks/adjoint.py --t 5 --t-backprop 5   # backprop at t = 5 too (about 11 GB)
    python benchmarks/adjoint.py --final --only-adjoint  # the final state saved, adjoint only
    python benchmarks/adjoint.py --final --only-adjoint --checkpoint 10  # a state per 10 steps
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time


def rss() -> int:
    """This process's resident set now, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(gradients: str, t_end: float, d: int, runs: int, n: int, final: bool,
          checkpoint: int | None) -> dict:
    import numpy as np
    import torch

    import attnflow as af
    from attnflow.sphere import uniform

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)

    def problem(n_tokens: int):
        Q, K, V = (torch.tensor(rng.standard_normal((d, d)) / np.sqrt(d), requires_grad=True)
                   for _ in range(3))
        x0 = torch.from_numpy(uniform((runs, n_tokens), d, seed=1)).requires_grad_(True)
        weights = torch.from_numpy(rng.standard_normal((runs, n_tokens, d)))
        return af.Attention(Q, K, V, beta=1.0, mask="causal"), x0, weights

    def once(model, x0, weights, t):
        run = af.simulate(model, x0, t, dt=0.05, method="rk4", gradients=gradients,
                          save_at=[t] if final else None,
                          checkpoint=checkpoint if t == t_end else None)
        (run.states[-1] * weights).sum().backward()
        return run

    once(*problem(8), 0.2)  # warm-up: imports, one-off allocations
    model, x0, weights = problem(n)
    start = rss()
    began = time.perf_counter()
    run = once(model, x0, weights, t_end)
    wall = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return {"gradients": gradients, "t_end": t_end, "seconds": wall,
            "peak_above_start_gb": (peak - start) / 1e9, "save_times": len(run.times),
            "steps": run.integrator["n_steps"],
            "grad_x0_norm": float(x0.grad.norm()), "grad_Q_norm": float(model.heads[0][0]
                                                                          .grad.norm())}


def measure(gradients: str, t_end: float, args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", gradients, "--t", str(t_end),
                          "--d", str(args.d), "--runs", str(args.runs), "--n", str(args.n)]
                         + (["--final"] if args.final else [])
                         + ([] if args.checkpoint is None or gradients != "adjoint"
                            else ["--checkpoint", str(args.checkpoint)]),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t", type=float, default=5.0, help="t_end of the adjoint run")
    parser.add_argument("--t-backprop", type=float, default=1.0,
                        help="t_end of the backprop and adjoint runs compared in time")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--final", action="store_true",
                        help="save the final state only (default: the default save times)")
    parser.add_argument("--checkpoint", type=int, default=None,
                        help="the adjoint runs keep one state per this many steps")
    parser.add_argument("--only-adjoint", action="store_true",
                        help="the adjoint run to --t only (no comparison)")
    parser.add_argument("--child", choices=("backprop", "adjoint"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.t, args.d, args.runs, args.n, args.final,
                               args.checkpoint)))
        return
    print(f"# {platform.processor() or platform.machine()}, load {os.getloadavg()}, "
          f"d = {args.d}, {args.runs} runs x n = {args.n}, causal, rk4 dt 0.05, 1 thread, "
          + ("the final state saved" if args.final else "the default save times")
          + ("" if args.checkpoint is None else f", adjoint checkpoint={args.checkpoint}"))
    if args.only_adjoint:
        rows = [measure("adjoint", args.t, args)]
    else:
        rows = [measure("backprop", args.t_backprop, args),
                measure("adjoint", args.t_backprop, args)]
        if args.t != args.t_backprop:
            rows.append(measure("adjoint", args.t, args))
    for r in rows:
        print(f"{r['gradients']:9s} t = {r['t_end']:g} ({r['steps']} steps, "
              f"{r['save_times']} save times): {r['seconds']:.2f} s, peak above start "
              f"{r['peak_above_start_gb']:.3f} GB, |grad x0| {r['grad_x0_norm']:.12g}, "
              f"|grad Q| {r['grad_Q_norm']:.12g}")
    if args.only_adjoint:
        return
    b, a = rows[0], rows[1]
    print(f"adjoint / backprop at t = {args.t_backprop:g}: time {a['seconds'] / b['seconds']:.2f}x,"
          f" memory {a['peak_above_start_gb'] / b['peak_above_start_gb']:.3f}x; "
          f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
