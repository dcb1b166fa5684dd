"""Forward + backward of `attnflow.simulate` on CPU tensors against a plain torch RK4 loop
around scaled_dot_product_attention, in one process.

    python benchmarks/gradients.py            # about 5 min on a loaded 2-core machine
    python benchmarks/gradients.py --quick    # tiny sizes: a check that it runs

The plain loop, written here: x' = P_x(a), a = SDPA(x Q^T, x, x, scale = beta,
is_causal = True for the causal mask, none for "full"), the same classical RK4 step as
attnflow's (`integrate.rk4_step`) and the same retraction (x / |x| after each step), in
float64. The loss is <W, x(t)> for fixed weights W; its gradient with respect to x0 (and Q)
by autograd. Rows (each the better of 1 and 2 threads, torch's and attnflow's alike, best of
REPEATS):

* d = 2, 3 (B 32 runs, n 200, causal, beta 64, 10 RK4 steps of dt 0.05): attnflow's choice
  on CPU tensors is the fused kernel with its fused backward (kernels/fused_torch.py);
* d = 64 (same sizes): SDPA on both sides (heads above auto.MAX_HEAD_FUSED_TENSOR);
* one attention call forward + backward, fused kernel against SDPA, d = 2, 3, 8, 16 (the
  crossover of `auto.MAX_HEAD_FUSED_TENSOR`);
* an Adam step through a small run (one run, n 24, d 3, full mask, beta 1, t 4, dt 0.05;
  the parameter Q, the loss as above): simulate's own cost around SDPA.

Every row asserts that simulate's gradients equal the plain loop's to 1e-12 (relative to
their largest entry) before it is timed, and prints the ratio simulate / plain loop with the
load average.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator

import numpy as np
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

import attnflow as af

REPEATS = 3


def plain_final(x0: torch.Tensor, Q: torch.Tensor | None, beta: float, mask: str,
                steps: int, dt: float) -> torch.Tensor:
    """The plain torch loop: RK4 steps of x' = P_x(SDPA(x Q^T, x, x)), retracted."""
    def field(x: torch.Tensor) -> torch.Tensor:
        q = x if Q is None else x @ Q.T
        shape = x.shape
        a = sdpa(*(t.reshape(-1, 1, *shape[-2:]) for t in (q, x, x)), scale=beta,
                 is_causal=mask == "causal").reshape(shape)
        return a - (a * x).sum(-1, keepdim=True) * x

    x = x0
    for _ in range(steps):
        k1 = field(x)
        k2 = field(x + dt / 2 * k1)
        k3 = field(x + dt / 2 * k2)
        k4 = field(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x


def ours_final(x0: torch.Tensor, Q: torch.Tensor | None, beta: float, mask: str,
               steps: int, dt: float) -> tuple[torch.Tensor, str]:
    """attnflow.simulate on the same model: the final state and the kernel it ran."""
    model = af.Attention(heads=[(Q, None, None)], beta=beta, mask=mask)
    run = af.simulate(model, x0, steps * dt, method="rk4", dt=dt, save_at=[steps * dt])
    return run.states[-1], run.integrator["kernel"]


def gradients(final, x0: np.ndarray, Q: np.ndarray | None, W: np.ndarray, *args
              ) -> list[torch.Tensor]:
    """d<W, x(t)> / d(x0, Q) through `final` (Q only when given)."""
    x = torch.tensor(x0, requires_grad=True)
    Qt = None if Q is None else torch.tensor(Q, requires_grad=True)
    out = final(x, Qt, *args)
    out = out[0] if isinstance(out, tuple) else out
    return list(torch.autograd.grad((out * torch.from_numpy(W)).sum(),
                                    [x] + ([] if Qt is None else [Qt])))


def adam_step(final, x0: np.ndarray, Q: np.ndarray, W: np.ndarray, *args) -> None:
    """One Adam step on Q through `final`."""
    Qt = torch.tensor(Q, requires_grad=True)
    opt = torch.optim.Adam([Qt], lr=1e-2)
    out = final(torch.from_numpy(x0), Qt, *args)
    out = out[0] if isinstance(out, tuple) else out
    (out * torch.from_numpy(W)).sum().backward()
    opt.step()


def best_time(call, repeats: int) -> float:
    """The best wall time of `repeats` calls (after one warm-up, which compiles)."""
    call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return min(times)


@contextlib.contextmanager
def on_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads and attnflow's kernel threads both `threads`, restored after
    (the smoke test runs this script in the test process)."""
    torch_before, env_before = torch.get_num_threads(), os.environ.get("ATTNFLOW_THREADS")
    torch.set_num_threads(threads)
    os.environ["ATTNFLOW_THREADS"] = str(threads)
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        if env_before is None:
            del os.environ["ATTNFLOW_THREADS"]
        else:
            os.environ["ATTNFLOW_THREADS"] = env_before


def row(name: str, runs: int, n: int, d: int, beta: float, mask: str, steps: int,
        dt: float, adam: bool, repeats: int) -> str:
    rng = np.random.default_rng(0)
    x0 = af.sphere.uniform((runs, n) if runs > 1 else n, d, seed=1)
    W = rng.standard_normal(x0.shape)
    Q = np.eye(d) + 0.1 * rng.standard_normal((d, d)) if adam else None
    args = (beta, mask, steps, dt)
    mine = gradients(ours_final, x0, Q, W, *args)
    theirs = gradients(plain_final, x0, Q, W, *args)
    for a, b in zip(mine, theirs):
        err = float((a - b).abs().max()) / (1 + float(b.abs().max()))
        assert err <= 1e-12, f"{name}: gradients differ from the plain loop's by {err:.2e}"
    kernel = ours_final(torch.from_numpy(x0), None if Q is None else torch.from_numpy(Q),
                        *args)[1]
    step = adam_step if adam else gradients
    best = {}
    for threads in (1, 2):
        with on_threads(threads):
            for who, final in (("ours", ours_final), ("plain", plain_final)):
                t = best_time(lambda final=final: step(final, x0, Q, W, *args), repeats)
                best[who] = min(best.get(who, np.inf), t)
    load = os.getloadavg()[0]
    return (f"| {name} | B={runs}, n={n}, d={d}, {mask}, beta={beta:g}, {steps} steps | "
            f"{kernel} | {best['ours'] * 1e3:.1f} ms | {best['plain'] * 1e3:.1f} ms | "
            f"{best['ours'] / best['plain']:.3f} | {load:.1f} |")


def kernel_row(d: int, runs: int, n: int, repeats: int) -> str:
    """One causal attention call (beta 64) forward + backward: the fused kernel on CPU tensors
    (kernels/fused_torch.py) against SDPA (kernels/torch.py), float64, the better of 1 and 2
    threads: the crossover behind auto.MAX_HEAD_FUSED_TENSOR."""
    from attnflow.kernels import fused_torch
    from attnflow.kernels import torch as torch_kernel

    rng = np.random.default_rng(2)
    x = torch.tensor(rng.standard_normal((runs, n, d)) / np.sqrt(d), requires_grad=True)
    W = torch.from_numpy(rng.standard_normal((runs, n, d)))

    def call(kernel) -> list[torch.Tensor]:
        return list(torch.autograd.grad((kernel(x, x, x, 64.0, "causal") * W).sum(), x))

    a, b = call(fused_torch.attend_tensor), call(torch_kernel.attend_tensor)
    err = float((a[0] - b[0]).abs().max()) / (1 + float(b[0].abs().max()))
    assert err <= 1e-12, f"kernel d={d}: fused and SDPA gradients differ by {err:.2e}"
    best = {}
    for threads in (1, 2):
        with on_threads(threads):
            for who, kernel in (("fused", fused_torch.attend_tensor),
                                ("sdpa", torch_kernel.attend_tensor)):
                t = best_time(lambda kernel=kernel: call(kernel), repeats)
                best[who] = min(best.get(who, np.inf), t)
    return (f"| kernel d={d} | B={runs}, n={n}, causal, beta=64, one call | fused vs SDPA | "
            f"{best['fused'] * 1e3:.2f} ms | {best['sdpa'] * 1e3:.2f} ms | "
            f"{best['fused'] / best['sdpa']:.3f} | {os.getloadavg()[0]:.1f} |")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check that it runs)")
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    big = dict(runs=8, n=60, steps=1) if args.quick else dict(runs=32, n=200, steps=10)
    repeats = 1 if args.quick else REPEATS
    rows = [row(f"d={d}", big["runs"], big["n"], d, 64.0 if d < 64 else 1.0, "causal",
                big["steps"], 0.05, False, repeats) for d in (2, 3, 64)]
    rows += [kernel_row(d, big["runs"], big["n"], 5 * repeats) for d in (2, 3, 8, 16)]
    rows.append(row("Adam step", 1, 24, 3, 1.0, "full", 4 if args.quick else 80, 0.05, True,
                    repeats))
    lines = ["| row | workload | attnflow kernel | simulate fwd+bwd | plain loop | ratio "
             "| load (1 min) |", "|---|---|---|---|---|---|---|", *rows]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
