"""Parameter sweeps on Dask: grids of simulations into one resumable Zarr store.

A sweep runs `attnflow.simulate` for every point of a parameter grid and every seed, keeps
summary metrics over time for each run (optionally the states too), and writes them into one
Zarr store that opens as an xarray Dataset with dims (grid axes..., seed, time[, token, coord]).

The spec (a TOML file, or the same nested mapping in Python)::

    batch = 16                  # runs per task (optional; default below)
    entropy = 0                 # root of the seed tree (optional, default 0)

    [grid]                      # a list makes an axis; one value is the same for every run
    beta = [1, 4, 16]           # inverse temperature >= 0                       (required)
    n = 32                      # tokens                                         (required)
    d = [2, 3]                  # ambient dimension >= 2                         (required)
    mask = "causal"             # causal | full | window:W
    Q = "identity"              # matrix presets of `attnflow.presets`: identity,
    K = "identity"              #   gaussian[:SEED], diag:l1,..,ld, orth:..., eig:..., FILE.npy
    V = ["identity", "diag:-1,-1"]
    method = "rk4"              # rk4 | euler | geodesic | dopri5
    dt = 0.05                   # step (fixed-step methods), first step (dopri5)
    rtol = 1e-6                 # dopri5 only (ignored by fixed-step methods); also atol
    backend = "auto"            # attention kernel (attnflow.kernels; default: Attention's)
    norm = ["post", "pre"]      # the model family (attnflow.family.text): post | pre | peri | ngpt
    alpha = 0.2                 #   nGPT's step
    attention = "softmax"       #   softmax | unnormalised | sinkhorn[:IT]
    rope = "none"               #   none | BASE[:halves|adjacent[:OFFSET]]
    alibi = "none"              #   none | default | S | S1,S2,...
    noise = 0.1                 #   sigma: Euler-Maruyama (method euler or geodesic)
    t_end = 50                  # one number: all runs share the time axis        (required)
    save_at = [0, 10, 50]       # save times, or a count of evenly spaced times from 0 to t_end
    seeds = 8                   # a count (seeds 0..7) or a list of seed indices  (required)

    [keep]
    metrics = ["max_distance_to_first", "cluster_count"]   # default: all of METRICS
    states = false              # also keep the saved states (padded with NaN to max n, d)
    cluster_tol = 0.05          # rad; default beta^{-1/2} / 4 per run (1e-2 when beta = 0)
    delta_scale = 4.0           # Rényi radius delta = delta_scale beta^-1/2 (docs/science.md §3)
    r_scale = 1.0               # consumption radius r = r_scale beta^-1/2 (docs/science.md §4)

Radii are capped at pi (beta = 0 gives pi).

**Seeds.** Run (grid point, seed s) draws its initial tokens (uniform on the sphere) from
``SeedSequence(entropy, spawn_key=(s, 0))`` and the random matrix presets without a seed of
their own from ``spawn_key=(s, 1)`` (V), ``(s, 2)`` (Q) and ``(s, 3)`` (K); with noise, the key
of its Brownian path from ``(s, 4)`` (noisy runs are integrated one by one). The stream
depends on the seed coordinate only, not on the other grid coordinates, the task it lands in,
the order of execution or the number of workers: runs that differ only in beta (say) start
from the same tokens (common random numbers, for paired comparisons), and the first n tokens
of a run with more tokens are the same points.

**Tasks.** The runs of one grid point are cut into blocks of `batch` consecutive seeds; a
block is one task, integrated as one batch (``(batch, n, d)`` arrays) when its runs share
their matrices, else run by run. The default batch is min(#seeds, 128, 2^22 / max(n)^2,
max(4, #seeds / 8)): big enough for the batched kernels to pay (`attnflow.kernels.auto` says
from when the fused kernel takes over), small enough for a grid point to make about 8 tasks.
It is a function of the spec only, so the partition, and with it every bit of the result,
does not depend on the cluster. (With "dopri5" the step
size is shared by the runs of a batch: every run meets the tolerance, but its steps depend on
its batch-mates.) If a batch fails, its runs are redone one by one, and a run that still
fails (a non-finite state, say) is recorded as failed with its error while the sweep goes on.

**Execution.** `scheduler=None`: a `distributed.LocalCluster` with one single-threaded
worker process per CPU (and ATTNFLOW_THREADS=1 there: one kernel thread each), listening on
127.0.0.1 only, without a dashboard unless one is asked for. An address ("tcp://host:8786")
or a `distributed.Client`: a running cluster (``dask scheduler`` and ``dask worker``,
dask-jobqueue, ...), whose workers need attnflow installed (and ATTNFLOW_THREADS set to their
share of the cores). ``"serial"``: in this process, without Dask. Only the driver writes the
store: the workers need no access to it.

**Store and resume.** The store is created atomically with the full layout, the spec
(JSON attribute ``attnflow_sweep``) and consolidated metadata (``xarray.open_zarr`` opens it
without a warning; the layout never changes afterwards), then filled as tasks finish. Chunks
are one task's block; each finished task writes its data, then its ``status`` (0 pending, 1 done,
2 failed, with ``error`` the message), and Zarr writes every chunk atomically, so a status
other than 0 means the task is complete. Rerunning the same sweep into the same store skips
exactly the finished tasks; a worker lost mid-sweep costs only its in-flight tasks (Dask
reruns them), and a killed driver loses nothing that was recorded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from attnflow._checks import fail
from attnflow._files import atomic_path, consolidating
from attnflow.analysis import (
    cluster_count,
    consumed_fraction,
    default_cluster_tol,
    renyi_centers,
    strong_renyi_centers,
)
from attnflow.family import Attention
from attnflow.family.text import family_options
from attnflow.integrate import METHODS, check_solver_args
from attnflow.kernels import KERNELS
from attnflow.kernels.masks import mask_from_text
from attnflow.presets import matrix_from_spec
from attnflow.simulate import simulate
from attnflow.sphere import geodesic_distance, uniform

__all__ = [
    "METRICS",
    "SweepIncompleteError",
    "SweepSpec",
    "load_spec",
    "local_cluster",
    "parse_spec",
    "run_task",
    "sweep",
    "sweep_status",
]

PENDING, DONE, FAILED = 0, 1, 2
SPEC_ATTR = "attnflow_sweep"
MAX_BATCH = 128
BATCH_FLOATS = 1 << 22  # cap on batch * n^2: the (batch, n, n) score arrays stay ~32 MiB
TASKS_PER_POINT = 8  # the default batch cuts a grid point's seeds into at least this many
MIN_BATCH = 4  # ... unless that makes batches smaller than this
STREAMS = {"x0": 0, "V": 1, "Q": 2, "K": 3, "noise": 4}  # spawn_key[1] of a run's draws
UNTRIM = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"


# ============================================================================ the spec
def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _real(lo: float, strict: bool) -> Callable[[str, Any], float]:
    want = f"a number {'>' if strict else '>='} {lo:g}"

    def check(name: str, v: Any) -> float:
        if not _is_number(v) or not math.isfinite(v) or v < lo or (strict and v == lo):
            raise fail(name, want, repr(v))
        return float(v)

    return check


def _integer(lo: int) -> Callable[[str, Any], int]:
    def check(name: str, v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise fail(name, f"an integer >= {lo}", repr(v))
        return v

    return check


def _text(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise fail(name, "a non-empty string", repr(v))
    return v.strip()


def _backend(name: str, v: Any) -> str:
    if v not in KERNELS:
        raise fail(name, f"one of {', '.join(KERNELS)}", repr(v))
    return v


def _method(name: str, v: Any) -> str:
    if v not in METHODS:
        raise fail(name, f"one of {', '.join(METHODS)}", repr(v))
    return v


def _mask_text(name: str, v: Any) -> str:
    mask_from_text(_text(name, v), name)
    return v.strip()


def _family_text(option: str) -> Callable[[str, Any], str]:
    """A checker of one of the model family's text options (`attnflow.family.text`)."""

    def check(name: str, v: Any) -> str:
        family_options(**{option: _text(name, v)}, names={option: name})
        return v.strip()

    return check


# Grid fields that may be axes, in the order of the store's dims: parser, default.
AXES: dict[str, tuple[Callable[[str, Any], Any], Any]] = {
    "beta": (_real(0, strict=False), ...),
    "n": (_integer(1), ...),
    "d": (_integer(2), ...),
    "mask": (_mask_text, "causal"),
    "Q": (_text, "identity"),
    "K": (_text, "identity"),
    "V": (_text, "identity"),
    "method": (_method, "rk4"),
    "dt": (_real(0, strict=True), None),
    "rtol": (_real(0, strict=True), None),
    "atol": (_real(0, strict=True), None),
    "backend": (_backend, None),
    "norm": (_family_text("norm"), "post"),
    "alpha": (_real(0, strict=True), 0.2),
    "attention": (_family_text("attention"), "softmax"),
    "rope": (_family_text("rope"), "none"),
    "alibi": (_family_text("alibi"), "none"),
    "noise": (_real(0, strict=False), None),
}
GRID_FIELDS = (*AXES, "t_end", "save_at", "seeds")
KEEP_FIELDS = ("metrics", "states", "cluster_tol", "delta_scale", "r_scale")
TOP_FIELDS = ("grid", "keep", "batch", "entropy")


@dataclass(frozen=True)
class Keep:
    """What a sweep keeps per run, and the radii of its metrics (see the module docstring)."""

    metrics: tuple[str, ...]
    states: bool = False
    cluster_tol: float | None = None
    delta_scale: float = 4.0
    r_scale: float = 1.0

    def radii(self, beta: float) -> dict[str, float]:
        """Cluster tolerance, Rényi radius delta and consumption radius r of a run (rad)."""
        scale = beta ** -0.5 if beta > 0 else math.inf
        tol = self.cluster_tol if self.cluster_tol is not None else default_cluster_tol(beta)
        return {"tol": min(math.pi, tol), "delta": min(math.pi, self.delta_scale * scale),
                "r": min(math.pi, self.r_scale * scale)}


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: build with `parse_spec` or `load_spec`.

    axes : grid fields given as lists, {name: values}, in the order of `AXES`.
    fixed : grid fields given as one value, {name: value} (None: the simulate default).
    t_end : final time; times : the save times (t_end included), shared by all runs.
    seeds : the seed indices; keep : what to keep; batch : runs per task; entropy : root seed.
    base : directory against which .npy matrix paths are resolved.
    """

    axes: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any]
    t_end: float
    times: tuple[float, ...]
    seeds: tuple[int, ...]
    keep: Keep
    batch: int
    entropy: int
    base: Path = field(default=Path("."), compare=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the run array: (len of each axis..., number of seeds)."""
        return (*(len(v) for v in self.axes.values()), len(self.seeds))

    @property
    def n_runs(self) -> int:
        return math.prod(self.shape)

    def values(self, name: str) -> tuple[Any, ...]:
        """All values a grid field takes (one for a fixed field)."""
        return self.axes[name] if name in self.axes else (self.fixed[name],)

    def record(self) -> dict[str, Any]:
        """The canonical JSON-friendly form: two specs that sweep the same runs have equal
        records (seeds = 3 and seeds = [0, 1, 2], say)."""
        grid = {k: list(v) for k, v in self.axes.items()}
        grid.update({k: v for k, v in self.fixed.items() if v is not None})
        grid.update(t_end=self.t_end, save_at=list(self.times), seeds=list(self.seeds))
        keep = {"metrics": list(self.keep.metrics), "states": self.keep.states,
                "cluster_tol": self.keep.cluster_tol, "delta_scale": self.keep.delta_scale,
                "r_scale": self.keep.r_scale}
        return {"grid": grid, "keep": keep, "batch": self.batch, "entropy": self.entropy}

    def tasks(self) -> list[Task]:
        """The tasks of the sweep, grid points in C order, seed blocks within each."""
        out = []
        names = list(self.axes)
        matrices: dict[tuple[str, str, int], Any] = {}
        for index in itertools.product(*(range(len(v)) for v in self.axes.values())):
            params = dict(self.fixed)
            params.update({k: self.axes[k][i] for k, i in zip(names, index)})
            for name in ("Q", "K", "V"):  # .npy files are read here, by the driver
                key = (name, params[name], params["d"])
                if key not in matrices:
                    matrices[key] = _matrix_source(name, params[name], params["d"], self.base)
                params[name] = matrices[key]
            for start in range(0, len(self.seeds), self.batch):
                out.append(Task(index=index, start=start,
                                seeds=self.seeds[start:start + self.batch], params=params,
                                times=self.times, t_end=self.t_end, keep=self.keep,
                                entropy=self.entropy))
        return out


def _resolve(preset: str, base: Path) -> str:
    """A matrix preset with a relative .npy path made relative to the spec's folder."""
    return str(base / preset) if preset.endswith(".npy") and not Path(preset).is_absolute() \
        else preset


def _matrix_source(name: str, preset: str, d: int, base: Path) -> Any:
    """What a task needs to build a matrix: the preset text, or the array of a .npy file."""
    if preset.endswith(".npy"):
        return matrix_from_spec(_resolve(preset, base), d, f"grid.{name}")
    return preset


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read and validate a sweep spec from a TOML file (.npy paths relative to its folder)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise fail("spec", "an existing TOML file", str(path)) from None
    except OSError as err:
        raise fail("spec", "a readable TOML file", f"{path} ({err.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise fail("spec", "valid TOML", f"{path}: {err}") from None
    return parse_spec(raw, base=path.parent)


def parse_spec(raw: Mapping[str, Any], base: str | os.PathLike = ".") -> SweepSpec:
    """Validate a spec mapping (the TOML layout of the module docstring) into a SweepSpec.

    Errors name the field (``grid.beta``, ``keep.metrics``, ...), what was expected and what
    was received; unknown fields are errors.
    """
    raw = _table("spec", raw, TOP_FIELDS)
    grid = _table("grid", raw.get("grid"), GRID_FIELDS)
    keep = _table("keep", raw.get("keep", {}), KEEP_FIELDS)
    axes: dict[str, tuple[Any, ...]] = {}
    fixed: dict[str, Any] = {}
    for name, (check, default) in AXES.items():
        key = f"grid.{name}"
        if name not in grid:
            if default is ...:
                raise fail(key, "a value or a list of values (required)", "nothing")
            fixed[name] = default
        elif isinstance(grid[name], list):
            values = tuple(check(f"{key}[{i}]", v) for i, v in enumerate(grid[name]))
            if not values:
                raise fail(key, "a value or a non-empty list of values", "an empty list")
            if len(set(values)) < len(values):
                raise fail(key, "distinct values", repr(list(values)))
            axes[name] = values
        else:
            fixed[name] = check(key, grid[name])
    if "t_end" not in grid:
        raise fail("grid.t_end", "a final time >= 0 (required)", "nothing")
    if isinstance(grid["t_end"], list):
        raise fail("grid.t_end", "one number (all runs share the time axis)", repr(grid["t_end"]))
    t_end = _real(0, strict=False)("grid.t_end", grid["t_end"])
    save_at = grid.get("save_at")
    if isinstance(save_at, int) and not isinstance(save_at, bool):
        save_at = np.linspace(0.0, t_end, _integer(1)("grid.save_at", save_at))
    elif save_at is not None and (not isinstance(save_at, list)
                                  or not all(_is_number(t) for t in save_at)):
        raise fail("grid.save_at", "a list of times or a count of times", repr(save_at))
    spec = SweepSpec(
        axes=axes, fixed=fixed, t_end=t_end,
        times=tuple(float(t) for t in _save_times(axes, fixed, t_end, save_at)),
        seeds=_seeds(grid.get("seeds")), keep=_keep(keep), batch=1,
        entropy=_integer(0)("entropy", raw.get("entropy", 0)), base=Path(base))
    _check_matrices(spec)
    n_max = max(spec.values("n"))
    batch = raw.get("batch")
    if batch is None:
        seeds = len(spec.seeds)
        batch = min(seeds, MAX_BATCH, max(1, BATCH_FLOATS // n_max**2),
                    max(MIN_BATCH, math.ceil(seeds / TASKS_PER_POINT)))
    else:
        batch = _integer(1)("batch", batch)
    return replace(spec, batch=batch)


def _table(name: str, value: Any, fields: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(name, "a table of fields", "nothing" if value is None else repr(value))
    for key in value:
        if key not in fields:
            where = f"{name}.{key}" if name != "spec" else str(key)
            raise fail(where, f"a known field (one of {', '.join(fields)})", "an unknown field")
    return value


def _save_times(axes: dict, fixed: dict, t_end: float, save_at: Any) -> np.ndarray:
    """The shared save times; also checks every (method, dt, rtol, atol) combination."""
    get = {k: axes.get(k, (fixed.get(k),)) for k in ("method", "dt", "rtol", "atol")}
    times = None
    for method, dt, rtol, atol in itertools.product(*get.values()):
        adaptive = method == "dopri5"
        try:
            _, times, *_ = check_solver_args(method, t_end, save_at, dt,
                                             rtol if adaptive else None, atol if adaptive else None)
        except ValueError as err:
            raise ValueError(f"grid.{err}") from None
    return times


def _seeds(value: Any) -> tuple[int, ...]:
    if value is None:
        raise fail("grid.seeds", "a count of seeds or a list of seed indices (required)",
                   "nothing")
    if isinstance(value, list):
        seeds = tuple(_integer(0)(f"grid.seeds[{i}]", s) for i, s in enumerate(value))
        if not seeds:
            raise fail("grid.seeds", "a count >= 1 or a non-empty list", "an empty list")
        if len(set(seeds)) < len(seeds):
            raise fail("grid.seeds", "distinct seed indices", repr(value))
        return seeds
    return tuple(range(_integer(1)("grid.seeds", value)))


def _keep(raw: Mapping[str, Any]) -> Keep:
    metrics = raw.get("metrics", list(METRICS))
    if not isinstance(metrics, list) or not metrics:
        raise fail("keep.metrics", f"a non-empty list of names from {list(METRICS)}",
                   repr(metrics))
    for i, m in enumerate(metrics):
        if m not in METRICS:
            raise fail(f"keep.metrics[{i}]", f"one of {list(METRICS)}", repr(m))
    if len(set(metrics)) < len(metrics):
        raise fail("keep.metrics", "distinct names", repr(metrics))
    states = raw.get("states", False)
    if not isinstance(states, bool):
        raise fail("keep.states", "true or false", repr(states))
    tol = raw.get("cluster_tol")
    return Keep(
        metrics=tuple(metrics), states=states,
        cluster_tol=None if tol is None else _real(0, strict=False)("keep.cluster_tol", tol),
        delta_scale=_real(0, strict=True)("keep.delta_scale", raw.get("delta_scale", 4.0)),
        r_scale=_real(0, strict=False)("keep.r_scale", raw.get("r_scale", 1.0)))


def _check_matrices(spec: SweepSpec) -> None:
    """Every matrix preset must make sense for every d of the grid (checked with seed 0)."""
    for d in spec.values("d"):
        for name in ("Q", "K", "V"):
            for preset in spec.values(name):
                matrix_from_spec(_resolve(preset, spec.base), d, f"grid.{name}",
                                 np.random.SeedSequence(0))


# ============================================================================ metrics
def _max_distance_to_first(states: np.ndarray, x0: np.ndarray, radii: dict) -> np.ndarray:
    return geodesic_distance(states, x0[None, :, :1, :]).max(axis=-1)


def _cluster_count(states: np.ndarray, x0: np.ndarray, radii: dict) -> np.ndarray:
    return cluster_count(states, radii["tol"]).astype(float)


def _center_count(finder: Callable) -> Callable:
    def count(states: np.ndarray, x0: np.ndarray, radii: dict) -> np.ndarray:
        return np.array([[finder(X, radii["delta"]).size for X in at_t] for at_t in states],
                        dtype=float)

    return count


def _consumed(finder: Callable) -> Callable:
    def consumed(states: np.ndarray, x0: np.ndarray, radii: dict) -> np.ndarray:
        return np.stack([consumed_fraction(states[:, b], finder(x0[b], radii["delta"]),
                                           radii["r"]) for b in range(x0.shape[0])], axis=1)

    return consumed


@dataclass(frozen=True)
class Metric:
    """A per-run summary over time: fn(states (T, B, n, d), x0 (B, n, d), radii) -> (T, B)."""

    fn: Callable[[np.ndarray, np.ndarray, dict], np.ndarray]
    units: str
    definition: str


METRICS: dict[str, Metric] = {
    "max_distance_to_first": Metric(
        _max_distance_to_first, "rad",
        "max over tokens k of the geodesic distance from x_k(t) to x_1(0) (Theorem 4.1: -> 0 "
        "for V = I)"),
    "cluster_count": Metric(
        _cluster_count, "1",
        "number of single-linkage clusters at geodesic tolerance cluster_tol "
        "(attnflow.analysis.cluster_count)"),
    "renyi_count": Metric(
        _center_count(renyi_centers), "1",
        "number of Rényi centers(delta) of the configuration at time t (docs/science.md §4)"),
    "strong_renyi_count": Metric(
        _center_count(strong_renyi_centers), "1",
        "number of strong Rényi centers(delta) of the configuration at time t "
        "(docs/science.md §4)"),
    "consumed_renyi": Metric(
        _consumed(renyi_centers), "1",
        "fraction of tokens within geodesic radius r of the current position of a Rényi "
        "center(delta) of the initial tokens (docs/science.md §4, Fig. 3)"),
    "consumed_strong": Metric(
        _consumed(strong_renyi_centers), "1",
        "fraction of tokens within geodesic radius r of the current position of a strong "
        "Rényi center(delta) of the initial tokens (docs/science.md §4, Fig. 3)"),
}


# ============================================================================ one task
@dataclass(frozen=True)
class Task:
    """A block of runs at one grid point: what a worker needs, and where the result goes."""

    index: tuple[int, ...]  # position on the grid axes
    start: int  # position of the first seed on the seed axis
    seeds: tuple[int, ...]
    params: dict[str, Any]  # beta, n, d, mask, Q, K, V (preset text or array), method, ...
    times: tuple[float, ...]
    t_end: float
    keep: Keep
    entropy: int

    @property
    def label(self) -> str:
        return "-".join(map(str, (*self.index, self.start)))


@dataclass
class TaskResult:
    """Per-run outputs of a task: metrics {name: (B, T)}, states (B, T, n, d) or None,
    status (B,) int8 (DONE or FAILED) and the error message of each failed run."""

    metrics: dict[str, np.ndarray]
    states: np.ndarray | None
    status: np.ndarray
    errors: list[str]


def run_task(task: Task) -> TaskResult:
    """Integrate and measure the runs of one task (this is what a Dask worker executes).

    Never raises for a failing run: its status is FAILED and its error is kept.
    """
    p = task.params
    B, T = len(task.seeds), len(task.times)
    result = TaskResult(metrics={m: np.full((B, T), np.nan) for m in task.keep.metrics},
                        states=np.full((B, T, p["n"], p["d"]), np.nan) if task.keep.states
                        else None,
                        status=np.full(B, FAILED, dtype=np.int8), errors=[""] * B)
    groups: dict[tuple, list[int]] = {}
    runs = []
    for b, seed in enumerate(task.seeds):
        try:
            runs.append(_prepare(task, seed))
        except Exception as err:  # a bad run is recorded, never fatal to its batch-mates
            runs.append(None)
            result.errors[b] = _message(err)
            continue
        model = runs[-1][1]
        key = tuple(None if m is None else m.tobytes() for m in model.heads[0])
        groups.setdefault(key, []).append(b)
    for members in groups.values():
        try:
            _measure(task, runs, members, result)
        except Exception as err:
            if len(members) == 1:
                result.errors[members[0]] = _message(err)
                continue
            for b in members:  # redo one by one: only the failing runs fail
                try:
                    _measure(task, runs, [b], result)
                except Exception as err_b:
                    result.errors[b] = _message(err_b)
    return result


def _prepare(task: Task, seed: int) -> tuple[np.ndarray, Attention]:
    """Initial tokens (n, d) and model of one run, from the run's seed streams."""
    p = task.params

    def stream(name: str) -> np.random.SeedSequence:
        return np.random.SeedSequence(task.entropy, spawn_key=(seed, STREAMS[name]))

    matrices = {name: p[name] if isinstance(p[name], np.ndarray) or p[name] is None
                else matrix_from_spec(p[name], p["d"], name, stream(name))
                for name in ("Q", "K", "V")}
    backend = {} if p["backend"] is None else {"backend": p["backend"]}
    family = family_options(p["norm"], p["alpha"], p["attention"], p["rope"], p["alibi"])
    model = Attention(**matrices, beta=p["beta"], mask=mask_from_text(p["mask"]), **backend,
                      **family)
    return uniform(p["n"], p["d"], np.random.default_rng(stream("x0"))), model


def _measure(task: Task, runs: list, members: list[int], result: TaskResult) -> None:
    """Simulate the runs `members` (which share a model) as one batch and fill `result`."""
    p = task.params
    if p["noise"] is not None and len(members) > 1:  # the noise of a run is its own
        for b in members:
            _measure(task, runs, [b], result)
        return
    x0 = np.stack([runs[b][0] for b in members])
    adaptive = p["method"] == "dopri5"
    noise = {} if p["noise"] is None else {"noise": p["noise"], "seed": int(
        np.random.SeedSequence(task.entropy, spawn_key=(task.seeds[members[0]], STREAMS[
            "noise"])).generate_state(1, np.uint64)[0] >> 1)}
    traj = simulate(runs[members[0]][1], x0, task.t_end, save_at=np.asarray(task.times),
                    method=p["method"], dt=p["dt"], rtol=p["rtol"] if adaptive else None,
                    atol=p["atol"] if adaptive else None, **noise)
    radii = task.keep.radii(p["beta"])
    theta = traj.directions  # pre- and peri-LN: the metrics are of the directions
    values = {m: METRICS[m].fn(theta, x0, radii).T for m in task.keep.metrics}
    for name, v in values.items():
        result.metrics[name][members] = v
    if result.states is not None:
        result.states[members] = np.moveaxis(traj.states, 1, 0)
    result.status[members] = DONE


def _message(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


# ============================================================================ the store
def _coord(values: tuple[Any, ...]) -> np.ndarray:
    arr = np.asarray(values)
    return arr.astype(object) if arr.dtype.kind == "U" else arr


def _layout(spec: SweepSpec) -> xr.Dataset:
    """The empty store: every variable at its fill value (NaN, PENDING, ""), lazily."""
    import dask.array as da

    dims = (*spec.axes, "seed")
    chunks = (*(1 for _ in spec.axes), spec.batch)
    T = len(spec.times)
    data = {}
    for name in spec.keep.metrics:
        m = METRICS[name]
        data[name] = (dims + ("time",), da.full((*spec.shape, T), np.nan, chunks=chunks + (T,)),
                      {"units": m.units, "definition": m.definition})
    coords: dict[str, Any] = {k: (k, _coord(v)) for k, v in spec.axes.items()}
    coords.update({k: _coord((v,)).reshape(()) for k, v in spec.fixed.items() if v is not None})
    coords.update(seed=("seed", np.asarray(spec.seeds)), time=("time", np.asarray(spec.times)))
    if spec.keep.states:
        n, d = max(spec.values("n")), max(spec.values("d"))
        data["states"] = (dims + ("time", "token", "coord"),
                          da.full((*spec.shape, T, n, d), np.nan, chunks=chunks + (T, n, d)),
                          {"definition": "token positions at the save times; NaN beyond the "
                           "run's n tokens and d coordinates"})
        coords.update(token=("token", np.arange(n)), coord=("coord", np.arange(d)))
    data["status"] = (dims, da.full(spec.shape, PENDING, dtype=np.int8, chunks=chunks),
                      {"flag_values": [PENDING, DONE, FAILED],
                       "flag_meanings": "pending done failed"})
    data["error"] = (dims, np.full(spec.shape, "", dtype=object),
                     {"definition": "the error of a failed run (status 2)"})
    radii = ("cluster_tol = " + (f"{spec.keep.cluster_tol:g} rad" if spec.keep.cluster_tol
                                 is not None else "beta^-1/2 / 4 (1e-2 rad if beta = 0)")
             + f"; delta = {spec.keep.delta_scale:g} beta^-1/2; r = {spec.keep.r_scale:g} "
             "beta^-1/2 (radii capped at pi)")
    return xr.Dataset(data, coords=coords, attrs={
        SPEC_ATTR: json.dumps(spec.record()), "radii": radii, "attnflow_version": _version(),
        "attnflow_commit": _commit() or "unknown"})


def _open_store(path: Path, spec: SweepSpec) -> zarr.Group:
    """Create the store atomically, or check that the existing one holds this sweep."""
    if not path.exists():
        # Consolidated metadata (xarray opens the store without a warning): the layout is
        # final here, tasks only ever write array chunks.
        chunks = (*(1 for _ in spec.axes), spec.batch)
        with atomic_path(path) as tmp, consolidating():
            _layout(spec).to_zarr(tmp, mode="w", compute=False, consolidated=True,
                                  encoding={"error": {"chunks": chunks}})
    try:
        group = zarr.open_group(path, mode="r+")
        held = json.loads(group.attrs[SPEC_ATTR])
    except Exception:
        raise fail("out", "a new path or an attnflow sweep store", str(path)) from None
    mine = json.loads(json.dumps(spec.record()))
    if held != mine:
        differ = sorted(f"{top}.{k}" for top in mine if isinstance(mine[top], dict)
                        for k in set(mine[top]) | set(held.get(top, {}))
                        if mine[top].get(k) != held.get(top, {}).get(k))
        differ += [k for k in mine if not isinstance(mine[k], dict) and mine[k] != held.get(k)]
        raise fail("out", f"a store of this sweep or a new path ({path} holds a different sweep,"
                   f" differing in {', '.join(differ)})", str(path))
    for partial in path.rglob("*.partial"):  # left by writes cut short by a killed driver
        partial.unlink(missing_ok=True)
    return group


def _write(group: zarr.Group, task: Task, result: TaskResult) -> None:
    """Write a task's block; its status goes last, marking the block complete."""
    region = (*task.index, slice(task.start, task.start + len(task.seeds)))
    for name, values in result.metrics.items():
        group[name][region] = values
    if result.states is not None:
        n, d = result.states.shape[-2:]
        group["states"][(*region, slice(None), slice(0, n), slice(0, d))] = result.states
    group["error"][region] = np.asarray(result.errors, dtype=object)
    group["status"][region] = result.status


def sweep_status(out: str | os.PathLike) -> dict[str, int]:
    """Counts of pending, done and failed runs in a sweep store."""
    try:
        status = zarr.open_group(Path(out), mode="r")["status"][...]
    except Exception:  # missing, not zarr, or no status array
        raise fail("out", "an attnflow sweep store", str(out)) from None
    return {"pending": int(np.sum(status == PENDING)), "done": int(np.sum(status == DONE)),
            "failed": int(np.sum(status == FAILED))}


# ============================================================================ execution
class SweepIncompleteError(RuntimeError):
    """Some tasks did not finish (their workers kept dying, say); the store holds all the
    others, and rerunning the same sweep retries exactly the missing ones."""

    def __init__(self, errors: list[tuple[str, BaseException]], total: int):
        self.errors = errors
        label, first = errors[0]
        super().__init__(f"{len(errors)} of {total} tasks did not finish (task {label}: "
                         f"{_message(first)}); rerun the same sweep to retry them")


Outcomes = Iterator[tuple[Task, "TaskResult | BaseException"]]


def _check_scheduler(scheduler: Any, workers: int | None, dashboard: str | None) -> None:
    own_cluster = scheduler is None
    if isinstance(scheduler, str):
        known = scheduler == "serial" or "://" in scheduler
    else:
        from distributed import Client

        known = own_cluster or isinstance(scheduler, Client)
    if not known:
        raise fail("scheduler", "None, 'serial', an address like tcp://host:8786 or a "
                   "distributed.Client", repr(scheduler))
    if not own_cluster and (workers is not None or dashboard is not None):
        raise fail("workers/dashboard", "None unless sweep starts its own local cluster "
                   "(scheduler=None)", f"workers={workers}, dashboard={dashboard}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise fail("workers", "an integer >= 1", repr(workers))


def local_cluster(workers: int | None = None, dashboard: str | None = None) -> Any:
    """The LocalCluster a sweep starts by default: `workers` single-threaded worker processes
    (default: one per CPU), each with one kernel thread (ATTNFLOW_THREADS=1), listening on
    127.0.0.1 only, with a dashboard only at `dashboard` (e.g. "127.0.0.1:8787")."""
    import dask
    from distributed import LocalCluster

    # Without a dashboard the scheduler still serves /health on its HTTP port, by default
    # 8787: an ephemeral loopback port instead leaves 8787 alone. Dask's nanny sets
    # MALLOC_TRIM_THRESHOLD_=65536 in its workers, which turns glibc's adaptive mmap threshold
    # off: every (batch, n, n) temporary is then mmapped and page-faulted afresh, 1.8x slower
    # here; None unsets it.
    with dask.config.set({UNTRIM: None}):
        return LocalCluster(
            n_workers=len(os.sched_getaffinity(0)) if workers is None else workers,
            threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=dashboard, worker_dashboard_address=None,
            scheduler_kwargs={"dashboard_address": dashboard or "127.0.0.1:0"},
            env={"ATTNFLOW_THREADS": "1"})  # the workers share the CPUs


@contextlib.contextmanager
def _executor(scheduler: Any, workers: int | None, dashboard: str | None
              ) -> Iterator[Callable[[list[Task]], Outcomes]]:
    """A function mapping tasks to (task, result or exception) in order of completion."""
    if isinstance(scheduler, str) and scheduler == "serial":
        yield lambda tasks: ((t, _attempt(t)) for t in tasks)
        return
    from distributed import Client, as_completed

    with contextlib.ExitStack() as stack:
        if isinstance(scheduler, Client):
            client = scheduler
        elif scheduler is None:
            cluster = stack.enter_context(local_cluster(workers, dashboard))
            client = stack.enter_context(Client(cluster, set_as_default=False))
        else:
            client = stack.enter_context(Client(scheduler, timeout="30s", set_as_default=False))
        session = os.urandom(4).hex()

        def run(tasks: list[Task]) -> Outcomes:
            by_key = {f"attnflow-sweep-{session}-{t.label}": t for t in tasks}
            futures = client.map(run_task, tasks, key=list(by_key), pure=False)
            for future in as_completed(futures, loop=client.loop):
                try:
                    yield by_key[future.key], future.result()
                except Exception as err:
                    yield by_key[future.key], err
                future.release()

        yield run


def _attempt(task: Task) -> TaskResult | BaseException:
    try:
        return run_task(task)
    except Exception as err:
        return err


def sweep(
    grid: Mapping[str, Any] | SweepSpec,
    keep: Mapping[str, Any] | None = None,
    *,
    batch: int | None = None,
    entropy: int = 0,
    out: str | os.PathLike | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    dashboard: str | None = None,
    progress: bool | Callable[[int, int], None] = False,
) -> xr.Dataset:
    """Run a parameter sweep and return its results as an xarray Dataset.

    Parameters
    ----------
    grid : the [grid] table of the spec as a dict (see the module docstring), e.g.
        ``{"beta": [1, 4, 16], "n": 32, "d": 2, "t_end": 20, "seeds": 8}``; or a SweepSpec
        from `load_spec` (then keep, batch and entropy come from it).
    keep : the [keep] table (default: every metric, no states).
    batch, entropy : runs per task and root seed (module docstring).
    out : the Zarr store (``.zarr`` directory), created or resumed. None: a temporary store,
        loaded into memory and deleted.
    scheduler : None (a LocalCluster on 127.0.0.1; it spawns worker processes, so a script
        calling this needs the ``if __name__ == "__main__":`` guard), "serial" (this
        process, no Dask: best for small grids), a scheduler address such as
        "tcp://10.0.0.5:8786", or a distributed.Client.
    workers : worker processes of the LocalCluster (default: one per CPU).
    dashboard : address for the LocalCluster's dashboard, e.g. "127.0.0.1:8787" (default: none).
    progress : True for a progress bar on stderr, or a callable receiving (runs finished,
        runs in all), first with the runs an earlier attempt already finished.

    Returns
    -------
    xr.Dataset
        The Dataset of the store: one variable per metric on dims (grid axes..., seed,
        time), ``states`` on (..., seed, time, token, coord) if kept, ``status`` and
        ``error`` on (..., seed); the grid fields given as one value are scalar coordinates.
        Opened lazily from `out` when given.

    Raises
    ------
    ValueError
        For a bad spec (naming the field).
    SweepIncompleteError
        When tasks could not be finished (the rest is stored; rerun to retry).
    """
    if isinstance(grid, SweepSpec):
        if keep is not None or batch is not None or entropy != 0:
            raise fail("keep/batch/entropy", "None with a SweepSpec (they are part of it)",
                       f"keep={keep}, batch={batch}, entropy={entropy}")
        spec = grid
    else:
        raw = {"grid": grid, "keep": {} if keep is None else keep, "entropy": entropy}
        spec = parse_spec(raw if batch is None else {**raw, "batch": batch})
    if out is None:
        with tempfile.TemporaryDirectory(prefix="attnflow-sweep-") as tmp:
            return sweep(spec, out=Path(tmp) / "sweep.zarr", scheduler=scheduler,
                         workers=workers, dashboard=dashboard, progress=progress).load()
    _check_scheduler(scheduler, workers, dashboard)
    path = Path(out)
    group = _open_store(path, spec)
    status = group["status"][...]
    tasks = [t for t in spec.tasks()
             if np.all(status[(*t.index, slice(t.start, t.start + len(t.seeds)))] == PENDING)]
    finished = spec.n_runs - sum(len(t.seeds) for t in tasks)
    lost: list[tuple[str, BaseException]] = []
    with contextlib.ExitStack() as stack:
        report = stack.enter_context(_progress(progress, spec.n_runs))
        report(finished)
        run = stack.enter_context(_executor(scheduler, workers, dashboard)) if tasks else list
        for task, outcome in run(tasks):
            if isinstance(outcome, BaseException):
                lost.append((task.label, outcome))
                continue
            _write(group, task, outcome)
            finished += len(task.seeds)
            report(finished)
    if lost:
        raise SweepIncompleteError(lost, len(tasks))
    ds = xr.open_zarr(path, consolidated=False)
    return ds[[*spec.keep.metrics, *(["states"] if spec.keep.states else []), "status", "error"]]


@contextlib.contextmanager
def _progress(progress: bool | Callable[[int, int], None], total: int
              ) -> Iterator[Callable[[int], None]]:
    if callable(progress):
        yield lambda done: progress(done, total)
        return
    if not progress:
        yield lambda done: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("sweeping"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
               TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("sweep", total=total)
        yield lambda done: bar.update(task, completed=done)


def _version() -> str:
    from attnflow._version import __version__

    return __version__


def _commit() -> str | None:
    from attnflow._version import git_commit

    return git_commit()
