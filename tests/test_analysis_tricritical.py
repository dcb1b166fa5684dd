"""attnflow.analysis.tricritical against independent computations: the Bessel-ratio root and
the closed form written here with scipy.special.iv, Funk-Hecke by quadrature, the mean-field
solver's measured growth rate, and the stationary self-consistency solved here by plain
fixed-point iteration with direct quadrature of the kernel (docs/science.md §11.2)."""

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp
from scipy.optimize import brentq
from scipy.special import eval_legendre, gamma, i0, iv

import attnflow.analysis.closedforms as closedforms
from attnflow.analysis.closedforms import (
    dispersion_rate,
    funk_hecke,
    instability_strength,
    landau_coefficient,
    linear_fluctuation,
    stationary_branch,
    stationary_order,
    transition_strengths,
    tricritical_beta,
)
from attnflow.meanfield import from_function, solve


@pytest.mark.parametrize("d", [2, 3, 4])
def test_tricritical_beta_is_the_bessel_ratio_root(d):
    root = brentq(lambda b: iv(d / 2 + 1, b) / iv(d / 2, b) - 1 / d, 0.1, 20.0, xtol=1e-14)
    assert tricritical_beta(d) == pytest.approx(root, rel=1e-12)
    assert landau_coefficient(0.99 * root, d) > 0 > landau_coefficient(1.01 * root, d)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_instability_strength_closed_form_and_kuramoto_limit(d):
    for beta in (0.3, 1.0, 4.0, 12.0):
        closed = beta ** (d / 2) / (2 ** (d / 2) * gamma(d / 2) * iv(d / 2, beta))
        assert instability_strength(beta, d) == pytest.approx(closed, rel=1e-12)
        assert instability_strength(beta, d, sigma=0.5) == pytest.approx(closed / 4, rel=1e-12)
    # beta -> 0: the Kuramoto threshold of drift K P_x m and noise sigma: K = sigma^2 d / 2
    assert instability_strength(1e-7, d) == pytest.approx(d / 2, rel=1e-6)


def test_funk_hecke_by_quadrature():
    beta = 2.3
    for l in range(5):
        circle = quad(lambda t, l=l: np.exp(beta * np.cos(t)) * np.cos(l * t), 0, 2 * np.pi)[0]
        assert funk_hecke(beta, 2, l) == pytest.approx(circle / (2 * np.pi), rel=1e-12)
        sphere = quad(lambda t, l=l: np.exp(beta * t) * eval_legendre(l, t), -1, 1)[0] / 2
        assert funk_hecke(beta, 3, l) == pytest.approx(sphere, rel=1e-10)


@pytest.mark.parametrize("beta", [1.5, 4.0])
def test_growth_rate_and_threshold_against_the_meanfield_solver(beta):
    """The solver (independent spectral code) from 1/(2 pi) (1 + eps cos theta): the measured
    rate of mode 1 over a short time is the formula's and changes sign at K_#."""
    K_sharp = instability_strength(beta, 2)
    rho0 = from_function(lambda t: 1 + 1e-6 * np.cos(t), modes=8)
    measured = []
    for K in (0.8 * K_sharp, 1.2 * K_sharp):
        res = solve(dict(beta=beta, mask="full", attention="unnormalised", strength=K), rho0,
                    1.0, save_at=[1.0], noise=1.0)
        rate = np.log(np.abs(res.coefficients[-1, 0, 1] / res.coefficients[0, 0, 1]))
        measured.append(rate)
        assert rate == pytest.approx(float(dispersion_rate(1, beta, 2, 1.0, "unnormalised", K)),
                                     abs=1e-6)
    assert measured[0] < 0 < measured[1]
    # the zero of the (linear in K) measured rate is K_#
    zero = 0.8 * K_sharp - measured[0] * 0.4 * K_sharp / (measured[1] - measured[0])
    assert zero == pytest.approx(K_sharp, rel=1e-5)


def test_higher_modes_destabilise_later():
    for d in (2, 3):
        for beta in (0.5, 3.0, 10.0):
            K = instability_strength(beta, d)
            assert np.all(dispersion_rate([2, 3, 4, 8], beta, d, 1.0, "unnormalised", K) < 0)


def _circle_fixed_point(kappa, beta, start, points=512, iterations=4000):
    """rho = e^{2 kappa Phi} / Z on the circle, Phi(x) = mean_y e^{beta cos} rho / beta, by
    fixed-point iteration on a grid (the kernel summed directly)."""
    theta = 2 * np.pi * np.arange(points) / points
    kernel = np.exp(beta * np.cos(theta[:, None] - theta[None, :])) / points
    rho = start(theta)
    rho = rho / rho.mean()
    for _ in range(iterations):
        U = 2 * kappa * (kernel @ rho) / beta
        new = np.exp(U - U.max())
        new /= new.mean()
        if np.abs(new - rho).max() < 1e-13:
            break
        rho = 0.5 * rho + 0.5 * new
    return float(np.abs(np.mean(rho * np.exp(1j * theta))))


def _sphere_fixed_point(kappa, beta, start, nodes=96, iterations=4000):
    """The same on S^2 for axially symmetric rho(t), t = <x, e>: the kernel integrated over
    the azimuth, int e^{beta <x, y>} dphi / 2 pi = e^{beta t s} I_0(beta sqrt(1-t^2)
    sqrt(1-s^2)), and over s with Gauss-Legendre (dy = ds / 2)."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    w = w / 2
    st = np.sqrt(1 - t**2)
    kernel = np.exp(beta * t[:, None] * t[None, :]) * i0(beta * st[:, None] * st[None, :]) * w
    rho = start(t)
    rho = rho / (w @ rho)
    for _ in range(iterations):
        U = 2 * kappa * (kernel @ rho) / beta
        new = np.exp(U - U.max())
        new /= w @ new
        if np.abs(new - rho).max() < 1e-13:
            break
        rho = 0.5 * rho + 0.5 * new
    return float(w @ (t * rho))


@pytest.mark.parametrize(("d", "beta", "ratio"), [(2, 1.0, 1.3), (3, 1.0, 1.2), (2, 5.0, 1.02),
                                                  (3, 4.0, 0.9)])
def test_stationary_order_against_direct_self_consistency(d, beta, ratio):
    K = ratio * instability_strength(beta, d)
    fixed = _circle_fixed_point if d == 2 else _sphere_fixed_point
    direct = fixed(K, beta, lambda t: np.exp(4 * np.cos(t) if d == 2 else 4 * t))
    assert stationary_order(K, beta, d) == pytest.approx(direct, abs=1e-9)


def test_first_order_strengths_bracket_the_direct_solutions():
    """beta = 5 > beta_* on the circle: K_sn < K_c < K_#; a concentrated start converges to a
    clustered state just above K_sn and to the uniform one just below (direct iteration)."""
    beta = 5.0
    tr = transition_strengths(beta, 2)
    assert not tr.continuous and tr.spinodal < tr.critical < tr.instability
    concentrated = lambda t: np.exp(6 * np.cos(t))  # noqa: E731
    assert _circle_fixed_point(0.98 * tr.spinodal, beta, concentrated) < 1e-6
    above = _circle_fixed_point(1.02 * tr.spinodal, beta, concentrated)
    assert above > 0.5
    assert above == pytest.approx(float(stationary_order(1.02 * tr.spinodal, beta, 2)),
                                  abs=1e-9)
    # the free energies cross at K_c: the clustered state at K_c has F - F_uniform = 0
    b = stationary_branch(beta, 2, np.linspace(0.01, 0.98, 98))
    rising = np.arange(98) >= np.argmin(b.strength)
    K_zero = np.interp(0.0, -b.free_energy[rising], b.strength[rising])
    assert K_zero == pytest.approx(tr.critical, rel=1e-3)


def test_landau_coefficient_is_the_branch_slope():
    for d, beta in ((2, 1.0), (3, 1.0), (2, 4.0), (3, 3.0)):
        r = np.array([0.004, 0.008])
        K = stationary_branch(beta, d, r).strength
        slope = (1 - instability_strength(beta, d) / K) / r**2
        g = landau_coefficient(beta, d)
        # (1 - K_#/K) / r^2 = g d^2 + O(r^2): Richardson over r and 2r
        assert (4 * slope[0] - slope[1]) / 3 == pytest.approx(g * d * d, rel=1e-3, abs=1e-4)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="d: expected an integer dimension"):
        instability_strength(1.0, 1)
    with pytest.raises(ValueError, match="d: expected an integer"):
        tricritical_beta(2.5)
    with pytest.raises(ValueError, match="beta: expected a finite beta > 0"):
        funk_hecke(0.0, 2, 1)
    with pytest.raises(ValueError, match="r: expected increasing"):
        stationary_branch(1.0, 2, [0.5, 0.2])
    with pytest.raises(ValueError, match="strength"):
        closedforms.stationary_order(-1.0, 1.0, 2)


def test_linear_fluctuation_solves_its_ode():
    """dS/dt = -2 a S + (d - 1) sigma^2, S(0) = 1 (solve_ivp), a = (d-1)(sigma^2/2)(1 - ratio)."""
    for d, sigma, ratio in ((3, 1.0, 0.7), (3, 1.0, 1.3), (2, 0.8, 1.0), (4, 1.2, 0.2)):
        a, c = (d - 1) * sigma**2 / 2 * (1 - ratio), (d - 1) * sigma**2
        sol = solve_ivp(lambda t, S, a=a, c=c: -2 * a * S + c, (0, 3), [1.0],
                        t_eval=[0.5, 3.0], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(linear_fluctuation(ratio, sol.t, d, sigma), sol.y[0],
                                   rtol=1e-8)
