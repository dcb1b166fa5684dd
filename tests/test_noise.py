"""Noisy dynamics (docs/science.md §6): Euler-Maruyama on the sphere and in R^d, checked
against the noisy Kuramoto model's closed forms, its strong order on refined Brownian paths,
and the invariances of its counter-based noise."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.closedforms import kuramoto_order
from attnflow.brownian import RUN_BLOCK, BrownianPath
from attnflow.sphere import uniform

N_KURAMOTO, RUNS_KURAMOTO = 100, 32


def order_parameter(kappa: float) -> tuple[float, float]:
    """Time-averaged R = |mean_j e^{i phi_j}| over t in [10, 30] at beta = 0 on the circle
    (full attention, noise sqrt(2 / kappa)): mean over runs and its standard error."""
    X0 = uniform((RUNS_KURAMOTO, N_KURAMOTO), 2, seed=1)
    traj = af.simulate(af.Attention(beta=0.0, mask="full"), X0, 30.0,
                       save_at=np.arange(0, 30.01, 0.5), method="euler", dt=0.05,
                       noise=np.sqrt(2 / kappa), seed=2)
    R = np.abs((traj.states[..., 0] + 1j * traj.states[..., 1]).mean(-1))  # (T, runs)
    per_run = R[traj.times >= 10].mean(0)
    return float(per_run.mean()), float(per_run.std(ddof=1) / np.sqrt(len(per_run)))


@pytest.mark.parametrize("kappa", [3.0, 4.0])
def test_kuramoto_order_parameter_is_the_root_of_the_self_consistency_equation(kappa):
    R, se = order_parameter(kappa)
    assert abs(R - kuramoto_order(kappa)) < 3 * se  # within its Monte Carlo error


def test_below_the_threshold_the_order_parameter_is_a_finite_n_fluctuation():
    """kappa < 2: the uniform state is stable; the order parameter Z = mean e^{i phi} is then a
    complex Gaussian fluctuation with E|Z|^2 = 1 / (n (1 - kappa / 2)) (linear response), so
    E|Z| = sqrt(pi / (4 n (1 - kappa / 2))) = 0.177 at n = 100, kappa = 1.5."""
    kappa = 1.5
    R, se = order_parameter(kappa)
    expected = np.sqrt(np.pi / (4 * N_KURAMOTO * (1 - kappa / 2)))
    assert abs(R - expected) < 3 * se
    assert R * np.sqrt(N_KURAMOTO) < 3  # order n^{-1/2}


@pytest.mark.parametrize("method, d", [("euler", 2), ("euler", 3), ("geodesic", 3)])
def test_strong_order_one_half_on_refined_brownian_paths(method, d):
    """Noise P_x dW is not commutative (its tangent directions turn with x), so the strong
    order of Euler-Maruyama is 1/2: criterion |fitted slope - 0.5| < 0.15."""
    model = af.Attention(beta=1.0)
    X0 = uniform((16, 6), d, seed=1)
    dt0, T = 0.1, 1.0

    def final(level):
        return af.simulate(model, X0, T, save_at=[T], method=method, dt=dt0 / 2**level,
                           noise=0.5, seed=3, brownian_dt=dt0).final

    ref = final(7)
    levels = np.arange(4)
    errors = [np.mean(np.linalg.norm(final(L) - ref, axis=-1)) for L in levels]
    slope = np.polyfit(np.log(dt0 / 2.0**levels), np.log(errors), 1)[0]
    assert abs(slope - 0.5) < 0.15


def test_brownian_path_refines_by_bridges():
    path = BrownianPath(5, 3, (4, 2), 0.2)
    for k in range(3):
        coarse = path.coarse_increments(k, 0)[0].copy()
        fine = path.coarse_increments(k, 3)
        np.testing.assert_allclose(fine.sum(0), coarse, atol=1e-15)
        half = path.coarse_increments(k, 2)
        np.testing.assert_allclose(fine.reshape(4, 2, 3, 4, 2).sum(1), half, atol=1e-15)
    samples = np.stack([path.coarse_increments(k, 2) for k in range(3, 800)])
    assert samples.var() == pytest.approx(0.2 / 4, rel=0.03)
    lag = np.mean(samples[:, 0] * samples[:, 1]) / samples.var()
    assert abs(lag) < 0.03  # independent halves


def test_sigma_zero_is_the_deterministic_euler_step_bit_for_bit():
    X0 = uniform((3, 7), 3, seed=4)
    model = af.Attention(beta=2.0)
    a = af.simulate(model, X0, 2.0, save_at=[2.0], method="euler", dt=0.1)
    b = af.simulate(model, X0, 2.0, save_at=[2.0], method="euler", dt=0.1, noise=0.0, seed=1)
    assert np.array_equal(a.states, b.states)


def test_noise_of_a_run_does_not_depend_on_the_batch_or_the_threads(monkeypatch):
    model = af.Attention(beta=2.0)
    X0 = uniform((RUN_BLOCK + 8, 5), 2, seed=5)
    whole = af.simulate(model, X0, 1.0, method="euler", dt=0.1, noise=0.3, seed=7).states
    first = af.simulate(model, X0[:3], 1.0, method="euler", dt=0.1, noise=0.3, seed=7).states
    np.testing.assert_array_equal(first, whole[:, :3])
    monkeypatch.setenv("ATTNFLOW_THREADS", "1")
    one = af.simulate(model, X0, 1.0, method="euler", dt=0.1, noise=0.3, seed=7).states
    np.testing.assert_array_equal(one, whole)
    other = af.simulate(model, X0, 1.0, method="euler", dt=0.1, noise=0.3, seed=8).states
    assert not np.array_equal(other, whole)


def test_noise_in_r_d_for_pre_ln_has_the_brownian_variance():
    """At beta = 0 with V = 0 pre-LN has no drift: X(T) - X(0) = sigma W(T), variance
    sigma^2 T per coordinate."""
    X0 = uniform((64, 20), 3, seed=6)
    traj = af.simulate(af.Attention(V=np.zeros((3, 3)), beta=0.0, norm="pre"), X0, 2.0,
                       method="euler", dt=0.1, noise=0.5, seed=9)
    step = traj.final - X0
    assert step.var() == pytest.approx(0.25 * 2.0, rel=0.05)
    assert abs(step.mean()) < 4 * np.sqrt(0.5 / step.size)


def test_noise_stays_on_the_sphere_and_saves_on_its_grid():
    traj = af.simulate(af.Attention(beta=1.0), uniform(5, 3, seed=1), 1.0, method="geodesic",
                       dt=0.03, noise=0.4, seed=0)
    np.testing.assert_allclose(np.linalg.norm(traj.states, axis=-1), 1.0, atol=1e-12)
    assert np.allclose(traj.times / 0.03, np.round(traj.times / 0.03))
    assert traj.integrator["noise"] == 0.4


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(noise=-0.1, seed=0), r"noise: expected sigma >= 0"),
    (dict(noise=0.1, method="euler"), r"seed: expected an int with noise"),
    (dict(noise=0.1, seed=0, method="rk4"), r"method: expected one of \('euler', 'geodesic'\)"),
    (dict(noise=0.1, seed=0, method="euler", dt=0.1, brownian_dt=0.3),
     r"brownian_dt: expected dt times a power of 2"),
    (dict(noise=0.1, seed=0, method="euler", dt=0.1, save_at=[0.25, 1.0]),
     r"save_at: expected times on the step grid"),
    (dict(noise=0.1, seed=-1, method="euler"), r"seed: expected a non-negative int"),
    (dict(noise=float("nan"), seed=0, method="euler"), r"noise: expected sigma >= 0"),
])
def test_bad_noise_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        af.simulate(af.Attention(), uniform(3, 2, seed=0), 1.0, **kwargs)
