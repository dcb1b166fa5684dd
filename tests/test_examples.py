"""The example sweep specs in examples/: documented, at the sizes they claim, and runnable (at
tiny size here) into stores that xarray opens without a warning (consolidated metadata), also
after an interrupted sweep, which resumes without recomputing finished runs."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from attnflow import sweep
from attnflow.analysis.renyi import renyi_centers
from attnflow.sphere import uniform
from attnflow.sweeps import SweepSpec, load_spec, parse_spec, sweep_status

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def tiny(path: Path, batch: int | None = None) -> SweepSpec:
    """The example with its axes cut to two values, n <= 6 tokens, 3 seeds, t_end = 0.5
    (and `batch` runs per task, default the spec's default)."""
    raw = tomllib.loads(path.read_text())
    grid = raw["grid"]
    for key, value in grid.items():
        if isinstance(value, list):
            grid[key] = value[:2]
    grid["n"] = [min(6, n) - i for i, n in enumerate(grid["n"])] \
        if isinstance(grid["n"], list) else min(6, grid["n"])
    grid.update(t_end=0.5, save_at=3, seeds=3)
    raw.pop("batch", None)
    if batch is not None:
        raw["batch"] = batch
    return parse_spec(raw, base=path.parent)


def open_quietly(store: Path) -> xr.Dataset:
    """Open a store as a user would (xarray's defaults), failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_zarr(store) as ds:
            return ds.load()


def test_every_example_is_documented_and_valid():
    assert {p.name for p in EXAMPLES} >= {"fig3.toml", "beta_n_grid.toml"}
    docs = (ROOT / "docs" / "sweeps.md").read_text()
    for path in EXAMPLES:
        assert f"examples/{path.name}" in docs
        load_spec(path)


def test_fig3_example_has_the_sizes_of_the_full_recipe():
    from attnflow.experiments import fig3

    spec, full = load_spec(ROOT / "examples" / "fig3.toml"), fig3.FULL
    assert spec.axes == {}
    grid = spec.fixed
    assert (grid["n"], grid["beta"], grid["d"], grid["method"], grid["dt"], grid["mask"]) == \
        (full["n"], full["beta"], 2, full["method"], full["dt"], "causal")
    assert (spec.t_end, len(spec.times), len(spec.seeds), spec.batch) == \
        (full["t_end"], full["n_times"], full["runs"], full["chunk"])
    assert spec.keep.delta_scale == 4.0  # delta = 4 beta^{-1/2}
    r = full["r"] if full["r"] is not None else full["beta"] ** -0.5
    assert spec.keep.r_scale == pytest.approx(r * full["beta"] ** 0.5)
    assert {"consumed_renyi", "consumed_strong"} <= set(spec.keep.metrics)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_run_at_tiny_size(path, tmp_path):
    spec = tiny(path)
    store = tmp_path / "store.zarr"
    sweep(spec, out=store, scheduler="serial")
    ds = open_quietly(store)
    assert (ds.status.values == 1).all()
    assert list(ds.status.dims) == [*spec.axes, "seed"]
    # At t = 0 the metrics are those of the documented initial tokens, computed directly.
    d = spec.fixed["d"]
    for s in spec.seeds:
        for n in spec.values("n"):
            rng = np.random.default_rng(np.random.SeedSequence(spec.entropy, spawn_key=(s, 0)))
            x0 = uniform(n, d, rng)
            point = ds.sel(seed=s, time=0.0, **({"n": n} if "n" in spec.axes else {}))
            if "max_distance_to_first" in ds:
                direct = np.arccos(np.clip(x0 @ x0[0], -1, 1)).max()
                np.testing.assert_allclose(point.max_distance_to_first, direct, atol=1e-7)
            if "consumed_renyi" in ds:
                beta = spec.fixed["beta"]
                centers = renyi_centers(x0, min(np.pi, spec.keep.delta_scale * beta ** -0.5))
                r = min(np.pi, spec.keep.r_scale * beta ** -0.5)
                near = np.arccos(np.clip(x0 @ x0[centers].T, -1, 1)).min(axis=1) <= r
                np.testing.assert_allclose(point.consumed_renyi, near.mean())


class Interrupted(Exception):
    pass


def test_an_interrupted_sweep_resumes_and_opens_without_warnings(tmp_path):
    spec = tiny(ROOT / "examples" / "beta_n_grid.toml", batch=1)
    store = tmp_path / "store.zarr"

    def stop_after_three(done: int, total: int) -> None:
        if done >= 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        sweep(spec, out=store, scheduler="serial", progress=stop_after_three)
    status = sweep_status(store)
    assert status["done"] == 3 and status["pending"] == spec.n_runs - 3
    partial = open_quietly(store)  # consolidated from the start: no warning even now
    finished = {p: p.stat().st_ino for p in (store / "status" / "c").rglob("*") if p.is_file()}
    assert len(finished) == 3  # one status chunk per finished task (batch = 1)

    calls: list[int] = []
    sweep(spec, out=store, scheduler="serial", progress=lambda done, total: calls.append(done))
    assert calls[0] == 3 and calls[-1] == spec.n_runs  # the three finished runs were skipped
    assert all(p.stat().st_ino == ino for p, ino in finished.items())  # and not rewritten
    done = open_quietly(store)
    assert (done.status.values == 1).all()
    reference = sweep(spec, scheduler="serial")  # uninterrupted, in a temporary store
    xr.testing.assert_identical(done[list(reference.data_vars)], reference)
    first = partial.status.values == 1
    np.testing.assert_array_equal(partial.cluster_count.values[first],
                                  reference.cluster_count.values[first])


def test_the_readme_python_examples_run(tmp_path, monkeypatch):
    """Every ```python block of the README runs as written (in a scratch folder)."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)\n```", readme, re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
