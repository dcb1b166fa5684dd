"""analysis.dispersion_rate against independent truth: the closed forms it replaced (the
circle's dispersion_rate and kinetic.growth_rate, tricritical's mode_growth_rate), written
here with scipy.special.iv and spherical_in; the beta -> 0 limit; the measured linear rates
of the three mean-field solvers (circle, S^2, zonal S^{d-1}) to 1e-6 relative; particles
from iid uniform tokens on S^2 (docs/science.md §9, "The dispersion relation on S^{d-1}")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import gamma, iv, sph_harm_y, spherical_in

import attnflow as af
from attnflow.analysis.closedforms import dispersion_rate
from attnflow.meanfield import solve, zonal
from attnflow.meanfield.sphere import MASS0


def circle_rate(k, beta, sigma=0.0, attention="softmax"):
    """The circle's former dispersion_rate: k^2 I_k(beta) / beta (/ I_0 for softmax)
    - sigma^2 k^2 / 2."""
    k = np.asarray(k, dtype=float)
    rate = k * k * iv(k, beta) / beta
    return (rate / iv(0, beta) if attention == "softmax" else rate) - sigma**2 * k * k / 2


def sphere_rate(l, d, beta, attention, strength=1.0, sigma=0.0):
    """tricritical's former mode_growth_rate (unnormalised) and its softmax form:
    l (l + d - 2) (K lambda_l / beta [/ lambda_0] - sigma^2 / 2), lambda_l the Funk-Hecke
    eigenvalue Gamma(d/2) (2 / beta)^{d/2 - 1} I_{l + d/2 - 1}(beta), beta > 0."""
    l = np.asarray(l, dtype=float)
    lam = gamma(d / 2) * (2 / beta) ** (d / 2 - 1) * iv(l + d / 2 - 1, beta)
    lam0 = gamma(d / 2) * (2 / beta) ** (d / 2 - 1) * iv(d / 2 - 1, beta)
    ratio = lam / beta / (lam0 if attention == "softmax" else 1.0)
    return l * (l + d - 2) * (strength * ratio - sigma**2 / 2)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_the_circle_is_the_former_dispersion_rate(attention):
    k = np.arange(1, 25)
    for beta in (-7.0, -0.3, 0.5, 9.0, 64.0):
        for sigma in (0.0, 0.4):
            np.testing.assert_allclose(dispersion_rate(k, beta, sigma=sigma,
                                                       attention=attention),
                                       circle_rate(k, beta, sigma, attention), rtol=1e-12,
                                       atol=1e-14)
    # kinetic.growth_rate(beta, k) was the softmax rate without noise
    np.testing.assert_allclose(dispersion_rate(k, 3.0), k**2 * iv(k, 3.0) / (3 * iv(0, 3.0)),
                               rtol=1e-12)


@pytest.mark.parametrize("d", [2, 3, 4, 5, 10])
@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_every_sphere_against_the_funk_hecke_closed_form(d, attention):
    l = np.arange(1, 12)
    for beta in (0.1, 1.5, 4.0, 40.0):
        for K, sigma in ((1.0, 0.0), (1.3, 0.7)):
            got = dispersion_rate(l, beta, d, sigma, attention, K)
            want = sphere_rate(l, d, beta, attention, K, sigma)
            np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13 * np.abs(want).max())


def test_s2_is_the_spherical_bessel_form():
    # docs/science.md §9 on S^2: l (l + 1) i_l(beta) / (beta i_0(beta)) (softmax)
    l = np.arange(1, 10)
    for beta in (-3.0, 0.7, 9.0):
        want = l * (l + 1) * spherical_in(l, beta) / (beta * spherical_in(0, beta))
        np.testing.assert_allclose(dispersion_rate(l, beta, 3), want, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(dispersion_rate(l, beta, 3, attention="unnormalised"),
                                   want * spherical_in(0, beta), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("d", [2, 3, 4, 7])
def test_beta_zero_and_negative_beta(d):
    # beta -> 0: only degree 1 grows, at (d - 1) / d (lambda_1 / (beta lambda_0) -> 1 / d);
    # tiny |beta| (scaled Bessel functions underflow there for d > 2) meets the limit
    np.testing.assert_allclose(dispersion_rate([1, 2, 3], 0.0, d), [(d - 1) / d, 0, 0],
                               atol=1e-15)
    for tiny in (1e-300, -1e-300, 1e-8):
        np.testing.assert_allclose(dispersion_rate([1, 2], tiny, d), [(d - 1) / d, 0],
                                   atol=1e-7)
    for attention in ("softmax", "unnormalised"):
        small = dispersion_rate([1, 2, 3], 1e-3, d, attention=attention)
        just = dispersion_rate([1, 2, 3], 1.01e-3, d, attention=attention)
        np.testing.assert_allclose(small, just, rtol=2e-2)  # continuous across branches
    # lambda_l(-beta) = (-1)^l lambda_l(beta): odd degrees keep their rate, even ones flip
    l = np.arange(1, 9)
    for beta in (0.5, 6.0):
        np.testing.assert_allclose(dispersion_rate(l, -beta, d),
                                   (-1.0) ** (l + 1) * dispersion_rate(l, beta, d), rtol=1e-13)


def test_broadcasting_and_refusals():
    got = dispersion_rate(np.arange(1, 4)[:, None], np.array([1.0, 5.0]), 3)
    assert got.shape == (3, 2)
    assert got[2, 1] == pytest.approx(float(sphere_rate(3, 3, 5.0, "softmax")), rel=1e-12)
    for bad, match in (({"l": 0}, "l: expected"), ({"l": 1.5}, "l: expected"),
                       ({"l": True}, "l: expected"), ({"beta": np.nan}, "beta: expected"),
                       ({"d": 1}, "d: expected"), ({"d": 3.0}, "d: expected"),
                       ({"sigma": -1.0}, "sigma"), ({"strength": np.inf}, "strength"),
                       ({"attention": "sinkhorn"}, "attention")):
        with pytest.raises(ValueError, match=match):
            dispersion_rate(**{"l": 1, "beta": 2.0, **bad})


# ------------------------------------------------------------ the mean-field solvers
def log_rate(first, last, T):
    return float(np.log(abs(last) / abs(first)) / T)


@pytest.mark.parametrize("attention, beta, k, sigma, K", [
    ("softmax", 9.0, 2, 0.0, 1.0), ("unnormalised", 4.0, 1, 0.5, 0.8),
    ("softmax", -3.0, 3, 0.0, 1.0)])
def test_the_circle_solver(attention, beta, k, sigma, K):
    rate = float(dispersion_rate(k, beta, 2, sigma, attention, K))
    T, eps, modes = min(1 / abs(rate), 3.0), 1e-9, max(8, 2 * k)
    c = np.zeros(modes + 1, dtype=complex)
    c[0], c[k] = 1 / (2 * np.pi), eps
    res = solve(af.Attention(beta=beta, mask="full", attention=attention, strength=K), c, T,
                save_at=[0.0, T], noise=sigma or None)
    assert res.resolution_lost_at is None
    measured = log_rate(eps, res.coefficients[-1, 0, k], T)
    assert abs(measured - rate) <= 1e-6 * abs(rate), (measured, rate)


@pytest.mark.parametrize("attention, beta, l, m, sigma, K", [
    ("softmax", 4.0, 2, 1, 0.0, 1.0), ("unnormalised", 2.0, 1, 0, 0.6, 1.5),
    ("softmax", -2.0, 3, 2, 0.3, 1.0)])
def test_the_s2_solver(attention, beta, l, m, sigma, K):
    rate = float(dispersion_rate(l, beta, 3, sigma, attention, K))
    L, eps = 8, 1e-10
    T = min(1 / abs(rate), 3.0)
    c = np.zeros((1, L + 1, L + 1), dtype=complex)
    c[0, 0, 0], c[0, l, m] = MASS0, eps
    res = solve(af.Attention(beta=beta, mask="full", attention=attention, strength=K), c, T,
                save_at=[0.0, T], noise=sigma or None)
    assert res.resolution_lost_at is None
    measured = log_rate(eps, res.coefficients[-1, 0, l, m], T)
    assert abs(measured - rate) <= 1e-6 * abs(rate), (measured, rate)


@pytest.mark.parametrize("d, attention, beta, l, sigma, K", [
    (4, "softmax", 2.5, 2, 0.0, 1.0), (5, "unnormalised", 1.5, 1, 0.4, 0.9),
    (8, "softmax", -2.0, 3, 0.2, 1.2)])
def test_the_zonal_solver(d, attention, beta, l, sigma, K):
    rate = float(dispersion_rate(l, beta, d, sigma, attention, K))
    eps, T = 1e-10, 1.0
    a = np.zeros((1, 8))
    a[0, 0], a[0, l] = 1 / zonal.area(d), eps
    res = solve(af.Attention(beta=beta, mask="full", attention=attention, strength=K), a, T,
                save_at=[T], d=d, noise=sigma or None, dt=0.005)
    measured = log_rate(eps, res.coefficients[-1, 0, l], T)
    assert abs(measured - rate) <= 1e-6 * abs(rate), (measured, rate)


# ------------------------------------------------------------ particles
def _particle_rates(n, runs, beta, T, degrees, backend, seed):
    """Linear rates of n iid uniform tokens on S^2 (softmax, full mask) and their standard
    errors. While the dynamics are linear each real moment M(t) = (1/n) sum_j Y(x_j(t)) of
    degree l (real and imaginary parts of scipy's harmonics, m = 0..l) is e^{gamma_l t} M(0)
    plus a remainder of O(1/n) (the quadratic terms, against moments of size 1/sqrt(n)):
    gamma_l = log(s) / T for the least-squares slope s of M(T) on M(0) through the origin
    over the runs (2 l + 1) moments, and its standard error the regression's, from the
    residuals' scatter, se(s) / (s T): about 1 / (T sqrt(n runs (2 l + 1))) times the
    remainder's size in units of 1/n."""
    x0 = af.sphere.uniform((runs, n), 3, seed=seed)
    xT = af.simulate(af.Attention(beta=beta, mask="full", backend=backend), x0, T,
                     save_at=[0.0, T], method="rk4", dt=0.1).final

    def moments(x, l):
        theta = np.arccos(np.clip(x[..., 2], -1, 1))
        phi = np.arctan2(x[..., 1], x[..., 0])
        M = [sph_harm_y(l, m, theta, phi).mean(axis=-1) for m in range(l + 1)]
        return np.concatenate([M[0].real[..., None]] + [np.sqrt(2) * np.stack(
            [v.real, v.imag], -1) for v in M[1:]], -1).ravel()  # runs (2 l + 1) values

    rates, errors = [], []
    for l in degrees:
        a, b = moments(x0, l), moments(xT, l)
        slope = (a @ b) / (a @ a)
        se = np.sqrt(np.sum((b - slope * a) ** 2) / (a.size - 1) / (a @ a))
        rates.append(np.log(slope) / T)
        errors.append(se / (slope * T))
    return np.array(rates), np.array(errors)


def test_particles_on_s2_follow_the_rates():
    n, runs, beta, T, l = 3000, 4, 2.0, 1.0, np.array([1, 2, 3])
    got, se = _particle_rates(n, runs, beta, T, l, "harmonic:1e-9", seed=5)
    want = dispersion_rate(l, beta, 3)
    # measured |z| 1.1, 3.3, 0.9. The O(1/n) remainder: se T sqrt(n runs (2 l + 1)) measured
    # 0.19, 1.0, 2.7 (it grows with l: the fast low degrees force the slow high ones)
    assert np.all(se < 8 / (T * np.sqrt(n * runs * (2 * l + 1))))
    assert np.all(np.abs(got - want) <= 4 * se), (got, want, se)


@pytest.mark.slow
def test_particles_on_s2_at_n_1e5_follow_the_rates():
    n, runs, beta, T, l = 100_000, 2, 2.0, 1.0, np.array([1, 2, 3, 4])
    got, se = _particle_rates(n, runs, beta, T, l, "harmonic:1e-9", seed=7)
    want = dispersion_rate(l, beta, 3)
    # measured: se T sqrt(n runs (2 l + 1)) 0.37, 1.4, 2.4, 5.5; |z| 1.3, 1.4, 2.8, 1.9
    assert np.all(se < 8 / (T * np.sqrt(n * runs * (2 * l + 1))))
    assert np.all(np.abs(got - want) <= 4 * se), (got, want, se)
