"""Circle theory: h, g, tau_beta, Lemma 5.1, Theorem 5.2 and Remark B.2 (docs/science.md §§1-2)."""

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from attnflow.analysis import closedforms


@pytest.mark.parametrize("beta", [0.0, 1.0, 9.0, 64.0])
def test_g_is_the_derivative_of_h(beta):
    x = np.linspace(-3, 3, 41)
    step = 1e-6
    numeric = (closedforms.h(x + step, beta) - closedforms.h(x - step, beta)) / (2 * step)
    np.testing.assert_allclose(closedforms.g(x, beta), numeric, atol=1e-8)


def test_h_is_odd_periodic_and_nonnegative_on_0_pi():
    x = np.linspace(0, np.pi, 50)
    np.testing.assert_allclose(closedforms.h(-x, 5.0), -closedforms.h(x, 5.0), atol=0)
    np.testing.assert_allclose(closedforms.h(x + 2 * np.pi, 5.0), closedforms.h(x, 5.0), atol=1e-14)
    assert np.all(closedforms.h(x, 5.0) >= 0)


@pytest.mark.parametrize("beta", [0.0, 0.3, 4.0, 64.0, 1e4])
def test_tau_maximises_h(beta):
    grid = np.linspace(0, np.pi, 200001)
    top = grid[np.argmax(closedforms.h(grid, beta))]
    best = minimize_scalar(lambda x: -closedforms.h(x, beta),
                           bounds=(max(0, top - 1e-4), top + 1e-4),
                           method="bounded", options={"xatol": 1e-12})
    assert closedforms.tau_beta(beta) == pytest.approx(best.x, abs=1e-6)
    assert closedforms.g(closedforms.tau_beta(beta), beta) == pytest.approx(0, abs=1e-12)


def test_tau_scales_like_inverse_sqrt_beta():
    beta = np.array([1e2, 1e4, 1e6])
    np.testing.assert_allclose(closedforms.tau_beta(beta) * np.sqrt(beta), 1.0, rtol=2e-2)


def test_lemma51_closed_form_is_sufficient():
    """T s < eps exp(c^2/2 - c^4/(24 beta)) implies T s h(c beta^{-1/2}) < eps c beta^{-1/2}:
    the closed-form time never exceeds the exact one, and is close for large beta."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        beta, c, eps, s = rng.uniform(1, 400), rng.uniform(1, 6), rng.uniform(0.01, 0.5), 7
        bound = closedforms.lemma51_bound(beta, c, eps, s)
        assert bound.time_closed_form <= bound.time * (1 + 1e-12)
        assert bound.separation == pytest.approx(c * (1 + 2 * eps) / np.sqrt(beta))
        T = bound.time * (1 - 1e-9)  # the exact hypothesis holds just below the bound
        assert T * s * closedforms.h(c / np.sqrt(beta), beta) < bound.displacement
    big = closedforms.lemma51_bound(1e6, 3.0, 0.1, 1)
    assert big.time_closed_form == pytest.approx(big.time, rel=1e-4)


def test_theorem52_remark_numbers():
    """eps = 0.1, c = 6.5: Remark B.2 reads beta >= 14.045 and N < 682.9 (docs/science.md §2)."""
    check = closedforms.remark_b2_conditions(14.045, 6.5, 0.1, 682)
    assert check.beta_min == pytest.approx(14.045, abs=1e-12)
    assert check.N_max == pytest.approx(682.9467, abs=1e-4)
    assert check.holds
    assert not closedforms.remark_b2_conditions(14.0, 6.5, 0.1, 682).holds  # beta too small
    assert not closedforms.remark_b2_conditions(14.1, 6.5, 0.1, 683).holds  # N too large
    assert closedforms.theorem52_min_beta(6.5, 0.1, 682, form="remark") == pytest.approx(14.045)
    assert closedforms.theorem52_min_beta(6.5, 0.1, 700, form="remark") == np.inf
    assert closedforms.theorem52_max_N(14.045, 6.5, 0.1, form="remark") == pytest.approx(682.9467,
                                                                                abs=1e-4)
    assert closedforms.theorem52_max_N(14.0, 6.5, 0.1, form="remark") == 0.0


def test_theorem52_exact_numbers():
    """The exact conditions (i)-(ii) are much weaker: N = 700 needs beta >= 6.4947 only, and
    beta = 14 allows N up to 3762.8 (docs/science.md §2)."""
    beta = closedforms.theorem52_min_beta(6.5, 0.1, 700)
    assert beta == pytest.approx(6.494691, abs=1e-5)
    assert closedforms.theorem52_conditions(beta * (1 + 1e-9), 6.5, 0.1, 700).holds
    assert not closedforms.theorem52_conditions(beta * (1 - 1e-9), 6.5, 0.1, 700).holds
    N = closedforms.theorem52_max_N(14.0, 6.5, 0.1)
    assert N == pytest.approx(3762.806, abs=1e-3)
    assert closedforms.theorem52_conditions(14.0, 6.5, 0.1, N * (1 - 1e-9)).holds
    assert not closedforms.theorem52_conditions(14.0, 6.5, 0.1, N * (1 + 1e-9)).holds
    # At beta = 14, condition (i) binds; (ii) alone would allow far more.
    at = closedforms.theorem52_conditions(14.0, 6.5, 0.1, N * (1 + 1e-9))
    assert not at.i and at.ii


def test_theorem52_sign_typo():
    """Without the minus sign, (ii) would read N g((c-2eps) beta^{-1/2}) < g(eps beta^{-1/2}),
    true for every N because g is negative at the first argument and positive at the second
    throughout the relevant range: an empty condition (docs/science.md §2)."""
    beta = np.geomspace(5, 1e4, 60)
    for b in beta:
        assert closedforms.g((6.5 - 0.2) / np.sqrt(b), b) < 0 < closedforms.g(0.1 / np.sqrt(b), b)


def test_remark_b2_implies_the_exact_conditions():
    rng = np.random.default_rng(1)
    tried = 0
    while tried < 300:
        eps = rng.uniform(0.01, 0.5)
        c = rng.uniform(5.5 + 2 * eps, 9)
        beta = (c - 1 - 2 * eps) ** 2 / 2 * rng.uniform(1, 50)
        N = closedforms.remark_b2_conditions(beta, c, eps, 0).N_max * rng.uniform(0, 1)
        assert closedforms.remark_b2_conditions(beta, c, eps, N).holds
        assert closedforms.theorem52_conditions(beta, c, eps, N).holds
        tried += 1


def test_exact_max_N_tends_to_its_large_beta_limit():
    """As beta -> inf, (i) allows N < exp((C^2 - eps^2)/2) eps / C with C = c - 1 - 2 eps."""
    C = 6.5 - 1 - 0.2
    limit = np.exp((C**2 - 0.01) / 2) * 0.1 / C
    assert closedforms.theorem52_max_N(1e9, 6.5, 0.1) == pytest.approx(limit, rel=1e-6)
    assert closedforms.theorem52_min_beta(6.5, 0.1, 1.01 * limit) == np.inf


def test_conditions_need_separation_and_room_on_the_circle():
    assert not closedforms.theorem52_conditions(64, 2.1, 0.1, 1).separated  # c <= 2 + 2 eps
    assert closedforms.theorem52_max_N(64, 2.1, 0.1) == 0.0
    tight = closedforms.theorem52_conditions(1.0, 6.5, 0.1, 1)  # c beta^{-1/2} > pi
    assert not tight.fits and not tight.holds
    assert closedforms.theorem52_min_beta(6.5, 0.1, 1) >= (6.5 / np.pi) ** 2


def test_bad_input():
    with pytest.raises(ValueError, match="form: expected"):
        closedforms.theorem52_max_N(14, 6.5, 0.1, form="paper")
    with pytest.raises(ValueError, match="beta: expected"):
        closedforms.theorem52_conditions(-1, 6.5, 0.1, 700)
    with pytest.raises(ValueError, match="N: expected"):
        closedforms.theorem52_conditions(14, 6.5, 0.1, -700)
    with pytest.raises(ValueError, match="beta: expected"):
        closedforms.tau_beta(np.nan)
