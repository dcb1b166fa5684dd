"""analysis.selectivity against independent truth: the cap mass (parking.cap_mass), the d = 3
closed forms (exponential integral), a Monte Carlo of the Poisson process written here (its
points placed by count and radial law, not by arrival times), the circle's explicit
nearest-key law, uniform points on the sphere from normal vectors, a plain softmax, and
scipy's quadrature of the exact score law."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.integrate import quad
from scipy.special import exp1, gamma, softmax

from attnflow.analysis.closedforms import (
    cap_constant,
    cap_mass,
    critical_beta,
    limit_keys,
    limit_statistics,
    mean_kernel,
    nearest_gaps,
    poisson_gaps,
    sample_gaps,
    weight_statistics,
)

EULER = 0.5772156649015329


def _ein(t: float) -> float:
    """Ein(t) = int_0^t (1 - e^{-y}) / y dy = gamma_E + ln t + E_1(t)."""
    return EULER + np.log(t) + exp1(t) if t > 1e-8 else t


@pytest.mark.parametrize("d", [2, 3, 4, 5, 7])
def test_cap_constant_is_the_small_cap_mass(d):
    t = 1e-4
    assert cap_constant(d) == pytest.approx(float(cap_mass(t, d)) / t ** (d - 1), rel=1e-6)


def test_cap_constant_on_the_circle_and_s2():
    assert cap_constant(2) == pytest.approx(1 / np.pi, rel=1e-14)
    assert cap_constant(3) == pytest.approx(0.25, rel=1e-14)
    assert limit_keys(3, 2.0) == pytest.approx(0.25, rel=1e-14)  # c_3 (2/gamma)^1


@pytest.mark.parametrize("gamma_", [0.25, 1.0, 4.0])
def test_d3_closed_forms(gamma_):
    # On S^2 the shifted process above the nearest point is homogeneous of rate b whatever x:
    # E[max w] = int e^{-t - b Ein(t)} dt, E[sum w^2] = int t e^{-t - b Ein(t)}
    # (1 + b (1 - (1 + t) e^{-t}) / t^2) dt.
    b = limit_keys(3, gamma_)
    law = limit_statistics(3, gamma_)

    def a2(t):
        return 0.5 if t < 1e-6 else (1 - (1 + t) * np.exp(-t)) / t**2

    mw = quad(lambda t: np.exp(-t - b * _ein(t)), 0, np.inf, epsabs=1e-13, limit=200)[0]
    ipr = quad(lambda t: t * np.exp(-t - b * _ein(t)) * (1 + b * a2(t)), 0, np.inf,
               epsabs=1e-13, limit=200)[0]
    assert law.b == b
    assert law.max_weight == pytest.approx(mw, rel=1e-7)
    assert law.participation == pytest.approx(ipr, rel=1e-7)


def _poisson_mc(d: int, b: float, draws: int, rng: np.random.Generator,
                x_max: float = 25.0) -> dict[str, np.ndarray]:
    """The limit process on (0, x_max]: N ~ Poisson(b x_max^kappa) points, each at
    x = x_max U^{1/kappa} (the mean count below x is b x^kappa); plain numpy weights."""
    kappa = (d - 1) / 2
    counts = rng.poisson(b * x_max**kappa, size=draws)
    width = counts.max()
    x = x_max * rng.random((draws, width)) ** (1 / kappa)
    x[np.arange(width)[None, :] >= counts[:, None]] = np.inf
    x = x[counts > 0]
    e = np.exp(-(x - x.min(axis=1, keepdims=True)))
    w = e / e.sum(axis=1, keepdims=True)
    return {"max_weight": w.max(axis=1), "participation": (w**2).sum(axis=1),
            "effective_keys": 1 / (w**2).sum(axis=1)}


@pytest.mark.parametrize("d, gamma_", [(2, 0.1), (3, 0.5), (5, 1.5)])
def test_limit_statistics_against_a_monte_carlo_of_the_poisson_process(d, gamma_):
    rng = np.random.default_rng(11 + d)
    mc = _poisson_mc(d, limit_keys(d, gamma_), 10_000, rng)
    law = limit_statistics(d, gamma_)
    for name, values in mc.items():
        se = values.std(ddof=1) / np.sqrt(values.size)
        assert abs(values.mean() - getattr(law, name)) < 4.5 * se, name


def test_poisson_gaps_follow_the_same_law():
    d, gamma_ = 5, 1.5
    x = poisson_gaps(d, gamma_, 200, 8000, np.random.default_rng(3))  # x_200 about 24
    assert x.shape == (8000, 200) and np.all(np.diff(x, axis=1) > 0)
    got = weight_statistics(x, 1.0)["max_weight"]
    law = limit_statistics(d, gamma_)
    assert abs(got.mean() - law.max_weight) < 4.5 * got.std() / np.sqrt(got.size)


def test_the_two_degenerate_ends_of_the_limit_law():
    # gamma -> infinity (b -> 0): on S^2 one second point at z with rate b dz takes
    # e^{-z} / (1 + e^{-z}) of the weight, so 1 - E[max w] ~ b ln 2.
    law = limit_statistics(3, 500.0)
    assert (1 - law.max_weight) / law.b == pytest.approx(np.log(2), rel=2e-3)
    # gamma -> 0 (b -> infinity): the law of large numbers, E[1/sum w^2] ~ Gamma(kappa + 1)
    # 2^kappa b, approached as b grows.
    ratios = []
    for d in (2, 3, 5):
        kappa = (d - 1) / 2
        for b in (20.0, 200.0):
            g = 2 * (cap_constant(d) / b) ** (1 / kappa)
            ratios.append(limit_statistics(d, g).effective_keys / (gamma(kappa + 1) * 2**kappa
                                                                     * b))
    ratios = np.array(ratios).reshape(3, 2)
    assert np.all(np.abs(ratios[:, 1] - 1) < np.abs(ratios[:, 0] - 1))
    assert np.all(np.abs(ratios[:, 1] - 1) < 0.05)


def test_circle_gaps_and_the_nearest_key_law():
    rng = np.random.default_rng(5)
    n = 200
    # all gaps: 1 - cos(phi), phi uniform on the circle
    gaps = sample_gaps(n, 2, 20, rng).ravel()
    assert stats.kstest(gaps, lambda t: np.arccos(1 - t) / np.pi).pvalue > 1e-3
    # the nearest key: P(theta_1 > t) = (1 - t / pi)^n
    theta = np.arccos(1 - nearest_gaps(n, 2, 1, 4000, rng)[:, 0])
    assert stats.kstest(theta, lambda t: 1 - (1 - t / np.pi) ** n).pvalue > 1e-3


def test_gaps_on_s4_match_uniform_points_from_normal_vectors():
    rng = np.random.default_rng(8)
    z = rng.standard_normal((20_000, 5))
    truth = 1 - z[:, 0] / np.linalg.norm(z, axis=1)
    assert stats.ks_2samp(sample_gaps(1000, 5, 20, rng).ravel(), truth).pvalue > 1e-3
    # the nearest gaps: the order statistics of sorted full samples
    n, k = 50, 4
    near = nearest_gaps(n, 5, k, 4000, rng)
    sorted_full = np.sort(sample_gaps(n, 5, 4000, rng), axis=1)[:, :k]
    assert np.all(np.diff(near, axis=1) >= 0)
    for i in range(k):
        assert stats.ks_2samp(near[:, i], sorted_full[:, i]).pvalue > 1e-3


def test_weight_statistics_is_a_stable_softmax():
    rng = np.random.default_rng(1)
    gaps = rng.random((7, 30)) * 2
    for beta in (0.3, 40.0):
        w = softmax(-beta * gaps, axis=1)
        got = weight_statistics(gaps, beta)
        assert np.allclose(got["max_weight"], w.max(axis=1), rtol=1e-12)
        assert np.allclose(got["participation"], (w**2).sum(axis=1), rtol=1e-12)
        assert np.allclose(got["effective_keys"], 1 / (w**2).sum(axis=1), rtol=1e-12)
    huge = weight_statistics(gaps, 1e6)  # e^{-beta delta} underflows: the shift keeps it
    assert np.allclose(huge["max_weight"], 1.0) and np.all(np.isfinite(huge["effective_keys"]))


@pytest.mark.parametrize("d", [2, 3, 5, 8])
def test_mean_kernel_against_quadrature_of_the_score_law(d):
    # <q, k> has density proportional to (1 - s^2)^{(d-3)/2} on [-1, 1]
    norm = quad(lambda s: (1 - s * s) ** ((d - 3) / 2), -1, 1)[0]
    for beta in (0.5, 7.0, 60.0):
        want = quad(lambda s, beta=beta: np.exp(-beta * (1 - s)) * (1 - s * s) ** ((d - 3) / 2),
                    -1, 1,
                    epsabs=1e-15, points=[1 - 1 / beta] if beta > 1 else None)[0] / norm
        assert float(mean_kernel(d, beta)) == pytest.approx(want, rel=1e-8)


def test_critical_beta_and_errors():
    assert np.allclose(critical_beta([10, 100], 3, 2.0), [20.0, 200.0])
    assert np.allclose(critical_beta(100, 5, 1.0), 10.0)
    with pytest.raises(ValueError, match="d: expected an integer dimension >= 2"):
        cap_constant(1)
    with pytest.raises(ValueError, match="gamma: expected a finite number > 0"):
        limit_keys(3, 0.0)
    with pytest.raises(ValueError, match="k: expected at most n = 5 nearest keys"):
        nearest_gaps(5, 3, 6, 2)
    with pytest.raises(ValueError, match="beta: expected inverse temperatures > 0"):
        mean_kernel(3, [1.0, -1.0])
    with pytest.raises(ValueError, match="n: expected an integer >= 1"):
        sample_gaps(0, 3, 2)


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3, 5])
def test_a_million_keys_follow_the_limit_law(d):
    # n = 1e6 with the exact nearest-gap sampler, 8000 contexts; on S^4 the cap correction
    # (about -0.2 % of E[1/sum w^2] here, docs/science.md §11.4) is below one standard error.
    n, gamma_ = 10**6, 2 * (cap_constant(d) / 1.0) ** (2 / (d - 1))  # b = 1
    rng = np.random.default_rng(21 + d)
    k = int(np.ceil((np.log(n) + 30) ** ((d - 1) / 2))) + 16
    law = limit_statistics(d, gamma_)
    got = {name: [] for name in ("max_weight", "participation", "effective_keys")}
    for _ in range(8):
        st = weight_statistics(nearest_gaps(n, d, k, 1000, rng), float(critical_beta(n, d, gamma_)))
        for name in got:
            got[name].append(st[name])
    for name, parts in got.items():
        v = np.concatenate(parts)
        assert abs(v.mean() - getattr(law, name)) < 4 * v.std() / np.sqrt(v.size), name
