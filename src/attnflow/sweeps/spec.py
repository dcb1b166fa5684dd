"""The sweep spec: a TOML file (or the same nested mapping) validated into a `SweepSpec`.

The fields are listed in the `attnflow.sweeps` docstring; their checkers and defaults are in
`attnflow.sweeps.axes`.
"""

from __future__ import annotations

import itertools
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.family.stack import Model, segments
from attnflow.methods import DEFAULT_DT, FIXED_STEP, check_solver_args
from attnflow.presets import matrix_from_spec
from attnflow.savetimes import MAX_SAVE_TIMES, on_step_grid
from attnflow.sweeps.axes import MATRICES, REQUIRED, integer, is_number, model_kind, real
from attnflow.sweeps.axes import axes as grid_axes
from attnflow.sweeps.metrics import DEFAULT_METRICS, METRICS, Keep
from attnflow.sweeps.models import PointModels, digest, owned_by, read_model

MAX_BATCH = 128
MAX_SEEDS = 10**6  # runs per grid point (grid.seeds as a count)
BATCH_FLOATS = 1 << 22  # cap on batch * n^2: the (batch, n, n) score arrays stay ~32 MiB
TASKS_PER_POINT = 8  # the default batch cuts a grid point's seeds into at least this many
MIN_BATCH = 4  # ... unless that makes batches smaller than this
OTHER_FIELDS = ("t_end", "save_at", "seeds")  # grid fields that are not axes
KEEP_FIELDS = ("metrics", "states", "cluster_tol", "delta_scale", "r_scale")
TOP_FIELDS = ("grid", "keep", "batch", "entropy")


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep: build with `parse_spec` or `load_spec`.

    axes : grid fields given as lists, {name: values}, in the order of `axes()`.
    fixed : grid fields given as one value, {name: value} (None: the simulate default, or a
        field the model file holds).
    t_end : final time; times : the save times (t_end included), shared by all runs.
    seeds : the seed indices; keep : what to keep; batch : runs per task; entropy : root seed.
    base : directory against which .npy matrix and model file paths are resolved.
    models : {path: model} of the model files named in grid.model, read by the driver.
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
    models: dict[str, Model] = field(default_factory=dict, compare=False)

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

    def model_digests(self) -> dict[str, str]:
        """{path: SHA-256 of the model's record} of the model files (`models.digest`)."""
        return {path: digest(model) for path, model in self.models.items()}


def resolve_preset(preset: str, base: Path) -> str:
    """A matrix preset with a relative .npy path made relative to the spec's folder."""
    return str(base / preset) if preset.endswith(".npy") and not Path(preset).is_absolute() \
        else preset


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read and validate a sweep spec from a TOML file (paths relative to its folder)."""
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
    """Validate a spec mapping (the TOML layout of the `attnflow.sweeps` docstring) into a
    SweepSpec.

    Errors name the field (``grid.beta``, ``keep.metrics``, ...), what was expected and what
    was received; unknown fields are errors.
    """
    raw = _table("spec", raw, TOP_FIELDS)
    grid = _table("grid", raw.get("grid"), (*grid_axes(), *OTHER_FIELDS))
    keep = _table("keep", raw.get("keep", {}), KEEP_FIELDS)
    axes: dict[str, tuple[Any, ...]] = {}
    fixed: dict[str, Any] = {}
    models: dict[str, Model] = {}
    owned: tuple[str, ...] = ()
    for name, (check, default) in grid_axes().items():
        key = f"grid.{name}"
        if name in owned:
            if name in grid:
                raise fail(key, "nothing with this grid.model (the model file holds it)",
                           repr(grid[name]))
            fixed[name] = None
        elif name not in grid:
            if default is REQUIRED and not (name == "d" and _model_d(models)):
                raise fail(key, "a value or a list of values (required)", "nothing")
            fixed[name] = _model_d(models) if default is REQUIRED else default
        elif isinstance(grid[name], list):
            values = tuple(check(f"{key}[{i}]", v) for i, v in enumerate(grid[name]))
            if not values:
                raise fail(key, "a value or a non-empty list of values", "an empty list")
            if len(set(values)) < len(values):
                raise fail(key, "distinct values", repr(list(values)))
            axes[name] = values
        else:
            fixed[name] = check(key, grid[name])
        if name == "model" and (axes.get(name) or fixed[name]):
            models, owned = _read_models(axes.get(name) or (fixed[name],), Path(base))
    t_end = _t_end(grid)
    save_at = grid.get("save_at")
    if isinstance(save_at, int) and not isinstance(save_at, bool):
        save_at = np.linspace(0.0, t_end, integer(1, MAX_SAVE_TIMES)("grid.save_at", save_at))
    elif save_at is not None and not isinstance(save_at, str) and (
            not isinstance(save_at, list) or not all(is_number(t) for t in save_at)):
        raise fail("grid.save_at", "a list of times, a count of times or a text form (log, "
                   "log:NUM, linspace:START:STOP:NUM)", repr(save_at))
    spec = SweepSpec(
        axes=axes, fixed=fixed, t_end=t_end,
        times=tuple(float(t) for t in _save_times(axes, fixed, t_end, save_at)),
        seeds=_seeds(grid.get("seeds")), keep=_keep(keep), batch=1,
        entropy=integer(0)("entropy", raw.get("entropy", 0)), base=Path(base), models=models)
    _check_matrices(spec)
    _check_models(spec)
    n_max = max(spec.values("n"))
    batch = raw.get("batch")
    if batch is None:
        seeds = len(spec.seeds)
        batch = min(seeds, MAX_BATCH, max(1, BATCH_FLOATS // n_max**2),
                    max(MIN_BATCH, math.ceil(seeds / TASKS_PER_POINT)))
    else:
        batch = integer(1)("batch", batch)
    return replace(spec, batch=batch)


def _table(name: str, value: Any, fields: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(name, "a table of fields", "nothing" if value is None else repr(value))
    for key in value:
        if key not in fields:
            where = f"{name}.{key}" if name != "spec" else str(key)
            raise fail(where, f"a known field (one of {', '.join(fields)})", "an unknown field")
    return value


def _read_models(paths: tuple[str, ...], base: Path) -> tuple[dict[str, Model], tuple[str, ...]]:
    """The models of grid.model's files, and the fields those files hold (one kind only)."""
    kinds = {model_kind(p) for p in paths}
    if len(kinds) > 1:
        raise fail("grid.model", "model files of one kind (all .npz weights, or all "
                   "Trajectory files)", repr(list(paths)))
    return {p: read_model(p, base) for p in paths}, owned_by(paths[0])


def _model_d(models: dict[str, Model]) -> int | None:
    """The dimension d all the model files share (None: none given, or not one d)."""
    dims = {m.d for m in models.values()}
    return dims.pop() if len(dims) == 1 else None


def _t_end(grid: Mapping[str, Any]) -> float:
    if "t_end" not in grid:
        raise fail("grid.t_end", "a final time >= 0 (required)", "nothing")
    if isinstance(grid["t_end"], list):
        raise fail("grid.t_end", "one number (all runs share the time axis)", repr(grid["t_end"]))
    return real(0, strict=False)("grid.t_end", grid["t_end"])


def tolerances(method: str, rtol: float | None, atol: float | None
               ) -> tuple[float | None, float | None]:
    """The (rtol, atol) a run passes to `simulate`: None for the fixed-step methods (which
    take no tolerance), as given for dopri5 and the implicit methods."""
    return (None, None) if method in FIXED_STEP else (rtol, atol)


def _save_times(axes: dict, fixed: dict, t_end: float, save_at: Any) -> np.ndarray:
    """The shared save times; also checks every (method, dt, rtol, atol) combination. The
    default times move to the step grid, as `attnflow.simulate` moves them, when every
    combination steps with fixed steps on the same grid of save times (so a point's run is
    the run `simulate` makes with its defaults); otherwise they stay as generated."""
    get = {k: axes.get(k, (fixed.get(k),)) for k in ("method", "dt", "rtol", "atol")}
    times, grids = None, set()
    for method, dt, rtol, atol in itertools.product(*get.values()):
        try:
            _, times, dt, *_ = check_solver_args(method, t_end, save_at, dt,
                                                 *tolerances(method, rtol, atol))
        except ValueError as err:
            raise ValueError(f"grid.{err}") from None
        grids.add(tuple(on_step_grid(times, DEFAULT_DT if dt is None else dt))
                  if method in FIXED_STEP else None)
    default = save_at is None or (isinstance(save_at, str) and save_at == "default")
    if default and len(grids) == 1 and None not in grids and "noise" not in axes and (
            fixed.get("noise") is None):
        return np.array(grids.pop())
    return times


def _seeds(value: Any) -> tuple[int, ...]:
    if value is None:
        raise fail("grid.seeds", "a count of seeds or a list of seed indices (required)",
                   "nothing")
    if isinstance(value, list):
        seeds = tuple(integer(0)(f"grid.seeds[{i}]", s) for i, s in enumerate(value))
        if not seeds:
            raise fail("grid.seeds", "a count >= 1 or a non-empty list", "an empty list")
        if len(set(seeds)) < len(seeds):
            raise fail("grid.seeds", "distinct seed indices", repr(value))
        return seeds
    return tuple(range(integer(1, MAX_SEEDS)("grid.seeds", value)))


def _keep(raw: Mapping[str, Any]) -> Keep:
    metrics = raw.get("metrics", list(DEFAULT_METRICS))
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
        cluster_tol=None if tol is None else real(0, strict=False)("keep.cluster_tol", tol),
        delta_scale=real(0, strict=True)("keep.delta_scale", raw.get("delta_scale", 4.0)),
        r_scale=real(0, strict=False)("keep.r_scale", raw.get("r_scale", 1.0)))


def _check_matrices(spec: SweepSpec) -> None:
    """Every matrix preset must make sense for every d of the grid (checked with seed 0)."""
    for d in spec.values("d"):
        for name in MATRICES:
            for preset in spec.values(name):
                if preset is not None:  # None: the model file holds the matrices
                    matrix_from_spec(resolve_preset(preset, spec.base), d, f"grid.{name}",
                                     np.random.SeedSequence(0))


def _check_models(spec: SweepSpec) -> None:
    """Every model of the grid's model files (with every combination of the options applied
    to .npz weights) must take the grid's tokens (n, d) up to t_end."""
    if not spec.models:
        return
    point_models = PointModels(spec.base, spec.models)
    names = point_models.fields
    for values in itertools.product(*(spec.values(k) for k in names)):
        model = point_models.get(dict(zip(names, values)))
        path = values[0]
        for d in spec.values("d"):
            if model.d is not None and model.d != d:
                raise fail("grid.d", f"the model's d = {model.d} ({path})", repr(d))
            for n in spec.values("n"):
                try:
                    model.check_tokens(np.full((n, d), d ** -0.5), "x0")
                except ValueError as err:
                    raise fail("grid.n", f"tokens the model of {path} takes", f"n = {n}, d = "
                               f"{d} ({err})") from None
        try:
            segments(model, spec.t_end)
        except ValueError as err:
            raise ValueError(f"grid.{err} ({path})") from None
