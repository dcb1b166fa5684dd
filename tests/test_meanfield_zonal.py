"""Zonal mean field on S^{d-1}, d >= 4 (attnflow.meanfield.zonal), against independent truth:
the Funk-Hecke eigenvalues against one-dimensional quadrature (scipy's quad); the velocity
against direct quadrature over S^3 in hyperspherical coordinates; d = 3 against the S^2
solver (spherical harmonics, a second implementation); the growth rates of degree l against
the closed form of docs/science.md §11.2 (Gamma and I_nu from scipy), with noise, at the
threshold K_#; the causal labels (the first label follows the full mask, s^p grows at
gamma_l / (p + 1)); mass; refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import eval_gegenbauer, gamma, iv, roots_jacobi

import attnflow as af
from attnflow.meanfield import from_function, solve, zonal


def normalised_gegenbauer(l: int, d: int, t):
    """C_l^alpha(t) / C_l^alpha(1), alpha = (d - 2) / 2."""
    alpha = (d - 2) / 2
    return eval_gegenbauer(l, alpha, t) / eval_gegenbauer(l, alpha, 1.0)


def rate(l: int, d: int, beta: float, weighting: str, strength: float = 1.0,
         sigma: float = 0.0) -> float:
    """§11.2: degree l grows at l (l + d - 2) (K mu_l / beta - sigma^2 / 2), mu_l =
    Gamma(d/2) (2/beta)^{d/2-1} I_{l+d/2-1}(beta) (the Funk-Hecke eigenvalue for the uniform
    probability measure), mu_l / mu_0 for softmax."""
    mu = lambda k: gamma(d / 2) * (2 / beta) ** (d / 2 - 1) * iv(k + d / 2 - 1, beta)  # noqa: E731
    growth = strength * mu(l) / beta / (mu(0) if weighting == "softmax" else 1.0)
    return l * (l + d - 2) * (growth - sigma**2 / 2)


@pytest.mark.parametrize("d, b", [(4, 2.5), (5, -1.5), (7, 4.0)])
def test_funk_hecke_eigenvalues_against_quadrature(d, b):
    """lambda_l = |S^{d-2}| int e^{b t} P_l(t) (1 - t^2)^{(d-3)/2} dt."""
    lam = zonal.funk_hecke(b, d, 6) * b
    for l in range(7):
        direct = zonal.area(d - 1) * quad(
            lambda t, l=l: np.exp(b * t) * normalised_gegenbauer(l, d, t) * (1 - t * t) ** (
                (d - 3) / 2), -1, 1, epsabs=1e-14, epsrel=1e-13)[0]
        assert abs(lam[l] - direct) < 1e-11 * abs(lam[0]), (l, lam[l], direct)


@pytest.mark.parametrize("weighting", ["softmax", "unnormalised"])
def test_velocity_on_s3_against_direct_quadrature(weighting):
    """d = 4: the velocity h(z) (e - z x) against N = int e^{b <x, y>} y rho(y) dy (divided
    by Z for softmax, tangential part) over S^3 in hyperspherical coordinates y = (cos psi,
    sin psi cos theta, sin psi sin theta cos phi, sin psi sin theta sin phi): Gauss-Jacobi
    in cos psi (weight sin psi), Gauss-Legendre in cos theta, trapezoidal in phi."""
    d, b, L = 4, 1.7, 8
    a = from_function(lambda z: np.exp(0.8 * z + 0.4 * z * z), L, d=d, tol=1e-3)
    field = zonal.ZonalField(d, b, 1.3, weighting, 1, L)
    t, wt = roots_jacobi(24, 0.5, 0.5)
    c, wc = np.polynomial.legendre.leggauss(24)
    phi = 2 * np.pi * np.arange(24) / 24
    T, C, F = np.meshgrid(t, c, phi, indexing="ij")
    S, R = np.sqrt(1 - T * T), np.sqrt(1 - C * C)
    y = np.stack([T, S * C, S * R * np.cos(F), S * R * np.sin(F)], -1).reshape(-1, 4)
    w = (wt[:, None, None] * wc[None, :, None] * np.full(24, 2 * np.pi / 24)).ravel()
    rho = zonal.values(a[0], d, y[:, 0]) * w
    z = field.grid.z
    x = np.stack([z, np.sqrt(1 - z * z), 0 * z, 0 * z], axis=1)
    E = np.exp(b * x @ y.T) * rho
    N = 1.3 * E @ y
    v = N - np.sum(N * x, axis=1, keepdims=True) * x
    if weighting == "softmax":
        v /= E.sum(axis=1, keepdims=True)
    e = np.array([1.0, 0, 0, 0])
    direction = e - z[:, None] * x
    mine = field.velocity(a)[0][:, None] * direction
    assert np.abs(mine - v).max() < 1e-12 * np.abs(v).max()


def test_d3_zonal_field_agrees_with_the_s2_field():
    """d = 3 (Legendre coefficients a_l, spherical-harmonic c_l0 = a_l sqrt(4 pi / (2 l + 1))):
    the zonal transport term equals the S^2 solver's, a second implementation (Funk-Hecke in
    i_l, the attention vector by the addition theorem, weak form on its own grid), to 1e-14,
    for both weightings and beta of either sign."""
    from attnflow.meanfield.sphere import TransportField2

    L = 20
    l = np.arange(L + 1)
    a = from_function(lambda z: np.exp(1.2 * z - 0.5 * z**3), L, d=4, tol=1e-6)  # any
    a[0, 0] = 1 / (4 * np.pi)
    c = np.zeros((1, L + 1, L + 1), dtype=complex)
    c[0, :, 0] = a[0] * np.sqrt(4 * np.pi / (2 * l + 1))
    for weighting, b in (("softmax", 3.0), ("unnormalised", -1.5)):
        mine = zonal.ZonalField(3, b, 0.8, weighting, 1, L)(a)[0] * np.sqrt(
            4 * np.pi / (2 * l + 1))
        other = TransportField2(b, 0.8 * np.eye(3), weighting, 1, L, axisymmetric=True)(c)
        assert np.abs(mine - other[0, :, 0].real).max() < 1e-14 * max(1.0, np.abs(mine).max())


@pytest.mark.parametrize("d, weighting, l, sigma", [
    (4, "softmax", 1, 0.0), (4, "unnormalised", 2, 0.5), (5, "softmax", 3, 0.3),
    (7, "unnormalised", 1, 0.0), (10, "softmax", 2, 0.0)])
def test_growth_rate_of_degree_l_matches_funk_hecke(d, weighting, l, sigma):
    beta, K, eps, T = 2.5, 0.9, 1e-10, 1.0
    a = np.zeros((1, 8))
    a[0, 0] = 1 / zonal.area(d)
    a[0, l] = eps
    res = solve(af.Attention(beta=beta, mask="full", attention=weighting, strength=K), a, T,
                save_at=[T], d=d, noise=sigma or None, dt=0.005)
    measured = np.log(res.coefficients[-1, 0, l] / eps) / T
    expected = rate(l, d, beta, weighting, K, sigma)
    assert abs(measured - expected) < 1e-8 * abs(expected), (measured, expected)


def test_noise_threshold_k_sharp_in_d_5():
    """Unnormalised, sigma = 1: degree 1 neither grows nor decays at K_# = beta / (2 mu_1)."""
    d, beta = 5, 2.0
    mu1 = gamma(d / 2) * (2 / beta) ** (d / 2 - 1) * iv(d / 2, beta)
    a = np.zeros((1, 6))
    a[0, 0], a[0, 1] = 1 / zonal.area(d), 1e-6  # the cubic terms: 1e-12 relative
    res = solve(af.Attention(beta=beta, mask="full", attention="unnormalised",
                             strength=beta / (2 * mu1)), a, 2.0, save_at=[2.0], d=d, noise=1.0,
                dt=0.002)  # RK4's error on the two rates that cancel: 5e-11
    assert abs(res.coefficients[-1, 0, 1] / 1e-6 - 1) < 1e-9


def test_clustering_conserves_mass_stops_where_resolution_is_lost_and_saves(tmp_path):
    d = 6
    a = from_function(lambda z: np.exp(z), 24, d=d)
    res = solve(af.Attention(beta=6.0, mask="full"), a, 30.0, d=d)
    assert res.resolution_lost_at is not None
    assert np.abs(res.coefficients[:, 0, 0] * zonal.area(d) - 1).max() < 1e-14
    dens = res.density(64)
    assert dens.shape[1:] == (1, 64) and dens[-1, 0, 0] > 3 * dens[0, 0, 0]  # gathered at e
    back = af.meanfield.load(res.save(tmp_path / "z.nc"))
    assert back.d == d and np.array_equal(back.coefficients, res.coefficients)


def test_causal_labels_in_d_5():
    """Softmax, causal: the first label follows the full-mask solution of f(0, .) exactly, and
    the profile eps(s) = s^2 of degree 2 grows at gamma_2 / 3 at every label."""
    d, L, beta, T = 5, 16, 2.0, 0.5
    rho0 = from_function(lambda s, z: np.exp((0.5 + s) * z), L, labels=16, scheme="chebyshev",
                         d=d, tol=1e-6)
    model = af.Attention(beta=beta, mask="causal")
    causal = solve(model, rho0, T, save_at=[T], scheme="chebyshev", d=d, tol=1e-6)
    full = solve(af.Attention(beta=beta, mask="full"), rho0[:1], T, save_at=[T], d=d, tol=1e-6)
    assert causal.resolution_lost_at is None
    assert np.abs(causal.coefficients[-1, 0] - full.coefficients[-1, 0]).max() < 1e-15
    s = af.meanfield.labels.label_nodes("chebyshev", 8)
    a = np.zeros((8, L + 1))
    a[:, 0] = 1 / zonal.area(d)
    a[:, 2] = 1e-10 * s**2
    lin = solve(model, a, T, save_at=[T], scheme="chebyshev", d=d, dt=0.01)
    exact = 1e-10 * s**2 * np.exp(rate(2, d, beta, "softmax") / 3 * T)
    assert np.abs(lin.coefficients[-1, :, 2] - exact).max() < 1e-8 * exact.max()


def test_refusals():
    a = np.zeros(6)
    a[0] = 1 / zonal.area(4)
    with pytest.raises(ValueError, match="V"):
        solve(af.Attention(beta=1.0, V=np.diag([1.0, 2, 1, 1])), a, 1.0, d=4)
    with pytest.raises(ValueError, match="beta"):
        solve(af.Attention(beta=0.0), a, 1.0, d=4)
    with pytest.raises(ValueError, match="mass"):
        solve(af.Attention(beta=1.0), 2 * a, 1.0, d=4)
    with pytest.raises(ValueError, match="rho0"):
        solve(af.Attention(beta=1.0), a, 1.0, d=3)
    with pytest.raises(ValueError, match="d"):
        solve(af.Attention(beta=1.0, Q=np.eye(5)), a, 1.0, d=4)


def test_picture_of_a_zonal_result():
    """plot_meanfield of a zonal result: one panel, the density against time and polar angle
    (checked against scipy's Gegenbauer polynomials)."""
    pytest.importorskip("matplotlib")
    from attnflow.plot import plot_meanfield

    d = 5
    a = from_function(lambda z: np.exp(0.7 * z), 12, d=d)
    res = solve(af.Attention(beta=2.0, mask="full"), a, 0.2, save_at=[0.1, 0.2], d=d)
    fig = plot_meanfield(res, points=32)
    assert len(fig.axes) == 2  # the panel and its colour bar
    shown = np.asarray(fig.axes[0].collections[0].get_array()).reshape(16, 3)
    z = np.cos((np.arange(16) + 0.5) * np.pi / 16)
    direct = np.array([sum(ct[l].real * normalised_gegenbauer(l, d, z) for l in range(13))
                       for ct in res.coefficients[:, 0]])
    assert np.abs(shown - direct.T).max() < 1e-13 * direct.max()
