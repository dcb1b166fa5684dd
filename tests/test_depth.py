"""The diagnostics battery (attnflow.analysis.depth) on inputs whose answers are known in closed
form, and the same numbers from a Trajectory and from the equivalent trace arrays."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.depth import (
    angular_distance,
    attention_to_first,
    cluster_count_at,
    cosine_to_first,
    effective_rank,
    massive_activation,
    mean_pairwise_cosine,
    norm_spread,
    renyi_center_count,
    sink_rate,
    strong_renyi_center_count,
)
from attnflow.analysis.metrics import battery


def orthonormal(n: int, d: int, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, n)))
    return q.T  # (n, d), orthonormal rows


def test_identical_tokens():
    x = np.array([3.0, -1.0, 2.0, 0.5])
    X = np.tile(x, (6, 1)) * np.arange(1, 7)[:, None]  # one direction, different norms
    assert np.isclose(mean_pairwise_cosine(X), 1.0, atol=1e-14)
    np.testing.assert_allclose(cosine_to_first(X), 1.0, atol=1e-14)
    assert cosine_to_first(X).shape == (5,)
    assert np.isclose(effective_rank(X), 1.0, atol=1e-6)
    assert cluster_count_at(X, 1e-3) == 1
    assert renyi_center_count(X, 0.1) == 1 and strong_renyi_center_count(X, 0.1) == 1
    # norms 1..6 times |x|: std / mean of 1..6
    assert np.isclose(norm_spread(X), np.std(np.arange(1, 7)) / 3.5)


def test_orthonormal_tokens():
    X = orthonormal(5, 9)
    assert np.isclose(mean_pairwise_cosine(X), 0.0, atol=1e-14)
    np.testing.assert_allclose(cosine_to_first(X), 0.0, atol=1e-14)
    assert np.isclose(effective_rank(X), 5.0, rtol=1e-12)
    # geodesic distance pi/2 between every pair
    assert cluster_count_at(X, 1.5) == 5 and cluster_count_at(X, 1.6) == 1
    assert renyi_center_count(X, 1.5) == 5 and strong_renyi_center_count(X, 1.6) == 1
    assert np.isclose(norm_spread(X), 0.0, atol=1e-14)


def test_pairwise_cosine_of_an_equiangular_configuration():
    """n unit vectors summing to zero (a regular simplex): every pair has cosine -1/(n-1)."""
    n = 5
    X = np.eye(n) - 1.0 / n
    assert np.isclose(mean_pairwise_cosine(X), -1 / (n - 1), atol=1e-14)
    # the simplex spans n - 1 dimensions with equal singular values
    assert np.isclose(effective_rank(X), n - 1, rtol=1e-12)


def test_leading_axes_are_independent_configurations():
    a, b = np.tile([1.0, 0.0, 0.0], (4, 1)), orthonormal(4, 4)[:, :4]
    X = np.stack([np.pad(a, ((0, 0), (0, 1))), b])  # (2, 4, 4)
    np.testing.assert_allclose(mean_pairwise_cosine(X), [1.0, 0.0], atol=1e-14)
    np.testing.assert_allclose(effective_rank(X), [1.0, 4.0], rtol=1e-6)
    np.testing.assert_array_equal(cluster_count_at(X, 0.1), [1, 4])
    np.testing.assert_array_equal(renyi_center_count(X, 0.1), [1, 4])


def test_attention_sink():
    H, n = 3, 7
    one_hot = np.zeros((2, H, n, n))
    one_hot[..., 0] = 1.0
    np.testing.assert_array_equal(attention_to_first(one_hot), np.ones((2, H)))
    np.testing.assert_array_equal(sink_rate(one_hot), [1.0, 1.0])
    # uniform causal attention: query i (1-based) gives 1/i to token 1
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    mean = np.mean(1.0 / np.arange(1, n + 1))
    np.testing.assert_allclose(attention_to_first(uniform[None]), [mean], rtol=1e-14)
    mixed = np.stack([one_hot[0, 0], uniform, np.eye(n)])  # sink, mean 0.37 > 0.3, 1/7
    assert np.isclose(sink_rate(mixed), 2 / 3) and np.isclose(sink_rate(mixed, eps=0.5), 1 / 3)
    with pytest.raises(ValueError, match="eps"):
        sink_rate(mixed, eps=1.5)
    with pytest.raises(ValueError, match="A"):
        attention_to_first(np.ones((2, 3, 4)))


def test_angular_distance_of_known_rotations():
    X = orthonormal(3, 3)
    c, s = np.cos(0.3), np.sin(0.3)
    R = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    e = np.eye(3)
    states = np.stack([e, e @ R.T, -e])  # each token turned by 0.3 rad, then to its antipode
    # tokens 1, 2 turn by 0.3, token 3 (the axis) stays: mean 0.2 rad; then pi - ...
    want0 = (0.3 + 0.3 + 0.0) / 3 / np.pi
    turned = e @ R.T
    want1 = np.mean(np.arccos(np.einsum("kd,kd->k", turned, -e))) / np.pi
    np.testing.assert_allclose(angular_distance(states), [want0, want1], rtol=1e-12)
    assert np.isclose(angular_distance(np.stack([X, 2 * X]))[0], 0.0, atol=1e-8)
    with pytest.raises(ValueError, match="T >= 2"):
        angular_distance(X[None])


def test_massive_activations():
    X = np.ones((4, 5))
    assert massive_activation(X) == 1.0
    X[2, 3] = -1000.0  # one massive activation
    assert massive_activation(X) == 1000.0
    assert massive_activation(np.zeros((2, 3))) == 1.0


def test_bad_tokens():
    with pytest.raises(ValueError, match="nonzero norm"):
        mean_pairwise_cosine(np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="n >= 2"):
        mean_pairwise_cosine(np.ones((1, 3)))
    with pytest.raises(ValueError, match="X"):
        effective_rank(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="tol"):
        cluster_count_at(orthonormal(3, 3), -1.0)


def test_battery_is_the_same_on_a_trajectory_and_on_its_arrays():
    """The battery of a simulated run, from its Trajectory states and from the same arrays
    written as a trace would hold them (float64 copies): identical numbers."""
    rng = np.random.default_rng(3)
    d, n = 4, 12
    model = af.Attention(Q=np.eye(d), K=np.eye(d), V=np.eye(d), beta=2.0)
    x0 = rng.normal(size=(n, d))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    traj = af.simulate(model, x0, 6.0, save_at=np.arange(7.0))
    attention = np.stack([[model.attention_matrix(x)] for x in traj.states[:-1]])
    a = battery(traj.states, attention, tol=0.05, delta=0.3)
    b = battery(np.array(traj.states, copy=True), np.array(attention, copy=True), tol=0.05,
                delta=0.3)
    assert a.keys() == b.keys() and len(a["mean_pairwise_cosine"]) == 7
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert a["angular_distance"].shape == (6,) and a["sink_rate"].shape == (6,)
    # the paper's dynamics concentrates (beta = 2, V = I): pairwise cosine rises
    assert a["mean_pairwise_cosine"][-1] > a["mean_pairwise_cosine"][0]
    with pytest.raises(ValueError, match="attention"):
        battery(traj.states, attention[:, :, :3, :3], tol=0.05, delta=0.3)
