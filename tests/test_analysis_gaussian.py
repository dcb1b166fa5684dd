"""The Gaussian closure (attnflow.analysis.gaussian) against Gauss-Hermite quadrature of the
mean-field velocity, a large sample advanced by the affine field with scipy's solve_ivp, and
the closed form 1 / (2 beta (t* - t)) of the isotropic blow-up."""

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from attnflow.analysis import closedforms
from attnflow.analysis.closedforms import (
    gaussian_blowup_time,
    gaussian_isotropic_moments,
    gaussian_moment_rhs,
    gaussian_moments,
)

RNG = np.random.default_rng(3)


def test_the_moment_rhs_is_the_mean_field_velocity_by_quadrature():
    """dm = E_x v(x), dSigma = E[(x - m) v^T + v (x - m)^T] with v(x) the softmax average
    of V y over y ~ N(m, Sigma), all by Gauss-Hermite quadrature (no Gaussian algebra)."""
    d, beta = 2, 0.6
    Q, K, V = RNG.normal(size=(3, d)), RNG.normal(size=(3, d)), RNG.normal(size=(d, d))
    m = np.array([0.4, -0.3])
    Sigma = np.array([[0.30, 0.08], [0.08, 0.15]])
    z, w = np.polynomial.hermite_e.hermegauss(40)
    w = w / w.sum()
    Z = np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, d)
    W = np.outer(w, w).ravel()
    pts = m + Z @ np.linalg.cholesky(Sigma).T  # nodes of N(m, Sigma), weights W
    scores = beta * (pts @ Q.T) @ (pts @ K.T).T  # [x node, y node]
    e = W[None, :] * np.exp(scores - scores.max(1, keepdims=True))
    v = (e @ (pts @ V.T)) / e.sum(1, keepdims=True)  # v(x) at every x node
    dm_quad = W @ v
    c = pts - m
    dS_quad = np.einsum("k,ka,kb->ab", W, c, v)
    dS_quad = dS_quad + dS_quad.T
    dm, dS = gaussian_moment_rhs(m, Sigma, beta, Q, K, V)
    np.testing.assert_allclose(dm, dm_quad, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dS, dS_quad, rtol=1e-9, atol=1e-12)
    assert np.abs(dS - dS.T).max() == 0


def test_the_moments_match_a_sample_advanced_by_the_affine_field():
    """Under v(x) = V (m + Sigma A x), m and Sigma the sample's own moments, any sample's
    mean and covariance obey the moment ODE exactly: integrate 4000 points."""
    d, n, beta = 3, 4000, 0.8
    Q, K, V = RNG.normal(size=(d, d)), RNG.normal(size=(d, d)), RNG.normal(size=(d, d))
    A = beta * K.T @ Q
    x0 = RNG.normal(size=(n, d)) @ np.diag([0.5, 0.3, 0.2]) + [0.2, 0.0, -0.1]

    def field(_t, y):
        x = y.reshape(n, d)
        mu, S = x.mean(0), np.cov(x.T, bias=True)
        return ((mu + x @ (S @ A).T) @ V.T).ravel()

    times = np.array([0.0, 0.5, 1.0, 2.0])
    sol = solve_ivp(field, (0, 2.0), x0.ravel(), method="DOP853", t_eval=times, rtol=1e-11,
                    atol=1e-12)
    xs = sol.y.T.reshape(-1, n, d)
    m, S = gaussian_moments(x0.mean(0), np.cov(x0.T, bias=True), times, beta, Q, K, V)
    np.testing.assert_allclose(m, xs.mean(1), atol=1e-9)
    np.testing.assert_allclose(S, [np.cov(x.T, bias=True) for x in xs], atol=1e-9)
    assert np.abs(S[-1] - S[0]).max() > 0.1  # the covariance did move


def test_the_isotropic_case_blows_up_at_the_closed_form_time():
    beta = 1.5
    Sigma0 = np.array([[0.20, 0.05], [0.05, 0.10]])
    m0 = np.array([0.3, -0.2])
    t_star = gaussian_blowup_time(Sigma0, beta)
    lam = np.linalg.eigvalsh(Sigma0)[-1]
    assert t_star == pytest.approx(1 / (2 * beta * lam), rel=1e-14)
    times = t_star * np.array([0.0, 0.5, 0.9, 0.99, 0.999])
    m, S = gaussian_moments(m0, Sigma0, times, beta, rtol=1e-12, atol=1e-14)
    mc, Sc = gaussian_isotropic_moments(m0, Sigma0, times, beta)
    np.testing.assert_allclose(S, Sc, rtol=1e-7)
    np.testing.assert_allclose(m, mc, rtol=1e-7)
    # dSigma/dt = 2 beta Sigma^2: lambda_max(t) = 1 / (2 beta (t* - t)), with no t* given
    top = np.linalg.eigvalsh(S)[:, -1]
    np.testing.assert_allclose(top, lam / (1 - 2 * beta * lam * times), rtol=1e-7)
    # and the mean's top component grows like e^t (t* - t)^(-1/2)
    u = np.linalg.eigh(Sigma0)[1][:, -1]
    np.testing.assert_allclose(m @ u, np.exp(times) * (u @ m0)
                               / np.sqrt(1 - times / t_star), rtol=1e-7)
    with pytest.raises(ValueError, match="^times: expected times before the moments blow up"):
        gaussian_moments(m0, Sigma0, [0.0, 1.01 * t_star], beta)
    with pytest.raises(ValueError, match="^times: expected times before the blow-up"):
        gaussian_isotropic_moments(m0, Sigma0, [1.01 * t_star], beta)


def test_bad_inputs_name_the_argument():
    S = np.eye(2)
    with pytest.raises(ValueError, match="^Sigma0: expected a symmetric matrix"):
        gaussian_moments([0, 0], [[1, 0.5], [0, 1]], [0, 1])
    with pytest.raises(ValueError, match="^Sigma0: expected a positive semi-definite"):
        gaussian_moments([0, 0], [[1, 2], [2, 1]], [0, 1])
    with pytest.raises(ValueError, match="^V: expected a \\(2, 2\\) matrix"):
        gaussian_moment_rhs([0, 0], S, V=np.eye(3))
    with pytest.raises(ValueError, match="^Q, K: expected query and key matrices"):
        gaussian_moment_rhs([0, 0], S, Q=np.ones((3, 2)), K=np.ones((2, 2)))
    with pytest.raises(ValueError, match="^times: expected a non-empty non-decreasing"):
        gaussian_moments([0, 0], S, [1, 0])
    with pytest.raises(ValueError, match="^beta: expected a finite number > 0"):
        gaussian_blowup_time(S, -1.0)
    assert closedforms.gaussian_moments is gaussian_moments
