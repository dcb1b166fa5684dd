"""Opening a saved run lazily (`attnflow.load`) against reading it whole (xarray's
``open_dataset(...).load()``, what `load` did before), for netCDF and Zarr, at a size given
in MB (default 1000: T = 64 save times of n tokens in d = 2, float64).

    PYTHONPATH=src python benchmarks/load_lazy.py [--mb 1000] [--dir /tmp]

Prints, per format: the file size, the time to open with `attnflow.load`, the time to read
the last save time (`traj.final`), the baseline (xarray reading the whole file into memory)
and reading all the states (`traj.states`, checks included); each the best of 3 (2 for the
whole reads). The ratio baseline / open
is what lazy loading saves before the states are used.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

import attnflow as af

sys.path.insert(0, str(Path(__file__).parent))
from machine import describe  # noqa: E402


def best(f, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=1000.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    T, d = 64, 2
    n = int(args.mb * 1e6 / (T * d * 8))
    x = np.random.default_rng(0).standard_normal((T, n, d))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    traj = af.Trajectory(times=np.arange(T, dtype=float), states=x, model=af.Attention(beta=1.0),
                         integrator={"method": "rk4"}, seed=0)
    del x
    print(describe())
    folder = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        for suffix, engine in ((".nc", "h5netcdf"), (".zarr", "zarr")):
            path = traj.save(folder / f"run{suffix}")
            size = sum(p.stat().st_size for p in [path, *path.rglob("*")] if p.is_file())
            opened = best(lambda p=path: af.load(p))
            final = best(lambda p=path: af.load(p).final)
            kwargs = {"consolidated": False} if engine == "zarr" else {}

            def baseline(p=path, engine=engine, kwargs=kwargs):
                with xr.open_dataset(p, engine=engine, **kwargs) as ds:
                    ds.load()

            base = best(baseline, repeat=2)
            whole = best(lambda p=path: af.load(p).states, repeat=2)
            print(f"{suffix:6s} {size / 1e6:8.0f} MB  open {opened * 1e3:7.1f} ms  "
                  f"final {final * 1e3:7.1f} ms  states {whole:6.2f} s  "
                  f"baseline (read whole) {base:6.2f} s  baseline / open {base / opened:6.0f}x")
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
