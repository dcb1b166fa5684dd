"""The atlas: predicted rows from V's spectrum, and the classifier of final configurations."""

import numpy as np
import pytest
from scipy.linalg import expm
from scipy.spatial.transform import Rotation

import attnflow as af
from attnflow.analysis import atlas
from attnflow.analysis.atlas import ROWS, distance_to_subspace
from attnflow.sphere import geodesic_distance, normalize, uniform

R = Rotation.random(random_state=0).as_matrix()
S = np.array([[1.0, 0.4, -0.3], [0.2, 1.0, 0.5], [0.1, -0.6, 1.0]])  # a non-orthogonal basis


def conjugate(D, basis):
    return basis @ np.diag(D) @ np.linalg.inv(basis)


ROW_SPECTRA = {
    "first-token": [2.0, 2.0, 2.0],
    "point-in-L": [2.0, 2.0, 1.0],
    "two-points": [3.0, 1.0, 0.5],
    "cloud-L": [-1.0, -1.0, -2.0],
    "two-clouds": [-1.0, -2.0, -3.0],
}


@pytest.mark.parametrize("basis", [R, S], ids=["symmetric", "non-normal"])
@pytest.mark.parametrize("row", list(ROW_SPECTRA))
def test_predict_every_row(row, basis):
    D = np.array(ROW_SPECTRA[row])
    V = conjugate(D, basis)
    p = atlas.predict_configuration(V)
    assert p.row == row and p.label.startswith(ROWS[row])
    assert p.lambda_max == pytest.approx(D[0], abs=1e-10)
    top = D == D[0]
    assert p.dim_L == p.multiplicity == top.sum()
    # L spans the top eigenvectors: V acts on it as lambda_max.
    np.testing.assert_allclose(V @ p.L, D[0] * p.L, atol=1e-9)
    if p.dim_L == 1:
        assert geodesic_distance(p.xi, normalize(basis[:, 0])) == pytest.approx(0, abs=1e-8) or \
            geodesic_distance(p.xi, -normalize(basis[:, 0])) == pytest.approx(0, abs=1e-8)


@pytest.mark.parametrize("basis", [R, S], ids=["symmetric", "non-normal"])
def test_predicted_point_is_the_limit_of_the_first_token(basis):
    """Token 1 solves dx/dt = P_x(V x), so x_1(t) = e^{tV} x_1(0) / |e^{tV} x_1(0)|: its limit
    (by scipy's expm at t = 40) is the predicted point, which for non-normal V is the
    spectral, not the orthogonal, projection."""
    V = conjugate(np.array([2.0, 2.0, 1.0]), basis)
    x1 = uniform(1, 3, seed=1)[0]
    p = atlas.predict_configuration(V, x1_0=x1)
    limit = normalize(expm(40 * V) @ x1)
    assert geodesic_distance(p.point, limit) < 1e-12
    orthogonal = normalize(p.L @ (p.L.T @ x1))
    if basis is S:
        assert geodesic_distance(orthogonal, limit) > 1e-2
    # V = lambda I: the point is x_1(0) itself.
    assert np.allclose(atlas.predict_configuration(2 * np.eye(3), x1_0=x1).point, x1)


@pytest.mark.parametrize("V, reason", [
    (np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]), "complex"),
    (conjugate(np.array([1.0, 0.5, 0.5]), S), None),
    (S @ np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.3]]) @ np.linalg.inv(S),
     "Jordan"),
    (np.diag([0.0, -1.0, -2.0]), "lambda_max = 0"),
])
def test_not_covered(V, reason):
    p = atlas.predict_configuration(V)
    if reason is None:
        assert p.row == "two-points"  # a control: a covered matrix stays covered
        return
    assert p.row == "not-covered" and reason in p.label
    assert p.label.startswith("not covered by the atlas")


def test_complex_top_pair_beside_real_eigenvalue():
    """Eigenvalues 1 and 1 +- 2i share the largest real part: not covered."""
    block = np.array([[1.0, -2.0], [2.0, 1.0]])
    V = np.zeros((3, 3))
    V[:2, :2] = block
    V[2, 2] = 1.0
    assert atlas.predict_configuration(R @ V @ R.T).row == "not-covered"


def tokens_near(points, spread, per, seed):
    rng = np.random.default_rng(seed)
    out = []
    for p in points:
        noise = spread * rng.standard_normal((per, len(p)))
        out.append(normalize(p + noise - np.outer(noise @ p, p)))
    return np.concatenate(out)


def test_classify_every_row():
    e1, e2, e3 = np.eye(3)
    x1 = normalize(np.array([0.3, 0.5, 0.8]))
    rng = np.random.default_rng(2)
    Vs = {row: np.diag(D) for row, D in ROW_SPECTRA.items()}
    # first-token: everything at x1(0).
    o = atlas.classify_configuration(tokens_near([x1], 1e-4, 20, 0), V=Vs["first-token"], x1_0=x1)
    assert o.row == "first-token" and o.max_dist_x1 < 1e-3
    # point-in-L: one point in span(e1, e2), not at x1(0).
    target = normalize(np.array([0.3, 0.5, 0.0]))
    o = atlas.classify_configuration(np.tile(target, (20, 1)), V=Vs["point-in-L"], x1_0=x1)
    assert o.row == "point-in-L" and o.max_dist_L < 1e-12 and o.max_dist_x1 > 0.5
    # two-points: +-e1 for V with simple top eigenvalue along e1.
    X = np.concatenate([np.tile(e1, (12, 1)), np.tile(-e1, (8, 1))])[rng.permutation(20)]
    o = atlas.classify_configuration(X, V=Vs["two-points"])
    assert o.row == "two-points" and o.antipodal_gap < 1e-12 and o.sides == (12, 8)
    assert abs(abs(o.xi @ e1) - 1) < 1e-12
    # cloud-L: spread around the great circle of span(e1, e2).
    angle = rng.uniform(0, 2 * np.pi, 40)
    X = normalize(np.stack([np.cos(angle), np.sin(angle), rng.uniform(-0.3, 0.3, 40)], 1))
    o = atlas.classify_configuration(X, V=Vs["cloud-L"])
    assert o.row == "cloud-L" and 0.1 < o.max_dist_L <= 0.3
    # two-clouds: spread around +-e1.
    X = tokens_near([e1, -e1], 0.25, 20, 3)
    o = atlas.classify_configuration(X, V=Vs["two-clouds"])
    assert o.row == "two-clouds" and o.sides == (20, 20)
    # k-clusters: three clumps, no V needed.
    X = tokens_near([e1, e2, e3], 1e-3, 10, 4)
    o = atlas.classify_configuration(X)
    assert o.row == "k-clusters" and o.label == "3 clusters" and o.sizes.tolist() == [10] * 3
    # other: uniform tokens.
    o = atlas.classify_configuration(uniform(40, 3, seed=5))
    assert o.row == "other" and o.n_clusters > 20


def test_classifier_needs_V_for_L_rows_and_checks_the_axis():
    e1, e2 = np.eye(3)[:2]
    one_point = np.tile(normalize(np.array([0.3, 0.5, 0.0])), (10, 1))
    assert atlas.classify_configuration(one_point).row == "k-clusters"  # 1 cluster, no L known
    pair = np.concatenate([np.tile(e2, (5, 1)), np.tile(-e2, (5, 1))])
    assert atlas.classify_configuration(pair).row == "two-points"  # antipodal, no V to check
    o = atlas.classify_configuration(pair, V=np.diag([3.0, 1.0, 0.5]))  # xi = e1, not e2
    assert o.row == "k-clusters" and o.max_dist_L == pytest.approx(np.pi / 2)
    # Uniform tokens are not a cloud around the e1-e2 great circle.
    o = atlas.classify_configuration(uniform(40, 3, seed=6), V=np.diag([-1.0, -1.0, -2.0]))
    assert o.row == "other" and o.max_dist_L > np.pi / 3
    # Clusters inside L are clusters, not a cloud.
    X = tokens_near([e1, e2, -e1], 1e-3, 8, 7)
    assert atlas.classify_configuration(X, V=np.diag([2.0, 2.0, 1.0])).row == "k-clusters"


def test_distance_to_subspace():
    X = normalize(np.array([[1.0, 0, 0], [1, 1, 0], [1, 0, 1], [0, 0, 1]]))
    L = np.array([[1.0, 0], [0, 1], [0, 0]])
    np.testing.assert_allclose(distance_to_subspace(X, L), [0, 0, np.pi / 4, np.pi / 2],
                               atol=1e-15)
    np.testing.assert_allclose(distance_to_subspace(X @ R.T, R @ L),
                               distance_to_subspace(X, L), atol=1e-14)


@pytest.mark.parametrize("row", list(ROW_SPECTRA))
def test_simulated_final_state_matches_prediction_small(row):
    """The conjecture at a small size that settles fast (n = 8, 4 runs, t = 50, beta as below,
    symmetric V): every run ends in the predicted configuration; in the two-points row all 8
    tokens may follow one of +-xi (a run classified "point-in-L" there still sits on the
    predicted line)."""
    D = np.array(ROW_SPECTRA[row])
    V = conjugate(D, R)
    x0 = uniform((4, 8), 3, seed=7)
    traj = af.simulate(af.Attention(V=V, beta=1.0 if D[0] > 0 else 9.0), x0, t_end=50.0,
                       save_at=[50.0], method="dopri5")
    allowed = {row, "point-in-L"} if row == "two-points" else {row}
    xi = R[:, 0]  # the top eigenvector of the two-points row
    for r in range(len(x0)):
        seen = atlas.classify_configuration(traj.final[r], V=V, x1_0=x0[r, 0])
        assert seen.row in allowed and atlas.predict_configuration(V, x1_0=x0[r, 0]).row == row
        if row == "two-points":
            to_line = np.minimum(geodesic_distance(traj.final[r], xi),
                                 geodesic_distance(traj.final[r], -xi))
            assert to_line.max() < 1e-2
        if row == "first-token":  # V = 2 I: Theorem 4.1, the first token's start
            assert geodesic_distance(traj.final[r], x0[r, 0]).max() < 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("row", list(ROW_SPECTRA))
def test_simulated_final_state_matches_prediction(row):
    """The conjecture on a small instance, n = 32, d = 3, t = 1000, in the regime where it shows
    in finite time: beta = 1 for the attracting rows (at beta = 9, seed 7 with V = 2 I still
    has 2 clusters at t = 5000: meta-stability) and beta = 9 for the repelling rows (at
    beta = 1 their tokens do not concentrate around L)."""
    D = np.array(ROW_SPECTRA[row])
    V = conjugate(D, R)
    x0 = uniform(32, 3, seed=7)
    beta = 1.0 if D[0] > 0 else 9.0
    traj = af.simulate(af.Attention(V=V, beta=beta), x0, t_end=1000.0, save_at=[1000.0],
                       method="dopri5")
    observed = atlas.classify_configuration(traj.final, V=V, x1_0=x0[0])
    assert observed.row == atlas.predict_configuration(V, x1_0=x0[0]).row


def test_bad_input():
    with pytest.raises(ValueError, match="V: expected a square matrix"):
        atlas.predict_configuration(np.ones((2, 3)))
    with pytest.raises(ValueError, match="x1_0: expected a unit vector of length 3"):
        atlas.predict_configuration(np.eye(3), x1_0=[1.0, 0.0])
    with pytest.raises(ValueError, match="V: expected a \\(3, 3\\) matrix"):
        atlas.classify_configuration(uniform(5, 3, seed=0), V=np.eye(2))
    with pytest.raises(ValueError, match="tol: expected"):
        atlas.classify_configuration(uniform(5, 3, seed=0), tol=-1)
