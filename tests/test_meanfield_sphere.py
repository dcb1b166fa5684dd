"""The mean-field solver on S^2 against independent truth: the velocity against direct
quadrature of the equation's integrals (numpy, a grid of the test's own) and against
attnflow's particle field (probes attending to quadrature nodes as weighted memory tokens);
the growth rates of the uniform state's harmonics against the Funk-Hecke closed form
(spherical Bessel functions, scipy), with noise and beta < 0; mass to round-off; the
resolution monitor; initial states; save/load; refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import spherical_in
from sphere_reference import density_at, quadrature

import attnflow as af
from attnflow.meanfield import from_coefficients, from_function, from_tokens, load, solve
from attnflow.meanfield.sphere import MASS0, TransportField2, lat_lon

V_GENERAL = np.array([[0.8, -0.5, 0.2], [0.3, 1.2, -0.4], [0.1, 0.6, 0.9]])


def harmonic_start(L: int, entries: dict[tuple[int, int], complex]) -> np.ndarray:
    """Coefficients (1, L + 1, L + 1) of 1 / (4 pi) plus the given (l, m) entries."""
    c = np.zeros((1, L + 1, L + 1), dtype=complex)
    c[0, 0, 0] = MASS0
    for (l, m), value in entries.items():
        c[0, l, m] = value
    return c






START = {(1, 0): 0.03, (1, 1): 0.02 - 0.01j, (2, 1): 0.05 + 0.02j, (3, 0): 0.04,
         (3, 3): -0.02j}


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
@pytest.mark.parametrize("beta", [-2.0, 0.0, 3.0])
def test_velocity_against_direct_quadrature(attention, beta):
    L = 10
    c = harmonic_start(L, START)
    field = TransportField2(beta, V_GENERAL, attention, 1, L)
    y, w = quadrature(40)
    rho = density_at(c[0], y) * w
    x = field.grid.points.reshape(-1, 3)
    E = np.exp(beta * x @ y.T)
    N = (E * rho) @ y
    U = N @ V_GENERAL.T
    v = U - np.sum(U * x, axis=1, keepdims=True) * x
    if attention == "softmax":
        v /= (E * rho).sum(axis=1, keepdims=True)
    v_theta, v_phi = field.velocity(c)
    e_theta, e_phi = field.grid.frames
    mine = (v_theta[0, ..., None] * e_theta + v_phi[0, ..., None] * e_phi).reshape(-1, 3)
    assert np.abs(mine - v).max() < 1e-12 * np.abs(v).max()


def test_velocity_is_the_limit_of_attnflow_particles():
    # Probes at the solver's grid points see no token (all-False mask) and attend to memory
    # tokens at quadrature nodes of the test's own rule, whose multiplicities are the
    # weights times the density: attnflow's softmax particle field is then the quadrature
    # of the mean field's velocity integrals.
    L = 10
    c = harmonic_start(L, START)
    field = TransportField2(2.5, V_GENERAL, "softmax", 1, L)
    probes = field.grid.points.reshape(-1, 3)
    y, w = quadrature(36)
    model = af.Attention(beta=2.5, V=V_GENERAL, mask=np.zeros((len(probes),) * 2, bool),
                         memory=(y, density_at(c[0], y) * w), backend="dense")
    particles = model.field(probes)
    v_theta, v_phi = field.velocity(c)
    e_theta, e_phi = field.grid.frames
    mine = (v_theta[0, ..., None] * e_theta + v_phi[0, ..., None] * e_phi).reshape(-1, 3)
    assert np.abs(mine - particles).max() < 1e-11 * np.abs(particles).max()


def derived_rate(l: int, beta: float, weighting: str, sigma: float = 0.0,
                 lam: float = 1.0) -> float:
    """Degree l of the uniform state grows at l (l + 1) lam i_l(beta) / beta, divided by
    i_0(beta) for softmax, minus sigma^2 l (l + 1) / 2 (V = lam I; docs/science.md §9)."""
    rate = lam * l * (l + 1) * spherical_in(l, beta) / beta
    if weighting == "softmax":
        rate /= spherical_in(0, beta)
    return rate - sigma**2 * l * (l + 1) / 2


@pytest.mark.parametrize("weighting, beta, l, m", [
    ("softmax", 9.0, 1, 0), ("softmax", 9.0, 2, 1), ("softmax", 4.0, 5, 3),
    ("unnormalised", 3.0, 1, 1), ("unnormalised", 3.0, 4, 2), ("softmax", -3.0, 3, 0)])
def test_growth_rate_of_a_harmonic_of_the_uniform_state(weighting, beta, l, m):
    lam = derived_rate(l, beta, weighting)
    L = max(8, 2 * l)
    T = min(1 / abs(lam), 3.0)
    eps = 1e-10
    res = solve(af.Attention(beta=beta, mask="full", attention=weighting),
                harmonic_start(L, {(l, m): eps}), T, save_at=[0.0, T])
    measured = np.log(abs(res.coefficients[-1, 0, l, m]) / eps) / T
    assert res.resolution_lost_at is None
    assert abs(measured - lam) <= 1e-6 * abs(lam), (measured, lam)


def test_noise_and_value_scale_enter_the_rate_as_derived():
    beta, sigma, lam_v = 6.0, 0.7, 1.5
    for l in (1, 2):
        lam = derived_rate(l, beta, "unnormalised", sigma, lam_v)
        T = 1 / abs(lam)
        res = solve(af.Attention(beta=beta, mask="full", attention="unnormalised",
                                 V=lam_v * np.eye(3)),
                    harmonic_start(10, {(l, 1): 1e-10}), T, save_at=[0.0, T], noise=sigma)
        measured = np.log(abs(res.coefficients[-1, 0, l, 1]) / 1e-10) / T
        assert abs(measured - lam) <= 1e-6 * abs(lam), (l, measured, lam)


def test_mass_is_conserved_and_resolution_loss_stops_the_run():
    c = from_function(lambda x: np.exp(0.3 * x[..., 2] + 0.2 * x[..., 0]), 24, d=3)
    res = solve(af.Attention(beta=9, mask="full"), c, 40.0)
    assert res.resolution_lost_at is not None  # clusters at beta = 9 outgrow degree 24
    mass = res.coefficients[:, 0, 0, 0] / MASS0
    assert np.abs(mass - 1).max() < 1e-13
    assert af.meanfield.sphere.tail(res.coefficients[-1]).max() <= res.settings["tol"]
    # the last resolved density has gathered: the order parameter |int x rho| grew
    r = np.abs(res.coefficients[:, 0, 1, :2]).sum(axis=-1)
    assert r[-1] > 2 * r[0]


def test_initial_states_from_tokens_functions_and_coefficients_agree():
    kappa = 1.2
    f = lambda x: np.exp(kappa * x[..., 2])  # noqa: E731
    c = from_function(f, 14, d=3)
    # closed form: e^{kappa cos theta} = sum_l (2 l + 1) i_l(kappa) P_l(cos theta), so
    # c_l0 = sqrt(4 pi (2 l + 1)) i_l(kappa) / (4 pi i_0(kappa)) after normalisation
    l = np.arange(15)
    exact = np.sqrt(4 * np.pi * (2 * l + 1)) * spherical_in(l, kappa) / (
        4 * np.pi * spherical_in(0, kappa))
    assert np.abs(c[0, :, 0] - exact).max() < 1e-14
    assert np.abs(c[0, :, 1:]).max() < 1e-14
    np.testing.assert_array_equal(from_coefficients(c), c)
    x = af.sphere.uniform(4000, d=3, seed=1)
    tok = from_tokens(x, 12, width=1.0)
    # the smoothed empirical measure of uniform tokens: each coefficient within a few of its
    # standard errors, e^{-l(l+1)/2} / sqrt(n) at most
    assert np.abs(tok[0, 1:]).max() < 5 * np.exp(-1) / np.sqrt(4000)


def test_result_saves_loads_and_gives_densities(tmp_path):
    c = from_function(lambda x: np.exp(x[..., 0]), 24, d=3)
    res = solve(af.Attention(beta=2, mask="full"), c, 1.0, save_at=[0.0, 0.5, 1.0])
    assert res.resolution_lost_at is None
    for name in ("r.nc", "r.zarr"):
        back = load(res.save(tmp_path / name))
        np.testing.assert_array_equal(back.coefficients, res.coefficients)
        assert back.d == 3
    grid = lat_lon(32)
    dens = res.density(32)
    assert dens.shape == (3, 1, 16, 32)
    expected = np.exp(grid[..., 0]) / (4 * np.pi * spherical_in(0, 1.0))
    assert np.abs(dens[0, 0] - expected).max() < 1e-8 * expected.max()


@pytest.mark.parametrize("options, rho0, match", [
    ({"beta": 2, "Q": np.diag([1.0, 2.0, 1.0])}, None, "Q, K"),
    ({"beta": 2, "Q": np.eye(2)}, None, "d"),
    ({"beta": 2}, "circle", "d"),
])
def test_refusals_name_what_is_supported(options, rho0, match):
    c = harmonic_start(6, {}) if rho0 is None else np.array([1 / (2 * np.pi), 0, 0, 0, 0])
    model = af.Attention(**options) if rho0 is None else af.Attention(Q=np.eye(3), **options)
    with pytest.raises(ValueError, match=match):
        solve(model, c, 1.0)


def test_bad_sphere_inputs_are_refused():
    with pytest.raises(ValueError, match="labels"):
        from_function(lambda x: 1 + 0 * x[..., 0], 8, labels=4, d=3)
    with pytest.raises(ValueError, match="d"):
        from_function(lambda x: 1 + 0 * x[..., 0], 8, d=1)
    bad = harmonic_start(6, {})
    bad[0, 1, 3] = 0.1  # m > l
    with pytest.raises(ValueError, match="m > l"):
        from_coefficients(bad)
    with pytest.raises(ValueError, match="mass"):
        from_coefficients(2 * harmonic_start(6, {}))
    with pytest.raises(ValueError, match="resolved"):
        from_tokens(af.sphere.uniform(50, d=3, seed=0), 6, width=0.05)


def test_mean_direction_against_quadrature():
    from attnflow.meanfield.sphere import mean_direction

    c = harmonic_start(6, START)
    y, w = quadrature(12)
    direct = (density_at(c[0], y) * w) @ y
    np.testing.assert_allclose(mean_direction(c[0]), direct, rtol=0, atol=1e-15)


def test_zonal_states_take_the_axisymmetric_path_with_the_same_result():
    c = from_function(lambda x: np.exp(1.5 * x[..., 2]), 20, d=3)
    model = af.Attention(beta=3, mask="full", attention="unnormalised", strength=0.5)
    res = solve(model, c, 1.0, save_at=[0.0, 1.0], noise=1.0)
    assert res.settings["axisymmetric"] is True
    generic = c.copy()
    generic[0, 3, 2] = 1e-9  # an order m > 0: the general path
    other = solve(model, generic, 1.0, save_at=[0.0, 1.0], noise=1.0)
    assert other.settings["axisymmetric"] is False
    # the m = 0 column evolves alone to first order in the 1e-9 perturbation
    assert np.abs(other.coefficients[-1, 0, :, 0] - res.coefficients[-1, 0, :, 0]).max() < 1e-12


def test_harmonic_power_of_uniform_tokens_has_mean_one_over_n():
    from attnflow.experiments.funkhecke import harmonic_power

    n, runs = 200, 400
    x = af.sphere.uniform((runs, n), 3, np.random.default_rng(3))
    p = harmonic_power(x, 4) * n  # (runs, 4), each of mean 1 (a sum of 2l + 1 squares)
    se = p.std(axis=0, ddof=1) / np.sqrt(runs)
    assert np.all(np.abs(p.mean(axis=0) - 1) < 4 * se), (p.mean(axis=0), se)
