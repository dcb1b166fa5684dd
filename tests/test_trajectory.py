"""Trajectory records, xarray conversion and bit-identical save/load."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_matrix

import attnflow as af
from attnflow.sphere import uniform


@pytest.fixture
def traj(rng):
    d = 3
    heads = [tuple(random_matrix(rng, d) for _ in range(3)), (None, None, None)]
    model = af.Attention(heads=heads, beta=3.0, mask=np.tril(np.ones((6, 6), bool)),
                         memory=(uniform(2, d, rng), np.array([1.0, 4.0])))
    return af.simulate(model, uniform((2, 3, 6), d, rng), 2.0, save_at=[0.5, 1.0, 2.0],
                       method="dopri5", seed=99)


def test_shapes_and_record(traj):
    assert traj.states.shape == (3, 2, 3, 6, 3)
    assert traj.batch_shape == (2, 3)
    assert traj.times.tolist() == [0.5, 1.0, 2.0]
    rec = traj.record()
    assert rec["seed"] == 99 and rec["version"] == af.__version__
    assert rec["integrator"]["method"] == "dopri5" and traj.n_evals > 0
    ds = traj.to_xarray()
    assert ds["states"].dims == ("time", "run", "token", "coord")
    assert ds.sizes["run"] == 6


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_save_load_round_trip_is_bit_identical(traj, tmp_path, suffix):
    path = traj.save(tmp_path / f"run{suffix}")
    back = af.load(path)
    assert np.array_equal(back.states, traj.states) and back.states.dtype == traj.states.dtype
    assert np.array_equal(back.times, traj.times)
    assert back.record() == traj.record()
    X = traj.final
    assert np.array_equal(back.model.field(X), traj.model.field(X))
    # Saving again over an existing store replaces it whole.
    traj.save(path)
    assert np.array_equal(af.load(path).states, traj.states)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"run{suffix}"]


def test_single_run_round_trip(tmp_path):
    traj = af.simulate(af.Attention(beta=2.0, mask="full"), uniform(4, 2, 1), 1.0)
    back = af.load(traj.save(tmp_path / "one.nc"))
    assert back.states.shape == (21, 4, 2)  # the default times on the step grid of dt = 0.05
    assert np.array_equal(back.states, traj.states)
