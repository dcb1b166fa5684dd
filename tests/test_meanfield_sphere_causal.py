"""The causal mean field on S^2 against independent truth (docs/science.md §9, "The causal
mask on S^2"): the velocity of every label against direct quadrature over (x', s' <= s)
(numpy and scipy's Y_lm, Gauss rules of the test's own, any V, ALiBi, three weightings); the
causal linearisation's closed forms (the Hardy and Volterra operators per degree l); the
first and last labels against the full-mask solver where the structure says they must agree;
mass per label; Chebyshev labels' convergence from an s-dependent start against a reference
of this file's own (zonal densities in cos(theta), the kernel's azimuthal integrals as
Bessel functions I_0, I_1, Gauss-Legendre labels, DOP853); attnflow's particles (causal
harmonic kernel on S^2)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.polynomial import legendre
from scipy.integrate import solve_ivp
from scipy.special import i0e, i1e, iv, spherical_in
from sphere_reference import density_at, quadrature

import attnflow as af
from attnflow.meanfield import from_coefficients, from_function, from_tokens, solve
from attnflow.meanfield.labels import Labels
from attnflow.meanfield.sphere import MASS0, TransportField2, mean_direction

FOUR_PI = 4 * np.pi
V_GENERAL = np.array([[0.8, -0.5, 0.2], [0.3, 1.2, -0.4], [0.1, 0.6, 0.9]])






def polynomial_parts(L: int) -> np.ndarray:
    """Coefficients (3, L + 1, L + 1) of the parts of a state quadratic in the label s,
    f(s) = f_0 + s f_1 + s^2 f_2: the uniform density plus entries of every kind (m = 0
    real, m > 0 complex), some changing with s."""
    parts = ({(0, 0): MASS0, (1, 0): 0.03, (1, 1): 0.02 - 0.01j, (2, 1): 0.05 + 0.02j,
              (3, 0): 0.04},
             {(1, 1): -0.03 + 0.02j, (2, 0): 0.05, (3, 3): 0.02j, (2, 2): 0.01 + 0.01j},
             {(1, 0): -0.04, (3, 1): 0.03 - 0.01j})
    c = np.zeros((3, L + 1, L + 1), dtype=complex)
    for power, entries in enumerate(parts):
        for (l, m), value in entries.items():
            c[power, l, m] = value
    return c


# ------------------------------------------------------------ 1. the velocity of each label
@pytest.mark.parametrize("weighting, beta, slope", [
    ("softmax", 2.5, 0.0), ("unnormalised", -1.5, 0.0), ("positional", 2.0, 3.0),
    ("softmax", 3.0, 2.0)])
def test_velocity_of_every_label_against_direct_quadrature(weighting, beta, slope):
    """Label s's velocity is that of the full mask for the measure sigma_s = int_0^s
    e^{-slope (s - s')} f(s', .) ds' (softmax: any scale cancels; unnormalised: sigma_s
    itself; positional: divided by int_0^s e^{-slope (s - s')} ds'); sigma_s here by 24
    Gauss-Legendre points in s' and the density summed from scipy's Y_lm, against the
    solver's Chebyshev labels (exact for f quadratic in s) to 1e-12 relative (measured
    1.3e-14 at worst). The first label s = 0 sees the limit s -> 0: f(0, .) itself
    (unnormalised: nothing, v = 0)."""
    L, S = 8, 7
    labels = Labels.of("chebyshev", S, slope)
    parts = polynomial_parts(L)
    c = np.einsum("sp,plm->slm", labels.nodes[:, None] ** np.arange(3), parts)
    field = TransportField2(beta, V_GENERAL, weighting, labels, L)
    y, wy = quadrature(30)
    x = field.grid.points.reshape(-1, 3)
    E = np.exp(beta * x @ y.T)
    u, wu = np.polynomial.legendre.leggauss(24)
    f_parts = [density_at(part, y) for part in parts]  # f_0, f_1, f_2 at the nodes y
    v_theta, v_phi = field.velocity(c)
    e_theta, e_phi = field.grid.frames
    worst = 0.0
    for j, s in enumerate(labels.nodes):
        if s == 0:
            sigma = f_parts[0]
        else:
            q, wq = s * (u + 1) / 2, s * wu / 2
            decay = np.exp(-slope * (s - q)) * wq
            sigma = sum(dq * (f_parts[0] + sq * f_parts[1] + sq**2 * f_parts[2])
                        for sq, dq in zip(q, decay))
            if weighting == "positional":
                sigma = sigma / decay.sum()
        N = (E * (sigma * wy)) @ y
        U = N @ V_GENERAL.T
        v = U - np.sum(U * x, axis=1, keepdims=True) * x
        if weighting == "softmax":
            v /= (E * (sigma * wy)).sum(axis=1, keepdims=True)
        mine = (v_theta[j, ..., None] * e_theta + v_phi[j, ..., None] * e_phi).reshape(-1, 3)
        scale = max(np.abs(v).max(), 1e-300)
        if weighting == "unnormalised" and s == 0:
            assert np.abs(mine).max() == 0.0
            continue
        worst = max(worst, float(np.abs(mine - v).max() / scale))
    assert worst < 1e-12, worst


# ------------------------------------------------------------ 2. the linearisation
def linear_response(model, L, l, m, profile, t_end, noise=None, labels=16, dt=0.01):
    """eps(s, t) (labels at the Chebyshev nodes) of f = 1 / (4 pi) + eps(s) Y_lm from
    eps(s, 0) = profile(s), by the symmetric difference of runs at +-delta (the second
    order cancels)."""
    nodes = Labels.of("chebyshev", labels).nodes
    out = []
    delta = 1e-6
    for sign in (1, -1):
        c = np.zeros((labels, L + 1, L + 1), dtype=complex)
        c[:, 0, 0] = MASS0
        c[:, l, m] = sign * delta * profile(nodes)
        res = solve(model, c, t_end, save_at=[t_end], scheme="chebyshev", noise=noise, dt=dt)
        assert res.resolution_lost_at is None
        out.append(res.coefficients[-1, :, l, m])
    return nodes, (out[0] - out[1]) / (2 * delta)


def full_rate(l, beta, weighting, lam=1.0):
    """The full mask's rate without noise: l (l + 1) lam i_l(beta) / beta [/ i_0(beta)]."""
    rate = lam * l * (l + 1) * spherical_in(l, beta) / beta
    return rate / spherical_in(0, beta) if weighting == "softmax" else rate


@pytest.mark.parametrize("l, m, p, noise", [(2, 1, 0, None), (2, 1, 2, None), (1, 0, 1, 0.5),
                                            (3, 2, 3, None)])
def test_softmax_linearisation_powers_of_s_are_eigenfunctions(l, m, p, noise):
    """Softmax: d_t eps = gamma_l H eps - sigma^2 l (l + 1) / 2 eps with H the Hardy average
    (1/s) int_0^s, for which s^p is an eigenfunction of eigenvalue 1 / (p + 1): eps = s^p
    e^{(gamma_l / (p + 1) - sigma^2 l (l + 1) / 2) t} (docs/science.md §9), to 1e-10."""
    beta, T = 3.0, 1.0
    model = af.Attention(beta=beta, mask="causal")
    s, eps = linear_response(model, 6, l, m, lambda s: s**p, T, noise, labels=8)
    sigma = 0.0 if noise is None else noise
    rate = full_rate(l, beta, "softmax") / (p + 1) - sigma**2 * l * (l + 1) / 2
    exact = s**p * np.exp(rate * T)
    assert np.abs(eps - exact).max() < 1e-10 * np.abs(exact).max(), np.abs(eps - exact).max()


@pytest.mark.parametrize("l, m", [(1, 1), (2, 0)])
def test_unnormalised_linearisation_is_the_volterra_series(l, m):
    """Unnormalised: d_t eps = gamma_l J eps with J eps = int_0^s eps; from eps = 1,
    J^k 1 = s^k / k!, so eps(s, t) = sum_k (gamma_l t s)^k / (k!)^2 = I_0(2 sqrt(gamma_l t s)),
    to 1e-10; the first label (s = 0) does not move."""
    beta, T = 2.0, 1.0
    model = af.Attention(beta=beta, mask="causal", attention="unnormalised", strength=0.7)
    s, eps = linear_response(model, 5, l, m, np.ones_like, T, labels=12)
    exact = iv(0, 2 * np.sqrt(full_rate(l, beta, "unnormalised", 0.7) * T * s))
    assert np.abs(eps - exact).max() < 1e-10 * exact.max(), np.abs(eps - exact).max()
    assert eps[0] == 1.0


# ------------------------------------------------------------ 3. structure
def s_dependent(s, x):
    """A start that depends on the label s and on the longitude (general orders m)."""
    return (1 + 0.3 * x[..., 2] * np.cos(3 * s) + 0.2 * s * x[..., 0]
            + 0.3 * (1.5 * x[..., 2] ** 2 - 0.5) * np.sin(3 * s))


def test_labels_agree_with_the_full_mask_where_the_structure_says():
    """Softmax from an s-independent start: every label sees its own density (sigma_s = s f,
    the factor cancels), so each label equals the full-mask solution, the last included.
    From an s-dependent start the first label s = 0 sees f(0, .) alone: the full-mask run
    from f(0, .). Unnormalised: the first label sees no mass and stays put. Mass per label
    is conserved to round-off."""
    L, T = 12, 0.3
    V = np.array([[1.0, -0.3, 0.1], [0.3, 0.9, 0.0], [0.0, 0.1, 1.1]])  # not zonal
    one = from_function(lambda x: np.exp(0.8 * x[..., 2] + 0.5 * x[..., 1]), L, d=3)
    full = solve(af.Attention(beta=2.0, mask="full"), one, T, save_at=[T])
    causal = solve(af.Attention(beta=2.0, mask="causal"), np.repeat(one, 10, axis=0), T,
                   save_at=[T], scheme="chebyshev")
    assert np.abs(causal.coefficients[-1] - full.coefficients[-1, 0]).max() < 1e-14
    rho0 = from_function(s_dependent, L, labels=20, scheme="chebyshev", d=3)
    causal = solve(af.Attention(beta=2.0, mask="causal", V=V), rho0, T, save_at=[T],
                   scheme="chebyshev", noise=0.3, tol=1e-6)  # the tail reaches 3e-8
    first = solve(af.Attention(beta=2.0, mask="full", V=V), rho0[:1], T, save_at=[T],
                  noise=0.3, tol=1e-6)
    assert causal.resolution_lost_at is None and first.resolution_lost_at is None
    assert np.abs(causal.coefficients[-1, 0] - first.coefficients[-1, 0]).max() < 1e-14
    assert np.abs(causal.coefficients[-1, 1:] - causal.coefficients[0, 1:]).max() > 1e-3
    mass = causal.coefficients[..., 0, 0] / MASS0
    assert np.abs(mass - 1).max() < 1e-14
    flat = solve(af.Attention(beta=2.0, mask="causal", attention="unnormalised"), rho0, T,
                 save_at=[T], scheme="chebyshev")
    np.testing.assert_array_equal(flat.coefficients[-1, 0], rho0[0])
    assert np.abs(flat.coefficients[-1, -1] - rho0[-1]).max() > 1e-3


def test_initial_states_with_labels_from_tokens_functions_and_coefficients(tmp_path):
    """from_function(f(s, x), labels, scheme, d=3) samples f at the scheme's labels; tokens
    (n, 3) with labels average each label cell's tokens (token i at (i + 1) / n); the result
    saves, loads and interpolates in s."""
    c = from_function(s_dependent, 10, labels=20, scheme="chebyshev", d=3)
    nodes = Labels.of("chebyshev", 20).nodes
    for j in (0, 10, 19):
        one = from_function(lambda x, s=nodes[j]: s_dependent(s, x), 10, d=3)
        assert np.abs(c[j] - one[0]).max() < 1e-15
    np.testing.assert_array_equal(from_coefficients(c), c)
    x = af.sphere.uniform(900, d=3, seed=2)
    x[:300, 2] = np.abs(x[:300, 2])  # the first third of the labels on the upper half
    tok = from_tokens(x, 12, width=1.0, labels=3)
    assert tok.shape == (3, 13, 13)
    # the first cell's mean z is 1/2 (the upper hemisphere), the others' 0, within 4 s.e.
    z = mean_direction(tok)[:, 2] / np.exp(-1.0)  # degree 1 damped by e^{-2 w^2 / 2}
    assert abs(z[0] - 0.5) < 4 * np.sqrt(1 / 12 / 300) and np.all(np.abs(z[1:]) < 4 / 30)
    with pytest.raises(ValueError, match="labels"):
        from_tokens(x[:2], 12, width=1.0, labels=3)
    res = solve(af.Attention(beta=1.0, mask="causal"), c, 0.2, save_at=[0.2],
                scheme="chebyshev", tol=1e-4)
    assert res.resolution_lost_at is None
    back = af.meanfield.load(res.save(tmp_path / "r.nc"))
    np.testing.assert_array_equal(back.coefficients, res.coefficients)
    assert back.labels is not None and back.density(16).shape == (2, 20, 8, 16)
    mid = res.at_labels([nodes[10], 0.37])
    assert np.abs(mid[:, 0] - res.coefficients[:, 10]).max() < 1e-15
    assert mid.shape == (2, 2, 11, 11)


# ------------------------------------------------------------ 4. labels' convergence
def zonal_start(s, z):
    """Issue 43's kind of start, zonal: (1 + 0.3 z cos 3s + 0.3 P_2(z) sin 3s) / (4 pi)."""
    return (1 + 0.3 * z * np.cos(3 * s) + 0.3 * (1.5 * z * z - 0.5) * np.sin(3 * s)) / FOUR_PI


def zonal_reference(beta: float, t_end: float, nodes: int = 20, points: int = 40):
    """The causal softmax mean field (Q = K = V = I) of zonal densities f(s, z), z = cos
    theta, written apart from the package: f on Gauss-Legendre nodes in s (label s sees the
    Legendre interpolant's average (1/s) int_0^s) and in z (`points`); at x = (sin theta, 0,
    z), Z = int e^{b <x, y>} sigma(y) dy and N . e_theta by the azimuthal integrals
    int e^{a cos phi} (1, cos phi) dphi = 2 pi (I_0(a), I_1(a)), then Gauss-Legendre in z';
    d_t f = d_z(sin theta f v_theta) by differentiating the Legendre interpolant; DOP853 at
    rtol 1e-12. Returns f (P, points) at labels s (P,) and the nodes z."""
    xs = legendre.leggauss(nodes)[0]
    s = (xs + 1) / 2
    vander = legendre.legvander(xs, nodes - 1)
    anti = np.stack([legendre.legval(xs, legendre.legint(np.eye(nodes)[j], lbnd=-1)) / 2
                     for j in range(nodes)], axis=1)
    average = anti @ np.linalg.inv(vander) / s[:, None]
    z, w = legendre.leggauss(points)
    sin = np.sqrt(1 - z * z)
    a = beta * np.outer(sin, sin)
    # exponentials scaled by e^{-|beta|} (softmax: the factor cancels in N / Z)
    scale = np.exp(beta * (np.outer(z, z) - 1) + np.abs(a)) * (2 * np.pi * w)
    K0, K1 = i0e(a) * scale, i1e(a) * scale  # (x node, y node)
    zv = legendre.legvander(z, points - 1)
    deriv = legendre.legvander(z, points - 2) @ legendre.legder(np.linalg.inv(zv))

    def rhs(_, y):
        f = y.reshape(nodes, points)
        seen = average @ f
        Z = seen @ K0.T
        Ntheta = z * ((seen * sin) @ K1.T) - sin * ((seen * z) @ K0.T)
        flux = sin * f * Ntheta / Z
        return (flux @ deriv.T).ravel()

    sol = solve_ivp(rhs, (0, t_end), zonal_start(s[:, None], z).ravel(), method="DOP853",
                    rtol=1e-12, atol=1e-14)
    series = np.linalg.solve(vander, sol.y[:, -1].reshape(nodes, points))
    return lambda q: legendre.legval(2 * np.asarray(q) - 1, series).T, z


def test_chebyshev_labels_converge_spectrally_on_s2():
    """Zonal s-dependent start, softmax beta = 3, degree 24, t = 1: 10, 16 and 24 Chebyshev
    labels against the reference at s = 0 (the first token), 0.25, 0.5, 1, relative to
    1 / (4 pi): 16 and 24 labels to 1e-10 (measured 1.8e-11 and 3.3e-12, the floor of RK4
    at dt = 0.01; 10 labels 5.9e-7); the failure message prints the table."""
    beta, T, L = 3.0, 1.0, 24
    ref, z = zonal_reference(beta, T)
    q = [0.0, 0.25, 0.5, 1.0]
    truth = ref(q)
    model = af.Attention(beta=beta, mask="causal")
    x = np.stack([np.sqrt(1 - z * z), 0 * z, z], axis=1)
    table = {}
    for S in (10, 16, 24):
        s = Labels.of("chebyshev", S).nodes
        rho0 = np.zeros((S, L + 1, L + 1))  # z = sqrt(4 pi / 3) Y_10, P_2 = sqrt(4 pi / 5) Y_20
        rho0[:, 0, 0] = MASS0
        rho0[:, 1, 0] = 0.3 * np.cos(3 * s) / np.sqrt(12 * np.pi)
        rho0[:, 2, 0] = 0.3 * np.sin(3 * s) / np.sqrt(20 * np.pi)
        res = solve(model, rho0, T, save_at=[T], scheme="chebyshev", tol=1e-3, dt=0.01)
        assert res.resolution_lost_at is None and res.settings["axisymmetric"]
        mine = af.meanfield.sphere.values(res.at_labels(q)[-1], x)
        table[S] = np.abs(mine - truth).max(axis=1) * FOUR_PI
    text = "; ".join(f"S = {S}: " + ", ".join(f"s = {s:g} {e:.1e}" for s, e in zip(q, err))
                     for S, err in table.items())
    assert table[16].max() < 1e-10 and table[24].max() < 1e-10, text
    assert table[10].max() > 100 * table[24].max(), text


# ------------------------------------------------------------ 5. particles
def test_causal_solver_follows_particles_on_s2():
    """n = 3000 tokens, token i at label s = i / n, its z the quantile of the start f(s, z)
    proportional to e^{kappa(s) z}, kappa(s) = 0.3 + 1.5 s, at the level frac(i g1), its
    longitude 2 pi frac(i g2) (the R2 low-discrepancy sequence in (s, level, longitude));
    causal softmax with the harmonic kernel, beta = 2, t = 1. The mean of z over the tokens
    of s in (1/2, 1] and in (0, 1/2] against the solver's integrals over the same labels:
    within 1 / sqrt(n) (a Monte Carlo bound; low discrepancy makes the error smaller), while
    the full-mask solution of the label-averaged start is farther than that."""
    n, beta, T, L = 3000, 2.0, 1.0, 32
    kappa = lambda s: 0.3 + 1.5 * s  # noqa: E731
    g = 1.22074408460575947536  # the plastic number: R2's generator
    i = np.arange(1, n + 1)
    s = i / n
    level, lon = np.mod(i / g, 1.0), 2 * np.pi * np.mod(i / g**2, 1.0)
    k = kappa(s)
    z = 1 + np.log(level + (1 - level) * np.exp(-2 * k)) / k  # e^{kz} on [-1, 1]
    r = np.sqrt(1 - z * z)
    x0 = np.stack([r * np.cos(lon), r * np.sin(lon), z], axis=1)
    particles = af.simulate(af.Attention(beta=beta, mask="causal", backend="harmonic"), x0,
                            T, save_at=[T], dt=0.05)
    zT = particles.states[-1][:, 2]
    measured = np.array([zT[s <= 0.5].mean(), zT[s > 0.5].mean()])

    def start(q):  # e^{kappa z} normalised: c_l0 = sqrt(4 pi (2 l + 1)) i_l / (4 pi i_0)
        l = np.arange(L + 1)
        c = np.zeros((len(q), L + 1, L + 1))
        c[:, :, 0] = np.sqrt(FOUR_PI * (2 * l + 1)) * spherical_in(l, kappa(q)[:, None]) / (
            FOUR_PI * spherical_in(0, kappa(q)[:, None]))
        return c

    res = solve(af.Attention(beta=beta, mask="causal"), start(Labels.of("chebyshev", 20).nodes),
                T, save_at=[T], scheme="chebyshev")
    assert res.resolution_lost_at is None and res.settings["axisymmetric"]
    u, w = np.polynomial.legendre.leggauss(30)
    halves = []
    for lo in (0.0, 0.5):
        c = res.at_labels(lo + (u + 1) / 4)[-1]
        halves.append(np.sum(w / 2 * mean_direction(c)[:, 2]))
    off = np.abs(measured - halves).max()
    averaged = np.einsum("q,qlm->lm", w / 2, start((u + 1) / 2))[None]
    full = solve(af.Attention(beta=beta, mask="full"), averaged, T, save_at=[T])
    wrong = np.abs(measured - mean_direction(full.coefficients[-1, 0])[2]).max()
    assert off < 1 / np.sqrt(n) < wrong, (off, wrong)


# ------------------------------------------------------------ 6. the picture
def test_picture_of_a_label_on_s2():
    """plot_meanfield of an S^2 result: the first panel is the label's density averaged over
    longitude against time and polar angle (checked against scipy's Y_lm summed at 16
    longitudes, exact for degree 6; a short run at a loose tail bound), the second its map
    at the last time; particles are refused."""
    pytest.importorskip("matplotlib")
    from attnflow.plot import plot_meanfield

    parts = polynomial_parts(6)
    nodes = Labels.of("chebyshev", 8).nodes
    c = np.einsum("sp,plm->slm", nodes[:, None] ** np.arange(3), parts)
    res = solve(af.Attention(beta=1.0, mask="causal"), c, 0.2, save_at=[0.1, 0.2],
                scheme="chebyshev", tol=1e-2)
    assert res.resolution_lost_at is None
    fig = plot_meanfield(res, label=2, points=32)
    shown = np.asarray(fig.axes[0].collections[0].get_array()).reshape(16, 3)  # (theta, t)
    theta = (np.arange(16) + 0.5) * np.pi / 16
    phi = 2 * np.pi * np.arange(16) / 16
    x = np.stack(np.broadcast_arrays(np.sin(theta)[:, None] * np.cos(phi),
                                     np.sin(theta)[:, None] * np.sin(phi),
                                     np.cos(theta)[:, None]), -1).reshape(-1, 3)
    direct = np.array([density_at(ct, x).reshape(16, 16).mean(axis=1)
                       for ct in res.coefficients[:, 2]])
    assert np.abs(shown - direct.T).max() < 1e-14
    assert len(fig.axes[1].collections) == 1
    with pytest.raises(ValueError, match="particles"):
        plot_meanfield(res, particles=af.simulate(af.Attention(beta=1.0), af.sphere.uniform(
            5, d=3, seed=0), 0.1))
