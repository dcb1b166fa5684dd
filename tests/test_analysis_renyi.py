"""Rényi centers, strong Rényi centers and consumed fractions (docs/science.md §4)."""

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

import attnflow as af
from attnflow.analysis import closedforms, renyi
from attnflow.sphere import geodesic_distance, uniform


def naive_centers(X, delta, dist):
    """Straight from the definition: token i is a center when dist(x_i, c) > delta for every
    earlier center c."""
    centers = []
    for i in range(len(X)):
        if all(dist(i, c) > delta for c in centers):
            centers.append(i)
    return centers


def naive_strong(X, delta, dist):
    return [i for i in range(len(X)) if all(dist(i, j) > delta for j in range(i))]


def geodesic(X):
    return lambda i, j: geodesic_distance(X[i], X[j])


def query_key_angle(X, Q, K):
    def dist(i, j):
        q, k = Q @ X[i], K @ X[j]
        return np.arccos(np.clip(q @ k / np.linalg.norm(q) / np.linalg.norm(k), -1, 1))
    return dist


@pytest.mark.parametrize("d,delta", [(2, 0.3), (3, 0.5), (6, 1.2)])
def test_match_the_definitions(d, delta):
    for seed in range(3):
        X = uniform(120, d, seed=seed)
        np.testing.assert_array_equal(renyi.renyi_centers(X, delta),
                                      naive_centers(X, delta, geodesic(X)))
        np.testing.assert_array_equal(renyi.strong_renyi_centers(X, delta),
                                      naive_strong(X, delta, geodesic(X)))


def test_query_key_distance_matches_definition():
    rng = np.random.default_rng(1)
    X = uniform(80, 3, seed=1)
    Q, K = np.eye(3) + 0.4 * rng.standard_normal((2, 3, 3))
    dist = query_key_angle(X, Q, K)
    np.testing.assert_array_equal(renyi.renyi_centers(X, 0.6, Q, K), naive_centers(X, 0.6, dist))
    np.testing.assert_array_equal(renyi.strong_renyi_centers(X, 0.6, Q, K),
                                  naive_strong(X, 0.6, dist))
    # Scaling Q (absorbing beta) changes nothing.
    np.testing.assert_array_equal(renyi.renyi_centers(X, 0.6, 7 * Q, K),
                                  renyi.renyi_centers(X, 0.6, Q, K))


def test_orthogonal_query_key_is_geodesic():
    X = uniform(100, 3, seed=2)
    R = Rotation.random(random_state=2).as_matrix()
    np.testing.assert_array_equal(renyi.renyi_centers(X, 0.4, R, R), renyi.renyi_centers(X, 0.4))
    np.testing.assert_array_equal(renyi.strong_renyi_centers(X, 0.4, R, R),
                                  renyi.strong_renyi_centers(X, 0.4))


@pytest.mark.parametrize("d", [2, 3, 5])
def test_strong_subset_of_centers_and_rotation_invariant(d):
    for seed in range(5):
        X = uniform(300, d, seed=seed)
        R = Rotation.random(random_state=seed).as_matrix() if d == 3 else \
            np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))[0]
        centers, strong = renyi.renyi_centers(X, 0.4), renyi.strong_renyi_centers(X, 0.4)
        assert centers[0] == strong[0] == 0
        assert set(strong) <= set(centers)
        np.testing.assert_array_equal(renyi.renyi_centers(X @ R.T, 0.4), centers)
        np.testing.assert_array_equal(renyi.strong_renyi_centers(X @ R.T, 0.4), strong)


def test_blocks_of_the_strong_scan_agree():
    """n above the block size (1024): the scan across blocks equals the definition, checked
    through the nearest earlier token."""
    X = uniform(2500, 3, seed=3)
    D = af.sphere.pairwise_geodesic(X)
    nearest_earlier = np.where(np.tri(2500, k=-1, dtype=bool), D, np.inf).min(axis=1)
    np.testing.assert_array_equal(renyi.strong_renyi_centers(X, 0.05),
                                  np.flatnonzero(nearest_earlier > 0.05))


@pytest.mark.parametrize("d", [2, 3])
def test_monte_carlo_strong_centers_exact_finite_n(d):
    """5000 sequences of n = 200 uniform tokens, delta = 0.5: mean count within 3 standard
    errors of the exact E_n (Lemma C.1). The paper's printed S^2 formula
    (3 sin^2(delta/2))^{-1} is far off: the 3 is a typo (docs/science.md §2)."""
    rng = np.random.default_rng(100 + d)
    counts = np.array([len(renyi.strong_renyi_centers(uniform(200, d, seed=rng), 0.5))
                       for _ in range(5000)])
    mean, se = counts.mean(), counts.std(ddof=1) / np.sqrt(len(counts))
    exact = closedforms.expected_strong_centers(200, 0.5, d)
    assert abs(mean - exact) < 3 * se
    if d == 3:
        printed = 1 / (3 * np.sin(0.25) ** 2)
        assert abs(mean - printed) > 100 * se
        assert abs(exact - 1 / np.sin(0.25) ** 2) < 1e-4  # n = 200 is already n = inf here


def test_monte_carlo_renyi_parking_on_the_circle():
    """Ordinary centers of many tokens on the circle (n = 10^5, delta = 0.05, 40 runs):
    count * delta / (2 pi) within 0.01 of Rényi's constant 0.74760, and the mean count within
    3 standard errors of the exact jamming count 1 + M(2 pi / delta - 1)."""
    rng = np.random.default_rng(7)
    delta = 0.05
    counts = np.array([len(renyi.renyi_centers(uniform(10**5, 2, seed=rng), delta))
                       for _ in range(40)])
    mean, se = counts.mean(), counts.std(ddof=1) / np.sqrt(len(counts))
    assert abs(mean * delta / (2 * np.pi) - 0.74760) < 0.01
    assert abs(mean - closedforms.expected_renyi_centers_circle(delta)) < 3 * se


def test_consumed_fraction_by_hand():
    # Circle; center tokens 0 and 1, r = 0.1. Token angles per time:
    angles = np.array([[0.0, 2.0, 0.05, 2.2, 3.0],     # tokens 0, 2 near c0: 3/5 consumed
                       [0.0, 2.0, 0.05, 2.05, 3.0]])   # token 3 joins c1: 4/5
    states = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    np.testing.assert_allclose(renyi.consumed_fraction(states, [0, 1], r=0.1), [0.6, 0.8])
    np.testing.assert_allclose(renyi.consumed_fraction(states, [4], r=0.0), [0.2, 0.2])
    np.testing.assert_allclose(renyi.consumed_fraction(states, [0], r=np.pi), [1.0, 1.0])


def test_consumed_fraction_of_a_trajectory_defaults_to_inverse_sqrt_beta():
    x0 = uniform(30, 2, seed=4)
    traj = af.simulate(af.Attention(beta=25.0), x0, t_end=2.0, save_at=[0, 1, 2])
    centers = renyi.strong_renyi_centers(x0, 4 / 5)
    np.testing.assert_array_equal(renyi.consumed_fraction(traj, centers),
                                  renyi.consumed_fraction(traj.states, centers, r=0.2))
    with pytest.raises(ValueError, match="r: expected"):
        renyi.consumed_fraction(traj.states, centers)


def test_bad_input():
    X = uniform(10, 3, seed=0)
    with pytest.raises(ValueError, match="delta: expected"):
        renyi.renyi_centers(X, 4.0)
    with pytest.raises(ValueError, match="K: expected a matrix mapping every token"):
        renyi.strong_renyi_centers(X, 0.3, K=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="Q: expected a \\(3, 3\\) matrix"):
        renyi.renyi_centers(X, 0.3, Q=np.eye(2))
    with pytest.raises(ValueError, match="centers: expected"):
        renyi.consumed_fraction(X[None], [10], r=0.1)
    with pytest.raises(ValueError, match="centers: expected"):
        renyi.consumed_fraction(X[None], [0.5], r=0.1)
