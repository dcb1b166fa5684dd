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
from attnflow._datafiles import MAX_BYTES, first_line, open_dataset, parse_record, save_dataset
from attnflow._files import recover
from attnflow._repr import Plain, ShortRepr
from attnflow.errors import CorruptFileError
from attnflow.family import Model, model_from_record
from attnflow.manifolds import SPHERE, directions

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["MAX_BYTES", "StatesOnDisk", "Trajectory", "load"]

FORMATS = {".nc": "netcdf", ".zarr": "zarr"}
CHUNK_BYTES = 8 * 2**20  # a Zarr chunk of states holds whole save times, up to 8 MiB


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
    integrator : method and settings (method, dt, rtol, atol, steps, rejected steps; dt_min,
        the smallest step taken by a fixed-step method; kernel, the attention kernel that
        ran, e.g. "harmonic (tol 1e-12, order 66)"; None in older files, which lack it).
    seed : the seed of the initial tokens when they were drawn by attnflow, else None.
    n_evals : number of field evaluations (each over the whole batch).
    wall_time : seconds spent integrating.
    version : attnflow version that produced it.
    commit : git commit of the attnflow source that produced it (None when unknown, e.g.
        from an installed wheel).
    summaries : for a run with store="summaries" (`attnflow.store`), arrays per save time:
        "time" (S,) and each summary (S, ...) or (S, ..., k); `times` and `states` are then
        the first and last save times only. None otherwise.
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
    summaries: dict[str, np.ndarray] | None = None
    _states: Any = field(init=False, repr=False, compare=False)

    def _summary(self) -> dict[str, Any]:
        """What the short repr shows: sizes, the times, the model and how it was run."""
        t = self.times
        return {"runs": int(np.prod(self.batch_shape)), "n": self.n, "d": self.d,
                "times": Plain(f"{t.size} from {t[0]:g} to {t[-1]:g}" if t.size else "none"),
                "model": self.model, "method": self.integrator.get("method"),
                "kernel": self.integrator.get("kernel"), "n_evals": self.n_evals, "seed": self.seed}

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Shape of the leading run axes (empty for a single run)."""
        return tuple(self._states.shape[1:-2])

    @property
    def n(self) -> int:
        """Number of tokens."""
        return self._states.shape[-2]

    @property
    def d(self) -> int:
        """Ambient dimension."""
        return self._states.shape[-1]

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
        """States at the last save time, (..., n, d) (of a loaded run: read alone)."""
        return self._at_index(len(self.times) - 1)

    def at(self, t: float) -> np.ndarray:
        """States at the saved time closest to t, (..., n, d) (of a loaded run: read alone)."""
        return self._at_index(int(np.argmin(np.abs(self.times - t))))

    def _at_index(self, i: int) -> np.ndarray:
        s = self._states
        return s.read(i) if isinstance(s, StatesOnDisk) else s[i]

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
                           "K; call attnflow.analysis.energy.energy(traj.directions, beta, Q, "
                           "K) otherwise)",
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
        for name, arr in (self.summaries or {}).items():  # (S, *batch, k...): runs flattened
            arr = arr.reshape(len(arr), runs, *arr.shape[1 + len(self.batch_shape):]) \
                if name != "time" else arr
            dims = ("summary_time",) if name == "time" else (
                "summary_time", "run", *(f"summary_{name}_dim{i}" for i in range(arr.ndim - 2)))
            data[f"summary_{name}"] = (dims, arr)
        return xr.Dataset(
            data,
            coords={"time": self.times, "run": np.arange(runs), "token": np.arange(n),
                    "coord": np.arange(d)},
            attrs={"attnflow": json.dumps(self.record())},
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``.nc`` (netCDF4 via h5netcdf) or ``.zarr``, atomically: the data goes to a
        temporary name beside the target, a completeness marker is written last, and the
        temporary is renamed into place when complete (`attnflow._datafiles.save_dataset`;
        docs/guide/files.md). A Zarr store holds the states in chunks of whole save times
        (as many as fit in 8 MiB, at least one; a time over 8 MiB split by tokens), so that
        reading one time reads its own chunks only."""
        path = Path(path)
        kind = FORMATS.get(path.suffix)
        if kind is None:
            raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
        ds = self.to_xarray()
        encoding = None
        if kind == "zarr":
            T, runs, n, d = ds["states"].shape
            per_token = max(1, runs * d * ds["states"].dtype.itemsize)
            times = max(1, min(T, CHUNK_BYTES // (per_token * n)))
            tokens = min(n, max(1, CHUNK_BYTES // per_token))  # all, unless one time is large
            encoding = {"states": {"chunks": (times, runs, tokens, d)}}
        return save_dataset(ds, path, kind, "attnflow", encoding)


def _get_states(self: Trajectory) -> np.ndarray:
    if isinstance(self._states, StatesOnDisk):
        self._states = self._states.read()
    return self._states


def _set_states(self: Trajectory, value: Any) -> None:
    self._states = value


# `states` is a dataclass field whose value a loaded run reads from its file on first use.
Trajectory.states = property(
    _get_states, _set_states,
    doc="(T, ..., n, d) token states at the save times (of a loaded run: read from the file, "
        "and checked, on first use).")


def load(path: str | os.PathLike, max_bytes: int | None = MAX_BYTES) -> Trajectory:
    """Open a Trajectory written by `Trajectory.save` (netCDF or Zarr), lazily: the times,
    the record and the model are read and checked now, the states when first used (all of
    them on ``.states``; one save time's on ``.final`` and ``.at(t)``), and checked then
    (finite; unit vectors for sphere schemes; non-zero where directions are read).

    Nothing but the file itself is read: links, external storage, special files and paths in
    the record are refused (docs/guide/files.md says what is checked and what is not).
    `max_bytes` bounds the sizes the file declares, checked before anything is read (default
    `MAX_BYTES`, 8 GiB; None: no bound).

    Raises FileNotFoundError for a missing path, ValueError naming the file for anything that
    is not such a run (another dataset, a sweep store), and `CorruptFileError` (a ValueError)
    naming the file and the field for a run file that is unreadable, incomplete (an
    interrupted save), inconsistent or over the budget.
    """
    path = Path(path)
    kind = FORMATS.get(path.suffix)
    if kind is None:
        raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
    recover(path)
    if not path.exists():
        raise FileNotFoundError(f"path: no trajectory at {path}")

    expected = f"a run written by attnflow (Trajectory.save, attnflow simulate) as {kind}"
    ds = open_dataset(path, kind, "attnflow", expected, max_bytes, indexes=False)
    if "attnflow" not in ds.attrs:
        what = ("a sweep store (open it with xarray.open_zarr)" if "attnflow_sweep" in ds.attrs
                else "a dataset without the 'attnflow' record")
        raise fail("path", expected, f"{path}, {what}")
    return _from_dataset(path, ds)


def from_xarray(ds: xr.Dataset) -> Trajectory:
    """Inverse of `Trajectory.to_xarray` (with the checks of `load`; the states are read
    when first used)."""
    return _from_dataset("<dataset>", ds)


RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (dict,), "integrator": (dict,), "batch_shape": (list,),
    "seed": (int, type(None)), "n_evals": (int,), "wall_time": (int, float),
    "version": (str,), "commit": (str, type(None))}


def _from_dataset(path: Any, ds: xr.Dataset) -> Trajectory:
    """The Trajectory of a Dataset written by `Trajectory.to_xarray`, its states lazy."""
    rec = parse_record(path, ds, "attnflow")
    for name, types in RECORD_FIELDS.items():
        if name not in rec and name == "commit":
            continue
        value = rec.get(name)
        if name not in rec or not isinstance(value, types) or isinstance(value, bool):
            raise CorruptFileError(path, f"attnflow.{name}", " or ".join(
                "null" if t is type(None) else t.__name__ for t in types),
                "nothing" if name not in rec else repr(value)[:60])
    if "states" not in ds.variables:
        raise CorruptFileError(path, "states", "a variable (time, run, token, coord)", "none")
    var = ds.variables["states"]
    if var.dims != ("time", "run", "token", "coord") or var.dtype.kind != "f":
        raise CorruptFileError(path, "states", "a float variable on (time, run, token, coord)",
                               f"{var.dtype} on {var.dims}")
    T, runs, n, d = var.shape
    batch = rec["batch_shape"]
    if (not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in batch)
            or int(np.prod(batch, dtype=object)) != runs):
        raise CorruptFileError(path, "attnflow.batch_shape", f"integers whose product is the "
                               f"{runs} runs of states", repr(batch)[:60])
    if T == 0 or n == 0 or d == 0:
        raise CorruptFileError(path, "states", "at least one save time, token and coordinate",
                               f"shape {var.shape}")
    times = _times(path, ds, T)
    arrays = {str(k): ds.variables[k].values for k in ds.data_vars
              if k != "states" and not str(k).startswith("summary_")}
    summaries = _summaries(ds, batch)
    try:
        model = model_from_record(rec["model"], arrays)
    except Exception as err:  # a record that does not build a model: name the field
        raise CorruptFileError(path, "attnflow.model", "a model record matching the file's "
                               "arrays", first_line(err)) from None
    try:
        model.check_tokens(np.broadcast_to(np.zeros((), var.dtype), (n, d)), "states")
    except ValueError as err:
        raise CorruptFileError(path, "attnflow.model", f"a model for the states' (n, d) = "
                               f"({n}, {d})", str(err)) from None
    return Trajectory(
        times=times,
        states=StatesOnDisk(path, var, (T, *batch, n, d), model),
        model=model,
        integrator=rec["integrator"],
        seed=rec["seed"],
        n_evals=rec["n_evals"],
        wall_time=rec["wall_time"],
        version=rec["version"],
        commit=rec.get("commit"),
        summaries=summaries,
    )


def _summaries(ds: xr.Dataset, batch: list[int]) -> dict[str, np.ndarray] | None:
    """The `summary_*` variables of a run with store="summaries", runs unflattened."""
    summaries = {str(name)[len("summary_"):]: ds.variables[name].values for name in ds.variables
                 if str(name).startswith("summary_")}
    for name, arr in summaries.items():
        if name != "time":
            summaries[name] = arr.reshape(len(arr), *batch, *arr.shape[2:])
    return summaries or None


def _times(path: Any, ds: xr.Dataset, T: int) -> np.ndarray:
    """The stored save times: T finite, strictly increasing numbers."""
    if "time" not in ds.variables:
        raise CorruptFileError(path, "time", f"{T} save times (one per state)", "none stored")
    var = ds.variables["time"]
    if var.dims != ("time",) or var.dtype.kind not in "fiu":
        raise CorruptFileError(path, "time", "numbers on dimension time",
                               f"{var.dtype} on {var.dims}")
    times = np.asarray(var.values, dtype=float)
    if not np.all(np.isfinite(times)):
        raise CorruptFileError(path, "time", "finite save times",
                               f"{int(np.sum(~np.isfinite(times)))} non-finite")
    if np.any(np.diff(times) <= 0):
        i = int(np.argmax(np.diff(times) <= 0))
        raise CorruptFileError(path, "time", "strictly increasing save times",
                               f"t[{i}] = {times[i]:g} then t[{i + 1}] = {times[i + 1]:g}")
    return times


class StatesOnDisk:
    """The states of a loaded run, still in the file: shape and dtype known, values read
    (and checked: `check_states`) when indexed. `Trajectory.states` reads them all once."""

    def __init__(self, path: Any, variable: Any, shape: tuple[int, ...], model: Model):
        self.path, self.variable, self.shape, self.model = path, variable, shape, model
        self.dtype = variable.dtype
        self.stamp = _stamp(path)

    def read(self, t: int | slice = slice(None)) -> np.ndarray:
        """The states at save index (or slice) `t`, checked."""
        if _stamp(self.path) != self.stamp:
            raise CorruptFileError(self.path, "states", "the file load opened", "a file "
                                   "replaced since (load it again)")
        T, *rest = self.shape
        values = np.asarray(self.variable[t].values)
        values = values.reshape(*values.shape[:-3], *rest)
        check_states(values, self.model, self.path)
        return values


def check_states(states: np.ndarray, model: Model, where: Any) -> None:
    """CorruptFileError unless the states are finite, unit vectors for a sphere scheme
    (within the manifold's tolerance) and of finite, non-zero norm where directions are
    read."""
    if states.ndim > 2 and states.shape[0] > 1:  # time by time: temporaries of one time
        for one in states:
            check_states(one, model, where)
        return
    with np.errstate(over="ignore", invalid="ignore"):  # 1e300 entries: an infinite norm
        norms = np.sqrt(np.einsum("...i,...i->...", states, states))
    if not np.all(np.isfinite(norms)):  # (a pass over the norms, not the entries)
        bad = int(np.sum(~np.isfinite(states)))
        if bad:
            raise CorruptFileError(where, "states", "finite entries", f"{bad} non-finite")
    if model.manifold == SPHERE:
        tol = model.manifold.tolerance(states.dtype)
        off = float(np.max(np.abs(norms - 1.0)))
        if off > tol:
            raise CorruptFileError(where, "states", f"unit vectors (|norm - 1| <= {tol:.2g}) "
                                   "for a sphere scheme", f"norms off 1 by up to {off:.3g}")
        return
    reads_directions = any(s is not None and s.unit_inputs
                           for layer in model.layers for s in (layer.scheme, layer.mlp_scheme))
    if not np.all(np.isfinite(norms)) or (reads_directions and np.any(norms == 0)):
        raise CorruptFileError(where, "states", "token vectors of finite, non-zero norm",
                               f"norms from {norms.min():.3g} to {norms.max():.3g}")


def _stamp(path: Any) -> tuple[int, ...] | None:
    """What identifies the file at `path`: its device, inode and change time."""
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)
def _version() -> str:
    from attnflow._version import __version__

    return __version__


def _commit() -> str | None:
    from attnflow._version import git_commit

    return git_commit()
