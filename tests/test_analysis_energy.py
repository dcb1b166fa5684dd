"""The interaction energy E_beta against a naive double sum, its stable logarithm, and its
monotonicity along full-attention trajectories (docs/science.md §6)."""

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.energy import energy, log_energy


def _tokens(shape, d, seed):
    return af.sphere.uniform(shape, d, seed=seed)


def _naive(X, beta, Q=None, K=None):
    n, d = X.shape
    Q = np.eye(d) if Q is None else Q
    K = np.eye(d) if K is None else K
    total = 0.0
    for i in range(n):
        for j in range(n):
            total += np.exp(beta * (Q @ X[i]) @ (K @ X[j]))
    return total / (2 * beta * n * n)


@pytest.mark.parametrize("beta", [0.1, 1.0, 7.5])
def test_energy_equals_the_naive_double_sum(beta):
    X = _tokens((3, 6), 4, seed=1)
    rng = np.random.default_rng(2)
    Q, K = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))  # rectangular heads
    got = energy(X, beta, Q, K)
    assert got.shape == (3,)
    want = [_naive(x, beta, Q, K) for x in X]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(energy(X[0], beta), _naive(X[0], beta), rtol=1e-12)


@pytest.mark.parametrize("beta", [500.0, 1000.0])
def test_log_energy_is_finite_where_energy_overflows(beta):
    X = _tokens(8, 3, seed=3)
    n = X.shape[0]
    log = log_energy(X, beta)
    assert np.isfinite(log)
    # Unit tokens: every score beta <x_i, x_j> is at most beta (the diagonal), so
    # E = e^beta sum_ij e^{beta (<x_i, x_j> - 1)} / (2 beta n^2) with terms in (0, 1].
    shifted = np.exp(beta * (X @ X.T - 1.0)).sum()
    np.testing.assert_allclose(log, beta + np.log(shifted) - np.log(2 * beta * n * n),
                               rtol=1e-14)
    # Q = 2 I doubles the scores: E at beta / 2 with Q = 2 I is 2 E at beta.
    np.testing.assert_allclose(log_energy(X, beta / 2, 2 * np.eye(3), np.eye(3)),
                               log + np.log(2.0), rtol=1e-14)
    with np.errstate(over="ignore"):
        naive_finite = np.isfinite(np.exp(beta * (X @ X.T)).sum())
    assert np.isfinite(energy(X, beta)) == naive_finite == (beta < 709)


def test_energy_rejects_beta_zero_and_bad_matrices():
    X = _tokens(4, 3, seed=0)
    with pytest.raises(ValueError, match="beta: expected a finite number > 0"):
        energy(X, 0.0)
    with pytest.raises(ValueError, match="Q: expected an"):
        energy(X, 1.0, Q=np.eye(4))
    with pytest.raises(ValueError, match="Q, K: expected one head size"):
        energy(X, 1.0, Q=np.ones((2, 3)), K=np.ones((3, 3)))


def test_top_level_exports():
    assert af.analysis.energy.energy is energy and af.analysis.energy.log_energy is log_energy


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_trajectory_energy_is_non_decreasing_under_full_attention(attention):
    x0 = _tokens((4, 12), 3, seed=5)
    traj = af.simulate(af.Attention(beta=3.0, mask="full", attention=attention), x0, 4.0,
                       save_at=np.linspace(0, 4, 41), method="rk4", dt=0.02)
    E = traj.energy()
    assert E.shape == (41, 4)
    np.testing.assert_allclose(E, energy(traj.states, 3.0), rtol=1e-14)
    np.testing.assert_allclose(traj.energy(beta=2.0, log=True),
                               log_energy(traj.states, 2.0), rtol=1e-14)
    # Non-decreasing up to rounding (the unnormalised run reaches the single point, E's
    # maximum e^beta / (2 beta), by t = 4), and rising by a clear amount.
    assert np.all(np.diff(E, axis=0) >= -1e-13 * E[1:])
    assert np.all(E[-1] > 1.5 * E[0])


def test_energy_decreases_along_some_causal_trajectory():
    # 64 random runs of 6 tokens on the circle: the causal mask is no gradient flow of E.
    x0 = _tokens((64, 6), 2, seed=1)
    traj = af.simulate(af.Attention(beta=1.0, mask="causal"), x0, 10.0,
                       save_at=np.linspace(0, 10, 101), method="rk4", dt=0.02)
    drop = np.diff(traj.energy(log=True), axis=0).min(axis=0)  # per run
    assert drop.min() < -1e-3  # far beyond the integration error (RK4, dt = 0.02)
    # ... while full attention from the same starts never decreases it.
    full = af.simulate(af.Attention(beta=1.0, mask="full"), x0, 10.0,
                       save_at=np.linspace(0, 10, 101), method="rk4", dt=0.02)
    assert np.diff(full.energy(log=True), axis=0).min() > -1e-12


def test_trajectory_energy_uses_directions_and_needs_one_head():
    x0 = _tokens(5, 3, seed=0)
    pre = af.simulate(af.Attention(beta=1.0, mask="full", norm="pre"), x0, 2.0,
                      method="euler", dt=0.1)
    assert pre.radii.max() > 1.5  # the states left the sphere; E reads their directions
    np.testing.assert_allclose(pre.energy(), energy(pre.directions, 1.0), rtol=1e-14)
    model = af.Attention(heads=[(None, None, None)] * 2, beta=1.0, mask="full")
    traj = af.simulate(model, x0, 0.1, method="euler", dt=0.05)
    with pytest.raises(ValueError, match=r"model: expected layers with one \(Q, K, V\) head each"):
        traj.energy()
