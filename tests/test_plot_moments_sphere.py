"""plot_moments on S^2: the mean field's harmonic moments and their spread against direct
quadrature of scipy's harmonics (tests/sphere_reference.py), the particles' markers against
harmonic_moments, the band's edges, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import sph_harm_y
from sphere_reference import density_at, quadrature

import attnflow as af
from attnflow.analysis.moments import harmonic_moments
from attnflow.meanfield import from_function, solve


def density(x):
    return np.exp(1.2 * x[..., 2] + 0.6 * x[..., 0] - 0.4 * x[..., 1] * x[..., 2])


def draws(n, seed):
    """n iid tokens of the density (rejection from uniform proposals: exact)."""
    rng, out = np.random.default_rng(seed), []
    top = np.exp(1.2 + 0.6 + 0.2)  # a bound of the density on the sphere
    while sum(len(o) for o in out) < n:
        x = af.sphere.uniform(4 * n, 3, seed=rng)
        out.append(x[rng.random(len(x)) * top < density(x)])
    return np.concatenate(out)[:n]


def real_harmonic(l, m, y):
    """The real orthonormal harmonic (uniform probability measure) from scipy's complex one."""
    theta, phi = np.arccos(np.clip(y[:, 2], -1, 1)), np.arctan2(y[:, 1], y[:, 0])
    ref = sph_harm_y(l, abs(m), theta, phi)
    return (np.sqrt(4 * np.pi) * ref.real if m == 0 else
            np.sqrt(8 * np.pi) * (-1.0) ** m * (ref.real if m > 0 else ref.imag))


def test_field_moments_against_quadrature():
    from attnflow.plot.meanfield import sphere_field_moments

    L = 20
    c = from_function(density, L, d=3)  # (1, L + 1, L + 1), mass 1
    m, sd = sphere_field_moments(c, 4)
    y, w = quadrature(40)
    rho = density_at(c[0], y) * w  # mass per node, scipy's harmonics
    degree = harmonic_moments(y[:2], 4).degree
    order = harmonic_moments(y[:2], 4).order
    for i, (l, k) in enumerate(zip(degree, order)):
        Y = real_harmonic(l, k, y)
        assert m[0, i] == pytest.approx(rho @ Y, abs=1e-13)
        assert sd[0, i] == pytest.approx(np.sqrt(rho @ Y**2 - (rho @ Y) ** 2), abs=1e-12)
    # the density's own draws: their moments scatter about m within the standard errors
    x = draws(20_000, 3)
    z = (harmonic_moments(x, 4).mean - m[0]) / (sd[0] / np.sqrt(len(x)))
    assert np.abs(z).max() < 4.5 and abs(np.mean(z**2) - 1) < 0.6  # 24 moments


def test_moments_figure_on_the_sphere(tmp_path):
    pytest.importorskip("matplotlib")
    from attnflow.plot import plot_moments
    from attnflow.plot.meanfield import sphere_field_moments

    model = af.Attention(beta=2.0, mask="full")
    c = from_function(density, 32, d=3)
    times = np.linspace(0, 1.0, 5)
    res = solve(model, c, 1.0, save_at=times)
    n = 1500
    traj = af.simulate(model, draws(n, 6), 1.0, save_at=times)
    assert res.resolution_lost_at is None
    fig = plot_moments(res, traj, modes=[1, 2])
    assert len(fig.axes) == 4
    dots = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
    want = harmonic_moments(traj, 1).mean  # (T, 3): orders -1, 0, 1
    assert len(dots) == 3
    for i, line in enumerate(dots):
        np.testing.assert_allclose(line.get_ydata(), want[:, i])
    m, sd = sphere_field_moments(res.coefficients[:, 0], 1)
    edge = fig.axes[0].collections[0].get_paths()[0].vertices  # m_{1,-1} +- 2 sd / sqrt(n)
    at0 = edge[edge[:, 0] == 0.0, 1]
    half = 2 * sd[0, 0] / np.sqrt(n)
    np.testing.assert_allclose([at0.min(), at0.max()], [m[0, 0] - half, m[0, 0] + half],
                               rtol=1e-9)
    fig.savefig(tmp_path / "moments_s2.png")
    with pytest.raises(ValueError, match="^modes: expected a sequence of degrees in 1..L"):
        plot_moments(res, traj, modes=[40])
    circle = af.simulate(model, af.sphere.uniform(20, 2, seed=1), 0.1, save_at=[0.0, 0.1])
    with pytest.raises(ValueError, match="^particles: expected"):
        plot_moments(res, circle)
