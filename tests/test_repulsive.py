"""beta < 0 (repulsive attention) through the package: every kernel through the model against
the dense kernel, the exact Jacobian against finite differences, the implicit methods against
a tight explicit run, the CLI, a sweep mixing signs, plots, the mean-field solver's growth
rates and the closed forms of analysis.family against quadrature (docs/science.md §9, §11.3)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import iv

import attnflow as af
from attnflow.analysis.closedforms import dispersion_rate, k_star, noise_threshold
from attnflow.analysis.clusters import default_cluster_tol, length_scale
from attnflow.meanfield import from_coefficients, solve
from attnflow.sphere import uniform

BETA = -3.0
BACKENDS = ["dense", "fused", "blocked", "torch", "harmonic"]


@pytest.mark.parametrize("mask", ["causal", "full"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kernel_agrees_with_dense_at_negative_beta(backend, mask):
    if backend == "torch":
        pytest.importorskip("torch")
    X = uniform((2, 40), 2, 3)
    ref = af.Attention(beta=BETA, mask=mask, backend="dense").field(X)
    got = af.Attention(beta=BETA, mask=mask, backend=backend).field(X)
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
    # on S^2 too (the harmonic kernel's spherical harmonics), with general Q, K, V
    Y = uniform(30, 3, 4)
    rng = np.random.default_rng(0)
    Q, K, V = (np.eye(3) + 0.3 * rng.standard_normal((3, 3)) for _ in range(3))
    ref = af.Attention(Q, K, V, beta=BETA, mask=mask, backend="dense").field(Y)
    if backend == "harmonic":  # needs queries and keys of one norm: Q = K = I
        Q = K = None
        ref = af.Attention(Q, K, V, beta=BETA, mask=mask, backend="dense").field(Y)
    got = af.Attention(Q, K, V, beta=BETA, mask=mask, backend=backend).field(Y)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)


def _numeric_jacobian(model, X, h=1e-6):
    n, d = X.shape
    J = np.zeros((n, d, n, d))
    for k in range(n):
        for b in range(d):
            E = np.zeros_like(X)
            E[k, b] = h
            J[:, :, k, b] = (model.tangent_field(X + E) - model.tangent_field(X - E)) / (2 * h)
    return J


@pytest.mark.parametrize("mask", ["causal", "full"])
def test_exact_jacobian_matches_finite_differences_at_negative_beta(mask):
    rng = np.random.default_rng(1)
    Q, K, V = (np.eye(3) + 0.4 * rng.standard_normal((3, 3)) for _ in range(3))
    model = af.Attention(Q, K, V, beta=-2.5, mask=mask)
    X = uniform(7, 3, 2)
    np.testing.assert_allclose(model.jacobian(X), _numeric_jacobian(model, X), rtol=0,
                               atol=1e-8)


@pytest.mark.parametrize("mask", ["causal", "full"])
@pytest.mark.parametrize("method", ["bdf", "radau", "lsoda"])
def test_implicit_methods_match_rk4_at_negative_beta(method, mask):
    model = af.Attention(beta=-2.0, mask=mask)
    x0 = uniform(5, 3, 5)
    save = [1.0, 3.0]
    ref = af.simulate(model, x0, 3.0, save_at=save, method="rk4", dt=0.005)
    got = af.simulate(model, x0, 3.0, save_at=save, method=method, rtol=1e-9, atol=1e-11)
    assert np.abs(ref.states[-1] - x0).max() > 0.05  # the tokens moved
    np.testing.assert_allclose(got.states, ref.states, atol=2e-6)


def test_cli_simulates_a_negative_beta_and_the_record_round_trips(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    out = tmp_path / "run.nc"
    res = CliRunner().invoke(app, ["simulate", "--n", "6", "--d", "2", "--beta", "-2", "--mask",
                                   "full", "--t-end", "2", "--dt", "0.1", "--no-progress",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "clusters" in res.output
    traj = af.load(out)
    assert traj.model.beta == -2.0 and traj.states.shape == (traj.times.size, 6, 2)
    again = af.simulate(traj.model, traj.states[0], 2.0, save_at=traj.times, dt=0.1)
    np.testing.assert_allclose(again.states, traj.states, atol=1e-12)


def test_sweep_with_a_beta_axis_of_both_signs():
    ds = af.sweep({"beta": [-4.0, 0.0, 4.0], "n": 8, "d": 2, "mask": "full", "t_end": 1.0,
                   "dt": 0.1, "seeds": 2}, {"states": True}, scheduler="serial")
    assert list(ds.beta.values) == [-4.0, 0.0, 4.0]
    X0 = ds.states.isel(time=0).values  # common random numbers: the same starts
    np.testing.assert_array_equal(X0[0], X0[2])
    # each run is the run of its own beta
    for i, beta in enumerate((-4.0, 4.0)):
        run = af.simulate(af.Attention(beta=beta, mask="full"), X0[2 * i, 0], 1.0,
                          save_at=ds.time.values, dt=0.1)
        np.testing.assert_allclose(ds.states.sel(beta=beta, seed=0).isel(time=-1).values,
                                   run.states[-1], atol=1e-12)
    assert int(ds.cluster_count.isel(time=0).min()) >= 1


def test_radii_use_the_absolute_length_scale():
    assert length_scale(-16.0) == length_scale(16.0) == 0.25
    assert length_scale(0.0) == np.inf
    assert default_cluster_tol(-16.0) == default_cluster_tol(16.0) == 1 / 16
    assert default_cluster_tol(0.0) == 1e-2


@pytest.mark.parametrize("kind", ["circle", "timeseries", "attention", "angles"])
def test_plots_of_a_negative_beta_run(kind):
    pytest.importorskip("matplotlib")
    from attnflow import plot

    tr = af.simulate(af.Attention(beta=-4.0, mask="causal"), uniform(10, 2, 0), 2.0,
                     save_at=[0.0, 1.0, 2.0], dt=0.1)
    fig = getattr(plot, f"plot_{kind}")(tr, figsize=(4, 3))
    assert fig.axes


def _quadrature_rate(k: int, beta: float, attention: str) -> float:
    """lambda_k by quadrature of the linearised velocity (docs/science.md §9): A = int e^{beta
    cos u} sin u sin(k u) du; softmax divides by Z_0 = int e^{beta cos u} du."""
    A = quad(lambda u: np.exp(beta * np.cos(u)) * np.sin(u) * np.sin(k * u), -np.pi, np.pi,
             epsabs=1e-13)[0]
    Z = quad(lambda u: np.exp(beta * np.cos(u)), -np.pi, np.pi, epsabs=1e-13)[0]
    return k * A / Z if attention == "softmax" else k * A / (2 * np.pi)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_dispersion_rate_at_negative_beta_against_quadrature(attention):
    for beta in (-0.3, -2.0, -7.0):
        for k in (1, 2, 3, 4):
            want = _quadrature_rate(k, beta, attention)
            assert dispersion_rate(k, beta, attention=attention) == pytest.approx(
                want, rel=1e-9, abs=1e-14)
            # the closed form: k^2 I_k(beta) / beta (times 1 / I_0 for softmax)
            closed = k * k * iv(k, beta) / beta / (iv(0, beta) if attention == "softmax" else 1)
            assert want == pytest.approx(closed, rel=1e-9)
            # the sign: odd modes grow, even modes decay
            assert (want > 0) == (k % 2 == 1)


def test_noise_threshold_and_k_star_at_negative_beta():
    np.testing.assert_allclose(noise_threshold([-5.0, -0.5]), noise_threshold([5.0, 0.5]))
    # mode 1 neutral at sigma^2 = 2 / kappa_c: the threshold is mode 1's, for beta < 0 too
    sigma = np.sqrt(2 / noise_threshold(-5.0))
    assert abs(dispersion_rate(1, -5.0, sigma=sigma)) < 1e-13
    assert np.all(dispersion_rate([2, 3, 4], -5.0, sigma=sigma) < 0)
    ks = np.arange(1, 40)
    for beta in (-30.0, -80.0):
        best = ks[np.argmax(ks**2 * iv(ks, beta) / beta)]
        assert k_star(beta) == best and best % 2 == 1


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_meanfield_solver_mode_rates_at_negative_beta(attention):
    """A small mode-k perturbation of the uniform density grows (odd k) or decays (even k) at
    k^2 I_k(beta) / (beta I_0(beta)) (softmax) or k^2 I_k(beta) / beta (unnormalised)."""
    beta, eps, t = -2.0, 1e-7, 2.0
    model = af.Attention(beta=beta, mask="full", attention=attention)
    for k in (1, 2, 3):
        c = np.zeros(17, dtype=complex)
        c[0], c[k] = 1 / (2 * np.pi), eps
        res = solve(model, from_coefficients(c), t, save_at=[0.0, t])
        rate = np.log(abs(res.coefficients[-1, 0, k]) / eps) / t
        closed = k * k * iv(k, beta) / beta / (iv(0, beta) if attention == "softmax" else 1)
        assert rate == pytest.approx(closed, rel=1e-5, abs=1e-7)


def test_two_token_interaction_and_its_maximiser_at_negative_beta():
    from attnflow.analysis.closedforms import g, h, tau_beta

    x = np.linspace(0.1, 3.0, 30)
    for beta in (-0.5, -3.0):
        np.testing.assert_allclose(g(x, beta), (h(x + 1e-6, beta) - h(x - 1e-6, beta)) / 2e-6,
                                   rtol=1e-7)
        fine = np.linspace(0, np.pi, 200_001)
        assert tau_beta(beta) == pytest.approx(fine[np.argmax(h(fine, beta))], abs=1e-4)
        assert tau_beta(beta) > np.pi / 2
    # pi - tau ~ |beta|^{-1/2} far out, computed without cancellation
    big = np.array([-1e4, -1e8, -1e12])
    np.testing.assert_allclose((np.pi - tau_beta(big)) * np.sqrt(-big), 1.0, rtol=1e-3)
    assert float(tau_beta(1e12)) * 1e6 == pytest.approx(1.0, rel=1e-3)


def test_equiangular_rhs_at_negative_beta_against_the_model():
    """d<x_i, x_k>/dt = <F_i, x_k> + <x_i, F_k> of the model's own field, at an exact
    equiangular start."""
    from attnflow.analysis.closedforms import equiangular_rhs, equiangular_start

    for attention in ("softmax", "unnormalised"):
        for rho in (-0.3, 0.4):
            X = equiangular_start(4, 5, rho)
            F = af.Attention(beta=-2.5, mask="full", attention=attention).field(X)
            want = F[0] @ X[1] + X[0] @ F[1]
            assert float(equiangular_rhs(rho, -2.5, 4, attention)[0]) == pytest.approx(
                want, rel=1e-12, abs=1e-14)


def test_live_explorer_settings_take_a_negative_beta():
    from attnflow.explorer.live import _settings

    assert _settings({"beta": -2, "mask": "full", "n": 8, "seed": 0})["beta"] == -2.0
    with pytest.raises(ValueError, match="beta"):
        _settings({"beta": float("nan"), "mask": "full", "n": 8, "seed": 0})


def test_explorer_pack_of_a_negative_beta_run_uses_the_absolute_length_scale():
    from attnflow.explorer import pack

    tr = af.simulate(af.Attention(beta=-16.0, mask="causal"), uniform(12, 2, 1), 1.0,
                     save_at=[0.0, 1.0], dt=0.1)
    packed = pack(tr)
    assert packed["delta"] == pytest.approx(1.0)  # 4 |beta|^{-1/2}
    np.testing.assert_allclose(packed["tol"], 1 / 16)  # |beta|^{-1/2} / 4
    assert packed["beta"] == [-16.0, -16.0]
