"""W1, W2 and W5 before and after the model redesign (issue 20), side by side in one run.

    python benchmarks/redesign.py --before /work/base/src      # about 6 min on 2 cores
    python benchmarks/redesign.py --before /work/base/src --quick

Two source trees: --before (a checkout of main before the redesign) and --after (default:
this checkout's src). Each repetition runs the workloads once per tree, each tree in its own
child process with PYTHONPATH = that tree, the order alternating (before, after; then after,
before; ...). The workloads are this checkout's benchmarks/run.py functions `w1`, `w5` and
`w2`, the same code for both trees (at smaller sizes than run.py's defaults, to keep the run
within minutes: see the options). A tree older than `attnflow.parallel` gets run.py's one
import from there, `n_threads`, from its `attnflow.kernels._threads`.

The first table: the CPU time (all threads) of the same work in both trees, after / before,
median over repetitions (W1, W5: inside `attnflow.simulate`, which is what depends on the
tree; W2: its child process). Then, for every row of run.py's output, the median of after /
before of the rate (wall time) and of the fraction of the floor (W1, W5: numpy's exp, W2:
the float64 GEMM, each measured in the same child beside the run). Rows that do not use
attnflow's kernels (W1's textbook baselines, the floors) are controls: their ratios show the
noise. Criterion (issue 20's 5%): a workload has not got slower when its median CPU-time
ratio is <= 1.05 (and a row when its median fraction ratio is >= 0.95). On a loaded machine
(load 7-9 on 2 cores) the wall-time ratios of the controls ranged from 0.45 to 2.35 in a
first run: there only the CPU-time ratios can show 5%.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
CPU_NOTE = ("W1, W5: CPU seconds of all threads inside attnflow.simulate, warm-up calls "
            "included; W2: CPU seconds of its child process, the dense check at n = 2048 "
            "included")
REPO = HERE.parent
MARK = "REDESIGN-ROWS "

CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import attnflow
try:
    import attnflow.parallel
except ImportError:  # before the redesign: n_threads lived in attnflow.kernels._threads
    from attnflow.kernels import _threads
    sys.modules["attnflow.parallel"] = _threads
import run
spent = [0.0]  # CPU seconds (all threads) inside attnflow.simulate, which run.py calls
plain = attnflow.simulate
def simulate(*args, **kwargs):
    start = time.process_time()
    try:
        return plain(*args, **kwargs)
    finally:
        spent[0] += time.process_time() - start
attnflow.simulate = simulate
def children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
args = json.loads(sys.argv[2])
rows, cpu = [], {}
if "W1" in args["only"]:
    start = spent[0]
    run.w1(runs=args["runs"], steps=args["steps"], rows=rows, torch_too=False)
    cpu["W1"] = spent[0] - start
if "W5" in args["only"]:
    start = spent[0]
    run.w5(runs=args["runs"], steps=args["steps"], rows=rows,
           alternations=args["alternations"])
    cpu["W5"] = spent[0] - start
if "W2" in args["only"]:
    start = children()
    run.w2(n=args["w2_n"], d=64, rows=rows)
    cpu["W2"] = children() - start
print(sys.argv[3] + json.dumps({"attnflow": attnflow.__file__, "rows": rows, "cpu": cpu}))
"""


def child_env(src: Path) -> dict[str, str]:
    """The environment of a child on the tree `src`: its PYTHONPATH, and numba's and Python's
    caches in a temporary folder of that tree's own (nothing is written into the trees)."""
    cache = Path(tempfile.gettempdir()) / "attnflow-redesign" / str(src.resolve()).strip(
        "/").replace("/", "_")
    return {**os.environ, "PYTHONPATH": str(src), "NUMBA_CACHE_DIR": str(cache / "numba"),
            "PYTHONPYCACHEPREFIX": str(cache / "pycache")}


def run_tree(src: Path, args: dict) -> tuple[dict, float]:
    """run.py's rows for the tree `src` (one child process), the CPU seconds of each
    workload (`CPU_NOTE`), and the child's wall time."""
    start = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", CHILD, str(HERE), json.dumps(args), MARK],
                           env=child_env(src), capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    line = next((ln for ln in child.stdout.splitlines() if ln.startswith(MARK)), None)
    if child.returncode != 0 or line is None:
        raise RuntimeError(f"the child on {src} failed (exit {child.returncode}):\n"
                           + child.stderr[-3000:])
    out = json.loads(line[len(MARK):])
    if not Path(out["attnflow"]).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"the child on {src} imported attnflow from {out['attnflow']}")
    return out, wall


def ratios(before: list[list], after: list[list]) -> list[dict]:
    """Per row (workload, what) of the first repetition: the after / before ratios of the
    rate and of the fraction of the floor, one per repetition."""
    table = []
    for i, row in enumerate(before[0]):
        w, what, size = row[:3]
        rate = [a[i][3] / b[i][3] for a, b in zip(after, before)]
        frac = [a[i][4] / b[i][4] for a, b in zip(after, before)
                if a[i][4] is not None and b[i][4] is not None]
        table.append({"workload": w, "what": what, "size": size,
                      "before": float(np.median([b[i][3] for b in before])),
                      "after": float(np.median([a[i][3] for a in after])),
                      "rate": rate, "fraction": frac})
    return table


def cell(values: list[float]) -> str:
    """Median (bold) and the values of each repetition."""
    if not values:
        return ""
    return f"**{np.median(values):.3f}** (" + ", ".join(f"{v:.2f}" for v in values) + ")"


def markdown(table: list[dict], cpu: dict, command: str, seconds: float, walls: dict) -> str:
    from w6 import cpu_isa  # the same CPU line as W6

    lines = [f"## {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, `{command}`", "",
             f"W1, W2, W5 before and after the redesign (benchmarks/redesign.py: each tree in "
             f"its own child process, alternating). CPU: {cpu_isa()}; python "
             f"{platform.python_version()}, numpy {np.__version__}; load average at the end "
             f"{', '.join(f'{v:.1f}' for v in os.getloadavg())} (a machine shared with other "
             f"agents: read the ratios, not the absolute rates). Child wall times (s): "
             + "; ".join(f"{k} " + ", ".join(f"{t:.0f}" for t in v) for k, v in walls.items())
             + f". Took {seconds:.0f} s.", "",
             f"CPU time of the same work ({CPU_NOTE}), after / before: median (each "
             "repetition); not slower when <= 1.05:", "",
             "| workload | CPU s before | CPU s after | after / before | not slower |",
             "|---|---|---|---|---|"]
    for w, (values, before, after) in cpu.items():
        verdict = "yes" if np.median(values) <= 1.05 else "**no**"
        lines.append(f"| {w} | {before:.1f} | {after:.1f} | {cell(values)} | {verdict} |")
    lines += ["", "run.py's rows (wall-time rates; fractions of the floor measured beside "
              "each run):", "",
              "| workload | what | size | rate before | rate after | after / before, rate: "
              "median (each repetition) | after / before, fraction of the floor | "
              "not slower (>= 0.95) |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        verdict = "" if not r["fraction"] else (
            "yes" if np.median(r["fraction"]) >= 0.95 else "**no**")
        lines.append(f"| {r['workload']} | {r['what']} | {r['size']} | {r['before']:.3g} | "
                     f"{r['after']:.3g} | {cell(r['rate'])} | {cell(r['fraction'])} | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="src folder of the tree before")
    parser.add_argument("--after", default=str(REPO / "src"),
                        help="src folder of the tree after (default: this checkout's)")
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    parser.add_argument("--only", default="W1,W5,W2", help="comma-separated workloads")
    parser.add_argument("--repetitions", type=int, default=None,
                        help="child pairs per tree (default 3)")
    parser.add_argument("--runs", type=int, default=None, help="W1/W5 runs (default 512)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per W1/W5 run (default 2)")
    parser.add_argument("--alternations", type=int, default=None,
                        help="W5's alternations inside each child (default 2)")
    parser.add_argument("--w2-n", type=int, default=None, help="W2's tokens (default 16384)")
    parser.add_argument("--results", default="", help="Markdown file to append to")
    args = parser.parse_args(argv)
    trees = {"before": Path(args.before), "after": Path(args.after)}
    for name, src in trees.items():
        if not (src / "attnflow" / "__init__.py").is_file():
            parser.error(f"--{name} {src}: no attnflow package there")
    sizes = {"only": args.only.split(","),
             "runs": args.runs or (32 if args.quick else 512),
             "steps": args.steps or (1 if args.quick else 2),
             "alternations": args.alternations or (1 if args.quick else 2),
             "w2_n": args.w2_n or (512 if args.quick else 16384)}
    repetitions = args.repetitions or (1 if args.quick else 3)
    start = time.perf_counter()
    rows: dict[str, list] = {"before": [], "after": []}
    cpu: dict[str, list] = {"before": [], "after": []}
    walls: dict[str, list[float]] = {"before": [], "after": []}
    for rep in range(repetitions):
        for name in ("before", "after") if rep % 2 == 0 else ("after", "before"):
            got, wall = run_tree(trees[name], sizes)
            rows[name].append(got["rows"])
            cpu[name].append(got["cpu"])
            walls[name].append(wall)
    table = ratios(rows["before"], rows["after"])
    command = ("python benchmarks/redesign.py "
               + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    cpu_table = {w: ([a[w] / b[w] for a, b in zip(cpu["after"], cpu["before"])],
                     float(np.median([b[w] for b in cpu["before"]])),
                     float(np.median([a[w] for a in cpu["after"]]))) for w in cpu["before"][0]}
    text = markdown(table, cpu_table, command, time.perf_counter() - start, walls)
    if args.results:
        with open(args.results, "a") as fh:
            fh.write("\n" + text)
    return text


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    print(main())
