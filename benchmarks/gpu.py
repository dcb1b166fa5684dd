"""Every GPU row of issue 41 in one run (at most 6 minutes on an H200), each as a ratio to a
floor of the same device measured in the same process, with its agreement and its target.

    python benchmarks/gpu.py                          # on "cuda"; prints a Markdown table
    python benchmarks/gpu.py --only W1,E1 --no-tests  # some rows, without the device tests
    python benchmarks/gpu.py --device cpu --quick     # tiny sizes: checks that it runs

First it runs the tests marked `gpu` (``pytest -m gpu tests/``; on the CPU with --quick only
the kernels' test files, whose gpu tests skip). Then the floors: exp throughput by a Triton
kernel that chains exp2 (the fused kernel's op) in registers, float32 and float64; copy
bandwidth; GEMM (float32 without TF32, float64). On the CPU, where Triton only interprets,
the exp floor is torch.exp over a large array. Then the rows (`ROWS`):

* W1: RK4 (dt 0.05), causal, beta 64, n 200, d 2, Q = K = V = I, B runs: the sphere's
  field through SDPA (`attnflow.kernels.torch.attend_tensor`, then the projection) and through
  the Triton fused kernel (projection fused), float32 and float64; causal pairs per second
  over the exp floor (one exp per pair). Agreement: one field evaluation of 8 runs against the
  numpy fused kernel, and the float32 final state against float64. On a GPU the fused kernel
  also runs at other block sizes and warps (`triton_configs`, rows "Triton fused BMxBN/Ww"),
  so that the first run shows which defaults to keep (W1 and E1).
* W1B: W1 with gradients: RK4 through the attention kernel attnflow picks for the device's
  tensors (`Attention.kernel_for`: SDPA on CUDA, where the Triton kernel has no backward;
  on CPU the fused kernel with its fused backward for enough runs), forward alone and
  forward + backward of the sum of the final state with respect to x0, float32 and float64.
  Agreement: the gradient's directional derivative against central differences.
* E1: one exact causal evaluation, d 2, n 10^6, float32, beta 64: the fused kernel, and SDPA
  with the head padded to 8 columns for comparison. Agreement: 64 rows against float64 sums.
* H1: the harmonic kernel on the device (`harmonic_torch`), circle, causal, beta 64, n 10^7;
  H4: RK4 dt 0.05 to t = 10 at n 10^6 with it. Floor: the copy time of its moments' traffic
  (written and read once, R n F H float64), the floor of this design (not of the problem).
* W2: d 64, n 65 536, one causal evaluation, float32 and float16: attnflow's tensor path
  against a bare SDPA call, and against GEMM (2 n^2 d flops).
* BW: a backward pass through RK4 (n 10^4, 200 steps, float32, SDPA padded to 8 columns)
  against its forward time, with peak memory, plain and checkpointed per step.
* TD: torchdiffeq's RK4 on W1's workload beside ours (a row with a note when not importable).

SDPA's math path holds the n x n scores (W2 in float64 once asked for 512 GiB): every SDPA
call here first estimates that size and skips the row with it when it would not fit in half
the free memory. A CUDA out-of-memory error, or any other, fails its row with the size; the
other rows still run.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BETA, N, D, DT = 64.0, 200, 2, 0.05
ROWS = ("W1", "W1B", "E1", "H1", "H4", "W2", "BW", "TD")
TARGETS = {
    "W1 float32": "float32 >= 25 % of the exp floor",
    "W1 float64": "float64 >= 30 % of the float64 exp floor",
    "E1": "<= 0.6 s (25 % of the floor)",
    "H1": "<= 50 ms",
    "H4": "<= 20 s",
    "W2": "within 1.2x of SDPA",
    "W1B": "forward + backward, time stated beside the forward",
    "BW": "backward <= 3x forward, memory stated",
    "TD": "side by side",
}
HEADER = ["| row | what | size | dtype | time | rate | of floor | agreement | target |",
          "|---|---|---|---|---|---|---|---|---|"]


class Bench:
    """The device, its synchronisation and its floors, shared by the rows."""

    def __init__(self, device: str, quick: bool) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.cuda = device.startswith("cuda")
        self.quick = quick
        self.floors: dict[str, float] = {}
        self.lines: list[str] = []

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, fn: Callable[[], object], repeat: int = 1) -> tuple[float, object]:
        """(best wall time of `repeat` calls in seconds, the last result)."""
        best, out = math.inf, None
        for _ in range(repeat):
            self.sync()
            start = time.perf_counter()
            out = fn()
            self.sync()
            best = min(best, time.perf_counter() - start)
        return best, out

    def row(self, name: str, what: str, size: str, dtype: str, wall: float | None,
            rate: str, floor: str, agreement: str, target: str = "") -> None:
        t = "" if wall is None else (f"{wall * 1e3:.1f} ms" if wall < 1 else f"{wall:.2f} s")
        self.lines.append(f"| {name} | {what} | {size} | {dtype} | {t} | {rate} | {floor} | "
                          f"{agreement} | {target} |")

    def free_bytes(self) -> float:
        if self.cuda:
            return float(self.torch.cuda.mem_get_info()[0])
        import psutil

        return float(psutil.virtual_memory().available)

    def sdpa_scores_fit(self, batch: int, n: int, d: int, dtype) -> tuple[bool, float]:
        """(whether an SDPA call of `batch` sequences of n tokens and head d fits, the bytes
        of its n x n scores): on CUDA the math path (float64, or a head not a multiple of 8)
        holds them, about three copies (scores, weights, mask); the fused paths do not."""
        torch = self.torch
        item = torch.tensor([], dtype=dtype).element_size()
        need = 3.0 * batch * n * n * item
        math_path = not self.cuda or dtype == torch.float64 or d % 8 != 0
        if self.cuda and not math_path:
            return True, need
        if not self.cuda and n <= 4096:
            return True, need
        return need <= self.free_bytes() / 2, need


def pct(x: float) -> str:
    """A ratio as a percentage with three significant digits."""
    return f"{100 * x:.3g} %"


def gib(x: float) -> str:
    return f"{x / 2**30:.3g} GiB"


# ---------------------------------------------------------------------- fields and RK4
def project(x, a):
    """P_x a = a - <a, x> x (the tangent part at unit x)."""
    return a - (a * x).sum(-1, keepdim=True) * x


def field_sdpa(x, beta: float = BETA):
    from attnflow.kernels.torch import attend_tensor

    return project(x, attend_tensor(x, x, x, beta, "causal"))


def padded_sdpa(q, k, v, beta: float, width: int = 8):
    """Causal SDPA with the head zero-padded to `width` columns (scores unchanged), on
    (batch, 1, n, width) views (torch's fused layout)."""
    from torch.nn.functional import pad
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    n, f = v.shape[-2], v.shape[-1]
    p = lambda a: pad(a, (0, width - a.shape[-1])).reshape(-1, 1, n, width)  # noqa: E731
    out = sdpa(p(q), p(k), p(v), is_causal=True, scale=float(beta))
    return out[..., :f].reshape(v.shape)


def field_padded(x, beta: float = BETA):
    return project(x, padded_sdpa(x, x, x, beta))


def field_triton(x, beta: float = BETA, **blocks):
    from attnflow.kernels.triton_fused import attend_tensor

    return attend_tensor(x, x, x, beta, "causal", tangent=x, **blocks)


def triton_configs(b: Bench, sizes: list[tuple[int, int, int]]) -> list[tuple[str, dict]]:
    """(label, block arguments) of the fused kernel: its default, and on a GPU each of
    `sizes` (block_m, block_n, num_warps) as well, so that one run shows which is fastest."""
    from attnflow.kernels.triton_fused import available

    if not available():
        return []
    out = [("Triton fused", {})]
    if b.cuda:
        out += [(f"Triton fused {m}x{n}/{w}w", dict(block_m=m, block_n=n, num_warps=w))
                for m, n, w in sizes]
    return out


def field_harmonic(x, beta: float = BETA):
    """The field at the directions u = x / |x| (the harmonic kernel reads directions, as the
    sphere scheme passes them: RK4's stages leave the sphere)."""
    from attnflow.kernels.harmonic_torch import attend_tensor

    u = x / x.norm(dim=-1, keepdim=True)
    return project(u, attend_tensor(u, u, u, beta, "causal"))


def rk4(field: Callable, x, steps: int, dt: float = DT):
    for _ in range(steps):
        x = rk4_step(field, x, dt)
    return x


def rk4_step(field: Callable, x, dt: float = DT):
    k1 = field(x)
    k2 = field(x + dt / 2 * k1)
    k3 = field(x + dt / 2 * k2)
    k4 = field(x + dt * k3)
    x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x / x.norm(dim=-1, keepdim=True)


def on_circle(torch, shape: tuple, device: str, dtype, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True)).to(device, dtype)


def sampled_rows_error(torch, out, x, beta: float, rows) -> float:
    """max |out_i - attention_i| over the given rows, attention summed directly in float64
    (causal, q = k = v = x (1, n, d))."""
    x64 = x[0].double()
    worst = 0.0
    for i in rows.tolist():
        s = beta * (x64[: i + 1] @ x64[i])
        w = torch.softmax(s, 0)
        worst = max(worst, float((out[0, i].double() - w @ x64[: i + 1]).abs().max()))
    return worst


# ---------------------------------------------------------------------- floors
def floors(b: Bench) -> None:
    torch = b.torch
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).split(".")[1]
        if b.cuda and triton_available():
            rate, how = exp_floor_triton(b, dtype), "Triton chain of exp2 in registers"
        else:
            x = -60 * torch.rand(2**20 if b.quick else 2**24, dtype=dtype)
            wall, _ = b.timed(lambda x=x: torch.exp(x), repeat=5)
            rate, how = x.numel() / wall, f"torch.exp over an array ({b.device})"
        b.floors[f"exp {name}"] = rate
        b.row("floor", f"exp: {how}", "", name, None, f"{rate:.3g} exp/s", "1", "")
    size = 2**22 if b.quick else 2**28  # float32 numbers: 16 MiB / 1 GiB
    src = torch.rand(size, device=b.device)
    dst = torch.empty_like(src)
    wall, _ = b.timed(lambda src=src, dst=dst: dst.copy_(src), repeat=5)
    b.floors["copy"] = 2 * 4 * size / wall
    b.row("floor", "copy bandwidth (read + write)", gib(4 * size), "float32", wall,
          f"{b.floors['copy'] / 1e9:.3g} GB/s", "1", "")
    del src, dst
    g = 256 if b.quick else 8192
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype in (torch.float32, torch.float64):
        name = str(dtype).split(".")[1]
        a = torch.randn(g, g, device=b.device, dtype=dtype)
        wall, _ = b.timed(lambda a=a: a @ a, repeat=3)
        b.floors[f"gemm {name}"] = 2 * g**3 / wall
        b.row("floor", "GEMM (no TF32)", f"{g}x{g}", name, wall,
              f"{b.floors[f'gemm {name}'] / 1e12:.3g} TFLOP/s", "1", "")


def triton_available() -> bool:
    from attnflow.kernels.triton_fused import available

    return available()


def exp_floor_triton(b: Bench, dtype) -> float:
    """exp2 per second on the device (`attnflow.kernels._triton_attend.exp2_chain`)."""
    from attnflow.kernels._triton_attend import exp2_chain

    torch = b.torch
    size, iters, block = 2**22, 2048 if dtype == torch.float32 else 512, 1024
    x = torch.rand(size, device=b.device, dtype=dtype)
    exp2_chain[(size // block,)](x, 4, BLOCK=block)  # compile
    wall, _ = b.timed(lambda: exp2_chain[(size // block,)](x, iters, BLOCK=block), repeat=5)
    return size * iters / wall


# ---------------------------------------------------------------------- rows
def row_w1(b: Bench) -> None:
    torch = b.torch
    from attnflow.kernels import fused

    runs, steps = (2, 1) if b.quick else (50_000, 40)
    pairs = runs * N * (N + 1) / 2 * 4 * steps
    x0 = on_circle(torch, (runs, N, D), b.device, torch.float64)
    check = x0[:8].cpu().numpy()  # (up to) 8 runs
    a = fused.attend(check, check, check, BETA, "causal")
    want = a - np.sum(a * check, -1, keepdims=True) * check
    finals = {}
    fields = [("SDPA + projection", field_sdpa)] + [
        (label, functools.partial(field_triton, **blocks)) for label, blocks in
        triton_configs(b, [(16, 16, 1), (32, 32, 2), (32, 32, 4), (64, 32, 4), (64, 64, 8)])]
    for label, field in fields:
        for dtype in (torch.float64, torch.float32):
            name = str(dtype).split(".")[1]
            x = x0.to(dtype)
            if label.startswith("SDPA"):
                fits, need = b.sdpa_scores_fit(runs, N, D, dtype)
                if not fits:
                    b.row("W1", f"RK4 {steps} steps, {label}", f"B={runs}, n={N}", name, None,
                          "skipped", "", f"SDPA's math path would hold {gib(need)}",
                          TARGETS[f"W1 {name}"])
                    continue
            err = float(np.abs(field(x[:8]).double().cpu().numpy() - want).max())
            wall, xf = b.timed(lambda x=x, field=field: rk4(field, x, steps))
            finals[label, name] = xf.double()
            floor = pairs / wall / b.floors[f"exp {name}"]
            agree = f"field vs numpy fused {err:.1e}"
            if name == "float32" and (label, "float64") in finals:
                drift = float((finals[label, name] - finals[label, "float64"]).abs().max())
                agree += f"; final x32 - x64 {drift:.1e}"
            b.row("W1", f"RK4 {steps} steps, {label}", f"B={runs}, n={N}", name, wall,
                  f"{pairs / wall:.3g} pairs/s", pct(floor), agree, TARGETS[f"W1 {name}"])
    if ("SDPA + projection", "float64") in finals and ("Triton fused", "float64") in finals:
        gap = float((finals["SDPA + projection", "float64"]
                     - finals["Triton fused", "float64"]).abs().max())
        b.row("W1", "Triton vs SDPA, final states", f"B={runs}, n={N}", "float64", None, "", "",
              f"max diff {gap:.1e}", "")


def row_w1_backward(b: Bench) -> None:
    torch = b.torch
    import attnflow as af

    runs, steps = (2, 1) if b.quick else (4096, 10)
    pairs = runs * N * (N + 1) / 2 * 4 * steps
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).split(".")[1]
        x0 = on_circle(torch, (runs, N, D), b.device, dtype, seed=11)
        h = on_circle(torch, (runs, N, D), b.device, dtype, seed=12)
        kernel = af.Attention(beta=BETA).kernel_for(x0)
        label = af.kernels.kernel_name(kernel)

        def field(x, kernel=kernel):
            return project(x, kernel(x, x, x, BETA, "causal"))

        def both(x0=x0, field=field):
            x = x0.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(rk4(field, x, steps).sum(), x)
            return grad

        both()  # first calls of the autograd paths (and compilation)
        fwd, _ = b.timed(lambda x0=x0, field=field: rk4(field, x0, steps), repeat=2)
        wall, grad = b.timed(both, repeat=2)
        eps = 1e-3 if dtype == torch.float32 else 1e-6
        fd = (rk4(field, x0 + eps * h, steps).sum() - rk4(field, x0 - eps * h, steps).sum()) \
            / (2 * eps)
        rel = abs(float(fd) - float((grad * h).sum())) / max(abs(float(fd)), 1e-30)
        b.row("W1B", f"RK4 {steps} steps, forward + backward, kernel {label}",
              f"B={runs}, n={N}", name, wall, f"{pairs / wall:.3g} pairs/s",
              f"forward {fwd * 1e3:.1f} ms: backward {(wall - fwd) / fwd:.2f}x forward",
              f"directional FD (eps {eps:g}) rel {rel:.1e}", TARGETS["W1B"])


def row_e1(b: Bench) -> None:
    torch = b.torch
    n = 512 if b.quick else 10**6
    x = on_circle(torch, (1, n, D), b.device, torch.float32, seed=1)
    pairs = n * (n + 1) / 2
    rows = torch.randint(0, n, (64,), generator=torch.Generator().manual_seed(2))
    from attnflow.kernels.triton_fused import attend_tensor

    for label, blocks in triton_configs(b, [(32, 32, 4), (64, 64, 8), (128, 64, 8)]):
        wall, out = b.timed(lambda blocks=blocks: attend_tensor(x, x, x, BETA, "causal",
                                                                **blocks),
                            repeat=1 if b.quick else 3)
        err = sampled_rows_error(torch, out, x, BETA, rows)
        b.row("E1", f"one causal evaluation, {label}", f"n={n}, d=2", "float32", wall,
              f"{pairs / wall:.3g} pairs/s", pct(pairs / wall / b.floors['exp float32']),
              f"64 rows vs float64 {err:.1e}", TARGETS["E1"])
    for dtype in (torch.float32, torch.float16):
        name = str(dtype).split(".")[1]
        xs = x.to(dtype)
        wall, out = b.timed(lambda xs=xs: padded_sdpa(xs, xs, xs, BETA), repeat=1 if b.quick
                            else 3)
        err = sampled_rows_error(torch, out, x, BETA, rows)
        b.row("E1", "SDPA, head padded to 8 (comparison)", f"n={n}, d=2", name, wall,
              f"{pairs / wall:.3g} pairs/s", pct(pairs / wall / b.floors['exp float32']),
              f"64 rows vs float64 {err:.1e}", "")


def harmonic_traffic(n: int, beta: float = BETA) -> float:
    """Bytes of the moments of one causal evaluation (R = 1, F = 3), written and read once."""
    from attnflow.kernels.harmonic import DEFAULT_TOL, features

    return 2.0 * n * 3 * features(beta, 2, DEFAULT_TOL) * 8


def row_h1(b: Bench) -> None:
    torch = b.torch
    n = 4000 if b.quick else 10**7
    x = on_circle(torch, (1, n, D), b.device, torch.float64, seed=3)
    from attnflow.kernels.harmonic_torch import attend_tensor

    attend_tensor(x[:, :4096], x[:, :4096], x[:, :4096], BETA, "causal")  # warm up
    wall, out = b.timed(lambda: attend_tensor(x, x, x, BETA, "causal"), repeat=1 if b.quick
                        else 3)
    rows = torch.randint(0, n, (16,), generator=torch.Generator().manual_seed(4))
    err = sampled_rows_error(torch, out, x, BETA, rows)
    floor = harmonic_traffic(n) / b.floors["copy"] / wall
    b.row("H1", "harmonic kernel, circle, causal, beta 64", f"n={n}", "float64", wall,
          f"{n / wall:.3g} rows/s", f"{pct(floor)} (moments' traffic)",
          f"16 rows vs float64 {err:.1e}", TARGETS["H1"])


def row_h4(b: Bench, budget_s: float = 60.0) -> None:
    torch = b.torch
    n, t_end = (300, 0.1) if b.quick else (10**6, 10.0)
    steps = round(t_end / DT)
    x = on_circle(torch, (1, n, D), b.device, torch.float64, seed=5)
    rows = torch.randint(0, n, (16,), generator=torch.Generator().manual_seed(6))
    from attnflow.kernels.harmonic_torch import attend_tensor

    err = sampled_rows_error(torch, attend_tensor(x, x, x, BETA, "causal"), x, BETA, rows)
    wall1, x1 = b.timed(lambda: rk4_step(field_harmonic, x))
    note = ""
    if wall1 * steps > budget_s:  # keep the whole script within its minutes
        done = max(1, int(budget_s / wall1))
        wall, xf = b.timed(lambda: rk4(field_harmonic, x1, done - 1))
        wall = (wall + wall1) * steps / done
        note = f"; extrapolated from {done} of {steps} steps"
    else:
        wall, xf = b.timed(lambda: rk4(field_harmonic, x1, steps - 1))
        wall += wall1
    unit = float((xf.norm(dim=-1) - 1).abs().max())
    floor = 4 * steps * harmonic_traffic(n) / b.floors["copy"] / wall
    b.row("H4", f"RK4 dt={DT} to t={t_end:g}, harmonic, causal, beta 64", f"n={n}", "float64",
          wall, f"{4 * steps * n / wall:.3g} rows/s", f"{pct(floor)} (moments' traffic)",
          f"field 16 rows vs float64 {err:.1e}; |x| - 1 {unit:.1e}{note}", TARGETS["H4"])


def row_w2(b: Bench) -> None:
    torch = b.torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from attnflow.kernels.torch import attend_tensor

    n, d = (256, 64) if b.quick else (65_536, 64)
    dtypes = (torch.float32,) if not b.cuda else (torch.float32, torch.float16)
    for dtype in dtypes:
        name = str(dtype).split(".")[1]
        fits, need = b.sdpa_scores_fit(1, n, d, dtype)
        if not fits:
            b.row("W2", "one causal evaluation", f"n={n}, d={d}", name, None, "skipped", "",
                  f"SDPA's math path would hold {gib(need)}", TARGETS["W2"])
            continue
        g = torch.Generator().manual_seed(7)
        q, k, v = (torch.randn((1, n, d), generator=g).to(b.device, dtype) / d**0.25
                   for _ in range(3))
        attend_tensor(q[:, :256], k[:, :256], v[:, :256], 1.0, "causal")
        wall, out = b.timed(lambda q=q, k=k, v=v: attend_tensor(q, k, v, 1.0, "causal"),
                            repeat=3)
        bare, ref = b.timed(lambda q=q, k=k, v=v: sdpa(q[:, None], k[:, None], v[:, None],
                                                       is_causal=True, scale=1.0), repeat=3)
        gemm = b.floors["gemm float32"]
        diff = float((out.float() - ref[:, 0].float()).abs().max())
        b.row("W2", "one causal evaluation, attnflow tensor path", f"n={n}, d={d}", name, wall,
              f"{wall / bare:.2f}x bare SDPA ({bare * 1e3:.1f} ms)",
              f"{pct(2 * n * n * d / wall / gemm)} of f32 GEMM", f"vs bare SDPA {diff:.1e}",
              TARGETS["W2"])


def row_bw(b: Bench) -> None:
    torch = b.torch
    from torch.utils.checkpoint import checkpoint

    n, steps = (128, 2) if b.quick else (10**4, 200)
    x0 = on_circle(torch, (1, n, D), b.device, torch.float32, seed=8)
    h = on_circle(torch, (1, n, D), b.device, torch.float32, seed=9)

    def loss(x, checkpointed: bool, steps: int = steps):
        for _ in range(steps):
            x = checkpoint(rk4_step, field_padded, x, use_reentrant=False) if checkpointed \
                else rk4_step(field_padded, x)
        return x[0, -1, 0]  # the last token's first coordinate

    warm = x0.clone().requires_grad_(True)
    torch.autograd.grad(loss(warm, True, 1), warm)  # first calls of the autograd paths
    fwd, _ = b.timed(lambda: loss(x0, False), repeat=2)
    for checkpointed in (False, True):
        if b.cuda:
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if b.cuda else 0

        def both(checkpointed=checkpointed):
            x = x0.clone().requires_grad_(True)
            value = loss(x, checkpointed)
            (grad,) = torch.autograd.grad(value, x)
            return grad

        wall, grad = b.timed(both, repeat=2)
        peak = (torch.cuda.max_memory_allocated() - base) if b.cuda else float("nan")
        eps = 1e-3
        fd = (loss(x0 + eps * h, False) - loss(x0 - eps * h, False)) / (2 * eps)
        rel = abs(float(fd) - float((grad * h).sum())) / max(abs(float(fd)), 1e-30)
        what = "forward + backward, " + ("checkpoint per step" if checkpointed else "plain")
        b.row("BW", what, f"n={n}, {steps} steps", "float32", wall,
              f"backward {(wall - fwd) / fwd:.2f}x forward ({fwd:.3g} s)",
              f"peak {gib(peak) if b.cuda else 'n/a (CPU)'}",
              f"directional FD (eps 1e-3, float32) rel {rel:.1e}", TARGETS["BW"])


def row_td(b: Bench) -> None:
    torch = b.torch
    try:
        from torchdiffeq import odeint
    except ImportError:
        b.row("TD", "torchdiffeq RK4 on W1", "", "", None, "skipped", "",
              "torchdiffeq not importable (pip install torchdiffeq)", TARGETS["TD"])
        return
    runs, steps = (8, 1) if b.quick else (5_000, 40)
    pairs = runs * N * (N + 1) / 2 * 4 * steps
    x = on_circle(torch, (runs, N, D), b.device, torch.float32, seed=10)
    t = torch.tensor([0.0, DT * steps], device=b.device)
    fields = [("SDPA", field_sdpa)] + ([("Triton fused", field_triton)] if triton_available()
                                       else [])
    for label, field in fields:
        wall, xt = b.timed(lambda field=field: odeint(
            lambda _t, y: field(y), x, t, method="rk4", options={"step_size": DT})[-1])
        ours, xo = b.timed(lambda field=field: rk4(field, x, steps))
        diff = float((xt / xt.norm(dim=-1, keepdim=True) - xo).abs().max())
        b.row("TD", f"torchdiffeq RK4 on W1, field by {label}", f"B={runs}, n={N}", "float32",
              wall, f"{pairs / wall:.3g} pairs/s; ours {pairs / ours:.3g}",
              f"ours {wall / ours:.2f}x faster",
              f"final states {diff:.1e} (torchdiffeq does not renormalise)", TARGETS["TD"])


RUNNERS = {"W1": row_w1, "W1B": row_w1_backward, "E1": row_e1, "H1": row_h1, "H4": row_h4,
           "W2": row_w2, "BW": row_bw, "TD": row_td}


def device_tests(b: Bench) -> str:
    """Run the tests marked gpu (on the CPU: the kernels' files only) in a subprocess; its
    summary line."""
    paths = ["tests/"] if b.cuda else ["tests/test_triton_fused.py",
                                        "tests/test_harmonic_torch.py"]
    env = dict(os.environ)
    if b.cuda:
        env.pop("TRITON_INTERPRET", None)
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q",
                               "-p", "no:cacheprovider", *paths], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired:
        return "pytest -m gpu: timed out after 150 s"
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    return f"pytest -m gpu {' '.join(paths)}: {lines[-1] if lines else done.stderr[-200:]}"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check that it runs)")
    parser.add_argument("--only", default=",".join(ROWS), help="rows, comma-separated")
    parser.add_argument("--no-tests", action="store_true", help="skip pytest -m gpu")
    args = parser.parse_args(argv)
    only = [r.strip() for r in args.only.split(",") if r.strip()]
    if unknown := sorted(set(only) - set(ROWS)):
        parser.error(f"--only: expected rows among {', '.join(ROWS)}, received {unknown}")
    if not args.device.startswith("cuda"):  # Triton runs on the CPU only in its interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    b = Bench(args.device, args.quick)
    if not triton_available():
        b.row("Triton", "the fused kernel's rows", "", "", None, "skipped", "",
              "triton not importable (pip install 'attnflow[gpu]')", "")
    name = torch.cuda.get_device_name() if b.cuda else "cpu"
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "not installed"
    head = [f"device {args.device} ({name}); torch {torch.__version__}, triton {tv}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"python benchmarks/gpu.py {' '.join(argv if argv is not None else sys.argv[1:])}"]
    start = time.perf_counter()
    if not args.no_tests:
        head.append(device_tests(b))
    head.append("")
    floors(b)
    for row in only:
        try:
            RUNNERS[row](b)
        except Exception as err:  # one failing row (CUDA OOM included) must not stop the others
            kind = "out of memory" if "out of memory" in str(err).lower() else type(err).__name__
            first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
            b.row(row, "FAILED", "", "", None, kind, "", first, "")
            if b.cuda:
                torch.cuda.empty_cache()
    tail = ["", f"total {time.perf_counter() - start:.0f} s"]
    return "\n".join(head + HEADER + b.lines + tail) + "\n"


if __name__ == "__main__":
    print(main())
