"""The result of a simulation: saved states with the full record of how they were made.

A `Trajectory` converts to an xarray Dataset (dims time, run, token, coord) and saves to
netCDF (``.nc``) or Zarr (``.zarr``); `load` reads it back bit-identically, model included.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow._array import TOKEN_DTYPES, dtype_name, to_numpy
from attnflow._checks import fail
from attnflow._datafiles import (
    MAX_BYTES,
    check_exists,
    first_line,
    open_dataset,
    parse_record,
    read_values,
    reading,
    save_dataset,
)
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
# a netCDF chunk at most HDF5's default chunk cache (1 MiB): larger chunks passed through the
# Fletcher-32 filter wrote at about half the rate (benchmarks/RESULTS.md)
HDF5_CHUNK_BYTES = 2**20


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

    def energy(self, beta: Any = None, log: bool = False) -> Any:
        """The interaction energy E_beta of the token directions at every saved time, (T, ...)
        (`attnflow.analysis.energy`; its logarithm when `log`, finite at any beta). At each
        time it is that of the layer acting then (a Stack's layer floor(t)): its beta (unless
        `beta` is given) and the Q, K of its single head (positional encodings, biases and
        the feed-forward term are not part of E_beta). A run on tensors gives a tensor in
        its autograd graph (`metric`)."""
        return self.metric("log_energy" if log else "energy", beta=beta)

    def metric(self, name: str, **context: Any) -> Any:
        """A registered quantity (`attnflow.analysis.metrics.METRICS`: "energy",
        "order_parameter", "cluster_count", ...) of the states at every saved time,
        (T, ...) or (T, ..., k), in the states' library: a run on tensors gives tensors in
        its autograd graph for a differentiable entry (a count of a tensor run that
        requires grad is refused, naming a differentiable one).

        The context an entry needs defaults, at each time, from the layer acting then (a
        Stack's layer floor(t)): beta its beta; Q, K those of its single (Q, K, V) head;
        tol `attnflow.analysis.clusters.default_cluster_tol(beta)`; delta 4 |beta|^{-1/2} and r
        |beta|^{-1/2} (at most pi); x0 the states at the first saved time; modes 4.
        Keywords override them (e.g. ``traj.metric("cluster_count", tol=0.05)``)."""
        from attnflow._array import namespace, scalar
        from attnflow.analysis.clusters import default_cluster_tol, length_scale
        from attnflow.analysis.metrics import METRICS, evaluate_metric

        if name not in METRICS:
            raise fail("name", f"a registered metric, one of {sorted(METRICS)}", repr(name))
        needs = METRICS[name].needs
        layers = [self.model.layer_at(float(t)) for t in self.times]
        if "Q" in needs and context.get("Q") is None and context.get("K") is None:
            for layer in set(layers):
                if len(layer.heads) != 1 or len(layer.heads[0]) != 3:
                    raise fail("model", "layers with one (Q, K, V) head each (E_beta takes "
                               "one Q, K; call attnflow.analysis.energy.energy("
                               "traj.directions, beta, Q, K) otherwise)", repr(layer))
        states = self.states
        given = {k: v for k, v in context.items() if v is not None}
        values: list[Any] = [None] * len(self.times)
        for layer in dict.fromkeys(layers):
            at = [i for i, other in enumerate(layers) if other is layer]
            b = float(scalar(layer.beta))  # the radii from its value (a tensor's too)
            scale = length_scale(b)
            ctx = {"beta": layer.beta, "tol": default_cluster_tol(b),
                   "delta": min(np.pi, 4.0 * scale), "r": min(np.pi, scale),
                   "x0": states[0], "modes": 4}
            if "Q" in needs:
                ctx["Q"], ctx["K"] = layer.heads[0][:2]
            ctx.update(given)
            out = evaluate_metric(name, states[at], **{k: ctx[k] for k in needs})
            for j, i in enumerate(at):
                values[i] = out[j]
        return namespace(states).stack(values)

    def record(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-friendly data."""
        meta, _ = self.model.to_record()
        return {"model": meta, "integrator": self.integrator, "seed": self.seed,
                "n_evals": self.n_evals, "wall_time": self.wall_time, "version": self.version,
                "commit": self.commit, "batch_shape": list(self.batch_shape),
                "dtype": dtype_name(self._states)}

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
        docs/guide/files.md). Both formats hold the states in chunks of whole save times (as
        many as fit in 8 MiB in Zarr, 1 MiB in netCDF, at least one; a larger time split by
        tokens), so that reading one time reads its own chunks only, each with its checksum
        (Fletcher-32 in netCDF, crc32c in Zarr)."""
        path = Path(path)
        kind = FORMATS.get(path.suffix)
        if kind is None:
            raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
        ds = self.to_xarray()
        T, runs, n, d = ds["states"].shape
        per_token = max(1, runs * d * ds["states"].dtype.itemsize)
        size = CHUNK_BYTES if kind == "zarr" else min(CHUNK_BYTES, HDF5_CHUNK_BYTES)
        times = max(1, min(T, size // (per_token * n)))
        tokens = min(n, max(1, size // per_token))  # all, unless one time is large
        chunks = (times, runs, tokens, d)
        encoding = {"states": {"chunks": chunks} if kind == "zarr" else {"chunksizes": chunks}}
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
    check_exists(path, "trajectory")

    expected = f"a run written by attnflow (Trajectory.save, attnflow simulate) as {kind}"
    with reading(path, kind):  # (a store: no save replaces it meanwhile)
        ds = open_dataset(path, kind, "attnflow", expected, max_bytes, indexes=False)
        if "attnflow" not in ds.attrs:
            what = ("a sweep store (open it with xarray.open_zarr)"
                    if "attnflow_sweep" in ds.attrs else "a dataset without the 'attnflow' record")
            raise fail("path", expected, f"{path}, {what}")
        return _from_dataset(path, ds)


def from_xarray(ds: xr.Dataset) -> Trajectory:
    """Inverse of `Trajectory.to_xarray` (with the checks of `load`; the states are read
    when first used)."""
    return _from_dataset("<dataset>", ds)


RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (dict,), "integrator": (dict,), "batch_shape": (list,),
    "seed": (int, type(None)), "n_evals": (int,), "wall_time": (int, float),
    "version": (str,), "commit": (str, type(None)), "dtype": (str,)}
OPTIONAL_FIELDS = ("commit", "dtype")  # (absent in files of earlier versions)


def _from_dataset(path: Any, ds: xr.Dataset) -> Trajectory:
    """The Trajectory of a Dataset written by `Trajectory.to_xarray`, its states lazy."""
    rec = parse_record(path, ds, "attnflow")
    for name, types in RECORD_FIELDS.items():
        if name not in rec and name in OPTIONAL_FIELDS:
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
    _check_dtype(path, rec, var.dtype)
    times = _times(path, ds, T)
    arrays = {str(k): read_values(path, ds, str(k)) for k in ds.data_vars
              if k != "states" and not str(k).startswith("summary_")}
    summaries = _summaries(path, ds, batch)
    if (rec["integrator"].get("store") == "summaries") != (summaries is not None):
        raise CorruptFileError(path, "attnflow.integrator.store", "summary_* variables for "
                               "store 'summaries' and none otherwise", repr(
                                   rec["integrator"].get("store"))[:40] + " with " + (
                                   "summaries" if summaries else "no summaries"))
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
    _check_model_record(path, rec["model"], model)
    return Trajectory(
        times=times,
        states=StatesOnDisk(path, ds, (T, *batch, n, d), model),
        model=model,
        integrator=rec["integrator"],
        seed=rec["seed"],
        n_evals=rec["n_evals"],
        wall_time=rec["wall_time"],
        version=rec["version"],
        commit=rec.get("commit"),
        summaries=summaries,
    )


def _check_dtype(path: Any, rec: dict[str, Any], dtype: np.dtype) -> None:
    """The states' dtype is the one the record says the run kept: its "dtype" (files of
    this version), else a tensor run's integrator "dtype", float32 for store "float32",
    float32 or float64 for the rest; a record naming another dtype names no run attnflow
    keeps (`_array.TOKEN_DTYPES`)."""
    integrator = rec["integrator"]
    said = rec.get("dtype", integrator.get("dtype"))
    if said is None and integrator.get("store") == "float32":
        said = "float32"
    if said is None:
        ok, want = str(dtype) in TOKEN_DTYPES, "float32 or float64 states"
    elif str(said) not in TOKEN_DTYPES:
        ok, want = False, f"float32 or float64 states (a run keeps no {said} states)"
    else:
        ok, want = str(dtype) == str(said), f"{said} states (the record's run)"
    if not ok:
        raise CorruptFileError(path, "states", want, f"{dtype} states")


def _check_model_record(path: Any, stored: Any, model: Model) -> None:
    """Every field of the stored model record is the one the model built from it (and the
    file's arrays) writes: n_heads, d, identity, ... say what the arrays are, so they must
    agree (fields of earlier versions that the model no longer writes are not compared)."""
    import json

    rebuilt = json.loads(json.dumps(model.to_record()[0]))
    where = _differs(stored, rebuilt, "attnflow.model")
    if where is not None:
        field_, held, built = where
        raise CorruptFileError(path, field_, f"{built[:60]} (what the file's arrays and the "
                               "rest of the record make)", held[:60])


def _differs(stored: Any, rebuilt: Any, at: str) -> tuple[str, str, str] | None:
    """(field, stored, rebuilt) of the first field of `stored` whose value `rebuilt` does not
    have (keys `rebuilt` lacks, and a mask given as nested lists by earlier versions, are
    skipped), else None."""
    if isinstance(stored, dict) and isinstance(rebuilt, dict):
        for key, value in stored.items():
            if key not in rebuilt or (key == "array" and isinstance(value, list)):
                continue
            found = _differs(value, rebuilt[key], f"{at}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(stored, list) and isinstance(rebuilt, list) and len(stored) == len(rebuilt):
        for i, (a, b) in enumerate(zip(stored, rebuilt)):
            found = _differs(a, b, f"{at}[{i}]")
            if found is not None:
                return found
        return None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                  for v in (stored, rebuilt))
    if stored == rebuilt and (numbers or type(stored) is type(rebuilt)):
        return None
    return at, repr(stored), repr(rebuilt)


def _summaries(path: Any, ds: xr.Dataset, batch: list[int]) -> dict[str, np.ndarray] | None:
    """The `summary_*` variables of a run with store="summaries", runs unflattened."""
    summaries = {str(name)[len("summary_"):]: read_values(path, ds, str(name))
                 for name in ds.variables if str(name).startswith("summary_")}
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
    times = np.asarray(read_values(path, ds, "time"), dtype=float)
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

    def __init__(self, path: Any, ds: Any, shape: tuple[int, ...], model: Model):
        self.path, self.ds, self.shape, self.model = path, ds, shape, model
        self.dtype = ds.variables["states"].dtype
        self.stamp = _stamp(path)

    def read(self, t: int | slice = slice(None)) -> np.ndarray:
        """The states at save index (or slice) `t`, checked."""
        kind = FORMATS.get(Path(self.path).suffix) if self.stamp is not None else None
        with reading(self.path, kind) if kind else contextlib.nullcontext():
            if _stamp(self.path) != self.stamp:
                raise CorruptFileError(self.path, "states", "the file load opened", "a file "
                                       "replaced since (load it again)")
            values = read_values(self.path, self.ds, "states", t)
        T, *rest = self.shape
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
