"""The result of a simulation: saved states with the full record of how they were made.

A `Trajectory` converts to an xarray Dataset (dims time, run, token, coord) and saves to
netCDF (``.nc``) or Zarr (``.zarr``); `load` reads it back bit-identically, model included.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow._array import to_numpy
from attnflow._checks import fail
from attnflow._files import atomic_path, consolidating
from attnflow._repr import Plain, ShortRepr
from attnflow.family import Model, model_from_record
from attnflow.manifolds import SPHERE, directions

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["Trajectory", "load"]

FORMATS = {".nc": "netcdf", ".zarr": "zarr"}


@dataclass(repr=False)
class Trajectory(ShortRepr):
    """Saved states of a batch of runs and the record of the run (its repr is short: sizes,
    times, model and method; notebooks show it as a small table).

    Attributes
    ----------
    times : (T,) save times (time units: one unit = one layer).
    states : (T, ..., n, d) token states at those times; the leading ... are runs. On the
        sphere for the post-LN and nGPT schemes, in R^d for pre- and peri-LN (see
        `directions`). A run on torch tensors keeps them as tensors on its device, in the
        autograd graph (`integrator` records "device" and "dtype"); `save` and `to_xarray`
        write them as numpy.
    model : the model that was integrated (an Attention layer or a Stack of layers).
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
    model: Model
    integrator: dict[str, Any]
    seed: int | None = None
    n_evals: int = 0
    wall_time: float = 0.0
    version: str = field(default_factory=lambda: _version())
    commit: str | None = field(default_factory=lambda: _commit())

    def _summary(self) -> dict[str, Any]:
        """What the short repr shows: sizes, the times, the model and how it was run."""
        t = self.times
        return {"runs": int(np.prod(self.batch_shape)), "n": self.n, "d": self.d,
                "times": Plain(f"{t.size} from {t[0]:g} to {t[-1]:g}" if t.size else "none"),
                "model": self.model, "method": self.integrator.get("method"),
                "n_evals": self.n_evals, "seed": self.seed}

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
    def directions(self) -> np.ndarray:
        """The token directions x / |x| (T, ..., n, d): the states themselves on the sphere;
        what analysis functions (clusters, Rényi centers) take for pre- and peri-LN runs."""
        if self.model.manifold == SPHERE:
            return self.states
        return directions(self.states)

    @property
    def radii(self) -> np.ndarray:
        """The token norms |x| (T, ..., n): 1 on the sphere, growing under pre-LN."""
        return np.linalg.norm(self.states, axis=-1)

    @property
    def final(self) -> np.ndarray:
        """States at the last save time, (..., n, d)."""
        return self.states[-1]

    def at(self, t: float) -> np.ndarray:
        """States at the saved time closest to t, (..., n, d)."""
        return self.states[int(np.argmin(np.abs(self.times - t)))]

    def energy(self, beta: float | None = None, log: bool = False) -> np.ndarray:
        """The interaction energy E_beta of the token directions at every saved time, (T, ...)
        (`attnflow.analysis.energy`; its logarithm when `log`, finite at any beta). At each
        time it is that of the layer acting then (a Stack's layer floor(t)): its beta (unless
        `beta` is given) and the Q, K of its single head (positional encodings, biases and
        the feed-forward term are not part of E_beta)."""
        from attnflow.analysis.energy import energy, log_energy

        layers = [self.model.layer_at(float(t)) for t in self.times]
        for layer in set(layers):
            if len(layer.heads) != 1 or len(layer.heads[0]) != 3:
                raise fail("model", "layers with one (Q, K, V) head each (E_beta takes one Q, "
                           "K; call attnflow.energy(traj.directions, beta, Q, K) otherwise)",
                           repr(layer))
        out = np.empty(self.states.shape[:-2])
        theta = self.directions
        for layer in dict.fromkeys(layers):
            at = [i for i, other in enumerate(layers) if other is layer]
            Q, K, _ = layer.heads[0]
            b = layer.beta if beta is None else beta
            out[at] = (log_energy if log else energy)(theta[at], b, Q, K)
        return out

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
        states = to_numpy(self.states)  # tensors (a run on a torch device) are saved as numpy
        data = {"states": (("time", "run", "token", "coord"), states.reshape(T, runs, n, d))}
        _, arrays = self.model.to_record()
        for name, arr in ((k, to_numpy(a)) for k, a in arrays.items()):
            # Dimensions of their own: heads may be rectangular, layers differ in shape.
            data[name] = (tuple(f"{name}_dim{i}" for i in range(arr.ndim)), arr)
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
        ds = self.to_xarray()
        with atomic_path(path) as tmp:
            if kind == "netcdf":
                ds.to_netcdf(tmp, engine="h5netcdf")
            else:
                with consolidating():
                    ds.to_zarr(tmp, mode="w", consolidated=True)
        return path


def load(path: str | os.PathLike) -> Trajectory:
    """Read a Trajectory written by `Trajectory.save` (netCDF or Zarr).

    Raises FileNotFoundError for a missing path and ValueError naming the file for anything
    else that is not such a run (an unreadable or corrupted file, another dataset, a sweep
    store).
    """
    path = Path(path)
    kind = FORMATS.get(path.suffix)
    if kind is None:
        raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
    if not path.exists():
        raise FileNotFoundError(f"path: no trajectory at {path}")

    expected = f"a run written by attnflow (Trajectory.save, attnflow simulate) as {kind}"
    ds = read_dataset(path, kind, expected)
    if "attnflow" not in ds.attrs:
        what = ("a sweep store (open it with xarray.open_zarr)" if "attnflow_sweep" in ds.attrs
                else "a dataset without the 'attnflow' record")
        raise fail("path", expected, f"{path}, {what}")
    try:
        return from_xarray(ds)
    except (KeyError, TypeError, ValueError) as err:
        raise fail("path", expected, f"{path}, whose record does not match its data "
                   f"({_first_line(err)})") from None


def read_dataset(path: Path, kind: str, expected: str) -> xr.Dataset:
    """The whole Dataset of an existing file of `kind` ("netcdf": h5netcdf, or "zarr"),
    loaded into memory; a ValueError naming the file and `expected` when it cannot be read."""
    import xarray as xr

    try:
        if kind == "netcdf":
            with xr.open_dataset(path, engine="h5netcdf") as ds:
                return ds.load()
        with xr.open_zarr(path, consolidated=False) as ds:
            return ds.load()
    except Exception as err:  # any reader failure: not a readable file of this kind
        raise fail("path", expected, f"{path}, which cannot be read ({_first_line(err)})"
                   ) from None


def _first_line(err: BaseException) -> str:
    """The exception as 'Type: first line of its message' (for one-line error messages)."""
    text = str(err).strip().splitlines()
    return type(err).__name__ + (f": {text[0]}" if text else "")


def from_xarray(ds: xr.Dataset) -> Trajectory:
    """Inverse of `Trajectory.to_xarray`."""
    rec = json.loads(ds.attrs["attnflow"])
    arrays = {name: ds[name].values for name in ds.data_vars if name != "states"}
    model = model_from_record(rec["model"], arrays)
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


def _version() -> str:
    from attnflow._version import __version__

    return __version__


def _commit() -> str | None:
    from attnflow._version import git_commit

    return git_commit()
