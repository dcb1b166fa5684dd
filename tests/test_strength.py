"""The interaction strength K (attnflow.family.Strength): the attention output times K, and the
time rescaling it equals (strength K, noise sigma, time t == strength 1, noise sigma / sqrt K,
time K t), for the particles (deterministic and pathwise with noise), the implicit methods and
the mean-field solver (docs/science.md §11.2)."""

import numpy as np
import pytest

import attnflow as af
from attnflow.family import PARTS, Strength, parts_table
from attnflow.family.text import family_options
from attnflow.meanfield import from_function, solve
from attnflow.sphere import uniform

K = 2.5


def _pair(**options):
    return af.Attention(strength=K, **options), af.Attention(**options)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
@pytest.mark.parametrize("backend", ["dense", "harmonic"])
def test_field_is_K_times_the_field(attention, backend):
    x = uniform((2, 30), 3, seed=1)
    a, b = _pair(beta=1.5, mask="full", attention=attention, backend=backend)
    np.testing.assert_allclose(a.field(x), K * b.field(x), rtol=0, atol=1e-14)


def test_default_changes_nothing_and_old_records_load():
    x = uniform(20, 3, seed=2)
    plain = af.Attention(beta=2.0)
    assert np.array_equal(af.Attention(beta=2.0, strength=1.0).field(x), plain.field(x))
    meta, arrays = plain.to_record()
    assert "strength" not in meta  # records of K = 1 are those of earlier versions
    assert af.Attention.from_record(meta, arrays).strength == 1.0


def test_record_round_trip_and_repr():
    a = af.Attention(beta=2.0, attention="unnormalised", strength=K)
    meta, arrays = a.to_record()
    assert meta["strength"] == {"kind": "strength", "K": K}
    b = af.Attention.from_record(meta, arrays)
    x = uniform(10, 3, seed=3)
    assert b.strength == K and np.array_equal(a.field(x), b.field(x))
    assert "strength=2.5" in repr(a)


def test_registered_part_text_and_errors():
    assert PARTS["strength"] is Strength
    assert "| `strength` | strength |" in parts_table()
    assert family_options(strength="2.5")["strength"] == Strength(2.5)
    from attnflow.sweeps.axes import family_axes

    check, default = family_axes()["strength"]  # a sweep axis, default 1
    assert default == "1" and check("strength", "2.5") == "2.5"
    assert af.Attention(parts=[Strength(3.0)]).strength == 3.0
    assert af.Attention(strength="0.5").strength == 0.5
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(ValueError, match="strength.*K > 0"):
            family_options(strength=bad)
    for bad in (0.0, -2.0, True, float("nan")):
        with pytest.raises(ValueError, match="strength"):
            af.Attention(strength=bad)
    with pytest.raises(ValueError, match="strength"):
        af.Attention(strength=2.0, parts=[Strength(3.0)])


def test_exact_jacobian_is_scaled():
    x = uniform(6, 3, seed=4)
    a, _ = _pair(beta=1.5, mask="causal")
    h = 1e-6
    J = a.jacobian(x)  # against central differences of the scaled field
    for i, k in ((2, 0), (5, 3), (1, 1)):
        for c in range(3):
            e = np.zeros_like(x)
            e[k, c] = h
            fd = (a.field(x + e) - a.field(x - e))[i] / (2 * h)
            np.testing.assert_allclose(J[i, :, k, c], fd, atol=1e-7)


@pytest.mark.parametrize("method", ["rk4", "bdf"])
def test_deterministic_time_rescaling(method):
    x0 = uniform(8, 3, seed=5)
    a, b = _pair(beta=1.5, mask="causal")
    T, h = 0.6, 0.02
    opts = dict(rtol=1e-10, atol=1e-12) if method == "bdf" else {}
    ra = af.simulate(a, x0, T, save_at=[T], method=method, dt=h, **opts)
    rb = af.simulate(b, x0, K * T, save_at=[K * T], method=method, dt=K * h, **opts)
    tol = 1e-13 if method == "rk4" else 1e-9
    np.testing.assert_allclose(ra.states[-1], rb.states[-1], rtol=0, atol=tol)
    plain = af.simulate(b, x0, T, save_at=[T], method=method, dt=h, **opts)
    assert np.abs(ra.states[-1] - plain.states[-1]).max() > 1e-3  # K matters


def test_noisy_time_rescaling_is_pathwise():
    """Keyed Brownian paths: N(0, dt) increments of the same standard normals, so with the
    step and brownian_dt rescaled by K the two SDEs take the same steps to round-off."""
    x0 = uniform((2, 40), 3, seed=6)
    a, b = _pair(beta=1.5, mask="full", attention="unnormalised", backend="harmonic")
    T, h, sigma = 1.0, 0.02, 0.7
    ra = af.simulate(a, x0, T, save_at=[T], method="geodesic", dt=h, noise=sigma, seed=3,
                     brownian_dt=h)
    rb = af.simulate(b, x0, K * T, save_at=[K * T], method="geodesic", dt=K * h,
                     noise=sigma / np.sqrt(K), seed=3, brownian_dt=K * h)
    np.testing.assert_allclose(ra.states[-1], rb.states[-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_meanfield_honours_the_strength(attention):
    rho0 = from_function(lambda t: np.exp(0.3 * np.cos(t) + 0.1 * np.sin(2 * t)), modes=16)
    T, h, sigma = 1.0, 0.005, 0.8
    opts = dict(beta=2.0, mask="full", attention=attention)
    a = solve({**opts, "strength": K}, rho0, T, save_at=[T], noise=sigma, dt=h)
    b = solve(opts, rho0, K * T, save_at=[K * T], noise=sigma / np.sqrt(K), dt=K * h)
    plain = solve(opts, rho0, T, save_at=[T], noise=sigma, dt=h)
    np.testing.assert_allclose(a.coefficients[-1], b.coefficients[-1], rtol=0, atol=1e-14)
    assert np.abs(a.coefficients[-1] - plain.coefficients[-1]).max() > 1e-3
