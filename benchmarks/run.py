"""Speed benchmarks of attnflow's kernels, each a ratio against a baseline timed in the same
run (absolute times drift on a shared machine; ratios measured together do not).

    python benchmarks/run.py            # full sizes (minutes), table appended to RESULTS.md
    python benchmarks/run.py --quick    # small sizes, seconds (the CI smoke test)
    python benchmarks/run.py --only W5 --runs 1000    # the model family's costs, minutes
    python benchmarks/run.py --only W1,W2,SDPA --target avx2   # numba, numpy, torch on AVX2

Every table names the CPU, its vector instruction set and the one each library runs with
(`--target avx2` makes numba compile for Haswell's AVX2, numpy and torch dispatch to their
AVX2 code and OpenBLAS load its Haswell kernels, so that an AVX-512 machine measures both;
OPENBLAS_CORETYPE set in the environment overrides OpenBLAS's own choice of kernels on a
native run: the table says which it loaded, benchmarks/machine.py).

Floors are floors: per dtype, the fastest vectorised exp of the process (numpy's or
torch's, whichever is faster on this CPU: numpy vectorises float64 exp only with AVX-512),
timed beside each run on 40 000 cache-resident arguments uniform in W1's score range
[-2 beta, 0] (float32: [-87, 0], above the subnormal results and their slow path), on as many
threads as the kernel uses, all at once (what they reach together, not one thread's rate
times their number: vCPUs may share a core's units); W2 against the GEMM rate of its own
dtype.

W1  the paper's Fig. 3 ensemble: runs x n = 200 x d = 2, beta = 64, causal, Q = K = V = I,
    RK4 dt = 0.05 (t = 150 projected from a few steps). Unit: causal pair-evaluations per
    second, runs * n(n+1)/2 * field evaluations / s. Baselines: the textbook per-run numpy
    step and its batched (B, n, n) form (benchmarks/baselines.py); floor: the exp floor of
    the run's dtype, timed beside each run (medians of ALTERNATIONS pairs).
W2  one field evaluation, n = 65 536, d = 64, causal, random Q, K, V (blocked kernel), float64
    and float32, each in a child process whose peak RSS is reported; against the GEMM rate in
    the same dtype timed in that child right before and after it, counting 2 n^2 d flops
    (the causal halves of scores and values), in wall and in CPU time.
W3  n = 200, d = 2, beta = 64, t = 10^4: work-precision of the adaptive methods (dopri5, and
    the implicit bdf, radau, lsoda with the exact Jacobian) against fixed-step RK4.
W4  the torch backend (CPU threads) on W1 beside numpy (torch at W2's size: SDPA).
SDPA  one causal evaluation, attnflow's default kernel ("auto") against what a user would
    call instead, torch.nn.functional.scaled_dot_product_attention(X, X, X, is_causal=True)
    on (1, 1, n, d) tensors (2-D ones take torch's materialising path), n = 1024 .. 65 536,
    d = 64 (X standard normal / d^(1/4), scale 1) and d = 2 (X on the circle, beta = 64, the
    paper's), float64 and float32, the same thread count; ratio = SDPA's time / attnflow's
    (best of runs of calls of each side in turn, each run after a pause in which torch's
    spinning OpenMP workers go to sleep: `SDPA_CALLS`, `SDPA_SETTLE`; one call at 65 536).
W5  what the model family's options cost at W1 size (fused kernel, float64): W1's RK4 with
    RoPE and with ALiBi (default slope) as fractions of the exp floor beside plain W1, and
    the time of one Euler step: plain post-LN, pre-LN, and noisy (Euler-Maruyama,
    sigma = 0.1). The variants alternate (5 times); medians of the fractions of the floor
    (as W1) and of the costs relative to the plain run of the same alternation, in CPU and
    in wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import attnflow as af
from attnflow.parallel import n_threads
from attnflow.sphere import uniform

sys.path.insert(0, str(Path(__file__).parent))
from baselines import batched_step, textbook_step  # noqa: E402
from machine import AVX2_ENV, describe, loadavg  # noqa: E402

HERE = Path(__file__).parent
BETA, N, D, DT = 64.0, 200, 2, 0.05
PAIRS = N * (N + 1) // 2
ALTERNATIONS = 5  # floor / simulation pairs timed for each fused W1 row (median reported)


def best_of(fn, repeats: int = 3, clock=time.perf_counter) -> float:
    """Smallest time of `repeats` calls (seconds; wall time unless another clock is given)."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


# W1's scores minus their shift lie in [-2 beta, 0]; float32 exp is normal above -87.3.
FLOOR_RANGE = {np.float64: -2 * BETA, np.float32: -87.0}
FLOOR_SIZE = 40_000  # elements: cache-resident


def _torch():
    """torch, or None where it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def exp_floor(dtype=np.float64, clock=time.perf_counter, threads: int = 1
              ) -> tuple[float, str]:
    """The fastest exp of the process in `dtype` (see the module docstring): (ns per
    element and thread, whose: "numpy" or "torch"), wall time or, with
    clock=time.thread_time, each thread's CPU time. With threads > 1 that many threads run
    it at once, each on its own arrays (rounds started together at a barrier): the floor of
    a kernel on that many threads is what they reach together, not one thread's rate times
    their number (two threads of this project's 2-vCPU machines have reached 1.13-2.16x one
    thread's rate, benchmarks/RESULTS.md 2026-12-02 12:33-13:22)."""
    torch = _torch()
    libraries = {"numpy": lambda x, out: np.exp(x, out=out)}
    if torch is not None:
        libraries["torch"] = lambda x, out: torch.exp(torch.from_numpy(x),
                                                      out=torch.from_numpy(out))
    seconds = {}
    for name, exp in libraries.items():
        per_thread = [[] for _ in range(threads)]
        barrier = threading.Barrier(threads)

        def work(times: list, exp=exp, barrier=barrier) -> None:
            x = np.random.default_rng(0).uniform(FLOOR_RANGE[dtype], 0, FLOOR_SIZE).astype(dtype)
            out = np.empty_like(x)
            for _ in range(5):
                barrier.wait()
                start = clock()
                for _ in range(100):
                    exp(x, out)
                times.append(clock() - start)

        saved = torch.get_num_threads() if torch is not None else None
        if torch is not None:
            torch.set_num_threads(1)
        try:
            if threads == 1:
                work(per_thread[0])
            else:
                workers = [threading.Thread(target=work, args=(t,)) for t in per_thread]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
        finally:
            if torch is not None:
                torch.set_num_threads(saved)
        seconds[name] = float(np.median([min(t) for t in per_thread]))
    name = min(seconds, key=seconds.get)
    return seconds[name] / 100 / FLOOR_SIZE * 1e9, name


def w1(runs: int, steps: int, rows: list, torch_too: bool) -> None:
    floors = {}
    for dtype in (np.float64, np.float32):
        ns, whose = exp_floor(dtype, threads=n_threads())
        floors[dtype] = n_threads() / ns * 1e9
        alone = exp_floor(dtype)[0]
        rows.append(("W1", f"floor: fastest exp on all threads at once, {np.dtype(dtype).name}",
                     f"{n_threads()} thr", floors[dtype], None,
                     f"{whose} exp, {ns:.3f} ns per element and thread ({alone:.3f} on one "
                     f"thread alone: {n_threads()} threads reach {alone / ns * n_threads():.2f}x "
                     "its rate)"))
    floor = floors[np.float64]
    x0 = uniform((runs, N), D, seed=0)
    few = min(runs, 20)
    t = best_of(lambda: [textbook_step(x, BETA, DT) for x in x0[:few] for _ in range(5)], 2)
    textbook = few * 5 * PAIRS / t
    rows.append(("W1", "baseline (a): textbook numpy per run, Euler", f"B={few}", textbook,
                 textbook / floor, ""))
    batch = min(runs, 256)
    t = best_of(lambda: batched_step(x0[:batch], BETA, DT), 2)
    rows.append(("W1", "baseline (b): textbook batched (B,n,n)", f"B={batch}", batch * PAIRS / t,
                 batch * PAIRS / t / floor, ""))
    finals, medians = {}, {}
    for name, backend, dtype, size, n_steps in (
            ("attnflow fused f64, RK4", "fused", np.float64, runs, steps),
            ("attnflow fused f32, RK4", "fused", np.float32, runs, steps),
            ("attnflow torch CPU f64, RK4", "torch", np.float64, min(runs, 256), 1)):
        if backend == "torch" and not torch_too:
            continue
        model = af.Attention(beta=BETA, backend=backend)
        x = x0[:size].astype(dtype)
        # Compile, and warm up at full size (the first full-size call of a process once ran
        # at half speed, cause not pinned down). Then ALTERNATIONS timed runs, each right
        # after its own floor measurement: the machine's speed drifts by 10-20% within
        # minutes, so each run is compared with the floor measured beside it (medians).
        af.simulate(model, x, t_end=DT, dt=DT, save_at=[DT], normalize=True)  # (not 101 saves)
        rates, fractions, cpu_fractions, cpu_rates = [], [], [], []
        for _ in range(ALTERNATIONS if backend == "fused" else 1):
            floor_now = n_threads() / exp_floor(dtype, threads=n_threads())[0] * 1e9
            # per CPU second of the floor's threads, all running at once
            floor_cpu = 1e9 / exp_floor(dtype, time.thread_time, n_threads())[0]
            cpu = time.process_time()
            traj = af.simulate(model, x, t_end=n_steps * DT, dt=DT, save_at=[n_steps * DT],
                               normalize=True)
            cpu = time.process_time() - cpu
            rates.append(size * PAIRS * traj.n_evals / traj.wall_time)
            fractions.append(rates[-1] / floor_now)
            cpu_rates.append(size * PAIRS * traj.n_evals / cpu)
            cpu_fractions.append(cpu_rates[-1] / floor_cpu)
        rate = float(np.median(rates))
        finals[name] = traj.final
        medians[name] = rate, float(np.median(cpu_rates))
        minutes = 3000 * 4 * runs * PAIRS / rate / 60  # t = 150: 3000 RK4 steps of all runs
        note = f"x{rate / textbook:.1f} textbook; t=150 in {minutes:.1f} min"
        if len(fractions) > 1:
            note += "; fractions of the floor beside each run: " + ", ".join(
                f"{f:.3f}" for f in fractions)
        note += ("; in CPU time (pairs per CPU second of the process over the floor's per "
                 "CPU second of its threads, all running at once): "
                 + ", ".join(f"{f:.3f}" for f in cpu_fractions))
        if dtype == np.float32:
            err = np.abs(traj.final - finals["attnflow fused f64, RK4"]).max()
            wall64, cpu64 = medians["attnflow fused f64, RK4"]
            note += (f"; **{rate / wall64:.2f}x the float64 rate** (in CPU time "
                     f"{medians[name][1] / cpu64:.2f}x); max |x32 - x64| after {steps} steps "
                     f"= {err:.1e}")
        rows.append(("W1", name, f"B={size}", rate, float(np.median(fractions)), note))


W2_CHILD = """
import json, resource, sys, time, numpy as np
from attnflow.kernels import blocked, dense
n, d, backend, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = np.random.default_rng(0)

def clocks(fn):  # (wall, CPU seconds of this process) of one call
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu

def gemm():  # 2048^3 products on all BLAS threads: the best (wall, CPU) rates of 3
    a, b = rng.standard_normal((2, 2048, 2048)).astype(dtype)
    times = [clocks(lambda: a @ b) for _ in range(3)]
    return [2 * 2048 ** 3 / min(t[i] for t in times) for i in (0, 1)]

q, k, v = ((rng.standard_normal((n, d)) / d ** 0.25).astype(dtype) for _ in range(3))
kernel = {"blocked": blocked.attend}[backend]
m = min(n, 2048)  # the dense check, at n = 2048 for the full size
err = float(np.abs(kernel(q[:m], k[:m], v[:m], 1.0, "causal")
                   - dense.attend(q[:m], k[:m], v[:m], 1.0, "causal")).max())
before = gemm()
wall, cpu = clocks(lambda: kernel(q, k, v, 1.0, "causal"))
try:  # this process's own peak (ru_maxrss keeps the forking parent's peak across exec)
    with open("/proc/self/status") as fh:
        rss_mb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024
except OSError:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
after = gemm()
print(json.dumps({"wall": wall, "cpu": cpu, "err": err, "rss_mb": rss_mb,
                  "gemm_before": before, "gemm_after": after}))
"""


def w5(runs: int, steps: int, rows: list, alternations: int = 5) -> None:
    """The model family's options at W1 size (see the module docstring). Each run is timed
    right after its own floor measurement (wall time, as W1). On a shared machine wall times
    swing with other processes' load, CPU times (all threads of this process) less, so the
    cost of each option against the plain run of the same alternation is given both ways."""
    x0 = uniform((runs, N), D, seed=0)
    plain = af.Attention(beta=BETA, backend="fused")
    variants = {
        "W1 RK4, plain": (plain, "rk4", {}),
        "W1 RK4, RoPE (base 1e4)": (af.Attention(beta=BETA, backend="fused", rope=af.RoPE()),
                                    "rk4", {}),
        "W1 RK4, ALiBi (slope 2^-8)": (af.Attention(beta=BETA, backend="fused",
                                                    alibi=af.ALiBi()), "rk4", {}),
        "Euler step, post-LN (plain)": (plain, "euler", {}),
        "Euler step, pre-LN": (af.Attention(beta=BETA, backend="fused", norm="pre"), "euler",
                               {}),
        "Euler step, noisy post-LN, sigma 0.1": (plain, "euler", {"noise": 0.1, "seed": 0}),
    }
    baseline = {"rk4": "W1 RK4, plain", "euler": "Euler step, post-LN (plain)"}

    def run(model, method, kw):
        cpu = time.process_time()
        traj = af.simulate(model, x0, t_end=steps * DT, dt=DT, save_at=[steps * DT],
                           method=method, normalize=True, **kw)
        return traj, time.process_time() - cpu

    for model, method, kw in variants.values():  # compile, warm up at full size
        run(model, method, kw)
    keys = ("rate", "fraction", "wall", "cpu")  # per step: wall and CPU seconds
    seen: dict[str, dict[str, list]] = {name: {k: [] for k in keys} for name in variants}
    for _ in range(alternations):
        for name, (model, method, kw) in variants.items():
            floor = n_threads() / exp_floor(threads=n_threads())[0] * 1e9
            traj, cpu = run(model, method, kw)
            rate = runs * PAIRS * traj.n_evals / traj.wall_time
            steps_done = traj.integrator["n_steps"]
            for key, value in zip(keys, (rate, rate / floor, traj.wall_time / steps_done,
                                         cpu / steps_done)):
                seen[name][key].append(value)
    for name, (_, method, _) in variants.items():
        mine, base = seen[name], seen[baseline[method]]
        note = (f"ms per step: wall {1e3 * np.median(mine['wall']):.1f}, CPU "
                f"{1e3 * np.median(mine['cpu']):.1f}; fractions of the floor beside each run: "
                + ", ".join(f"{f:.3f}" for f in mine["fraction"]))
        if name != baseline[method]:
            for clock in ("cpu", "wall"):
                extra = [a / b - 1 for a, b in zip(mine[clock], base[clock])]
                best = min(mine[clock]) / min(base[clock]) - 1
                note += (f"; {'CPU' if clock == 'cpu' else 'wall'} time on the plain step "
                         f"**{100 * np.median(extra):+.1f}%** (median of "
                         + ", ".join(f"{100 * e:+.0f}%" for e in extra)
                         + f"; fastest against fastest {100 * best:+.1f}%)")
        rows.append(("W5", name, f"B={runs}", float(np.median(mine["rate"])),
                     float(np.median(mine["fraction"])), note))


def w2(n: int, d: int, rows: list) -> None:
    """W2 in float64 and float32, each against the GEMM rate of its dtype, timed in the same
    child process right before and right after the kernel (the machine's speed drifts over the
    kernel's tens of seconds): the kernel's rate over the mean of the two, in wall time and
    in CPU time (flops per CPU second of the process, which time taken by other processes
    on a shared machine affects less)."""
    for dtype in ("float64", "float32"):
        what = f"blocked kernel, one causal field evaluation, {dtype}"
        child = subprocess.run([sys.executable, "-c", W2_CHILD, str(n), str(d), "blocked",
                                dtype], capture_output=True, text=True)
        if child.returncode != 0:
            why = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
            rows.append(("W2", what, f"n={n}, d={d}", float("nan"), None,
                         f"failed: {why[:120]}"))
            continue
        res = json.loads(child.stdout)
        (wall_0, cpu_0), (wall_1, cpu_1) = res["gemm_before"], res["gemm_after"]
        gemm, gemm_cpu = (wall_0 + wall_1) / 2, (cpu_0 + cpu_1) / 2
        rows.append(("W2", f"{dtype} GEMM rate (GFLOP/s, 2048^3), beside the kernel", "",
                     gemm / 1e9, None, f"before {wall_0 / 1e9:.1f}, after {wall_1 / 1e9:.1f}; "
                     f"per CPU second {cpu_0 / 1e9:.1f}, {cpu_1 / 1e9:.1f}"))
        flops = 2 * n * n * d
        rows.append(("W2", what, f"n={n}, d={d}", flops / res["wall"] / 1e9,
                     flops / res["wall"] / gemm,
                     f"{res['wall']:.2f} s; in CPU time **{flops / res['cpu'] / gemm_cpu:.3f}** "
                     f"of the GEMM's rate; peak RSS {res['rss_mb']:.0f} MB; "
                     f"max |blocked - dense| at n={min(n, 2048)}: {res['err']:.1e}"))


# Each side is timed in runs of its own calls, alternating, ROUNDS times. After a torch call
# its OpenMP workers spin and take a core from whatever runs next (measured 2026-12-02,
# n = 1024, d = 64, float32, 2 threads: attnflow right after SDPA 2.25 ms, 1.44 ms with
# OMP_WAIT_POLICY=PASSIVE, 1.25 ms alone; SDPA 1.75 ms in every case), for about 10 ms: on
# 2026-12-03 the process used 10 ms of CPU time while it slept 10 ms after one SDPA call,
# 8 ms while it slept 50 ms, and attnflow's calls right after 9 SDPA calls took (fastest of
# 10) 2.83, 2.31, 2.01, 1.70, 1.61, 1.48 ms, the 1.5 ms of its calls alone only from the 6th.
# So every run starts after SDPA_SETTLE seconds idle, and its first call (the pool's and the
# caches' wake-up after the pause) is not counted, for both sides alike. Calls per run by
# size (at 65 536 one call, counted: seconds long, a wake-up does not matter).
SDPA_ROUNDS = 3
SDPA_SETTLE = 0.05
SDPA_CALLS = {1024: 8, 4096: 4, 16384: 2, 65536: 1}


def sdpa(sizes: list[int], rows: list) -> None:
    """The SDPA workload (module docstring): attnflow's "auto" kernel against torch's
    scaled_dot_product_attention, alternating, on the same threads."""
    torch = _torch()
    if torch is None:
        rows.append(("SDPA", "torch not installed", "", float("nan"), None, ""))
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(n_threads())
    try:
        for d, beta in ((64, 1.0), (2, BETA)):
            for n in sizes:
                for dtype in (np.float64, np.float32):
                    x = (np.random.default_rng(0).standard_normal((n, d)) / d**0.25 if d > 2
                         else uniform(n, d, seed=0)).astype(dtype)
                    rows.append(_sdpa_row(torch, x, beta))
    finally:
        torch.set_num_threads(threads)


def _sdpa_row(torch, x: np.ndarray, beta: float) -> tuple:
    """One SDPA row: X = x (n, d) through both, alternating, and their outputs compared."""
    from attnflow.kernels import get_kernel

    attend = get_kernel("auto")
    n, d = x.shape
    tx = torch.from_numpy(x).reshape(1, 1, n, d)

    def ours():
        return attend(x, x, x, beta, "causal")

    def theirs():
        return torch.nn.functional.scaled_dot_product_attention(tx, tx, tx, is_causal=True,
                                                                scale=beta)

    calls = SDPA_CALLS.get(n, 2)
    t_ours, t_theirs = [], []
    for _ in range(SDPA_ROUNDS if calls > 1 else 1):  # compiled at the smallest n already
        for fn, times in ((ours, t_ours), (theirs, t_theirs)):
            time.sleep(SDPA_SETTLE)
            for call in range(calls + (calls > 1)):
                start = time.perf_counter()
                result = fn()
                if call or calls == 1:
                    times.append(time.perf_counter() - start)
            if fn is ours:
                got = result
            else:
                want = result
    err = np.abs(got - want.reshape(n, d).numpy()).max()
    ratio = min(t_theirs) / min(t_ours)
    return ("SDPA", f"causal, d={d}, beta={beta:g}, {x.dtype}", f"n={n}",
            n * (n + 1) / 2 / min(t_ours), ratio,
            f"attnflow {1e3 * min(t_ours):.1f} ms, SDPA {1e3 * min(t_theirs):.1f} ms: "
            f"**{'faster' if ratio >= 1 else 'slower'}**; max |attnflow - SDPA| {err:.1e}")


def w3(t_end: float, rk4_dts: list, rtols: dict, rows: list) -> list:
    """Work-precision at t_end: field evaluations (and, for the implicit methods, Jacobians
    counted at their measured cost in field evaluations) to reach final error <= 1e-6."""
    x0 = uniform(N, D, seed=3)
    model = af.Attention(beta=BETA)
    ref = af.simulate(model, x0, t_end, save_at=[t_end], method="dopri5", rtol=1e-12,
                      atol=1e-14).final
    jac_cost = (best_of(lambda: [model.jacobian(x0) for _ in range(20)])
                / best_of(lambda: [model.tangent_field(x0) for _ in range(20)]))
    table = []
    runs = [("rk4", {"dt": dt}) for dt in rk4_dts]
    runs += [(m, {"rtol": r, "atol": r * 1e-3}) for m, rs in rtols.items() for r in rs]
    for method, opts in runs:
        start = time.perf_counter()
        tr = af.simulate(model, x0, t_end, save_at=[t_end], method=method, **opts)
        wall = time.perf_counter() - start
        jacs = tr.integrator.get("n_jacobians", 0)
        setting = ", ".join(f"{k}={v:g}" for k, v in opts.items() if k != "atol")
        table.append((method, setting, tr.n_evals, jacs, tr.n_evals + jac_cost * jacs, wall,
                      float(np.abs(tr.final - ref).max())))
    ok = [r for r in table if r[-1] <= 1e-6]
    best_rk4 = min((r for r in ok if r[0] == "rk4"), key=lambda r: r[2], default=None)
    for method in rtols:
        best = min((r for r in ok if r[0] == method), key=lambda r: r[4], default=None)
        if best_rk4 is None or best is None:
            rows.append(("W3", f"{method} vs RK4 at final error <= 1e-6", f"t={t_end:g}",
                         float("nan"), None, "a method did not reach 1e-6: see the table"))
            continue
        rows.append(("W3", f"{method} vs RK4 at final error <= 1e-6", f"t={t_end:g}",
                     best_rk4[2] / best[2], None,
                     f"field evals: RK4 {best_rk4[1]} {best_rk4[2]}, {method} {best[1]} "
                     f"{best[2]} (ratio in the value column); with its {best[3]} Jacobians "
                     f"at {jac_cost:.1f} evals each: x{best_rk4[2] / best[4]:.1f}; wall time "
                     f"x{best_rk4[5] / best[5]:.1f}"))
    return table


def markdown(rows: list, table: list, command: str, seconds: float) -> str:
    lines = [f"## {datetime.datetime.now():%Y-%m-%d %H:%M}, `{command}`", "",
             f"{describe()}.", "",
             f"Machine: {platform.machine()}, {n_threads()} threads used, "
             f"python {platform.python_version()}, numpy {np.__version__}; load average "
             f"at the end {', '.join(f'{x:.1f}' for x in loadavg())} (a shared machine: "
             f"compare the ratios, not the absolute rates). Took {seconds:.0f} s.", "",
             "| workload | what | size | rate | fraction of floor / GEMM; SDPA: speed over "
             "SDPA | notes |",
             "|---|---|---|---|---|---|"]
    for w, what, size, rate, frac, note in rows:
        frac_s = "" if frac is None else f"{frac:.3f}"
        lines.append(f"| {w} | {what} | {size} | {rate:.3g} | {frac_s} | {note} |")
    if table:
        lines += ["", "W3 work-precision (final-state max error against dopri5 rtol 1e-12; "
                  "cost = field evaluations + Jacobians x their measured cost):", "",
                  "| method | setting | field evaluations | Jacobians | cost | wall s "
                  "| max error |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {m} | {s} | {ev} | {jac} | {cost:.0f} | {wall:.2f} | {err:.2e} |"
                  for m, s, ev, jac, cost, wall, err in table]
    return "\n".join(lines) + "\n"


WORKLOADS = ("W1", "W2", "W3", "W5", "SDPA")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--only", default="W1,W2,W3,W5,SDPA",
                        help="comma-separated workloads")
    parser.add_argument("--target", choices=("native", "avx2"), default="native",
                        help="avx2: numba, numpy and torch run their AVX2 code (a child "
                             "process; see benchmarks/machine.py)")
    parser.add_argument("--sdpa-sizes", default=None,
                        help="SDPA: comma-separated n (default 1024,4096,16384,65536; "
                             "256,512 with --quick)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    parser.add_argument("--runs", type=int, default=None,
                        help="runs of W1 and W5 (default 5000; 32 with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per timed W1/W5 run (default 10; 1 with --quick)")
    parser.add_argument("--alternations", type=int, default=None,
                        help="W5: timed runs of each variant, alternating (default 5; 2 with "
                             "--quick)")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"),
                        help="Markdown file to append to ('' for none)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only.split(",")) - set(WORKLOADS))
    if unknown:
        parser.error(f"--only: expected a comma-separated subset of {', '.join(WORKLOADS)} "
                     f"(W4, the torch backend, is W1's torch row), got {', '.join(unknown)}")
    for name in ("runs", "steps", "alternations"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name}: expected an integer >= 1, got {value}")
    if args.sdpa_sizes is not None and not all(
            n.isdigit() and int(n) >= 1 for n in args.sdpa_sizes.split(",")):
        parser.error(f"--sdpa-sizes: expected comma-separated integers >= 1, got "
                     f"{args.sdpa_sizes!r}")
    if args.target == "avx2" and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        child = subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:])],
                               env={**os.environ, **AVX2_ENV}, capture_output=True, text=True)
        if child.returncode != 0:
            raise RuntimeError(f"--target avx2 child failed: {child.stderr[-2000:]}")
        return child.stdout
    only = set(args.only.split(","))
    runs = args.runs or (32 if args.quick else 5000)
    steps = args.steps or (1 if args.quick else 10)
    start = time.perf_counter()
    rows: list = []
    table: list = []
    if "W1" in only:
        w1(runs=runs, steps=steps, rows=rows, torch_too=not args.no_torch)
    if "W5" in only:
        w5(runs=runs, steps=steps, rows=rows,
           alternations=args.alternations or (2 if args.quick else 5))
    if "W2" in only:
        w2(n=512 if args.quick else 65536, d=64, rows=rows)
    if "SDPA" in only and not args.no_torch:
        sizes = args.sdpa_sizes or ("256,512" if args.quick else "1024,4096,16384,65536")
        sdpa([int(n) for n in sizes.split(",")], rows)
    if "W3" in only:
        if args.quick:
            table = w3(2.0, [0.5], {"dopri5": [1e-6], "bdf": [1e-6]}, rows)
        else:
            rtols = [1e-6, 1e-7, 1e-8, 1e-9]
            table = w3(1e4, [1.6, 0.8, 0.4, 0.2],
                       {"dopri5": rtols, "bdf": rtols, "radau": rtols, "lsoda": rtols}, rows)
    command = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, table, command.strip(), time.perf_counter() - start)
    if args.results:
        with open(args.results, "a") as fh:
            fh.write("\n" + text)
    return text


if __name__ == "__main__":
    print(main())
