"""The result of a simulation: saved states with the full record of how they were made.

A `Trajectory` converts to an xarray Dataset (dims time, run, token, coord) and saves to
netCDF (``.nc``) or Zarr (``.zarr``); `load` reads it back bit-identically, model included.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow._checks import fail
from attnflow.model import Attention

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["Trajectory", "load"]

FORMATS = {".nc": "netcdf", ".zarr": "zarr"}


@dataclass
class Trajectory:
    """Saved states of a batch of runs and the record of the run.

    Attributes
    ----------
    times : (T,) save times (time units: one unit = one layer).
    states : (T, ..., n, d) token positions at those times; the leading ... are runs.
    model : the Attention model that was integrated.
    integrator : method and settings (method, dt, rtol, atol, steps, rejected steps).
    seed : the seed of the initial tokens when they were drawn by attnflow, else None.
    n_evals : number of field evaluations (each over the whole batch).
    wall_time : seconds spent integrating.
    version : attnflow version that produced it.
    commit : git commit of the attnflow source that produced it (None when unknown, e.g.
        from an installed wheel).
    """

    times: np.ndarray
    states: np.ndarray
    model: Attention
    integrator: dict[str, Any]
    seed: int | None = None
    n_evals: int = 0
    wall_time: float = 0.0
    version: str = field(default_factory=lambda: _version())
    commit: str | None = field(default_factory=lambda: _commit())

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Shape of the leading run axes (empty for a single run)."""
        return tuple(self.states.shape[1:-2])

    @property
    def n(self) -> int:
        """Number of tokens."""
        return self.states.shape[-2]

    @property
    def d(self) -> int:
        """Ambient dimension."""
        return self.states.shape[-1]

    @property
    def final(self) -> np.ndarray:
        """States at the last save time, (..., n, d)."""
        return self.states[-1]

    def at(self, t: float) -> np.ndarray:
        """States at the saved time closest to t, (..., n, d)."""
        return self.states[int(np.argmin(np.abs(self.times - t)))]

    def record(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-friendly data."""
        meta, _ = self.model.to_record()
        return {"model": meta, "integrator": self.integrator, "seed": self.seed,
                "n_evals": self.n_evals, "wall_time": self.wall_time, "version": self.version,
                "commit": self.commit, "batch_shape": list(self.batch_shape)}

    def to_xarray(self) -> xr.Dataset:
        """A Dataset with `states` on dims (time, run, token, coord) (runs flattened; the
        batch shape is kept in the attributes), the model's matrices and memory as variables,
        and the full record as a JSON attribute ``attnflow``."""
        import xarray as xr

        T, n, d = len(self.times), self.n, self.d
        runs = int(np.prod(self.batch_shape, dtype=int))
        data = {"states": (("time", "run", "token", "coord"), self.states.reshape(T, runs, n, d))}
        _, arrays = self.model.to_record()
        for name, arr in arrays.items():
            if name == "memory_points":
                data[name] = (("memory", "coord"), arr)
            elif name == "memory_weights":
                data[name] = (("memory",), arr)
            else:
                data[name] = (("row", "col"), arr)
        return xr.Dataset(
            data,
            coords={"time": self.times, "run": np.arange(runs), "token": np.arange(n),
                    "coord": np.arange(d)},
            attrs={"attnflow": json.dumps(self.record())},
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``.nc`` (netCDF4 via h5netcdf) or ``.zarr``, atomically: the data goes to a
        temporary name beside the target and is renamed into place when complete."""
        path = Path(path)
        kind = FORMATS.get(path.suffix)
        if kind is None:
            raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        ds = self.to_xarray()
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)) / path.name
        try:
            if kind == "netcdf":
                ds.to_netcdf(tmp, engine="h5netcdf")
            else:
                ds.to_zarr(tmp, mode="w", consolidated=False)
            _replace(tmp, path)
        finally:
            shutil.rmtree(tmp.parent, ignore_errors=True)
        return path


def load(path: str | os.PathLike) -> Trajectory:
    """Read a Trajectory written by `Trajectory.save` (netCDF or Zarr)."""
    path = Path(path)
    kind = FORMATS.get(path.suffix)
    if kind is None:
        raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
    if not path.exists():
        raise FileNotFoundError(f"path: no trajectory at {path}")
    import xarray as xr

    if kind == "netcdf":
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds = ds.load()
    else:
        with xr.open_zarr(path, consolidated=False) as ds:
            ds = ds.load()
    return from_xarray(ds)


def from_xarray(ds: xr.Dataset) -> Trajectory:
    """Inverse of `Trajectory.to_xarray`."""
    rec = json.loads(ds.attrs["attnflow"])
    arrays = {name: ds[name].values for name in ds.data_vars if name != "states"}
    model = Attention.from_record(rec["model"], arrays)
    states = ds["states"].values
    T, _, n, d = states.shape
    return Trajectory(
        times=ds["time"].values,
        states=states.reshape(T, *rec["batch_shape"], n, d),
        model=model,
        integrator=rec["integrator"],
        seed=rec["seed"],
        n_evals=rec["n_evals"],
        wall_time=rec["wall_time"],
        version=rec["version"],
        commit=rec.get("commit"),
    )


def _replace(src: Path, dst: Path) -> None:
    """Move src onto dst; a directory store replaces the old one only once src is complete."""
    if src.is_dir() and dst.exists():
        old = dst.with_name(f".{dst.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def _version() -> str:
    from attnflow import __version__

    return __version__


def _commit() -> str | None:
    from attnflow._version import git_commit

    return git_commit()
