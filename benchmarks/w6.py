"""W6: one decoder block with an MLP against the GEMM floor (issue 20).

    python benchmarks/w6.py                  # n = 4096, float32 and float64 (about 1 min)
    python benchmarks/w6.py --quick          # n = 512, seconds
    python benchmarks/w6.py --profile        # also where one float64 step's time goes

The block has SmolLM2-135M's shapes with random weights: d = 576, 9 query heads of size
e = 64 sharing 3 key/value heads (grouped-query attention: heads of a group share the K and V
array objects, as `attnflow.pretrained.build` passes them), factored (Q, K, V, O) heads,
beta = 1 / sqrt(64), causal, RoPE (base 1e5, adjacent pairs), pre-LN with RMSNorm(g, 1e-5)
around attention and around a SwiGLU MLP of hidden width 1536, in sequential form: one Euler
step of dt = 1 (`af.simulate`) is one layer of the network on n tokens.

Work counted (flops of the GEMMs, 2 per multiply-add; norms, RoPE, softmax and SwiGLU's
elementwise passes are not counted):

    projections  2 n d (H e + 2 Hkv e) (q; k, v once per key/value head) + 2 n (H e) d (o)
    attention    2 H n(n+1)/2 e (q k^T on the causal half) + the same for the weighted values
    MLP          3 x 2 n d h (gate, up, down)

The floor: a plain numpy GEMM of the same dtype, (n, d) @ (d, h) (the MLP's shape), timed
right before each step (alternating, several times); the share is the block's flops per
second over the GEMM's, in wall time and in CPU time (all threads of the process). On a shared
machine the CPU-time share is the steadier one.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import platform
import pstats
import sys
import time
from pathlib import Path

import numpy as np

import attnflow as af

sys.path.insert(0, str(Path(__file__).parent))
from machine import loadavg  # noqa: E402

HERE = Path(__file__).parent
D, HEADS, KV_HEADS, HEAD, HIDDEN = 576, 9, 3, 64, 1536  # SmolLM2-135M


def block_and_tokens(n: int, dtype: type, seed: int = 0) -> tuple[af.Attention, np.ndarray]:
    """The W6 block (module docstring), weights Gaussian of variance 1 / fan-in, gains near
    1, in `dtype`; and n tokens of unit variance per coordinate."""
    rng = np.random.default_rng(seed)

    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(dtype)

    def gain() -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(D)).astype(dtype)

    group = HEADS // KV_HEADS
    Ks = [w(HEAD, D) for _ in range(KV_HEADS)]
    Vs = [w(HEAD, D) for _ in range(KV_HEADS)]
    heads = [(w(HEAD, D), Ks[h // group], Vs[h // group], w(D, HEAD)) for h in range(HEADS)]
    mlp = af.MLP(w(HIDDEN, D), w(D, HIDDEN), w(HIDDEN, D), "swiglu")
    block = af.Attention(heads=heads, beta=1 / np.sqrt(HEAD),
                         norm=af.family.Pre(af.RMSNorm(gain(), 1e-5)),
                         rope=af.RoPE(1e5, "adjacent"), mlp=mlp,
                         mlp_norm=af.family.Pre(af.RMSNorm(gain(), 1e-5)), form="sequential")
    return block, rng.standard_normal((n, D)).astype(dtype)


def flops(n: int) -> dict[str, float]:
    """The GEMM work of one step of the W6 block on n tokens (module docstring)."""
    return {"projections": 2 * n * D * (HEADS * HEAD + 2 * KV_HEADS * HEAD)
            + 2 * n * HEADS * HEAD * D,
            "attention": 2 * 2 * HEADS * n * (n + 1) // 2 * HEAD,
            "MLP": 3 * 2 * n * D * HIDDEN}


def timed(fn, clock) -> float:
    start = clock()
    fn()
    return clock() - start


def best_gemm(a: np.ndarray, b: np.ndarray, repeats: int = 3) -> tuple[float, float]:
    """Fastest wall time of a @ b, and the CPU time of that call (seconds)."""
    best = (np.inf, np.inf)
    for _ in range(repeats):
        cpu = time.process_time()
        wall = timed(lambda: a @ b, time.perf_counter)
        best = min(best, (wall, time.process_time() - cpu))
    return best


def one_step(block: af.Attention, x: np.ndarray) -> np.ndarray:
    """One Euler step of dt = 1: the block's layer (sequential form: attention, then MLP)."""
    return af.simulate(block, x, 1.0, save_at=[1.0], method="euler", dt=1.0).final


def check_step(block: af.Attention, x: np.ndarray, y: np.ndarray) -> float:
    """max |y - layer(x)| with the layer written out from the block's two drifts (pre-LN: the
    state is in R^d, no retraction): what `one_step` timed is that layer."""
    attention, mlp = block.splitting(block.kernel_for(x))
    mid = x + attention(x)
    return float(np.abs(y - (mid + mlp(mid))).max())


def measure(n: int, dtype: type, alternations: int) -> dict:
    """Shares of the GEMM floor over `alternations` (floor, step) pairs (medians)."""
    block, x = block_and_tokens(n, dtype)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, D)).astype(dtype)
    b = rng.standard_normal((D, HIDDEN)).astype(dtype)
    work = flops(n)
    total = sum(work.values())
    y = one_step(block, x)  # warm-up (compilation)
    err = check_step(block, x, y)
    shares: dict[str, list[float]] = {"wall": [], "cpu": []}
    step_times: dict[str, list[float]] = {"wall": [], "cpu": []}
    gemm_rates: dict[str, list[float]] = {"wall": [], "cpu": []}
    for _ in range(alternations):
        g_wall, g_cpu = best_gemm(a, b)
        cpu = time.process_time()
        s_wall = timed(lambda: one_step(block, x), time.perf_counter)
        s_cpu = time.process_time() - cpu
        for clock, g, s in (("wall", g_wall, s_wall), ("cpu", g_cpu, s_cpu)):
            gemm = 2 * n * D * HIDDEN / g
            gemm_rates[clock].append(gemm)
            step_times[clock].append(s)
            shares[clock].append(total / s / gemm)
    return {"dtype": np.dtype(dtype).name, "n": n, "flops": total, "work": work, "err": err,
            "shares": shares, "steps": step_times, "gemm": gemm_rates}


def profile(n: int, dtype: type, top: int = 14) -> str:
    """cProfile of one step (CPU time of the process, all threads), by internal time."""
    block, x = block_and_tokens(n, dtype)
    one_step(block, x)
    prof = cProfile.Profile(time.process_time)
    prof.runcall(one_step, block, x)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def cpu_isa() -> str:
    """The CPU model and its widest vector instruction sets (from /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines()
                      if line.startswith("flags")), []))
    isa = [f for f in ("avx512f", "avx512_bf16", "avx2", "fma") if f in flags]
    return f"{model}, {' '.join(isa) or 'no avx2'}"


def markdown(results: list[dict], command: str, seconds: float) -> str:
    lines = [f"## {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
             f"`{command}`", "",
             f"W6 (one SmolLM2-shaped block with a SwiGLU MLP, one Euler dt = 1 step). CPU: "
             f"{cpu_isa()}; python {platform.python_version()}, numpy {np.__version__}; load "
             f"average at the end {', '.join(f'{v:.1f}' for v in loadavg())} (a machine "
             f"shared with other agents: read the shares, not the absolute times). "
             f"Took {seconds:.0f} s.", "",
             "| dtype | n | GFLOP per step | share of the GEMM floor, CPU time | wall time "
             "| step s (wall, CPU) | GEMM GFLOP/s (wall, CPU) | check |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        cpu, wall = r["shares"]["cpu"], r["shares"]["wall"]
        lines.append(
            f"| {r['dtype']} | {r['n']} | {r['flops'] / 1e9:.1f} | **{np.median(cpu):.2f}** "
            f"(" + ", ".join(f"{s:.2f}" for s in cpu) + f") | {np.median(wall):.2f} ("
            + ", ".join(f"{s:.2f}" for s in wall) + f") | {np.median(r['steps']['wall']):.2f}, "
            f"{np.median(r['steps']['cpu']):.2f} | {np.median(r['gemm']['wall']) / 1e9:.1f}, "
            f"{np.median(r['gemm']['cpu']) / 1e9:.1f} | max dev. from the written-out layer "
            f"{r['err']:.0e} |")
    work = results[0]["work"]
    total = sum(work.values())
    lines += ["", "Flops per step: " + ", ".join(
        f"{k} {v / 1e9:.2f} G ({100 * v / total:.0f}%)" for k, v in work.items())
        + f" at n = {results[0]['n']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 512, 2 alternations")
    parser.add_argument("--n", type=int, default=None, help="tokens (default 4096)")
    parser.add_argument("--alternations", type=int, default=None,
                        help="(floor, step) pairs per dtype (default 5)")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--profile", action="store_true",
                        help="append a cProfile of one float64 step")
    parser.add_argument("--results", default="", help="Markdown file to append to")
    args = parser.parse_args(argv)
    n = args.n or (512 if args.quick else 4096)
    alternations = args.alternations or (2 if args.quick else 5)
    start = time.perf_counter()
    results = [measure(n, np.dtype(name).type, alternations)
               for name in args.dtypes.split(",")]
    command = "python benchmarks/w6.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(results, command.strip(), time.perf_counter() - start)
    if args.profile:
        text += ("\nOne float64 step, cProfile (CPU time of the process), by internal time:"
                 "\n\n```\n" + profile(n, np.float64).strip() + "\n```\n")
    if args.results:
        with open(args.results, "a") as fh:
            fh.write("\n" + text)
    return text


if __name__ == "__main__":
    print(main())
