"""Honest defaults at large n (issue 42): a run of 10^5 tokens with the default save times
takes the steps it records, and the record names the kernel that ran."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.kernels import harmonic

N = 100_000


@pytest.fixture(scope="module")
def counted(request):
    """A default run of N tokens (causal, beta = 64: auto picks the harmonic kernel), with
    the harmonic kernel's calls counted (one per field evaluation: one head)."""
    calls = []
    original = harmonic.attend
    mp = pytest.MonkeyPatch()
    mp.setattr(harmonic, "attend", lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        traj = af.simulate(af.Attention(beta=64.0, mask="causal"),
                           af.sphere.uniform(N, 2, seed=0), t_end=0.2)
    finally:
        mp.undo()
    return traj, len(calls)


def test_the_recorded_step_is_the_step_taken(counted):
    traj, calls = counted
    steps = round(0.2 / traj.integrator["dt"])  # 4 steps of the default dt = 0.05
    assert traj.integrator["dt"] == 0.05 and calls == 4 * steps  # RK4: 4 evaluations a step
    assert traj.integrator["n_steps"] == steps and traj.n_evals == calls
    assert traj.integrator["dt_min"] == pytest.approx(0.05, rel=1e-12)
    np.testing.assert_allclose(traj.times, 0.05 * np.arange(steps + 1), atol=1e-15)


def test_the_record_names_the_kernel_that_ran(counted):
    traj, _ = counted
    K = harmonic.order(64.0, 2, harmonic.DEFAULT_TOL)
    assert traj.integrator["kernel"].startswith(f"harmonic (tol 1e-12, order {K})")
    assert f"order {K}" in repr(traj)


def test_given_times_shorten_the_steps_and_the_record_says_so():
    traj = af.simulate(af.Attention(beta=1.0), af.sphere.uniform(5, 2, seed=0), 0.23,
                       save_at=[0.1])
    # [0, 0.1] in 2 steps of 0.05, [0.1, 0.23] in 3 of 0.13 / 3
    assert traj.integrator["n_steps"] == 5
    assert traj.integrator["dt_min"] == pytest.approx(0.13 / 3)
