"""Particles and densities (docs/science.md §9, "Particles and densities"): tokens drawn from a
density (`attnflow.meanfield.sample`) against quadrature of the density, the particles'
Fourier moments against the von Mises closed form within their standard errors, the
Wasserstein distance on the circle against closed forms and a transport linear program, its
rates n^{-1/2} (i.i.d.) and pi / (2 n) (quantiles), and the bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import linprog
from scipy.special import ive

import attnflow as af
from attnflow.analysis.closedforms import inverse_cdf
from attnflow.analysis.moments import fourier_moments, wasserstein_circle
from attnflow.meanfield import from_function, sample, solve, token_labels

KAPPA = 2.0


def von_mises(kappa: float = KAPPA, modes: int = 48) -> np.ndarray:
    """Coefficients (1, K + 1) of rho ~ e^{kappa cos theta}: moments I_k(kappa) / I_0(kappa)."""
    return from_function(lambda t: np.exp(kappa * np.cos(t)), modes=modes)


def vm_moment(k, kappa: float = KAPPA):
    return ive(k, kappa) / ive(0, kappa)


def angles(x: np.ndarray) -> np.ndarray:
    return np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)


def density(c: np.ndarray):
    c = np.asarray(c)[0]
    k = np.arange(1, len(c))
    return lambda t: float(c[0].real + 2 * np.real(np.exp(1j * k * t) @ c[1:]))


# ---- inverse_cdf and from_function: the reported bugs ----------------------------------------

def test_inverse_cdf_takes_the_solvers_own_coefficients():
    c = from_function(lambda t: np.exp(np.cos(t)) + 0.3 * np.sin(2 * t) + 1, modes=128)
    assert c.shape == (1, 129)
    q = np.array([0.0, 0.01, 0.3, 0.5, 0.97])
    theta = inverse_cdf(c, q)
    rho = density(c)
    got = [quad(rho, 0.0, th, epsabs=1e-14, limit=200)[0] for th in theta]
    assert np.allclose(got, q, atol=1e-12)
    assert np.array_equal(theta, inverse_cdf(c[0], q))
    with pytest.raises(ValueError, match=r"^c: expected .*one row c\[j\]"):
        inverse_cdf(np.vstack([c, c]), q)


def test_from_function_with_two_arguments_needs_labels():
    with pytest.raises(ValueError, match="^labels: expected an integer S >= 1"):
        from_function(lambda s, t: 1 + s * np.cos(t), modes=16)
    with pytest.raises(ValueError, match="^labels: .*received 4 with f of 1 arguments"):
        from_function(lambda t: 1 + 0.5 * np.cos(t), modes=16, labels=4)
    assert from_function(lambda s, t: 1 + s * np.cos(t), modes=16, labels=4).shape == (4, 17)


# ---- sampling ----------------------------------------------------------------------------------

def test_quantile_draws_sit_at_the_quantiles_by_quadrature():
    c = von_mises()
    n = 7
    theta = angles(sample(c, n, method="quantile"))
    rho = density(c)
    got = [quad(rho, 0.0, th, epsabs=1e-14)[0] for th in theta]
    assert np.allclose(got, (np.arange(n) + 0.5) / n, atol=1e-12)


def test_causal_labels_draw_each_token_from_its_cell():
    S, n = 4, 40_000
    c = from_function(lambda s, t: np.exp(3 * s * np.cos(t)), modes=48, labels=S)
    x = sample(c, n, seed=3)
    assert np.allclose(token_labels(n)[[0, -1]], [1 / n, 1.0])
    for j in range(S):  # token i has label (i + 1) / n in cell ((j - 1) / S, j / S]
        cell = x[j * n // S:(j + 1) * n // S]
        m = fourier_moments(cell, 1)
        kappa = 3 * (j + 0.5) / S
        assert abs(m.mean[0].real - vm_moment(1, kappa)) < 4 * m.se_real[0]


def test_sample_from_a_result_at_a_saved_time_and_seeded():
    c = von_mises(modes=64)
    res = solve(af.Attention(beta=4.0, mask="full"), c, 0.5, save_at=[0.0, 0.25, 0.5])
    a, b = sample(res, 100, t=0.25, seed=1), sample(res, 100, t=0.25, seed=1)
    assert np.array_equal(a, b)
    q = sample(res, 50, t=0.25, method="quantile")
    assert np.allclose(q, sample(res.coefficients[1], 50, method="quantile"))
    assert np.allclose(sample(res, 50, method="quantile"),
                       sample(res.coefficients[-1], 50, method="quantile"))


@pytest.mark.parametrize("bad, message", [
    (dict(n=0), "^n: expected an integer number of tokens >= 1, received 0"),
    (dict(n=2.5), "^n: expected an integer"),
    (dict(method="sobol"), "^method: expected one of"),
    (dict(t=0.3), r"^t: expected None for coefficients"),
])
def test_sample_refuses_bad_arguments(bad, message):
    args = {"n": 10, **bad}
    with pytest.raises(ValueError, match=message):
        sample(von_mises(), args.pop("n"), **args)


def test_sample_refuses_a_negative_density_or_wrong_mass_or_an_unsaved_time():
    c = np.zeros((1, 9), dtype=complex)
    c[0, 0], c[0, 1] = 1 / (2 * np.pi), 0.3  # 1/(2 pi) + 0.6 cos theta < 0 near pi
    with pytest.raises(ValueError, match=r"^density: expected a density >= 0 everywhere"):
        sample(c, 10)
    with pytest.raises(ValueError, match=r"^density: expected densities of mass 1 .* "
                       r"received mass 1\.02"):
        sample(von_mises() * 1.02, 10)
    res = solve(af.Attention(beta=4.0, mask="full"), von_mises(modes=64), 0.5,
                save_at=[0.0, 0.5])
    for t in (0.7, -1.0, 0.2, float("nan")):
        with pytest.raises(ValueError, match=r"^t: expected one of the result's saved times "
                           r"in \[0, 0.5\]"):
            sample(res, 10, t=t)


# ---- moments -------------------------------------------------------------------------------------

def test_moments_lie_within_their_standard_errors_of_the_closed_form():
    """i.i.d. draws of the von Mises density (seed fixed): each of the 8 real and imaginary
    parts within 4 standard errors of I_k / I_0 (imaginary part 0). Under the null a 4-SE
    excursion has probability 6e-5 per part, 5e-4 for the 8 together, so a failure means a
    wrong sampler or a wrong error bar, not bad luck; and the standard errors themselves
    match the closed-form variances (Var cos k theta = (1 + m_2k) / 2 - m_k^2) to 5 %."""
    n, k = 20_000, np.arange(1, 5)
    m = fourier_moments(sample(von_mises(), n, seed=11), 4)
    assert m.n == n and np.array_equal(m.k, k)
    assert np.all(np.abs(m.mean.real - vm_moment(k)) < 4 * m.se_real)
    assert np.all(np.abs(m.mean.imag) < 4 * m.se_imag)
    var_cos = (1 + vm_moment(2 * k)) / 2 - vm_moment(k) ** 2
    var_sin = (1 - vm_moment(2 * k)) / 2
    assert np.allclose(m.se_real, np.sqrt(var_cos / n), rtol=0.05)
    assert np.allclose(m.se_imag, np.sqrt(var_sin / n), rtol=0.05)
    # the quantile draws are a midpoint rule: far inside the band
    q = fourier_moments(sample(von_mises(), n, method="quantile"), 4)
    assert np.allclose(q.mean, vm_moment(k), atol=1e-12)


def test_moments_take_batches_and_refuse_spheres():
    x = af.sphere.uniform((3, 50), 2, seed=0)
    m = fourier_moments(x, [1, 3])
    assert m.mean.shape == (3, 2)
    direct = np.exp(1j * 3 * np.arctan2(x[1, :, 1], x[1, :, 0])).mean()
    assert m.mean[1, 1] == pytest.approx(direct, abs=1e-14)
    with pytest.raises(ValueError, match="^x: expected points"):
        fourier_moments(af.sphere.uniform(10, 3, seed=0), 2)
    with pytest.raises(ValueError, match="^modes: expected"):
        fourier_moments(x, [0.5])


# ---- Wasserstein distance -----------------------------------------------------------------------

def uniform_density(modes: int = 8) -> np.ndarray:
    c = np.zeros(modes + 1, dtype=complex)
    c[0] = 1 / (2 * np.pi)
    return c


def points(theta: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def test_wasserstein_closed_forms_against_the_uniform_density():
    # one token: the mean geodesic distance to a uniform point, pi / 2
    assert wasserstein_circle(points(np.array([2.0])), uniform_density()) == pytest.approx(
        np.pi / 2, rel=1e-12)
    # n equally spaced tokens: each carries its arc of width 2 pi / n, n (pi / n)^2 / (2 pi)
    for n in (3, 10, 1000):
        theta = 0.7 + 2 * np.pi * np.arange(n) / n
        assert wasserstein_circle(points(theta), uniform_density()) == pytest.approx(
            np.pi / (2 * n), rel=1e-9)


def test_wasserstein_agrees_with_a_transport_linear_program():
    """A second implementation: the optimal transport LP between the tokens and the density
    lumped onto 720 angles (each carrying its cell's exact mass), geodesic cost. Lumping moves
    mass by at most half a cell, pi / 720, so the two agree to that."""
    c = von_mises(kappa=1.5, modes=32)
    theta = np.array([0.3, 1.0, 2.5, 4.0, 5.9])
    cells = 720
    edges = 2 * np.pi * np.arange(cells + 1) / cells
    rho = density(c)
    mass = np.array([quad(rho, a, b)[0] for a, b in zip(edges[:-1], edges[1:])])
    centres = (edges[:-1] + edges[1:]) / 2
    gap = np.abs(theta[:, None] - centres[None, :])
    cost = np.minimum(gap, 2 * np.pi - gap)
    n = len(theta)
    rows = np.kron(np.eye(n), np.ones(cells))  # each token sends 1 / n
    cols = np.kron(np.ones(n), np.eye(cells))  # each cell receives its mass
    lp = linprog(cost.ravel(), A_eq=np.vstack([rows, cols]),
                 b_eq=np.concatenate([np.full(n, 1 / n), mass]), bounds=(0, None),
                 method="highs")
    assert lp.status == 0
    assert wasserstein_circle(points(theta), c) == pytest.approx(lp.fun, abs=np.pi / cells)


def test_wasserstein_rates_iid_half_and_quantile_one():
    """log W1 against log n over n = 1e2..1e5: slope -1/2 for i.i.d. draws (W1 sqrt(n) tends
    to a Brownian-bridge functional; 8 draws per n leave the mean of log W1 uncertain by
    about 0.13, the slope by about 0.03, so +-0.1 is 4 standard errors) and -1 for quantile
    draws, where W1 = pi / (2 n) (1 + O(1/n)) (docs/science.md §9): both checked."""
    c = von_mises()
    ns = np.array([100, 1000, 10_000, 100_000])
    rng = np.random.default_rng(5)
    iid = [np.mean([np.log(wasserstein_circle(sample(c, n, seed=rng), c)) for _ in range(8)])
           for n in ns]
    quant = np.array([wasserstein_circle(sample(c, n, method="quantile"), c) for n in ns])
    slope_iid = np.polyfit(np.log(ns), iid, 1)[0]
    slope_q = np.polyfit(np.log(ns), np.log(quant), 1)[0]
    assert abs(slope_iid + 0.5) < 0.1, slope_iid
    assert abs(slope_q + 1.0) < 0.01, slope_q
    assert np.allclose(quant[1:] * 2 * ns[1:] / np.pi, 1.0, atol=1e-3)


def test_wasserstein_refuses_bad_input():
    with pytest.raises(ValueError, match="^c: expected a density of mass 1"):
        wasserstein_circle(points(np.array([0.0])), uniform_density() * 2)
    with pytest.raises(ValueError, match="^x: expected"):
        wasserstein_circle(af.sphere.uniform((2, 5), 2, seed=0), uniform_density())


# ---- density-based cluster counts ---------------------------------------------------------------

def clustered(k: int, per: int, spread: float, rng, masses=None) -> np.ndarray:
    """k tight clusters (normal angles of sd `spread`) at random equally spaced centres."""
    centres = rng.uniform(0, 2 * np.pi) + 2 * np.pi * np.arange(k) / k
    sizes = [per] * k if masses is None else masses
    return points(np.concatenate([c + spread * rng.standard_normal(m)
                                  for c, m in zip(centres, sizes)]))


def test_density_count_agrees_with_single_linkage_on_separated_clusters():
    """Clusters of sd 0.01 rad at least 2 pi / 9 = 0.7 rad apart, beta = 25 (w = 0.2): far
    tighter than w / 4 (single linkage's tolerance) and farther apart than 2 w."""
    from attnflow.analysis.clusters import cluster_count
    from attnflow.analysis.modes import density_cluster_count

    rng = np.random.default_rng(7)
    for k in range(1, 10):
        x = clustered(k, 40, 0.01, rng)
        assert density_cluster_count(x, 25.0) == cluster_count(x, 0.25 / 5) == k


def test_kde_against_the_direct_sum_and_the_mass_rule():
    from scipy.special import i0e

    from attnflow.analysis.modes import density_cluster_count, density_modes, kde_circle

    x = af.sphere.uniform(60, 2, seed=2)
    w = 0.2
    values = kde_circle(x, w)
    grid = 2 * np.pi * np.arange(len(values)) / len(values)
    theta = np.arctan2(x[:, 1], x[:, 0])
    direct = np.mean(np.exp((np.cos(grid[:, None] - theta) - 1) / w**2), axis=1) / (
        2 * np.pi * i0e(1 / w**2))
    assert np.abs(values - direct).max() < 1e-3 * direct.max()  # linear binning, h = 0.012
    # a cluster of 0.5 % of the tokens: counted only when the mass fraction allows it
    rng = np.random.default_rng(1)
    x = clustered(3, 0, 0.01, rng, masses=[597, 398, 5])
    assert density_cluster_count(x, 25.0) == 2
    assert density_cluster_count(x, 25.0, mass=0.001) == 3
    modes = density_modes(kde_circle(x, 0.2), mass=0.001)
    assert np.allclose(np.sort(modes.masses), [0.005, 0.398, 0.597], atol=2e-3)
    # uniform tokens at n = 1e5: one component, whatever the noise of the estimate
    assert np.all(density_cluster_count(af.sphere.uniform((2, 100_000), 2, seed=3), 100) == 1)


def test_density_peaks_of_a_mixture_and_of_its_draws_agree():
    """A density of k von Mises bumps (kappa 400, about 0.05 rad wide) of unequal masses (a
    factor up to 3), at least 2 pi / 11 - 0.1 = 0.47 rad = 3.8 w apart (beta = 64): its peak
    count from the coefficients, and the count of 1e5 tokens drawn from it, are k."""
    from attnflow.analysis.modes import density_cluster_count, density_peak_count

    rng = np.random.default_rng(4)
    for k in (2, 5, 11):
        centres = 2 * np.pi * np.arange(k) / k + rng.uniform(-0.05, 0.05, k)
        weights = rng.uniform(0.5, 1.5, k)
        c = from_function(lambda t, w=weights, m=centres: np.exp(
            400 * (np.cos(t[:, None] - m) - 1)) @ w, modes=512)
        assert density_peak_count(c, 64.0).count == k
        assert density_peak_count(c, width=0.0).count == k
        assert density_cluster_count(sample(c, 100_000, seed=k), 64.0) == k


def test_density_counts_refuse_bad_input():
    from attnflow.analysis.modes import density_cluster_count, density_modes

    x = af.sphere.uniform(20, 2, seed=0)
    with pytest.raises(ValueError, match="^beta: expected a finite beta != 0"):
        density_cluster_count(x, 0.0)
    with pytest.raises(ValueError, match="^beta, width: expected exactly one"):
        density_cluster_count(x, 4.0, width=0.1)
    with pytest.raises(ValueError, match="^points: expected an integer grid size"):
        density_cluster_count(x, 4.0, points=8)
    with pytest.raises(ValueError, match="^mass: expected a mass fraction"):
        density_modes(np.ones(16), mass=2.0)


# ---- the pictures -------------------------------------------------------------------------------

def test_moments_figure_draws_the_band_and_the_particles():
    pytest.importorskip("matplotlib")
    from attnflow.plot import plot_meanfield, plot_moments

    c = von_mises(modes=32)
    model = af.Attention(beta=4.0, mask="full")
    times = np.linspace(0, 0.5, 3)
    res = solve(model, c, 0.5, save_at=times)
    traj = af.simulate(model, sample(c, 300, seed=0), 0.5, save_at=times)
    fig = plot_moments(res, traj, modes=[1, 2])
    dots = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
    want = fourier_moments(traj.states, [1]).mean[:, 0]
    assert np.allclose(dots[0].get_ydata(), want.real) and np.allclose(dots[1].get_ydata(),
                                                                      want.imag)
    edge = fig.axes[0].collections[0].get_paths()[0].vertices  # Re m_1 +- 2 sd / sqrt(n)
    at0 = edge[edge[:, 0] == 0.0, 1]
    m1 = vm_moment(1)
    half = 2 * np.sqrt(((1 + vm_moment(2)) / 2 - m1**2) / 300)
    assert np.allclose([at0.min(), at0.max()], [m1 - half, m1 + half], rtol=1e-6)
    with pytest.raises(ValueError, match="^modes: expected"):
        plot_moments(res, traj, modes=[40])
    with pytest.raises(ValueError, match="^ax: expected None when particles are drawn"):
        plot_meanfield(res, particles=traj, ax=fig.axes[0])
