"""analysis.harmonic_moments against independent truth: scipy's sph_harm_y in real form and
eval_gegenbauer, orthonormality by quadrature (tests/sphere_reference.py, Gauss-Jacobi),
fourier_moments on the circle, the addition theorem's pair sums written here, rotations,
iid uniform tokens, and torch gradients against central differences of the numpy path."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import eval_chebyt, eval_gegenbauer, eval_legendre, roots_jacobi, sph_harm_y
from sphere_reference import quadrature

import attnflow as af
from attnflow.analysis.harmonics import harmonic_basis, harmonic_dimension
from attnflow.analysis.moments import fourier_moments, harmonic_moments


def unit(shape, d, seed):
    x = np.random.default_rng(seed).normal(size=(*shape, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def rotation(d, seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q * np.sign(np.diag(r))  # Haar: rotations and reflections alike


def test_s2_harmonics_are_scipys_in_real_form_and_orthonormal():
    y, w = quadrature(24)  # exact for degree < 47: products of degrees <= 10
    w = w / w.sum()  # the uniform probability measure
    columns, degree, order = harmonic_basis(y, 10)
    Y = np.stack(columns, -1)
    assert list(degree[:8]) == [1, 1, 1, 2, 2, 2, 2, 2] and list(order[:3]) == [-1, 0, 1]
    np.testing.assert_allclose((Y * w[:, None]).T @ Y, np.eye(len(degree)), atol=1e-13)
    theta, phi = np.arccos(y[:, 2]), np.arctan2(y[:, 1], y[:, 0])
    for i, (l, m) in enumerate(zip(degree, order)):
        ref = sph_harm_y(l, abs(m), theta, phi)  # Condon-Shortley phase (-1)^m
        real = (np.sqrt(4 * np.pi) * ref.real if m == 0 else
                np.sqrt(8 * np.pi) * (-1.0) ** m * (ref.real if m > 0 else ref.imag))
        np.testing.assert_allclose(Y[:, i], real, atol=1e-13)


def test_circle_is_fourier_moments_times_root_two():
    x = unit((3, 40), 2, 1)
    mine, ref = harmonic_moments(x, 5), fourier_moments(x, 5)
    assert list(mine.order[:4]) == [-1, 1, -2, 2]
    np.testing.assert_allclose(mine.mean[..., 0::2], np.sqrt(2) * ref.mean.imag, atol=1e-14)
    np.testing.assert_allclose(mine.mean[..., 1::2], np.sqrt(2) * ref.mean.real, atol=1e-14)
    np.testing.assert_allclose(mine.se[..., 0::2], np.sqrt(2) * ref.se_imag, atol=1e-14)
    np.testing.assert_allclose(mine.se[..., 1::2], np.sqrt(2) * ref.se_real, atol=1e-14)
    np.testing.assert_allclose(mine.power, 2 * np.abs(ref.mean) ** 2, atol=1e-14)
    theta = 2 * np.pi * np.arange(64) / 64  # trapezoid: exact for orders < 64
    Y = np.stack(harmonic_basis(np.stack([np.cos(theta), np.sin(theta)], -1), 8)[0], -1)
    np.testing.assert_allclose(Y.T @ Y / 64, np.eye(16), atol=1e-13)


@pytest.mark.parametrize("d", [4, 6, 9])
def test_zonal_harmonics_are_normalised_gegenbauer_polynomials(d):
    alpha, L = (d - 2) / 2, 9
    z, w = roots_jacobi(20, (d - 3) / 2, (d - 3) / 2)  # the weight (1 - z^2)^{(d-3)/2}
    w = w / w.sum()
    axis = unit((), d, 3)
    # points at those heights about the axis: z e + sqrt(1 - z^2) u, u a unit vector _|_ e
    u = unit((), d, 4)
    u = u - (u @ axis) * axis
    u /= np.linalg.norm(u)
    x = z[:, None] * axis + np.sqrt(1 - z * z)[:, None] * u
    columns, degree, order = harmonic_basis(x, L, axis)
    Y = np.stack(columns, -1)
    assert np.all(order == 0) and list(degree) == list(range(1, L + 1))
    np.testing.assert_allclose((Y * w[:, None]).T @ Y, np.eye(L), atol=1e-12)
    for l in range(1, L + 1):
        ref = eval_gegenbauer(l, alpha, z) / eval_gegenbauer(l, alpha, 1.0)
        np.testing.assert_allclose(Y[:, l - 1], np.sqrt(harmonic_dimension(l, d)) * ref,
                                   atol=1e-12)
    assert [harmonic_dimension(l, 3) for l in (1, 2, 3)] == [3, 5, 7]
    assert harmonic_dimension(2, 4) == 9 and harmonic_dimension(3, 2) == 2


def pair_power(x, L):
    """The addition theorem's dim_l / n^2 sum_ij P_l(<x_i, x_j>), P_l by scipy: cos(l
    dtheta) on the circle (dim 2), Legendre on S^2 (dim 2 l + 1), normalised Gegenbauer."""
    d, n = x.shape[-1], x.shape[-2]
    g = np.clip(x @ np.swapaxes(x, -1, -2), -1, 1)
    out = []
    for l in range(1, L + 1):
        if d == 2:
            p, dim = eval_chebyt(l, g), 2
        elif d == 3:
            p, dim = eval_legendre(l, g), 2 * l + 1
        else:
            a = (d - 2) / 2
            p = eval_gegenbauer(l, a, g) / eval_gegenbauer(l, a, 1.0)
            dim = harmonic_dimension(l, d)
        out.append(dim * p.sum(axis=(-2, -1)) / n**2)
    return np.stack(out, -1)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_power_per_degree_is_the_pair_sum_and_rotation_invariant(d):
    x = unit((2, 3, 30), d, 5)  # leading axes batched
    got = harmonic_moments(x, 6)
    assert got.mean.shape[:2] == (2, 3) and got.power.shape == (2, 3, 6)
    np.testing.assert_allclose(got.power, pair_power(x, 6), rtol=1e-11, atol=1e-14)
    R = rotation(d, 6)
    np.testing.assert_allclose(harmonic_moments(x @ R.T, 6).power, got.power, rtol=1e-11,
                               atol=1e-14)
    if d > 3:  # one unit vector of the degree-l space: its moment squared is below the power
        assert np.all(got.mean**2 <= got.power * (1 + 1e-12))
        same = np.broadcast_to(got.axis, (4, d))  # all tokens at the axis: equality
        np.testing.assert_allclose(harmonic_moments(same, 4).power,
                                   harmonic_moments(same, 4).mean ** 2, rtol=1e-12)
    else:  # the moments rotate among the orders of a degree, not out of it
        moved = harmonic_moments(x @ R.T, 6).mean
        assert not np.allclose(moved, got.mean)


@pytest.mark.parametrize("d", [2, 3, 4])
def test_iid_uniform_tokens_have_unit_variance_per_moment(d):
    runs, n, L = 400, 60, 3
    got = harmonic_moments(af.sphere.uniform((runs, n), d, seed=9), L)
    # E[M^2] = 1 / n per moment (Var Y = 1 under the uniform measure): n M^2 has mean 1
    # and sd sqrt(2) (a chi-square of one degree), so 5 sd of the mean over the runs
    z = n * got.mean**2
    assert np.all(np.abs(z.mean(axis=0) - 1) < 5 * np.sqrt(2 / runs))
    np.testing.assert_allclose((got.se**2 * n).mean(axis=0), 1, atol=0.05)
    dims = np.array([harmonic_dimension(l, d) for l in range(1, L + 1)])
    assert np.all(np.abs((n * got.power / dims).mean(axis=0) - 1) < 5 * np.sqrt(2 / runs))


def test_a_trajectory_counts_as_its_directions_and_refusals():
    traj = af.simulate(af.Attention(beta=2.0), af.sphere.uniform(10, 3, seed=1), 1.0,
                       save_at=[0.0, 1.0])
    np.testing.assert_array_equal(harmonic_moments(traj, 2).mean,
                                  harmonic_moments(traj.directions, 2).mean)
    x = unit((5,), 3, 1)
    assert np.all(harmonic_moments(x[:1], 2).se == 0)  # n = 1
    for kwargs, match in (({"degree": 0}, "degree: expected"),
                          ({"degree": True}, "degree: expected"),
                          ({"degree": 2, "axis": [0, 0, 1]}, "axis: expected None"),
                          ({"x": 2 * x, "degree": 2}, "x: expected unit vectors"),
                          ({"x": unit((5,), 4, 1), "degree": 2, "axis": [1, 1, 0, 0]},
                           "axis: expected a unit vector")):
        with pytest.raises(ValueError, match=match):
            harmonic_moments(**{"x": x, **kwargs})


@pytest.mark.parametrize("d", [2, 3, 5])
def test_gradients_on_tensors_against_central_differences(d):
    torch = pytest.importorskip("torch")
    x = unit((2, 12), d, 11)
    v = np.random.default_rng(12).normal(size=x.shape)
    L = 4
    weights = np.random.default_rng(13).normal(size=3 * L * L)

    def score(m):  # a scalar of the means, standard errors and powers
        k = m.mean.shape[-1]
        w = weights[:k]
        return ((m.mean * w).sum() + (m.se * w).sum() + (m.power * weights[:L]).sum())

    def along(eps):
        y = x + eps * v
        return y / np.linalg.norm(y, axis=-1, keepdims=True)

    h = 1e-6
    numeric = (score(harmonic_moments(along(h), L)) - score(harmonic_moments(along(-h), L))
               ) / (2 * h)
    eps = torch.zeros((), dtype=torch.float64, requires_grad=True)
    y = torch.as_tensor(x) + eps * torch.as_tensor(v)
    y = y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)
    tensors = harmonic_moments(y, L)
    wt = torch.as_tensor(weights)
    k = tensors.mean.shape[-1]
    value = ((tensors.mean * wt[:k]).sum() + (tensors.se * wt[:k]).sum()
             + (tensors.power * wt[:L]).sum())
    value.backward()
    np.testing.assert_allclose(float(value.detach()), score(harmonic_moments(x, L)), rtol=1e-12)
    assert float(eps.grad) == pytest.approx(numeric, rel=1e-6, abs=1e-8)
