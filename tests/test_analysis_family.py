"""Closed forms of the model family (docs/science.md §6) against independent truth: the
equiangular ODE against simulations of the engine, the Kuramoto root plugged back into its
equation, the long-context correlation against its limits and a direct computation."""

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp
from scipy.special import iv

import attnflow as af
from attnflow.analysis.closedforms import (
    dispersion_rate,
    equiangular_rhs,
    equiangular_start,
    k_star,
    kuramoto_order,
    noise_threshold,
    output_correlation,
    output_correlation_limit,
    self_weight,
    uniform_fluctuation,
)


def _offdiag(G):
    n = G.shape[-1]
    return G[..., ~np.eye(n, dtype=bool)]


@pytest.mark.parametrize(("n", "d", "rho"), [(5, 6, 0.3), (5, 5, 0.0), (6, 5, -0.2),
                                             (4, 10, 0.95), (3, 2, -0.5)])
def test_equiangular_start_is_exact(n, d, rho):
    for seed in (None, 7):
        X = equiangular_start(n, d, rho, seed=seed)
        assert X.shape == (n, d)
        G = X @ X.T
        np.testing.assert_allclose(np.diag(G), 1.0, atol=1e-15)
        np.testing.assert_allclose(_offdiag(G), rho, atol=5e-16)


def test_equiangular_start_rejects_what_does_not_exist():
    with pytest.raises(ValueError, match="n: expected n <= d"):
        equiangular_start(6, 5, 0.1)
    with pytest.raises(ValueError, match="rho: expected a number in"):
        equiangular_start(4, 5, -0.5)
    with pytest.raises(ValueError, match="rho: expected a number < 1"):
        equiangular_start(4, 5, 1.0)


@pytest.mark.parametrize(("attention", "norm"), [
    ("softmax", "post"), ("unnormalised", "post"), ("softmax", "pre"), ("softmax", "peri"),
    ("softmax", "ngpt"), ("unnormalised", "pre")])
def test_equiangular_ode_matches_the_engine(attention, norm):
    n, d, beta, rho0, t_end = 5, 7, 3.0, 0.1, 3.0
    times = np.linspace(0.0, t_end, 7)
    x0 = equiangular_start(n, d, rho0, seed=1)
    model = af.Attention(beta=beta, mask="full", attention=attention, norm=norm, alpha=0.5)
    traj = af.simulate(model, x0, t_end, save_at=times, method="rk4", dt=0.0025)
    theta = traj.directions
    off = _offdiag(theta @ np.swapaxes(theta, -1, -2))
    assert np.ptp(off, axis=-1).max() < 1e-12  # stays equiangular
    assert np.ptp(traj.radii, axis=-1).max() < 1e-12  # one common radius

    def rhs(t, y):
        return np.array(equiangular_rhs(y[0], beta, n, attention, norm, r=y[1], alpha=0.5))

    ode = solve_ivp(rhs, (0, t_end), [rho0, 1.0], t_eval=times, rtol=1e-12, atol=1e-14,
                    method="DOP853")
    np.testing.assert_allclose(off.mean(axis=-1), ode.y[0], rtol=0, atol=1e-9)
    np.testing.assert_allclose(traj.radii[:, 0], ode.y[1], rtol=1e-9)
    assert ode.y[0, -1] - rho0 > 0.1  # the comparison covers real motion


def test_equiangular_rhs_written_forms():
    rho, beta, n = np.linspace(-0.2, 0.99, 9), 5.0, 7
    soft = 2 * np.exp(beta * rho) * (1 - rho) * ((n - 1) * rho + 1) / (
        np.exp(beta) + (n - 1) * np.exp(beta * rho))
    np.testing.assert_allclose(equiangular_rhs(rho, beta, n)[0], soft, rtol=1e-13)
    unnorm = (2 / n) * np.exp(beta * rho) * (1 - rho) * ((n - 1) * rho + 1)
    np.testing.assert_allclose(equiangular_rhs(rho, beta, n, "unnormalised")[0], unnorm,
                               rtol=1e-13)
    # The softmax form stays finite where e^beta overflows.
    assert np.isfinite(equiangular_rhs(0.5, 2000.0, n)[0])


def test_kuramoto_root_solves_its_equation():
    kappa = np.array([2.5, 3.0, 4.0, 8.0])
    R = kuramoto_order(kappa)
    assert np.all((R > 0) & (R < 1))
    np.testing.assert_allclose(iv(1, kappa * R) / iv(0, kappa * R), R, rtol=0, atol=1e-10)
    assert np.all(np.diff(R) > 0)
    # Near the threshold R ~ sqrt(8 (kappa - 2) / kappa^3) (expansion of I_1 / I_0).
    np.testing.assert_allclose(kuramoto_order(2.0 + 1e-6), np.sqrt(8e-6 / 8), rtol=1e-5)
    np.testing.assert_array_equal(kuramoto_order([0.0, 1.0, 2.0]), 0.0)


def test_long_context_correlation_limits():
    rho = 0.4
    crit = 1 / (1 - rho)
    huge = 1e12
    for gamma, want in ((0.5 * crit, 1.0), (crit, 4 * rho / (1 + 3 * rho)), (2 * crit, rho)):
        np.testing.assert_allclose(output_correlation_limit(gamma, rho), want, rtol=1e-15)
        np.testing.assert_allclose(output_correlation(huge, gamma, rho), want, atol=1e-5)
    np.testing.assert_allclose(self_weight(100.0, crit, rho), 100 / (100 + 99), rtol=1e-14)


def test_long_context_correlation_equals_a_direct_layer():
    n, d, rho, gamma = 40, 41, 0.3, 1.2
    theta = equiangular_start(n, d, rho, seed=3)
    model = af.Attention(beta=gamma * np.log(n), mask="full")
    y = model.attention_output(theta)
    c = (y @ y.T) / np.outer(np.linalg.norm(y, axis=1), np.linalg.norm(y, axis=1))
    np.testing.assert_allclose(_offdiag(c), output_correlation(n, gamma, rho), atol=1e-13)
    np.testing.assert_allclose(np.diag(model.attention_matrix(theta)),
                               self_weight(n, gamma, rho), rtol=1e-13)


def test_k_star_maximises_k2_ik():
    for beta in (4.0, 9.0, 25.0, 100.0):
        k = np.arange(1, 200)
        assert k_star(beta) == k[np.argmax(k**2 * iv(k, beta))]
    assert k_star(100.0) == 14 and k_star(9.0) == 4


def test_noise_threshold_is_the_mode_one_balance():
    for beta in (0.5, 4.0, 30.0):
        # Mode 1 of the linearised drift: <sin^2 u> under the weight e^{beta cos u}.
        num = quad(lambda u, b=beta: np.exp(b * (np.cos(u) - 1)) * np.sin(u) ** 2, 0,
                   2 * np.pi)[0]
        den = quad(lambda u, b=beta: np.exp(b * (np.cos(u) - 1)), 0, 2 * np.pi)[0]
        np.testing.assert_allclose(noise_threshold(beta), den / num, rtol=1e-10)
    np.testing.assert_allclose(noise_threshold([0.0, 1e-9]), 2.0, rtol=1e-9)
    np.testing.assert_allclose(uniform_fluctuation([0.0, 1.0, 1.5], 0.0), [1.0, 2.0, 4.0])
    assert np.isinf(uniform_fluctuation(2.0, 0.0)) and np.isinf(uniform_fluctuation(5.0, 4.0))


def _linearised_rate(k: int, beta: float, attention: str) -> float:
    """lambda_k by quadrature of the linearised velocity: for rho = 1/(2 pi) + eps cos(k theta)
    the numerator int e^{beta cos(theta - phi)} sin(phi - theta) rho(phi) dphi is
    -eps sin(k theta) A, A = int e^{beta cos u} sin u sin(k u) du, and the continuity equation
    gives d eps / dt = k A eps / (2 pi Z_0), Z_0 = (1 / 2 pi) int e^{beta cos u} du (softmax;
    Z_0 = 1 unnormalised). Both integrals scaled by e^{-beta}."""
    opts = {"epsabs": 1e-15, "epsrel": 1e-12, "limit": 400}
    A = quad(lambda u: np.exp(beta * (np.cos(u) - 1)) * np.sin(u) * np.sin(k * u),
             -np.pi, np.pi, **opts)[0]
    Z0 = quad(lambda u: np.exp(beta * (np.cos(u) - 1)), -np.pi, np.pi, **opts)[0] / (2 * np.pi)
    if attention == "softmax":
        return k * A / (2 * np.pi * Z0)
    return k * A * np.exp(beta) / (2 * np.pi)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
@pytest.mark.parametrize("beta", [0.5, 9.0, 25.0, 64.0])
def test_dispersion_rate_is_the_linearised_operator(attention, beta):
    ks = np.arange(1, 2 * k_star(beta) + 2)
    got = dispersion_rate(ks, beta, attention=attention)
    want = [_linearised_rate(int(k), beta, attention) for k in ks]
    # relative to the largest rate: the far modes' rates are tiny differences of quadratures
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11 * max(want))
    assert int(ks[np.argmax(got)]) == k_star(beta)


def test_dispersion_rate_limits_and_noise():
    np.testing.assert_allclose(dispersion_rate([1, 2, 3], 0.0), [0.5, 0.0, 0.0], atol=1e-15)
    # noise: mode 1 is neutral exactly at the Kuramoto-type threshold sigma^2 = 2 / kappa_c
    for beta in (0.0, 4.0, 30.0):
        sigma = np.sqrt(2 / noise_threshold(beta))
        assert abs(dispersion_rate(1, beta, sigma=sigma)) < 1e-14
    assert dispersion_rate(2, 9.0, sigma=0.3) == pytest.approx(
        dispersion_rate(2, 9.0) - 0.09 * 4 / 2, rel=1e-14)
    for bad in ({"l": 0, "beta": 1.0}, {"l": 1.5, "beta": 1.0}, {"l": 1, "beta": np.nan}):
        with pytest.raises(ValueError):
            dispersion_rate(**bad)
    with pytest.raises(ValueError, match="attention"):
        dispersion_rate(1, 1.0, attention="sinkhorn")
