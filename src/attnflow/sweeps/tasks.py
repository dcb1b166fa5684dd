"""Tasks: blocks of runs at one grid point, what a worker integrates and measures.

`plan` cuts a spec into tasks (grid points in C order, blocks of `batch` seeds within each);
`run_task` is what a Dask worker executes. Seed streams and batching: `attnflow.sweeps`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow.family.stack import Model
from attnflow.presets import matrix_from_spec
from attnflow.simulate import simulate
from attnflow.sphere import uniform
from attnflow.sweeps.axes import MATRICES
from attnflow.sweeps.metrics import Keep, measure
from attnflow.sweeps.models import PointModels, run_model
from attnflow.sweeps.spec import SweepSpec, resolve_preset, tolerances

PENDING, DONE, FAILED = 0, 1, 2  # a run's status
STREAMS = {"x0": 0, "V": 1, "Q": 2, "K": 3, "noise": 4}  # spawn_key[1] of a run's draws


@dataclass(frozen=True)
class Task:
    """A block of runs at one grid point: what a worker needs, and where the result goes."""

    index: tuple[int, ...]  # position on the grid axes
    start: int  # position of the first seed on the seed axis
    seeds: tuple[int, ...]
    params: dict[str, Any]  # the grid point's fields; "model": the shared model or None
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


def plan(spec: SweepSpec) -> list[Task]:
    """The tasks of the sweep, grid points in C order, seed blocks within each. Matrices of
    .npy files and the models of model files are read here, by the driver."""
    out = []
    names = list(spec.axes)
    matrices: dict[tuple[str, str, int], Any] = {}
    models = PointModels(spec.base, spec.models)
    for index in itertools.product(*(range(len(v)) for v in spec.axes.values())):
        params = dict(spec.fixed)
        params.update({k: spec.axes[k][i] for k, i in zip(names, index)})
        for name in MATRICES:
            key = (name, params[name], params["d"])
            if params[name] is not None and key not in matrices:
                matrices[key] = _matrix_source(name, params[name], params["d"], spec.base)
            params[name] = matrices.get(key)
        params["model"] = models.get(params)
        for start in range(0, len(spec.seeds), spec.batch):
            out.append(Task(index=index, start=start,
                            seeds=spec.seeds[start:start + spec.batch], params=params,
                            times=spec.times, t_end=spec.t_end, keep=spec.keep,
                            entropy=spec.entropy))
    return out


def _matrix_source(name: str, preset: str, d: int, base: Any) -> Any:
    """What a task needs to build a matrix: the preset text, or the array of a .npy file."""
    if preset.endswith(".npy"):
        return matrix_from_spec(resolve_preset(preset, base), d, f"grid.{name}")
    return preset


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
            result.errors[b] = message(err)
            continue
        groups.setdefault(_weights_key(runs[-1][1]), []).append(b)
    for members in groups.values():
        try:
            _measure(task, runs, members, result)
        except Exception as err:
            if len(members) == 1:
                result.errors[members[0]] = message(err)
                continue
            for b in members:  # redo one by one: only the failing runs fail
                try:
                    _measure(task, runs, [b], result)
                except Exception as err_b:
                    result.errors[b] = message(err_b)
    return result


def _weights_key(model: Model) -> tuple:
    """The bytes of every matrix of every head of every layer: runs of a task with equal
    keys have one model (the other options are the grid point's) and share a batch."""
    return tuple(None if m is None else m.tobytes()
                 for layer in model.layers for head in layer.heads for m in head)


def _prepare(task: Task, seed: int) -> tuple[np.ndarray, Model]:
    """Initial tokens (n, d) and model of one run, from the run's seed streams."""
    p = task.params

    def stream(name: str) -> np.random.SeedSequence:
        return np.random.SeedSequence(task.entropy, spawn_key=(seed, STREAMS[name]))

    model = p["model"] if p["model"] is not None else run_model(p, stream)
    return uniform(p["n"], p["d"], np.random.default_rng(stream("x0"))), model


def _measure(task: Task, runs: list, members: list[int], result: TaskResult) -> None:
    """Simulate the runs `members` (which share a model) as one batch and fill `result`."""
    p = task.params
    if p["noise"] is not None and len(members) > 1:  # the noise of a run is its own
        for b in members:
            _measure(task, runs, [b], result)
        return
    x0 = np.stack([runs[b][0] for b in members])
    model = runs[members[0]][1]
    rtol, atol = tolerances(p["method"], p["rtol"], p["atol"])
    noise = {} if p["noise"] is None else {"noise": p["noise"], "seed": int(
        np.random.SeedSequence(task.entropy, spawn_key=(task.seeds[members[0]], STREAMS[
            "noise"])).generate_state(1, np.uint64)[0] >> 1)}
    traj = simulate(model, x0, task.t_end, save_at=np.asarray(task.times), method=p["method"],
                    dt=p["dt"], rtol=rtol, atol=atol, **noise)
    layers = [model.layer_at(t) for t in traj.times]
    # pre- and peri-LN: the metrics are of the directions
    values = measure(task.keep, traj.directions, x0, layers)
    for name, v in values.items():
        result.metrics[name][members] = v
    if result.states is not None:
        result.states[members] = np.moveaxis(traj.states, 1, 0)
    result.status[members] = DONE


def message(err: BaseException) -> str:
    """An exception as "Type: message" (the error kept for a failed run)."""
    return f"{type(err).__name__}: {err}"
