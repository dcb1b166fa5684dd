"""The mean-field solver against independent truth (docs/science.md §9): the growth rates of
the uniform state's modes (Bessel functions), exact mass conservation, the resolution
monitor, the noisy Kuramoto state's self-consistency root (scipy.optimize.brentq), the causal
linearisation's closed form (the Hardy operator's exponential by quadrature), and attnflow's
own particles: their field (general Q, K, V, both weightings, causal labels) and their
moments in time."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import i0e, i1e, iv

import attnflow as af
from attnflow.meanfield import from_coefficients, from_function, from_tokens, load, solve, tail
from attnflow.meanfield.model import MeanFieldModel
from attnflow.meanfield.spectral import TransportField

TWO_PI = 2 * np.pi


def uniform_plus(modes: int, k: int, eps: complex, labels: int = 1) -> np.ndarray:
    """Coefficients (labels, K + 1) of 1/(2 pi) + 2 Re(eps e^{i k theta}) (eps per label)."""
    c = np.zeros((labels, modes + 1), dtype=complex)
    c[:, 0] = 1 / TWO_PI
    c[:, k] = eps
    return c


def derived_rate(k: int, beta: float, weighting: str, sigma: float = 0.0) -> float:
    """lambda_k of the uniform state (Q = K = V = I): k^2 I_k(beta) / beta, divided by
    I_0(beta) for softmax, minus sigma^2 k^2 / 2."""
    rate = k * k * iv(k, beta) / beta
    if weighting == "softmax":
        rate /= iv(0, beta)
    return rate - sigma**2 * k * k / 2


# ---------------------------------------------------------------- 1. linear growth rates
@pytest.mark.parametrize("weighting", ["softmax", "unnormalised"])
@pytest.mark.parametrize("beta", [9.0, 25.0, 64.0])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_growth_rate_of_a_mode_of_the_uniform_state(weighting, beta, k):
    lam = derived_rate(k, beta, weighting)
    modes = max(6, 2 * k)
    # The mode grows at most e-fold (from 1e-7 relative: far from nonlinear), and the
    # fastest mode of the K at most e^5-fold: every mode of the uniform state grows, from
    # round-off (1e-24 here) too, which must stay far below the measured one.
    fastest = max(derived_rate(j, beta, weighting) for j in range(1, modes + 1))
    T = min(1 / lam, 5 / fastest)
    eps = 1e-7 / TWO_PI
    res = solve(af.Attention(beta=beta, mask="full", attention=weighting),
                uniform_plus(modes, k, eps), T, save_at=[0.0, T])
    measured = np.log(abs(res.coefficients[-1, 0, k]) / eps) / T
    assert res.resolution_lost_at is None
    assert abs(measured - lam) <= 1e-6 * lam, (measured, lam)
    # the mode stays a real cosine: no drift of the phase
    assert abs(np.angle(res.coefficients[-1, 0, k])) < 1e-9


def test_growth_rate_with_noise_drops_by_sigma_squared_k_squared_over_two():
    beta, sigma = 9.0, 0.5
    for k in (1, 2):
        lam = derived_rate(k, beta, "softmax", sigma)
        T = 10.0
        res = solve(af.Attention(beta=beta, mask="full"), uniform_plus(12, k, 1e-8), T,
                    save_at=[0.0, T], noise=sigma)
        measured = np.log(abs(res.coefficients[-1, 0, k]) / 1e-8) / T
        assert abs(measured - lam) <= 1e-6 * abs(lam), (k, measured, lam)


# ---------------------------------------------------------------- 2. mass and resolution
def bump(kappa: float, at: float = 0.0):
    """theta -> e^{kappa cos(theta - at)} (a smooth bump; from_function normalises it)."""
    return lambda theta: np.exp(kappa * np.cos(theta - at))


def test_mass_is_conserved_to_round_off():
    rng = np.random.default_rng(3)
    rho0 = from_function(lambda s, t: bump(1.5, 0.3)(t) + s * bump(2.0, 2.0)(t), 32, labels=8)
    model = af.Attention(beta=4.0, mask="causal", V=rng.standard_normal((2, 2)),
                         attention="unnormalised")
    res = solve(model, rho0, 2.0, noise=0.3, save_at=np.linspace(0, 2, 5))
    P = 128
    mass = res.density(P).sum(axis=-1) * TWO_PI / P  # trapezoid rule: exact for K < P / 2
    assert np.abs(mass - 1).max() < 1e-14
    assert np.abs(res.coefficients[..., 0] - 1 / TWO_PI).max() < 1e-16
    assert np.abs(res.coefficients[-1] - res.coefficients[0]).max() > 1e-3  # it did move


def test_clustering_run_stops_where_resolution_is_lost_and_returns_resolved_states():
    model = af.Attention(beta=9.0, mask="full")
    coarse = solve(model, from_function(bump(2.0), 64), 30.0)
    assert coarse.resolution_lost_at is not None
    assert 2.0 < coarse.resolution_lost_at < 30.0
    assert coarse.times[-1] <= coarse.resolution_lost_at
    assert coarse.resolution_lost_at - coarse.times[-1] <= coarse.settings["dt"] * (1 + 1e-9)
    assert tail(coarse.coefficients[-1]).max() <= 1e-8
    assert coarse.density(512).min() * TWO_PI >= -1e-8
    # twice the modes resolve the collapsing bump for longer...
    fine = solve(model, from_function(bump(2.0), 128), 30.0, save_at=[coarse.times[-1]])
    assert fine.resolution_lost_at > coarse.resolution_lost_at + 0.3
    # ...and agree with the last state the coarse run returned to its tail bound: not
    # garbage (measured: 2e-11)
    diff = np.abs(fine.coefficients[1, 0, :65] - coarse.coefficients[-1, 0])
    assert diff.max() * TWO_PI < 1e-8


def test_refinement_doubles_the_modes_where_resolution_would_be_lost():
    model = af.Attention(beta=9.0, mask="full")
    direct = solve(model, from_function(bump(2.0), 128), 30.0)
    refined = solve(model, from_function(bump(2.0), 32), 30.0, refine_to=128)
    assert [K for _, K in refined.settings["refinements"]] == [64, 128]
    assert refined.settings["modes"] == 128 and refined.coefficients.shape[-1] == 129
    # 32 modes resolve the bump until t ~ 2, 64 until t ~ 3.2 (the test above)
    assert 1.0 < refined.settings["refinements"][0][0] < refined.settings["refinements"][1][0]
    # the refined run is the 128-mode run: same loss of resolution, same states
    assert abs(refined.resolution_lost_at - direct.resolution_lost_at) <= direct.settings["dt"]
    last = min(refined.times[-1], direct.times[-1])
    i, j = (int(np.flatnonzero(r.times == last)[0]) for r in (refined, direct))
    assert np.abs(refined.coefficients[i] - direct.coefficients[j]).max() * TWO_PI < 1e-8
    with pytest.raises(ValueError, match="refine_to"):
        solve(model, from_function(bump(2.0), 32), 1.0, refine_to=16)


# ---------------------------------------------------------------- 3. noisy Kuramoto
def test_noisy_beta_zero_state_solves_the_kuramoto_self_consistency():
    # beta = 0: every weight 1/n, the velocity is r sin(psi - theta) (r e^{i psi} the mean
    # of e^{i theta}); with noise sigma the stationary density is proportional to
    # e^{kappa r cos(theta - psi)}, kappa = 2 / sigma^2, so r = I_1(kappa r) / I_0(kappa r),
    # a root r > 0 iff kappa > 2 (sigma < 1).
    sigma = 0.6
    kappa = 2 / sigma**2
    r = brentq(lambda r: r - i1e(kappa * r) / i0e(kappa * r), 1e-3, 1.0)
    res = solve(af.Attention(beta=0.0, mask="full"), from_function(bump(1.0, 0.4), 24), 30.0,
                noise=sigma, save_at=[0.0, 30.0])
    m1 = res.moments(1)[-1, 0]
    assert abs(abs(m1) - r) < 1e-8
    k = np.arange(25)
    von_mises = iv(k, kappa * r) / iv(0, kappa * r) / TWO_PI * np.exp(-1j * k * np.angle(m1))
    assert np.abs(res.coefficients[-1, 0] - von_mises).max() * TWO_PI < 1e-8


# ---------------------------------------------------------------- 4. causal linearisation
def psi(tau: float, y: float) -> float:
    """sum_m tau^{m+1} y^m / (m! (m+1)!) = sqrt(tau / y) I_1(2 sqrt(tau y)) (psi(tau, 0) =
    tau)."""
    return tau if y <= 0 else np.sqrt(tau / y) * iv(1, 2 * np.sqrt(tau * y))


def profile(s):
    return np.exp(-0.5 * ((s - 0.5) / 0.08) ** 2)


def causal_exact(s: float, tau: float, weighting: str) -> float:
    """exp(tau H) applied to `profile` at s: H = the Hardy operator (1/s) int_0^s (softmax),
    the Volterra operator int_0^s (unnormalised); their powers' kernels sum to psi."""
    if weighting == "softmax":
        kernel = lambda sp: psi(tau, np.log(s / sp)) / s  # noqa: E731
    else:
        kernel = lambda sp: psi(tau, s - sp)  # noqa: E731
    integral = quad(lambda sp: kernel(sp) * profile(sp), 0, s, epsabs=1e-14, epsrel=1e-12,
                    limit=200)[0]
    return profile(s) + integral


@pytest.mark.parametrize("weighting, sigma", [("softmax", 0.0), ("softmax", 0.3),
                                              ("unnormalised", 0.0)])
def test_causal_linear_regime_follows_the_hardy_operator(weighting, sigma):
    beta, k = 9.0, 2
    lam = derived_rate(k, beta, weighting)  # the rate of the full mask's mode k
    T = 3 / lam
    errors = []
    for S in (32, 64):
        s = (np.arange(S) + 0.5) / S
        a = 1e-9
        res = solve(af.Attention(beta=beta, mask="causal", attention=weighting),
                    uniform_plus(8, k, a * profile(s), labels=S), T,
                    save_at=[0.0, T], noise=sigma)
        got = res.coefficients[-1, :, k] / a
        exact = np.exp(-sigma**2 * k * k * T / 2) * np.array(
            [causal_exact(x, lam * T, weighting) for x in s])
        assert np.abs(got.imag).max() < 1e-12
        errors.append(np.abs(got.real - exact).max() / np.abs(exact).max())
    # second order in the label cells' width 1/S
    assert errors[1] < 2e-3
    assert 3.6 < errors[0] / errors[1] < 4.4, errors


# ------------------------------------------------- the velocity against attnflow's particles
def quantiles(c: np.ndarray, n: int) -> np.ndarray:
    """n angles at the quantiles (i + 1/2) / n of the density with coefficients c (K + 1,)
    (inverting its distribution function by brentq)."""
    k = np.arange(1, len(c))

    def cdf(theta: float) -> float:
        return c[0].real * theta + 2 * np.real(np.sum(c[1:] * np.expm1(1j * k * theta)
                                                      / (1j * k)))

    return np.array([brentq(lambda t, u=u: cdf(t) - u, 0.0, TWO_PI, xtol=1e-15)
                     for u in (np.arange(n) + 0.5) / n])


def circle(theta: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def particle_velocity(options: dict, c: np.ndarray, per_label: int, probes: np.ndarray
                      ) -> np.ndarray:
    """The angular velocity (S, P) that attnflow's particle field gives probe tokens at the
    angles `probes`, where tokens at the quantiles of each label's density stand for it. A
    boolean mask lets a probe of label cell m see what the mean field's label m sees: every
    token (full mask), or the cells before m and every other token of cell m (half of it, by
    a shifted quantile rule); probes are seen by no one. Unnormalised weights divide by all
    N tokens, probes included: rescaled to the tokens standing for the density."""
    S = c.shape[0]
    tokens = np.concatenate([quantiles(c[m], per_label) for m in range(S)])
    n, P = len(tokens), len(probes)
    N = n + S * P
    allowed = np.zeros((N, N), dtype=bool)
    allowed[:n, :n] = True  # the density tokens' own rows: anything valid
    label = np.repeat(np.arange(S), per_label)
    for m in range(S):
        rows = slice(n + m * P, n + (m + 1) * P)
        if S == 1:
            allowed[rows, :n] = True
        else:
            allowed[rows, :n] = (label < m) | ((label == m) & (np.arange(n) % 2 == 0))
    model = af.Attention(mask=allowed, backend="dense", **options)
    x = circle(np.concatenate([tokens, np.tile(probes, S)]))
    F = model.field(x)[n:].reshape(S, P, 2)
    x = x[n:].reshape(S, P, 2)
    omega = x[..., 0] * F[..., 1] - x[..., 1] * F[..., 0]
    if options.get("attention") == "unnormalised":
        omega *= N / n
    return omega


def rotation(a: float) -> np.ndarray:
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


REFLECTION = np.array([[np.cos(1.1), np.sin(1.1)], [np.sin(1.1), -np.cos(1.1)]])
V_GENERAL = np.array([[0.8, -0.5], [0.3, 1.2]])


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
@pytest.mark.parametrize("Q, K", [(None, None), (2 * rotation(0.3), 0.7 * rotation(-0.4)),
                                  (1.5 * rotation(0.2), 0.8 * REFLECTION)])
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_velocity_is_the_limit_of_attnflow_particles(attention, Q, K, mask):
    S = 1 if mask == "full" else 3
    rho0 = from_function(lambda s, t: bump(1.2, 0.5)(t) + (1 + s) * bump(0.8, 2.5 + s)(t),
                         24, labels=S)
    options = {"Q": Q, "K": K, "V": V_GENERAL, "beta": 2.0, "attention": attention}
    field = TransportField(MeanFieldModel.of({**options, "mask": mask}), S, 24)
    probes = TWO_PI * np.arange(field.points) / field.points
    mean_field = field.velocity(rho0)
    particles = particle_velocity(options, rho0, 400, probes)
    # quantile tokens integrate smooth periodic functions spectrally: 400 per label suffice
    assert np.abs(mean_field - particles).max() < 1e-9 * np.abs(mean_field).max()


def test_moments_follow_attnflow_particles_from_quantile_starts():
    # Tokens at the quantiles of rho0 stay at the quantiles of rho_t (the flow keeps their
    # order), and the quantile rule integrates smooth periodic functions spectrally: the
    # moments' gap measured at t = 1 is 3e-5 (n = 250), 2e-8 (n = 500) and 8e-9 (n = 1000
    # and 2000 alike: the particles' RK4 error at dt = 0.05), far below O(1/n).
    rho0 = from_function(lambda t: bump(2.0)(t) + 0.6 * bump(3.0, 2.5)(t), 64)
    model = af.Attention(beta=9.0, mask="full")
    traj = af.simulate(model, circle(quantiles(rho0[0], 1000)), 1.0, save_at=[0.0, 1.0],
                       dt=0.05)
    res = solve(model, rho0, 1.0, save_at=[0.0, 1.0])
    theta = np.arctan2(traj.states[..., 1], traj.states[..., 0])
    for k in range(1, 6):
        particles = np.mean(np.exp(1j * k * theta), axis=-1)
        assert np.abs(particles - res.moments(k)[:, 0]).max() < 5e-8, k
    assert abs(res.moments(1)[1, 0] - res.moments(1)[0, 0]) > 0.02  # it did move


# ---------------------------------------------------------------- results on disk
@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_result_saves_and_loads_bit_identically(tmp_path, suffix):
    model = af.Attention(beta=3.0, mask="causal", V=V_GENERAL, attention="unnormalised")
    rho0 = from_function(lambda s, t: bump(1.0 + s)(t), 24, labels=4)
    res = solve(model, rho0, 0.02, save_at=[0.0, 0.01], noise=0.2, path=tmp_path / f"r{suffix}")
    back = load(tmp_path / f"r{suffix}")
    assert np.array_equal(back.coefficients, res.coefficients)
    assert np.array_equal(back.times, res.times)
    assert back.settings == res.settings and back.resolution_lost_at is None
    assert np.array_equal(back.model.heads[0][2], V_GENERAL)
    assert back.model.mask == "causal" and back.model.weighting.method == "unnormalised"
    assert np.array_equal(back.labels, (np.arange(4) + 0.5) / 4)
    ds = res.to_xarray()
    assert ds["real"].dims == ("time", "label", "mode") and ds.sizes["mode"] == 25


def test_an_interrupted_run_leaves_no_file(tmp_path, monkeypatch):
    import attnflow.meanfield.solver as solver

    calls = []
    step = solver.rk4_step

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(solver, "rk4_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        solve(af.Attention(beta=1.0, mask="full"), from_function(bump(1.0), 32), 5.0,
              path=tmp_path / "run.nc")
    assert len(calls) == 20
    assert list(tmp_path.iterdir()) == []


def test_load_refuses_other_files(tmp_path):
    traj = af.simulate(af.Attention(beta=1.0), af.sphere.uniform(4, d=2, seed=0), 0.1)
    traj.save(tmp_path / "t.nc")
    with pytest.raises(ValueError, match="without the 'attnflow_meanfield' record"):
        load(tmp_path / "t.nc")
    with pytest.raises(ValueError, match="ending in one of"):
        load(tmp_path / "t.h5")


# ---------------------------------------------------------------- initial states
def test_initial_states_from_tokens_coefficients_and_functions_agree():
    exact = from_function(bump(1.5, 1.0), 24)
    theta = quantiles(exact[0], 1000)  # tokens of that density (spectrally exact moments)
    width = 0.05
    c = from_tokens(circle(theta), 24, width)
    k = np.arange(25)
    # the smoothing multiplies mode k by e^{-k^2 w^2 / 2}; quantiles are spectrally exact
    assert np.abs(c - exact * np.exp(-0.5 * (k * width) ** 2)).max() < 1e-12
    assert np.array_equal(from_coefficients(c[0]), c)
    labelled = from_tokens(circle(np.concatenate([theta, theta + 1])), 24, width, labels=2)
    assert np.allclose(labelled[1], c[0] * np.exp(-1j * k), atol=1e-15)


@pytest.mark.parametrize("options, match", [
    ({"mask": ("window", 3)}, "mask 'full' or 'causal'"),
    ({"mask": "full", "attention": "sinkhorn"},
     "attention 'softmax', 'unnormalised' or 'positional'"),
    ({"mask": "full", "Q": np.diag([1.0, 2.0])}, "Q\\^T K a multiple of an orthogonal"),
    ({"mask": "full", "Q": np.eye(3)}, "d = 2"),
    ({"mask": "full", "norm": "pre"}, "norm 'post'"),
    ({"mask": "full", "rope": 100.0}, "positional encodings"),
    ({"mask": "full", "heads": [(None, None, None)] * 2}, "one \\(Q, K, V\\) head"),
])
def test_unsupported_settings_name_what_is_supported(options, match):
    with pytest.raises(ValueError, match=match):
        solve(options, from_function(bump(1.0), 16), 1.0)


def test_bad_densities_and_steps_are_refused():
    model = af.Attention(beta=1.0, mask="full")
    with pytest.raises(ValueError, match="mass 1"):
        solve(model, np.array([1.0, 0, 0, 0, 0]), 1.0)
    with pytest.raises(ValueError, match="resolved by its 16 modes"):
        solve(model, from_function(bump(40.0), 64)[:, :17], 1.0)
    with pytest.raises(ValueError, match="enough modes to resolve f"):
        from_function(bump(40.0), 16)
    with pytest.raises(ValueError, match="values >= 0"):
        from_function(np.sin, 16)
    with pytest.raises(ValueError, match="one density"):
        solve(model, from_function(lambda s, t: bump(1.0)(t), 16, labels=2), 1.0)
    with pytest.raises(ValueError, match="Courant number"):
        solve(model, from_function(bump(1.0), 16), 1.0, dt=0.5)
    with pytest.raises(ValueError, match="label cells"):
        from_tokens(circle(np.zeros(3)), 8, 0.1, labels=4)


# ---------------------------------------------------------------- the picture
def test_picture_shows_the_density_against_time_and_angle_with_particles():
    pytest.importorskip("matplotlib")
    from attnflow.plot import plot_meanfield

    rho0 = from_function(bump(2.0, 1.0), 32)
    model = af.Attention(beta=4.0, mask="full")
    res = solve(model, rho0, 1.0, save_at=np.linspace(0, 1, 6))
    traj = af.simulate(model, circle(quantiles(rho0[0], 50)), 1.0, save_at=np.linspace(0, 1, 6))
    fig = plot_meanfield(res, particles=traj, points=128)
    ax = fig.axes[0]
    (mesh,) = ax.collections
    shown = np.asarray(mesh.get_array()).reshape(128, 6)  # (theta, time)
    theta = -np.pi + TWO_PI * np.arange(128) / 128
    k = np.arange(33)
    weights = np.where(k == 0, 1.0, 2.0)  # rho = c_0 + 2 Re sum_{k >= 1} c_k e^{i k theta}
    direct = np.real(np.exp(1j * np.outer(theta, k)) @ (weights * res.coefficients[:, 0]).T)
    assert np.abs(shown - direct).max() < 1e-12
    # the particles' own panel: a histogram per saved time (16 bins for 50 tokens), as numpy
    (hist,) = fig.axes[1].collections
    shown = np.asarray(hist.get_array()).reshape(16, 6)
    phi = np.arctan2(traj.states[..., 1], traj.states[..., 0])  # (6, 50)
    direct = [np.histogram(a, 16, (-np.pi, np.pi))[0] / (50 * TWO_PI / 16) for a in phi]
    assert np.allclose(shown.T, direct)
    with pytest.raises(ValueError, match="points"):
        plot_meanfield(res, points=64)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_velocity_against_quadrature_with_large_top_modes(attention):
    """A state whose top modes are large (so the velocity's mode K + 2, which a general V
    produces, matters): the collocated velocity against the definition, integrated by the
    trapezoid rule on 4096 angles (spectrally accurate for periodic integrands)."""
    K = 6
    rng = np.random.default_rng(4)
    c = np.zeros((1, K + 1), complex)
    c[0, 0] = 1 / TWO_PI
    c[0, 1:] = 0.02 * (rng.normal(size=K) + 1j * rng.normal(size=K))
    b = 1.5
    field = TransportField(MeanFieldModel.of({"beta": b, "V": V_GENERAL, "mask": "full",
                                              "attention": attention}), 1, K)
    theta = TWO_PI * np.arange(field.points) / field.points
    phi = TWO_PI * np.arange(4096) / 4096
    weights = c[0] * np.r_[1, 2 * np.ones(K)]  # rho = c_0 + 2 Re sum_k c_k e^{ik phi}
    rho = np.real(np.exp(1j * np.outer(np.arange(K + 1), phi)).T @ weights)
    w = np.exp(b * np.cos(theta[:, None] - phi[None, :])) * rho * (TWO_PI / 4096)
    N = w @ np.stack([np.cos(phi), np.sin(phi)], -1) @ np.asarray(V_GENERAL).T
    v = -np.sin(theta) * N[:, 0] + np.cos(theta) * N[:, 1]
    if attention == "softmax":
        v /= w.sum(axis=1)
    np.testing.assert_allclose(field.velocity(c)[0], v, rtol=0, atol=1e-12 * np.abs(v).max())


def test_refusals_of_the_review():
    """A negative start, a mode outside 0..K, unnormalised weights whose e^(beta c)
    overflows: each named, not a later failure."""
    with pytest.raises(ValueError, match="rho0: expected a density >= 0"):
        solve(af.Attention(beta=1.0, mask="full"), [1 / TWO_PI, 0.2, 0, 0], 1.0)
    res = solve(af.Attention(beta=1.0, mask="full"), from_function(bump(1.0), 16), 0.1)
    for k in (-1, 17, 1.5):
        with pytest.raises(ValueError, match="k: expected a mode 0 <= k <= K = 16"):
            res.moments(k)
    with pytest.raises(ValueError, match=r"beta: expected \|beta\| c <= 700"):
        solve(af.Attention(beta=800.0, mask="full", attention="unnormalised"),
              from_function(bump(1.0), 16), 0.1)
