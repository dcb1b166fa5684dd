"""The array layer's cost on CPU (issue 41): W1 with numpy input on two source trees, the
torch path on the same workload, and the peak memory of a backward pass with and without
checkpointing.

    git archive BASE src | tar -x -C /tmp/base            # the tree before the array layer
    python benchmarks/torch_cpu.py --before /tmp/base/src  # about 10 min on a loaded 2-core machine

Every measurement runs in a child process of its own (PYTHONPATH = the tree), alternating
the trees' order over repetitions. W1 here is run.py's workload at a smaller size (RUNS runs
x n = 200 x d = 2, beta = 64, causal, Q = K = V = I, RK4 dt = 0.05, STEPS steps, float64):
the CPU time (all threads) of `attnflow.simulate`, one warm-up call first. Criterion (issue
41): numpy input keeps today's speed, median after / before <= 1.05. The torch rows run the
same simulate with the tokens as a float64 (and float32) CPU tensor, in this tree, and give
the ratio to this tree's numpy time. The memory rows: RK4 with gradients through every step
(unnormalised weights, whose (n, n) scores every field evaluation saves for the backward
pass; n = MEM_N, d = 2, MEM_STEPS steps, loss = sum of the final state, backward), the
child's peak resident memory above its resident memory before the run, without and with
checkpoint = MEM_CHUNK. (With softmax, SDPA saves only O(n) per evaluation at d = 2, and the
peak is the backward's workspace: 2026-12-04, n = 1000, 100 steps: 226 MB plain, 397 MB
checkpointed, forward 12.7 s, forward + backward 224 s and 141 s on the loaded machine.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
RUNS, N, STEPS = 128, 200, 20
MEM_N, MEM_STEPS, MEM_CHUNK = 400, 100, 10

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import attnflow as af
kind = sys.argv[2]
RUNS, N, STEPS, MEM_N, MEM_STEPS, MEM_CHUNK = (int(a) for a in sys.argv[3:9])
def cpu():
    return time.process_time()
if kind.startswith("w1"):
    model = af.Attention(beta=64.0)
    x0 = af.sphere.uniform((RUNS, N), 2, seed=0)
    if kind != "w1-numpy":
        import torch
        x0 = torch.from_numpy(x0 if kind == "w1-torch64" else x0.astype(np.float32))
    af.simulate(model, x0[:8], 0.05, dt=0.05)  # warm-up (compiles, caches)
    c, w = cpu(), time.perf_counter()
    af.simulate(model, x0, STEPS * 0.05, dt=0.05, save_at=[STEPS * 0.05])
    print(json.dumps({"cpu": cpu() - c, "wall": time.perf_counter() - w}))
else:
    import torch
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
    model = af.Attention(beta=1.0, attention="unnormalised")  # its (n, n) scores are saved
    x0 = torch.from_numpy(af.sphere.uniform((MEM_N,), 2, seed=0)).requires_grad_()
    af.simulate(model, x0.detach(), 0.05, dt=0.05)
    before = rss()
    chunk = None if kind == "mem-plain" else MEM_CHUNK
    w = time.perf_counter()
    run = af.simulate(model, x0, MEM_STEPS * 0.05, dt=0.05, save_at=[MEM_STEPS * 0.05],
                      checkpoint=chunk)
    forward = time.perf_counter() - w
    run.states[-1].sum().backward()
    total = time.perf_counter() - w
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_mb": peak - before, "forward": forward, "total": total}))
"""


def torch_version() -> str:
    import torch

    return torch.__version__


def child(tree: str, kind: str) -> dict:
    args = [sys.executable, "-c", CHILD, tree, kind,
            *map(str, (RUNS, N, STEPS, MEM_N, MEM_STEPS, MEM_CHUNK))]
    out = subprocess.run(args, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin",
                              "HOME": str(Path.home())})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{Path(tree).parent.name} {kind}: {result}", file=sys.stderr, flush=True)
    return result


def cpu_name() -> str:
    """The CPU model and its widest vector instruction set (from /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), platform.machine())
    isa = "AVX-512" if " avx512f" in text else "AVX2" if " avx2" in text else "no AVX2"
    return f"{model}, {isa}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="src of the tree before")
    parser.add_argument("--after", default=str(HERE.parent / "src"))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--memory-only", action="store_true", help="only the memory rows")
    args = parser.parse_args()
    ratios, torch64, torch32 = [], [], []
    for rep in range(0 if args.memory_only else args.reps):
        order = [args.before, args.after] if rep % 2 == 0 else [args.after, args.before]
        cpu = {tree: child(tree, "w1-numpy")["cpu"] for tree in order}
        ratios.append(cpu[args.after] / cpu[args.before])
        torch64.append(child(args.after, "w1-torch64")["cpu"] / cpu[args.after])
        torch32.append(child(args.after, "w1-torch32")["cpu"] / cpu[args.after])
    mem = {kind: child(args.after, kind) for kind in ("mem-plain", "mem-checkpoint")}
    date = datetime.date.today().isoformat()
    lines = [
        f"\n## {date}: torch_cpu.py (issue 41: the array layer on CPU)\n",
        f"`python benchmarks/torch_cpu.py --before <tree before the array layer>`, "
        f"{cpu_name()}, torch {torch_version()}, {args.reps} repetitions, medians.\n",
        "| row | value | criterion |", "|---|---|---|",
    ]
    if ratios:
        lines += [
            f"| W1 numpy input ({RUNS} runs x {N} x 2, RK4, {STEPS} steps): CPU after / "
            f"before | {np.median(ratios):.3f} (all: {', '.join(f'{r:.3f}' for r in ratios)}) "
            f"| <= 1.05: {'met' if np.median(ratios) <= 1.05 else 'NOT met'} |",
            f"| W1 as a float64 CPU tensor: CPU time / numpy's | {np.median(torch64):.2f} | - |",
            f"| W1 as a float32 CPU tensor: CPU time / numpy float64's | "
            f"{np.median(torch32):.2f} | - |"]
    for kind, label in (("mem-plain", "no checkpoint"),
                        ("mem-checkpoint", f"checkpoint = {MEM_CHUNK}")):
        m = mem[kind]
        lines.append(f"| backward through RK4 (unnormalised), n = {MEM_N}, {MEM_STEPS} steps, "
                     f"{label}: peak "
                     f"RSS above start | {m['peak_mb']:.0f} MB (forward {m['forward']:.2f} s, "
                     f"forward + backward {m['total']:.2f} s) | - |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
