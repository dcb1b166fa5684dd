"""Speed benchmarks of attnflow's kernels, each a ratio against a baseline timed in the same
run (absolute times drift on a shared machine; ratios measured together do not).

    python benchmarks/run.py            # full sizes (minutes), table appended to RESULTS.md
    python benchmarks/run.py --quick    # small sizes, seconds (the CI smoke test)
    python benchmarks/run.py --only W5 --runs 1000    # the model family's costs, minutes

W1  the paper's Fig. 3 ensemble: runs x n = 200 x d = 2, beta = 64, causal, Q = K = V = I,
    RK4 dt = 0.05 (t = 150 projected from a few steps). Unit: causal pair-evaluations per
    second, runs * n(n+1)/2 * field evaluations / s. Baselines: the textbook per-run numpy
    step and its batched (B, n, n) form (benchmarks/baselines.py); floor: numpy's exp on a
    cache-resident array (40 000 float64) times the threads used.
W2  one field evaluation, n = 65 536, d = 64, causal, random Q, K, V (blocked kernel), in a
    child process whose peak RSS is reported; against this run's float64 GEMM rate, counting
    2 n^2 d flops (the causal halves of scores and values).
W3  n = 200, d = 2, beta = 64, t = 10^4: work-precision of the adaptive methods (dopri5, and
    the implicit bdf, radau, lsoda with the exact Jacobian) against fixed-step RK4.
W4  the torch backend (CPU threads) on W1 and W2 beside numpy.
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
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import attnflow as af
from attnflow.parallel import n_threads
from attnflow.sphere import uniform

sys.path.insert(0, str(Path(__file__).parent))
from baselines import batched_step, textbook_step  # noqa: E402

HERE = Path(__file__).parent
BETA, N, D, DT = 64.0, 200, 2, 0.05
PAIRS = N * (N + 1) // 2
ALTERNATIONS = 3  # floor / simulation pairs timed for each fused W1 row (median reported)


def best_of(fn, repeats: int = 3, clock=time.perf_counter) -> float:
    """Smallest time of `repeats` calls (seconds; wall time unless another clock is given)."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def exp_floor(clock=time.perf_counter) -> float:
    """numpy exp on 40 000 cache-resident float64 (scores range of W1): ns per element (wall
    time, or this thread's CPU time with clock=time.thread_time)."""
    x = -np.random.default_rng(0).uniform(0, 2 * BETA, 40_000)
    out = np.empty_like(x)
    return best_of(lambda: [np.exp(x, out=out) for _ in range(200)], 5, clock) / 200 / x.size \
        * 1e9


def gemm_rate() -> float:
    """float64 GEMM rate of this run (FLOP/s), 2048^3 products on all BLAS threads."""
    a, b = np.random.default_rng(0).standard_normal((2, 2048, 2048))
    return 2 * 2048**3 / best_of(lambda: a @ b, 3)


def w1(runs: int, steps: int, rows: list, torch_too: bool) -> None:
    floor_ns = exp_floor()
    floor = n_threads() / floor_ns * 1e9
    rows.append(("W1", "floor: numpy exp x threads", f"{n_threads()} thr", floor, None, ""))
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
    finals = {}
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
        af.simulate(model, x, t_end=DT, dt=DT, normalize=True)
        rates, fractions = [], []
        for _ in range(ALTERNATIONS if backend == "fused" else 1):
            floor_now = n_threads() / exp_floor() * 1e9
            traj = af.simulate(model, x, t_end=n_steps * DT, dt=DT, save_at=[n_steps * DT],
                               normalize=True)
            rates.append(size * PAIRS * traj.n_evals / traj.wall_time)
            fractions.append(rates[-1] / floor_now)
        rate = float(np.median(rates))
        finals[name] = traj.final
        minutes = 3000 * 4 * runs * PAIRS / rate / 60  # t = 150: 3000 RK4 steps of all runs
        note = f"x{rate / textbook:.1f} textbook; t=150 in {minutes:.1f} min"
        if len(fractions) > 1:
            note += "; fractions of the floor beside each run: " + ", ".join(
                f"{f:.3f}" for f in fractions)
        if dtype == np.float32:
            err = np.abs(traj.final - finals["attnflow fused f64, RK4"]).max()
            note += f"; max |x32 - x64| after {steps} steps = {err:.1e}"
        rows.append(("W1", name, f"B={size}", rate, float(np.median(fractions)), note))


W2_CHILD = """
import json, resource, sys, time, numpy as np
from attnflow.kernels import blocked, dense, torch as torch_kernel
n, d, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((n, d)) / d ** 0.25 for _ in range(3))
kernel = {"blocked": blocked.attend, "torch": torch_kernel.attend}[backend]
m = min(n, 2048)  # the dense check, at n = 2048 for the full size
err = float(np.abs(kernel(q[:m], k[:m], v[:m], 1.0, "causal")
                   - dense.attend(q[:m], k[:m], v[:m], 1.0, "causal")).max())
start = time.perf_counter()
kernel(q, k, v, 1.0, "causal")
wall = time.perf_counter() - start
try:  # this process's own peak (ru_maxrss keeps the forking parent's peak across exec)
    with open("/proc/self/status") as fh:
        rss_mb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024
except OSError:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "err": err, "rss_mb": rss_mb}))
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
            floor = n_threads() / exp_floor() * 1e9
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


def w2(n: int, d: int, rows: list, torch_too: bool) -> None:
    gemm = gemm_rate()
    rows.append(("W2", "float64 GEMM rate (GFLOP/s, 2048^3)", "", gemm / 1e9, None, ""))
    for backend in ("blocked", "torch") if torch_too else ("blocked",):
        child = subprocess.run([sys.executable, "-c", W2_CHILD, str(n), str(d), backend],
                               capture_output=True, text=True)
        if child.returncode != 0:
            why = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
            rows.append(("W2", f"{backend} kernel, one causal field evaluation",
                         f"n={n}, d={d}", float("nan"), None, f"failed: {why[:120]}"))
            continue
        res = json.loads(child.stdout)
        flops = 2 * n * n * d / res["wall"]
        rows.append(("W2", f"{backend} kernel, one causal field evaluation", f"n={n}, d={d}",
                     flops / 1e9, flops / gemm,
                     f"{res['wall']:.2f} s; peak RSS {res['rss_mb']:.0f} MB; "
                     f"max |{backend} - dense| at n={min(n, 2048)}: {res['err']:.1e}"))


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
             f"Machine: {platform.machine()}, {n_threads()} threads used, "
             f"python {platform.python_version()}, numpy {np.__version__}; load average "
             f"at the end {', '.join(f'{x:.1f}' for x in _loadavg())} (a shared machine: "
             f"compare the ratios, not the absolute rates). Took {seconds:.0f} s.", "",
             "| workload | what | size | rate | fraction of floor / GEMM | notes |",
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


def _loadavg() -> tuple[float, ...]:
    try:
        import os
        return os.getloadavg()
    except OSError:
        return ()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--only", default="W1,W2,W3,W5", help="comma-separated workloads")
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
        w2(n=512 if args.quick else 65536, d=64, rows=rows, torch_too=not args.no_torch)
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
