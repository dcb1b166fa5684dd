"""Clusters: single linkage at a geodesic tolerance, against known configurations and scipy."""

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.transform import Rotation

import attnflow as af
from attnflow.analysis.clusters import spanning_tree
from attnflow.sphere import geodesic_distance, normalize, uniform


def clumps(centers, per, radius, seed):
    """`per` points within `radius` (radians) of each center, clump after clump."""
    rng = np.random.default_rng(seed)
    out = []
    for c in centers:
        tangent = rng.standard_normal((per, len(c)))
        tangent -= np.outer(tangent @ c, c)
        tangent *= (rng.uniform(0, radius, per) / np.linalg.norm(tangent, axis=1))[:, None]
        out.append(af.sphere.exp_map(np.broadcast_to(c, tangent.shape), tangent))
    return np.concatenate(out)


def scipy_single_linkage(X, tol):
    """Independent truth: scipy's single linkage on the full geodesic distance matrix."""
    n = len(X)
    i, j = np.triu_indices(n, 1)
    Z = linkage(geodesic_distance(X[i], X[j]), method="single")
    return fcluster(Z, tol, criterion="distance")


def same_partition(a, b):
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_separated_clumps():
    centers = normalize(np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, -1, -1.0]]))
    X = clumps(centers, per=25, radius=0.02, seed=0)
    c = af.analysis.clusters.clusters(X, tol=0.1)
    assert c.count == 4
    np.testing.assert_array_equal(c.labels, np.repeat(np.arange(4), 25))
    np.testing.assert_array_equal(c.sizes, [25] * 4)
    assert np.all(geodesic_distance(c.centroids, centers) < 0.02)
    assert af.analysis.clusters.cluster_count(X, 0.1) == 4


def test_labels_numbered_by_first_token():
    centers = normalize(np.array([[1, 0, 0], [0, 1, 0.0]]))
    X = clumps(centers, per=5, radius=0.01, seed=1)[[7, 0, 8, 1, 2, 9, 3, 4, 5, 6]]
    c = af.analysis.clusters.clusters(X, tol=0.1)
    np.testing.assert_array_equal(c.labels, [0, 1, 0, 1, 1, 0, 1, 1, 0, 0])


def test_one_clump_and_single_token():
    X = clumps(normalize(np.array([[1.0, 2.0, 3.0]])), per=50, radius=0.05, seed=2)
    c = af.analysis.clusters.clusters(X, tol=0.1)
    assert c.count == 1 and c.sizes.tolist() == [50]
    one = af.analysis.clusters.clusters(X[:1], tol=0.1)
    assert one.count == 1 and one.labels.tolist() == [0]


@pytest.mark.parametrize("n", [12, 101])
def test_great_circle(n):
    """Evenly spaced points on a great circle: one cluster just above the spacing, n just
    below; the members' mean vanishes, so the centroid is undefined (NaN)."""
    angle = 2 * np.pi * np.arange(n) / n
    R = Rotation.random(random_state=3).as_matrix()
    X = np.stack([np.cos(angle), np.sin(angle), np.zeros(n)], axis=1) @ R.T
    spacing = 2 * np.pi / n
    above = af.analysis.clusters.clusters(X, spacing * 1.001)
    assert above.count == 1 and np.all(np.isnan(above.centroids))
    assert af.analysis.clusters.clusters(X, spacing * 0.999).count == n


@pytest.mark.parametrize("d,tol", [(2, 0.02), (3, 0.12), (5, 0.5)])
def test_matches_scipy_single_linkage(d, tol):
    for seed in range(4):
        X = uniform(150, d, seed=seed)
        truth = scipy_single_linkage(X, tol)
        c = af.analysis.clusters.clusters(X, tol)
        assert c.count == len(np.unique(truth))
        assert same_partition(c.labels, truth)


@pytest.mark.parametrize("d", [2, 3])  # the circle has its own O(n log n) tree
@pytest.mark.parametrize("n", [2, 3, 80])
def test_spanning_tree_is_minimal(d, n):
    """A tree rooted at token 0 whose total length equals that of scipy's minimum spanning
    tree on the full distance matrix."""
    from scipy.sparse.csgraph import minimum_spanning_tree

    for seed in range(5):
        X = uniform(n, d, seed=seed)
        D = af.sphere.pairwise_geodesic(X)
        np.fill_diagonal(D, 0)
        parent, length = spanning_tree(X)
        assert length[0] == 0 and parent[0] == 0
        np.testing.assert_allclose(length.sum(), minimum_spanning_tree(D).sum(), rtol=1e-12)
        np.testing.assert_allclose(length[1:], geodesic_distance(X[1:], X[parent[1:]]))
        k = np.arange(n)  # following parents, every token reaches the root in < n steps
        for _ in range(n):
            k = parent[k]
        assert np.all(k == 0)


def test_batched_count_matches_loop_and_rotation_invariance():
    X = uniform((3, 4, 60), 3, seed=6)
    counts = af.analysis.clusters.cluster_count(X, 0.3)
    assert counts.shape == (3, 4)
    loop = [[af.analysis.clusters.clusters(X[a, b], 0.3).count for b in range(4)] for a in range(3)]
    np.testing.assert_array_equal(counts, loop)
    R = Rotation.random(random_state=7).as_matrix()
    np.testing.assert_array_equal(af.analysis.clusters.cluster_count(X @ R.T, 0.3), counts)


def test_circle_counts_match_gap_formula():
    """On the circle the clusters at tol are the runs between gaps > tol of the sorted angles."""
    X = uniform((50, 40), 2, seed=8)
    phi = np.sort(np.arctan2(X[..., 1], X[..., 0]), axis=-1)
    gaps = np.diff(np.concatenate([phi, phi[:, :1] + 2 * np.pi], axis=1), axis=1)
    expected = np.maximum(1, np.count_nonzero(gaps > 0.1, axis=1))
    np.testing.assert_array_equal(af.analysis.clusters.cluster_count(X, 0.1), expected)


def test_cluster_counts_along_trajectory():
    model = af.Attention(beta=4.0)
    traj = af.simulate(model, uniform((2, 10), 2, seed=9), t_end=3.0, save_at=[0, 1, 2, 3])
    counts = af.analysis.clusters.cluster_count(traj, 0.05)
    assert counts.shape == (4, 2)
    # on the circle single linkage at tol cuts the sorted angles at the gaps wider than tol
    phi = np.sort(np.arctan2(traj.states[..., 1], traj.states[..., 0]), axis=-1)
    gaps = np.diff(np.concatenate([phi, phi[..., :1] + 2 * np.pi], axis=-1), axis=-1)
    np.testing.assert_array_equal(counts, np.maximum(1, np.count_nonzero(gaps > 0.05, axis=-1)))
    assert counts[0].min() > counts[-1].max()  # the tokens gathered


def test_bad_input():
    with pytest.raises(ValueError, match="tol: expected"):
        af.analysis.clusters.clusters(uniform(5, 3, seed=0), -0.1)
    with pytest.raises(ValueError, match="X: expected unit vectors"):
        af.analysis.clusters.clusters(2 * uniform(5, 3, seed=0), 0.1)
    with pytest.raises(ValueError, match="X: expected an array with 2 dimensions"):
        af.analysis.clusters.clusters(uniform((2, 5), 3, seed=0), 0.1)


def test_min_size_leaves_stragglers_out():
    # two tight clusters of 3 and a straggler far from both: 3 clusters, 2 of size >= 2
    a, b, c = np.eye(3)
    near = [a, af.sphere.normalize(a + 0.01 * b), af.sphere.normalize(a + 0.01 * c),
            b, af.sphere.normalize(b + 0.01 * a), af.sphere.normalize(b + 0.01 * c), c]
    X = np.array(near)
    assert af.analysis.clusters.cluster_count(X, 0.1) == 3
    assert af.analysis.clusters.cluster_count(X, 0.1, min_size=2) == 2
    assert af.analysis.clusters.cluster_count(X, 0.1, min_size=4) == 0


def test_min_size_matches_the_clusters_sizes_in_a_batch():
    X = np.stack([af.sphere.uniform(40, 3, seed=s) for s in range(4)]).reshape(2, 2, 40, 3)
    for m in (1, 2, 3):
        want = [[int(np.sum(af.analysis.clusters.clusters(x, 0.3).sizes >= m)) for x in row]
                for row in X]
        np.testing.assert_array_equal(af.analysis.clusters.cluster_count(X, 0.3, min_size=m), want)


@pytest.mark.parametrize("bad", [0, 1.5, True, "2"])
def test_min_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"min_size: expected an integer >= 1"):
        af.analysis.clusters.cluster_count(af.sphere.uniform(5, 3, seed=0), 0.1, min_size=bad)


def test_float32_tokens_are_held_to_float32s_tolerance():
    # unit vectors rounded to float32 are off 1 by ~4e-8, over float64's 1e-8: the points are
    # checked once, in the dtype they were computed in (a second check after the cast to
    # float64 refused them)
    X = uniform(300, 2, seed=0)
    X32 = (X / np.linalg.norm(X, axis=-1, keepdims=True)).astype(np.float32)
    off = np.abs(np.linalg.norm(X32.astype(float), axis=-1) - 1).max()
    assert off > 1e-8
    want = af.analysis.clusters.cluster_count(X32.astype(float) / np.linalg.norm(
        X32.astype(float), axis=-1, keepdims=True), 0.01)
    assert af.analysis.clusters.cluster_count(X32, 0.01) == want
    assert af.analysis.clusters.clusters(X32, 0.01).count == want
