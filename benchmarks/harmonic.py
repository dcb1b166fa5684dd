"""The harmonic kernels against the best kernel before them, in one run (issue 35's targets).

Rows (each a ratio measured in this process; absolute seconds drift on a shared machine):
* H1: one causal evaluation on the circle, n = 1e5, beta = 64: harmonic against the blocked
  kernel (the fastest for one long run, benchmarks/RESULTS.md); target >= 50x.
* H2: one causal evaluation on the circle at n = 1e6: target under 1 s on 2 cores.
* H3: one causal evaluation on S^2, n = 1e5, beta = 9: harmonic against blocked; target >= 5x.
* H4: RK4, dt = 0.05, to t = 10 at n = 1e6 on the circle (beta = 64, causal, backend
  "harmonic"): target within 15 minutes, with the peak memory (RSS) of the process.
* H5: one causal evaluation on the circle at n = 1e6, beta = 64, on 1 thread and on 2
  (ATTNFLOW_THREADS), with the time of its parts on 1 thread: the numba loops (the fused
  circle path's segment totals and rows, which V = K takes since H6; before, the general
  path's block totals and rows) and the rest (numpy):
  targets >= 1.7x on 2 threads and <= 0.1 s per evaluation on 2 cores (issue 42).
* H6: one causal evaluation on the circle at n = 1e6, beta = 64, V = K (q = k = v = x), on
  all threads: the fused circle path (complex moments M_0..M_{K+1} in SIMD lanes of
  segments, `kernels._circle`)
  against the general path (real features times (v, 1), `kernels._harmonic`, forced in the
  same process) and against the floor of any kernel that reads the tokens and writes its
  output once (numpy x * 1.0 into a preallocated array), alternating; target <= 0.1 s on 2
  cores (issue 42), with the error of sampled rows against long-double sums.
Every harmonic row states its order K and its agreement with the baseline (or, without one,
with direct long-double sums over sampled rows). `--quick` runs small sizes in seconds.

    python benchmarks/harmonic.py [--quick] [--only H1,H2,H3,H4,H5,H6] [--results FILE]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import describe, loadavg  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.kernels import blocked, harmonic  # noqa: E402
from attnflow.parallel import n_threads  # noqa: E402

WORKLOADS = ("H1", "H2", "H3", "H4", "H5", "H6")


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def exact_rows(x: np.ndarray, beta: float, rows: np.ndarray) -> np.ndarray:
    """Causal softmax attention (V = I) of the given rows, summed directly in long double."""
    out = []
    for i in rows:
        xl = x[: i + 1].astype(np.longdouble)
        s = beta * (xl @ x[i].astype(np.longdouble))
        w = np.exp(s - s.max())
        out.append((w @ xl) / w.sum())
    return np.asarray(out, dtype=float)


def versus_blocked(label: str, n: int, d: int, beta: float, repeats: int, rows: list) -> None:
    x = af.sphere.uniform(n, d, seed=0)
    harmonic.attend(x[:2000], x[:2000], x[:2000], beta, "causal")  # compiled, cached
    blocked.attend(x[:2000], x[:2000], x[:2000], beta, "causal")
    ours = best_of(lambda: harmonic.attend(x, x, x, beta, "causal"), repeats)
    theirs = best_of(lambda: blocked.attend(x, x, x, beta, "causal"), max(1, repeats // 2))
    diff = np.abs(harmonic.attend(x, x, x, beta, "causal")
                  - blocked.attend(x, x, x, beta, "causal")).max()
    K = harmonic.order(beta, d, harmonic.DEFAULT_TOL)
    rows.append((label, f"causal, d={d}, beta={beta:g}, one evaluation", f"n={n}",
                 f"{ours:.3f} s", f"{theirs / ours:.1f}x over blocked ({theirs:.2f} s)",
                 f"K={K}, max |harmonic - blocked| = {diff:.1e}"))


def million(n: int, repeats: int, rows: list) -> None:
    x = af.sphere.uniform(n, 2, seed=0)
    harmonic.attend(x[:2000], x[:2000], x[:2000], 64.0, "causal")
    t = best_of(lambda: harmonic.attend(x, x, x, 64.0, "causal"), repeats)
    got = harmonic.attend(x, x, x, 64.0, "causal")
    sample = np.array([n - 1, n // 2, n // 3])
    err = np.abs(got[sample] - exact_rows(x, 64.0, sample)).max()
    rows.append(("H2", "causal, d=2, beta=64, one evaluation", f"n={n}", f"{t:.3f} s",
                 "target < 1 s", f"max error of 3 rows against long-double sums {err:.1e}"))


def threads(n: int, repeats: int, rows: list) -> None:
    """H5: the kernel on 1 thread against 2 threads, one process, alternating."""
    import cProfile
    import os
    import pstats

    x = af.sphere.uniform(n, 2, seed=0)
    harmonic.attend(x[:9000], x[:9000], x[:9000], 64.0, "causal")  # compiled, cached
    before = os.environ.get("ATTNFLOW_THREADS")
    times: dict[int, list[float]] = {1: [], 2: []}
    try:
        for _ in range(repeats):
            for k in (1, 2):
                os.environ["ATTNFLOW_THREADS"] = str(k)
                times[k].append(best_of(lambda: harmonic.attend(x, x, x, 64.0, "causal"), 1))
        os.environ["ATTNFLOW_THREADS"] = "1"
        profile = cProfile.Profile()
        profile.runcall(harmonic.attend, x, x, x, 64.0, "causal")
    finally:
        if before is None:
            os.environ.pop("ATTNFLOW_THREADS", None)
        else:
            os.environ["ATTNFLOW_THREADS"] = before
    stats = pstats.Stats(profile).stats
    # the numba loops by name: the general path's (block totals, forward rows) and the
    # fused circle path's (`_circle.totals`, then its rows), which V = K takes
    names = {"block_totals": "block totals", "forward": "rows", "totals": "fused totals",
             "rows_for": "fused rows"}
    part = {label: sum(v[2] for key, v in stats.items() if key[2] == name)
            for name, label in names.items()}
    total = sum(v[2] for v in stats.values())
    one, two = min(times[1]), min(times[2])
    loops = ", ".join(f"{label} {t:.2f} s" for label, t in part.items() if t > 0)
    rows.append(("H5", "causal, d=2, beta=64, one evaluation, 1 vs 2 threads", f"n={n}",
                 f"{one:.3f} s / {two:.3f} s", f"{one / two:.2f}x (target >= 1.7x; "
                 f"<= 0.1 s on 2 cores)",
                 f"1 thread, profiled: {loops}, rest (numpy) "
                 f"{total - sum(part.values()):.2f} s of {total:.2f} s"))


def fused_path(n: int, repeats: int, rows: list) -> None:
    """H6: the fused circle path against the general path and the copy floor, alternating."""
    x = af.sphere.uniform(n, 2, seed=0)
    fused = harmonic._circle_affine

    def general(*args):
        return None

    out = np.empty_like(x)
    harmonic.attend(x[:9000], x[:9000], x[:9000], 64.0, "causal")  # compiled, cached
    times: dict[str, list[float]] = {"fused": [], "general": [], "floor": []}
    try:
        for _ in range(repeats):
            for name in ("fused", "general"):
                harmonic._circle_affine = fused if name == "fused" else general
                times[name].append(best_of(lambda: harmonic.attend(x, x, x, 64.0, "causal"), 1))
            times["floor"].append(best_of(lambda: np.multiply(x, 1.0, out=out), 1))
    finally:
        harmonic._circle_affine = fused
    got = harmonic.attend(x, x, x, 64.0, "causal")
    sample = np.array([n - 1, n // 2, n // 2 - 1, n // 3])
    err = np.abs(got[sample] - exact_rows(x, 64.0, sample)).max()
    new, old, floor = (min(times[k]) for k in ("fused", "general", "floor"))
    rows.append(("H6", "causal, d=2, beta=64, V=K, one evaluation: fused circle path vs "
                 "general path vs copy floor", f"n={n}",
                 f"{new:.3f} s / {old:.3f} s / {floor:.4f} s",
                 f"{old / new:.2f}x over the general path, {new / floor:.0f}x the floor "
                 f"(target <= 0.1 s on 2 cores)",
                 f"medians {np.median(times['fused']):.3f} / {np.median(times['general']):.3f}"
                 f" s; max error of 4 rows against long-double sums {err:.1e}"))


def rk4(n: int, t_end: float, rows: list) -> None:
    x0 = af.sphere.uniform(n, 2, seed=0)
    model = af.Attention(beta=64.0, mask="causal", backend="harmonic")
    start = time.perf_counter()
    traj = af.simulate(model, x0, t_end, method="rk4", dt=0.05, save_at=[0.0, t_end])
    took = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    norm = np.abs(np.linalg.norm(traj.states[-1], axis=-1) - 1).max()
    rows.append(("H4", f"RK4 dt=0.05 to t={t_end:g}, d=2, beta=64, causal", f"n={n}",
                 f"{took:.0f} s", "target < 900 s",
                 f"{traj.n_evals} evaluations, peak RSS {rss:.0f} MB, max ||x| - 1| = "
                 f"{norm:.1e}"))


def markdown(rows: list, command: str, seconds: float) -> str:
    lines = [f"## {datetime.datetime.now():%Y-%m-%d %H:%M}, `{command}`", "",
             f"{describe()}.", "",
             f"Machine: {platform.machine()}, {n_threads()} threads used, python "
             f"{platform.python_version()}, numpy {np.__version__}; load average at the end "
             f"{', '.join(f'{v:.1f}' for v in loadavg())}. Took {seconds:.0f} s.", "",
             "| workload | what | size | time | ratio / target | notes |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help=f"comma-separated workloads out of {','.join(WORKLOADS)}")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"),
                        help="append the table to this file ('' for none)")
    args = parser.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown or not only:
        parser.error(f"--only: expected workloads out of {','.join(WORKLOADS)}, "
                     f"received {args.only!r}")
    quick = args.quick
    start = time.perf_counter()
    rows: list = []
    if "H1" in only:
        versus_blocked("H1", 4000 if quick else 100_000, 2, 64.0, 1 if quick else 3, rows)
    if "H2" in only:
        million(20_000 if quick else 1_000_000, 1 if quick else 3, rows)
    if "H3" in only:
        versus_blocked("H3", 4000 if quick else 100_000, 3, 9.0, 1 if quick else 3, rows)
    if "H4" in only:
        rk4(2000 if quick else 1_000_000, 0.2 if quick else 10.0, rows)
    if "H5" in only:
        threads(20_000 if quick else 1_000_000, 1 if quick else 3, rows)
    if "H6" in only:
        fused_path(20_000 if quick else 1_000_000, 1 if quick else 5, rows)
    command = "python benchmarks/harmonic.py" + (" " + " ".join(argv or sys.argv[1:])
                                                 if (argv or sys.argv[1:]) else "")
    text = markdown(rows, command.strip(), time.perf_counter() - start)
    print(text)
    if args.results:
        with open(args.results, "a") as fh:
            fh.write("\n" + text)
    return text


if __name__ == "__main__":
    main()
