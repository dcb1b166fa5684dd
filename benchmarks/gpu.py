"""W1 and W2 at larger sizes on a CUDA device, in under 5 minutes (torch backend).

    python benchmarks/gpu.py               # on "cuda"; prints a Markdown table
    python benchmarks/gpu.py --device cpu --quick   # tiny sizes, to check that it runs

W1: RK4 (dt = 0.05) of causal attention with Q = K = V = I, beta = 64, n = 200, d = 2, for
runs x n tokens integrated on the device (`attend_tensor`, no host copies), float64 and
float32; causal pair-evaluations per second, and the float32 final error against float64.
The first runs are checked against the numpy fused kernel (float64, one field evaluation).
W2: one causal field evaluation at n tokens, d = 64, random Q, K, V, through
scaled_dot_product_attention (is_causal), against the device's GEMM rate measured in the same
run, counting 2 n^2 d flops. Not run on the project's machines so far (no GPU was lent):
see RESULTS.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from attnflow.kernels import fused
from attnflow.kernels.torch import attend_tensor
from attnflow.sphere import uniform

BETA, N, D, DT = 64.0, 200, 2, 0.05


def timed(fn, device: str) -> tuple[float, object]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def field(x):
    a = attend_tensor(x, x, x, BETA, "causal")
    return a - (a * x).sum(-1, keepdim=True) * x


def rk4(x, steps: int):
    for _ in range(steps):
        k1 = field(x)
        k2 = field(x + DT / 2 * k1)
        k3 = field(x + DT / 2 * k2)
        k4 = field(x + DT * k3)
        x = x + DT / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        x = x / x.norm(dim=-1, keepdim=True)
    return x


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    dev = args.device
    runs, steps, n2, g = (64, 2, 1024, 512) if args.quick else (50_000, 40, 262_144, 4096)
    lines = [f"device {dev} ({torch.cuda.get_device_name() if dev.startswith('cuda') else 'cpu'})",
             "", "| workload | what | size | rate | notes |", "|---|---|---|---|---|"]
    x0 = uniform((runs, N), D, seed=0)
    check = x0[:8]
    err = np.abs(attend_tensor(*(torch.from_numpy(check).to(dev),) * 3, BETA, "causal")
                 .cpu().numpy() - fused.attend(check, check, check, BETA, "causal")).max()
    finals = {}
    for dtype in (torch.float64, torch.float32):
        x = torch.from_numpy(x0).to(dev, dtype)
        rk4(x[:8], 1)  # warm up
        wall, xf = timed(lambda x=x: rk4(x, steps), dev)
        finals[dtype] = xf.double().cpu().numpy()
        rate = runs * N * (N + 1) / 2 * 4 * steps / wall
        if dtype == torch.float64:
            note = f"{wall:.1f} s; |torch - fused numpy| = {err:.1e}"
        else:
            drift = np.abs(finals[dtype] - finals[torch.float64]).max()
            note = f"{wall:.1f} s; max |x32 - x64| = {drift:.1e}"
        lines.append(f"| W1 | RK4 {steps} steps, {dtype} | B={runs} | {rate:.3g} pairs/s "
                     f"| {note} |")
    for dtype in (torch.float64, torch.float32):
        a = torch.randn(g, g, device=dev, dtype=dtype)
        a @ a
        wall, _ = timed(lambda a=a: a @ a, dev)
        gemm = 2 * g**3 / wall
        q, k, v = (torch.randn(n2, 64, device=dev, dtype=dtype) / 64**0.25 for _ in range(3))
        attend_tensor(q[:1024], k[:1024], v[:1024], 1.0, "causal")
        wall, _ = timed(lambda q=q, k=k, v=v: attend_tensor(q, k, v, 1.0, "causal"), dev)
        flops = 2 * n2 * n2 * 64 / wall
        lines.append(f"| W2 | SDPA causal, {dtype} | n={n2}, d=64 | {flops / 1e9:.3g} GFLOP/s | "
                     f"{wall:.2f} s; {flops / gemm:.2f} of GEMM ({gemm / 1e9:.3g} GFLOP/s) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main())
