"""Sweeps of saved models (a Stack of mixed layers with several heads, per-layer .npz weights)
against direct `simulate` calls, the tolerances of the adaptive and implicit methods, and a
two-worker sweep of a Stack killed and resumed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import attnflow as af
from attnflow.family.text import layers_from_npz
from attnflow.sphere import uniform
from attnflow.sweeps import load_spec, parse_spec, sweep, sweep_status

pytestmark = pytest.mark.timeout(180)


def mixed_stack(beta0: float = 2.0) -> af.Stack:
    """Three layers on the sphere, d = 4: two post-LN heads; nGPT with RoPE and a full mask;
    post-LN with ALiBi and unnormalised weights. Each layer has its own beta."""
    rng = np.random.default_rng(20)
    heads = [(rng.normal(size=(2, 4)), rng.normal(size=(2, 4)), rng.normal(size=(4, 4)) / 4)
             for _ in range(2)]
    return af.Stack([
        af.Attention(heads=heads, beta=beta0),
        af.Attention(beta=9.0, norm="ngpt", alpha=0.3, rope=af.RoPE(100.0), mask="full"),
        af.Attention(V=-0.5 * np.eye(4), beta=1.0, alibi=0.5, attention="unnormalised"),
    ])


def save_model(model: af.Stack, path: Path) -> Path:
    af.simulate(model, uniform(3, 4, seed=0), len(model)).save(path)
    return path


def x0_of(seed: int, n: int, d: int, entropy: int = 0) -> np.ndarray:
    """A run's initial tokens, by the documented seed stream (entropy, (seed, 0))."""
    stream = np.random.SeedSequence(entropy, spawn_key=(seed, 0))
    return uniform(n, d, np.random.default_rng(stream))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A folder with stack.nc (a saved `mixed_stack`) and w.npz (two layers, two heads)."""
    tmp = tmp_path_factory.mktemp("models")
    save_model(mixed_stack(), tmp / "stack.nc")
    rng = np.random.default_rng(3)
    np.savez(tmp / "w.npz", Q=rng.normal(size=(2, 2, 2, 4)), K=rng.normal(size=(2, 2, 2, 4)),
             V=rng.normal(size=(2, 2, 4, 4)) / 4)
    return tmp


# ---------------------------------------------------------------------------- saved models
def test_a_saved_stack_runs_as_direct_simulation(files):
    """Each run of a Stack read from a Trajectory file moves as `simulate` moves it, and the
    metrics use the radii of the layer acting at each save time (its own beta)."""
    spec = parse_spec({"grid": {"model": "stack.nc", "n": 6, "t_end": 3.0, "dt": 0.1,
                                "save_at": 7, "seeds": 3}, "keep": {"states": True}},
                      base=files)
    assert spec.fixed["d"] == 4  # the model's
    ds = sweep(spec, scheduler="serial")
    assert (ds.status.values == 1).all() and "beta" not in ds.coords
    stack, times = mixed_stack(), ds.time.values
    for s in range(3):
        x0 = x0_of(s, 6, 4)
        direct = af.simulate(stack, x0, 3.0, save_at=times, dt=0.1).states
        np.testing.assert_allclose(ds.states.sel(seed=s).values, direct, rtol=0, atol=1e-12)
        for i, t in enumerate(times):
            X = ds.states.sel(seed=s).values[i]
            dist = np.arccos(np.clip(X @ X.T, -1, 1))
            delta = min(np.pi, 4 * stack.layer_at(t).beta ** -0.5)
            strong = sum(np.all(dist[k, :k] > delta) for k in range(6))
            assert ds.strong_renyi_count.sel(seed=s).values[i] == strong
            assert ds.max_distance_to_first.sel(seed=s).values[i] == pytest.approx(
                np.arccos(np.clip(X @ x0[0], -1, 1)).max(), abs=1e-7)


def test_npz_weights_take_the_grid_options(files):
    """An .npz of per-layer weights is a Stack whose layers get the grid's beta and norm."""
    ds = sweep(parse_spec({"grid": {"model": "w.npz", "beta": [0.5, 3.0], "n": 5,
                                    "norm": "pre", "t_end": 2.0, "dt": 0.1, "save_at": 3,
                                    "seeds": 2}, "keep": {"states": True}}, base=files),
               scheduler="serial")
    assert (ds.status.values == 1).all()
    for beta in (0.5, 3.0):
        model = layers_from_npz(files / "w.npz", beta=beta, norm="pre")
        for s in range(2):
            direct = af.simulate(model, x0_of(s, 5, 4), 2.0, save_at=ds.time.values, dt=0.1)
            np.testing.assert_allclose(ds.states.sel(beta=beta, seed=s).values, direct.states,
                                       rtol=0, atol=1e-12)
    a, b = (ds.states.sel(beta=beta).values for beta in (0.5, 3.0))
    assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-3  # beta reached the layers


@pytest.mark.parametrize("grid, field", [
    ({"model": "stack.nc", "beta": 1.0}, "grid.beta"),  # the file holds it
    ({"model": "stack.nc", "rope": "100"}, "grid.rope"),
    ({"model": "w.npz", "beta": 1.0, "V": "identity"}, "grid.V"),
    ({"model": "stack.nc", "d": 3}, "grid.d"),  # the stack's d is 4
    ({"model": "stack.nc", "t_end": 3.5}, "grid.t_end"),  # 3 layers
    ({"model": ["stack.nc", "w.npz"], "beta": 1.0}, "grid.model"),  # two kinds
    ({"model": "missing.nc"}, "grid.model"),
    ({"model": "w.txt"}, "grid.model"),
    ({"model": "w.npz"}, "grid.beta"),  # .npz weights need the options
])
def test_bad_model_fields_name_the_field(files, grid, field):
    spec = {"grid": {"n": 4, "t_end": 1.0, "seeds": 1, **grid}}
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}: expected "):
        parse_spec(spec, base=files)


def test_resume_refuses_a_changed_model_file(tmp_path):
    path = save_model(mixed_stack(), tmp_path / "stack.nc")
    grid = {"model": str(path), "n": 4, "t_end": 1.0, "seeds": 2}
    out = tmp_path / "s.zarr"
    sweep(grid, {"metrics": ["cluster_count"]}, out=out, scheduler="serial")
    sweep(grid, {"metrics": ["cluster_count"]}, out=out, scheduler="serial")  # same: resumes
    save_model(mixed_stack(beta0=3.0), path)
    with pytest.raises(ValueError, match=r"^out: .*the model in .*stack.nc differs"):
        sweep(grid, {"metrics": ["cluster_count"]}, out=out, scheduler="serial")


# ---------------------------------------------------------------------------- tolerances
@pytest.mark.parametrize("method", ["bdf", "radau", "lsoda", "dopri5"])
def test_tolerances_reach_the_adaptive_and_implicit_methods(method):
    """Each rtol of the grid gives the runs `simulate` gives with that rtol and atol (for the
    task's batch of runs), and the two tolerances give different runs (none was dropped)."""
    rtols, atol = (1e-2, 1e-10), 1e-12
    ds = sweep({"beta": 4.0, "n": 5, "d": 3, "method": method, "rtol": list(rtols),
                "atol": atol, "t_end": 3.0, "save_at": 4, "seeds": 2},
               {"states": True, "metrics": ["max_distance_to_first"]}, scheduler="serial")
    assert (ds.status.values == 1).all()
    x0 = np.stack([x0_of(s, 5, 3) for s in range(2)])  # one task: dopri5 shares its steps
    for rtol in rtols:
        direct = af.simulate(af.Attention(beta=4.0), x0, 3.0, save_at=ds.time.values,
                             method=method, rtol=rtol, atol=atol)
        assert direct.integrator["rtol"] == rtol and direct.integrator["atol"] == atol
        np.testing.assert_allclose(ds.states.sel(rtol=rtol).values,
                                   np.moveaxis(direct.states, 1, 0), rtol=0, atol=1e-13)
    loose, tight = (ds.states.sel(rtol=r).values[:, -1] for r in rtols)
    assert np.abs(loose - tight).max() > 1e-6


# ---------------------------------------------------------------------------- processes
STACK_SPEC = """\
batch = 2
[grid]
model = "stack.nc"
n = 16
t_end = 3
dt = 0.05
save_at = 7
seeds = 32
[keep]
metrics = ["cluster_count", "consumed_strong"]
states = true
"""


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from attnflow.cli import app; app()",
                             "sweep", *args, "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_stack_on_two_workers_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    """The driver and its two-worker LocalCluster are killed mid-sweep; rerunning computes
    only the missing tasks, and the store equals the sweep run in this process."""
    save_model(mixed_stack(), tmp_path / "stack.nc")
    spec = tmp_path / "spec.toml"
    spec.write_text(STACK_SPEC)
    reference = sweep(load_spec(spec), scheduler="serial")
    out = tmp_path / "s.zarr"
    first = _cli(str(spec), "--workers", "2", "--out", str(out))
    deadline = time.monotonic() + 120
    while not (out.exists() and sweep_status(out)["done"] >= 4):
        assert time.monotonic() < deadline and first.poll() is None, "the sweep did not start"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and its cluster
    first.communicate(timeout=30)
    status = sweep_status(out)
    assert 0 < status["done"] < 32 and status["failed"] == 0
    written = [p for p in (out / "status" / "c").rglob("*") if p.is_file()]
    # a write the kill cut short leaves zarr's temporary "<chunk>.<uuid>.partial" file
    chunks = {p: p.stat().st_ino for p in written if p.suffix != ".partial"}
    assert len(chunks) == status["done"] // 2  # one status chunk per finished task

    second = _cli(str(spec), "--workers", "2", "--out", str(out))
    stdout, stderr = second.communicate(timeout=120)
    assert second.returncode == 0, stderr
    assert f"32 ({status['done']} finished before, {status['pending']} computed now)" in stdout
    assert all(p.stat().st_ino == ino for p, ino in chunks.items())  # not rewritten
    assert not list(out.rglob("*.partial"))  # cut-short writes removed on resuming
    with xr.open_zarr(out, consolidated=False) as ds:
        got = ds.load()
    assert (got.status.values == 1).all()
    xr.testing.assert_identical(got[list(reference.data_vars)], reference)
