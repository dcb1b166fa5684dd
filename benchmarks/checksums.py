"""What the data checksums of saved runs cost: `Trajectory.save` and reading all the states
back (`attnflow.load(path).states`, checks included) with the checksums (netCDF: HDF5's
Fletcher-32 on every variable; Zarr: crc32c after zstd) and without (the writer of format 2:
the marker, no checksum), in the same run, for netCDF and Zarr, as MB/s of states, at a size
given in MB (default 1000: benchmarks/load_lazy.py's run, T = 64 save times of n tokens in
d = 2, float64).

    PYTHONPATH=src python benchmarks/checksums.py [--mb 1000] [--dir /tmp] [--repeat 2]

Each figure is the best of `--repeat`, the two writers alternating, so a change of the
machine's load hits both (after a warm-up save and load of a tiny run in each format and
mode: imports and first calls are not timed); the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import attnflow as af
from attnflow import _datafiles

sys.path.insert(0, str(Path(__file__).parent))
from machine import describe  # noqa: E402


@contextlib.contextmanager
def without_checksums():
    """The writer of format 2: the same files but for the checksums."""
    saved = _datafiles.FORMAT, _datafiles.checksum_encoding
    _datafiles.FORMAT = 2
    _datafiles.checksum_encoding = lambda ds, kind, encoding=None: encoding
    try:
        yield
    finally:
        _datafiles.FORMAT, _datafiles.checksum_encoding = saved


def timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=1000.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    T, d = 64, 2
    n = int(args.mb * 1e6 / (T * d * 8))
    x = np.random.default_rng(0).standard_normal((T, n, d))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    traj = af.Trajectory(times=np.arange(T, dtype=float), states=x, model=af.Attention(beta=1.0),
                         integrator={"method": "rk4"}, seed=0)
    mb = x.nbytes / 1e6
    del x
    print(describe())
    print(f"states: {mb:.0f} MB (T = {T}, n = {n}, d = {d}, float64); load average before: "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    folder = Path(tempfile.mkdtemp(dir=args.dir))
    tiny = af.Trajectory(times=traj.times[:2], states=traj.states[:2, :10], model=traj.model,
                         integrator=traj.integrator, seed=0)
    try:
        for suffix in (".nc", ".zarr"):  # imports and first calls outside the timings
            for mode in ("on", "off"):
                with without_checksums() if mode == "off" else contextlib.nullcontext():
                    af.load(tiny.save(folder / f"warm-{mode}{suffix}")).states  # noqa: B018
        for suffix in (".nc", ".zarr"):
            best: dict[str, list[float]] = {"on": [np.inf, np.inf], "off": [np.inf, np.inf]}
            for _ in range(args.repeat):
                for mode in ("on", "off"):
                    path = folder / f"{mode}{suffix}"
                    with without_checksums() if mode == "off" else contextlib.nullcontext():
                        save = timed(lambda p=path: traj.save(p))
                    read = timed(lambda p=path: af.load(p).states)
                    best[mode] = [min(best[mode][0], save), min(best[mode][1], read)]
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            (s_on, r_on), (s_off, r_off) = best["on"], best["off"]
            print(f"{suffix:6s} save: {mb / s_on:7.0f} MB/s with checksums, {mb / s_off:7.0f} "
                  f"without ({s_on / s_off:.2f}x the time); load: {mb / r_on:7.0f} MB/s with, "
                  f"{mb / r_off:7.0f} without ({r_on / r_off:.2f}x)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
