"""The implicit solvers on the sphere: the stabilised extension of the field and its Jacobian,
and long runs where the plain extension left the sphere (a V of negative spectrum)."""

import numpy as np
import pytest
from scipy.stats import ortho_group

import attnflow as af
from attnflow.implicit import RADIAL_RATE, sphere_extension
from attnflow.sphere import uniform


def negative_model(beta=1.0, seed=0):
    """The atlas's cloud-L row: V symmetric with eigenvalues -0.5, -0.5, -1."""
    B = ortho_group.rvs(3, random_state=np.random.default_rng(seed))
    return af.Attention(V=B @ np.diag([-0.5, -0.5, -1.0]) @ B.T, beta=beta)


def central_differences(f, x, eps=1e-6):
    n, d = x.shape
    J = np.zeros((n, d, n, d))
    for k in range(n):
        for b in range(d):
            step = np.zeros_like(x)
            step[k, b] = eps
            J[:, :, k, b] = (f(x + step) - f(x - step)) / (2 * eps)
    return J


def test_extension_jacobian_matches_central_differences_off_the_sphere():
    model = negative_model()
    x = uniform(6, 3, 2) * np.linspace(0.8, 1.3, 6)[:, None]  # radii off 1
    g, dg = sphere_extension(model.tangent_field, model.jacobian)
    np.testing.assert_allclose(dg(x), central_differences(g, x), atol=1e-8)


def test_extension_equals_the_field_on_the_sphere_and_pulls_the_radius_to_one():
    model = negative_model()
    y = uniform(6, 3, 4)
    g, _ = sphere_extension(model.tangent_field, model.jacobian)
    np.testing.assert_allclose(g(y), model.tangent_field(y), atol=1e-14)
    r = 1.2
    radial = np.sum(g(r * y) * y, axis=-1)  # d|x|/dt at radius r
    np.testing.assert_allclose(radial, -RADIAL_RATE * (r - 1.0), atol=1e-14)


@pytest.mark.parametrize("method", ["bdf", "lsoda", "radau"])
def test_implicit_runs_with_negative_spectrum_match_a_tight_explicit_run(method):
    """The plain extension leaves the sphere near t = 20 here (bdf: step size underflow at
    t = 25, lsoda: a non-finite state at t = 31); the reference is dopri5 at rtol 1e-11,
    retracted after every step."""
    model = negative_model()
    x0 = uniform((2, 8), 3, 1)
    save = np.array([10.0, 30.0, 60.0])
    ref = af.simulate(model, x0, 60.0, save_at=save, method="dopri5", rtol=1e-11, atol=1e-13)
    got = af.simulate(model, x0, 60.0, save_at=save, method=method, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got.states, ref.states, atol=1e-5)


@pytest.mark.parametrize("row", ["first-token", "point-in-L", "two-points", "cloud-L",
                                 "two-clouds", "complex-top"])
def test_jacobian_matches_central_differences_on_the_atlas_value_matrices(row):
    """The atlas's V (a non-orthogonal eigenbasis, random Q, K) at beta = 9: the exact
    Jacobian of the field is right where the implicit solvers used to fail."""
    from attnflow.experiments import atlas

    rng = np.random.default_rng(3)
    B = atlas._bases(["general"], [row], 4.0, rng)[row, "general"]
    Q, K = rng.standard_normal((2, 3, 3)) / np.sqrt(3)
    model = af.Attention(Q, K, atlas._value_matrix(row, B), beta=9.0)
    x = uniform(10, 3, 5)
    np.testing.assert_allclose(model.jacobian(x), central_differences(model.tangent_field, x),
                               atol=1e-7)
