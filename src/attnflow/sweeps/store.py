"""The sweep's Zarr store: its layout, created atomically; resume checks; task writes.

Layout and guarantees: the `attnflow.sweeps` docstring ("Store and resume").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from attnflow._checks import fail
from attnflow._files import atomic_path, consolidating
from attnflow.sweeps.metrics import METRICS
from attnflow.sweeps.spec import SweepSpec
from attnflow.sweeps.tasks import DONE, FAILED, PENDING, Task, TaskResult
from attnflow.sweeps.tidy import NOTE_ATTR, nested_note

SPEC_ATTR = "attnflow_sweep"
MODELS_ATTR = "attnflow_models"  # {path: SHA-256 of the model}, with model files only


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
                      {"units": m.units, "definition": m.description})
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
    attrs = {SPEC_ATTR: json.dumps(spec.record()), "radii": spec.keep.describe_radii(),
             "attnflow_version": _version(), "attnflow_commit": _commit() or "unknown"}
    if spec.models:
        attrs[MODELS_ATTR] = json.dumps(spec.model_digests())
    note = nested_note(spec)
    if note is not None:
        attrs[NOTE_ATTR] = note
    return xr.Dataset(data, coords=coords, attrs=attrs)


def open_store(path: Path, spec: SweepSpec) -> zarr.Group:
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
    held_models = json.loads(group.attrs.get(MODELS_ATTR, "{}"))
    changed = sorted(p for p, sha in spec.model_digests().items() if held_models.get(p) != sha)
    if changed:
        raise fail("out", f"a store of this sweep or a new path (the model in "
                   f"{', '.join(changed)} differs from the one {path} was made with)", str(path))
    for partial in path.rglob("*.partial"):  # left by writes cut short by a killed driver
        partial.unlink(missing_ok=True)
    return group


def pending(group: zarr.Group, tasks: list[Task]) -> list[Task]:
    """The tasks whose runs the store does not hold yet."""
    status = group["status"][...]
    return [t for t in tasks if np.all(status[_region(t)] == PENDING)]


def _region(task: Task) -> tuple:
    return (*task.index, slice(task.start, task.start + len(task.seeds)))


def write(group: zarr.Group, task: Task, result: TaskResult) -> None:
    """Write a task's block; its status goes last, marking the block complete."""
    region = _region(task)
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


def _version() -> str:
    from attnflow._version import __version__

    return __version__


def _commit() -> str | None:
    from attnflow._version import git_commit

    return git_commit()
