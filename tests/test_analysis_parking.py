"""Parking theory: cap masses, expected strong centers, Rényi's M(x) and constant."""

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import gamma

from attnflow.analysis import closedforms
from attnflow.analysis.closedforms import (
    cap_mass,
    expected_renyi_centers_circle,
    expected_strong_centers,
    renyi_parking_mean,
)


def cap_mass_by_quadrature(delta, d):
    """Independent truth: int_0^delta sin^{d-2} / int_0^pi sin^{d-2}."""
    w = lambda t: np.sin(t) ** (d - 2)  # noqa: E731
    return quad(w, 0, delta)[0] / quad(w, 0, np.pi)[0]


@pytest.mark.parametrize("d", [2, 3, 4, 7, 30])
@pytest.mark.parametrize("delta", [0.0, 0.05, 0.7, np.pi / 2, 2.3, np.pi])
def test_cap_mass_matches_quadrature(d, delta):
    assert cap_mass(delta, d) == pytest.approx(cap_mass_by_quadrature(delta, d), abs=1e-12)


def test_cap_mass_closed_forms():
    delta = np.linspace(0, np.pi, 9)
    np.testing.assert_allclose(cap_mass(delta, 2), delta / np.pi, atol=1e-15)
    np.testing.assert_allclose(cap_mass(delta, 3), np.sin(delta / 2) ** 2, atol=1e-15)
    np.testing.assert_allclose(cap_mass(delta, 4), (delta - np.sin(delta) * np.cos(delta)) / np.pi,
                               atol=1e-15)
    # Small caps on S^{d-1}: area ~ omega_{d-2} delta^{d-1} / (d-1) over |S^{d-1}|.
    d, small = 6, 1e-3
    ratio = gamma(d / 2) / (np.sqrt(np.pi) * gamma((d - 1) / 2)) * small ** (d - 1) / (d - 1)
    assert cap_mass(small, d) == pytest.approx(ratio, rel=1e-5)


def test_expected_strong_centers_limits():
    assert expected_strong_centers(np.inf, 0.5, 2) == pytest.approx(np.pi / 0.5, rel=1e-14)
    assert expected_strong_centers(np.inf, 0.5, 3) == pytest.approx(1 / np.sin(0.25) ** 2,
                                                                       rel=1e-14)
    assert expected_strong_centers(1, 0.5, 5) == pytest.approx(1.0, rel=1e-14)
    # Sum of the series, term by term.
    p = cap_mass(0.3, 4)
    assert expected_strong_centers(50, 0.3, 4) == pytest.approx(
        sum((1 - p) ** (k - 1) for k in range(1, 51)), rel=1e-13)
    np.testing.assert_array_equal(expected_strong_centers(17, [0.0, np.pi], 3), [17.0, 1.0])
    assert expected_strong_centers(np.inf, 0.0, 3) == np.inf


def test_renyi_constant_from_its_integral():
    """c_R = int_0^inf exp(-2 int_0^t (1 - e^{-u}) / u du) dt (Rényi 1958)."""
    inner = lambda t: quad(lambda u: -np.expm1(-u) / u, 0, t)[0]  # noqa: E731
    f = lambda t: np.exp(-2 * inner(t))  # noqa: E731
    value = quad(f, 0, 1)[0] + quad(f, 1, np.inf, limit=200)[0]
    assert value == pytest.approx(closedforms.RENYI_PARKING_CONSTANT, abs=1e-12)
    assert closedforms.RENYI_PARKING_CONSTANT == pytest.approx(0.74760, abs=5e-6)


def test_parking_mean_closed_forms_and_asymptote():
    x = np.array([0.0, 0.5, 0.999, 1.0, 1.5, 2.0])
    np.testing.assert_array_equal(renyi_parking_mean(x), [0, 0, 0, 1, 1, 1])
    # [2, 3]: 1 + 2 (x-2)/(x-1); [3, 4]: 1 + 2 (1 + 3 (x-3) - 2 log(x-2)) / (x-1).
    x = np.linspace(2, 3, 7)
    np.testing.assert_allclose(renyi_parking_mean(x), 1 + 2 * (x - 2) / (x - 1), atol=1e-12)
    x = np.linspace(3, 4, 7)
    np.testing.assert_allclose(renyi_parking_mean(x),
                               1 + 2 * (1 + 3 * (x - 3) - 2 * np.log(x - 2)) / (x - 1), atol=1e-10)
    # The table meets the asymptote c_R x + c_R - 1 (error O((2e/x)^{x-3/2})).
    c = closedforms.RENYI_PARKING_CONSTANT
    for x in (20.0, 29.5):
        assert renyi_parking_mean(x) == pytest.approx(c * x + c - 1, abs=1e-10)


def test_jamming_count_on_the_circle():
    # Large delta: 2 centers for delta in (2 pi / 3, pi), 3 just below 2 pi / 3 is possible.
    assert expected_renyi_centers_circle(2.5) == 2.0
    assert expected_renyi_centers_circle(np.pi) == 1.0
    small = np.array([0.1, 0.01])
    np.testing.assert_allclose(expected_renyi_centers_circle(small) * small / (2 * np.pi),
                               closedforms.RENYI_PARKING_CONSTANT, rtol=1e-10)


def test_bad_input():
    with pytest.raises(ValueError, match="d: expected"):
        cap_mass(0.3, 1)
    with pytest.raises(ValueError, match="delta: expected"):
        expected_strong_centers(10, 4.0, 3)
    with pytest.raises(ValueError, match="n: expected"):
        expected_strong_centers(2.5, 0.3, 3)
    with pytest.raises(ValueError, match="delta: expected"):
        expected_renyi_centers_circle(0.0)
