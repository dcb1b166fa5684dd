"""The flat scheme (no normalisation, attention reads x in R^d itself) against a plain numpy
formula and scipy's solve_ivp; its record, CLI flag, sweep axis and refusals."""

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from typer.testing import CliRunner

import attnflow as af
from attnflow.cli import app
from attnflow.family import SCHEMES, Flat, make_scheme

RNG = np.random.default_rng(7)
D, E, N = 3, 2, 6
Q, K, V = RNG.normal(size=(E, D)), RNG.normal(size=(E, D)), RNG.normal(size=(D, D))
BETA = 0.7


def numpy_field(x, causal, beta=BETA, Q=Q, K=K, V=V):
    """dx_i/dt = sum_j softmax_j(beta <Q x_i, K x_j>) V x_j over j <= i (causal) or all j."""
    n = x.shape[0]
    out = np.zeros_like(x)
    for i in range(n):
        js = range(i + 1) if causal else range(n)
        s = np.array([beta * (Q @ x[i]) @ (K @ x[j]) for j in js])
        w = np.exp(s - s.max())
        w /= w.sum()
        out[i] = sum(wj * (V @ x[j]) for wj, j in zip(w, js))
    return out


@pytest.mark.parametrize("mask", ["causal", "full"])
def test_the_field_is_softmax_attention_on_x_itself(mask):
    x = 2.0 * RNG.normal(size=(N, D))  # far off the sphere
    model = af.Attention(Q, K, V, beta=BETA, mask=mask, norm="flat")
    np.testing.assert_allclose(model.field(x), numpy_field(x, mask == "causal"), rtol=1e-12,
                               atol=1e-12)
    assert model.manifold.name == "euclidean" and isinstance(model.scheme, Flat)


@pytest.mark.parametrize("mask", ["causal", "full"])
def test_the_exact_jacobian_matches_central_differences(mask):
    x = RNG.normal(size=(N, D))
    Qs, Ks = RNG.normal(size=(D, D)), RNG.normal(size=(D, D))
    model = af.Attention(Qs, Ks, V, beta=BETA, mask=mask, norm="flat")
    assert model.has_exact_jacobian
    J = model.jacobian(x)
    h = 1e-6
    for k in range(N):
        for b in range(D):
            e = np.zeros_like(x)
            e[k, b] = h
            fd = (numpy_field(x + e, mask == "causal", Q=Qs, K=Ks)
                  - numpy_field(x - e, mask == "causal", Q=Qs, K=Ks)) / (2 * h)
            np.testing.assert_allclose(J[:, :, k, b], fd, atol=1e-7)


@pytest.mark.parametrize("mask", ["causal", "full"])
def test_the_trajectory_matches_solve_ivp(mask):
    x0 = RNG.normal(size=(N, D))
    model = af.Attention(Q, K, V, beta=BETA, mask=mask, norm="flat")
    times = np.linspace(0.0, 1.5, 4)
    ref = solve_ivp(lambda t, y: numpy_field(y.reshape(N, D), mask == "causal").ravel(),
                    (0, 1.5), x0.ravel(), method="DOP853", t_eval=times, rtol=1e-12,
                    atol=1e-12).y.T.reshape(-1, N, D)
    traj = af.simulate(model, x0, 1.5, save_at=times, method="dopri5", rtol=1e-11,
                       atol=1e-12)
    np.testing.assert_allclose(traj.states, ref, atol=1e-8)
    np.testing.assert_array_equal(traj.states[0], x0)  # never normalised on input
    # the implicit path with the exact Jacobian
    bdf = af.simulate(model, x0, 1.5, save_at=times, method="bdf", rtol=1e-9, atol=1e-11)
    assert bdf.integrator["n_jacobians"] >= 1
    np.testing.assert_allclose(bdf.states, ref, atol=1e-6)


def test_without_an_exact_jacobian_the_implicit_methods_use_finite_differences():
    x0 = RNG.normal(size=(N, D))
    model = af.Attention(Q, K, V, beta=BETA, mask="full", norm="flat", qk_norm="rms")
    assert not model.has_exact_jacobian
    ref = af.simulate(model, x0, 1.0, save_at=[0.0, 1.0], method="dopri5", rtol=1e-11,
                      atol=1e-12)
    bdf = af.simulate(model, x0, 1.0, save_at=[0.0, 1.0], method="bdf", rtol=1e-9,
                      atol=1e-11)
    np.testing.assert_allclose(bdf.final, ref.final, atol=1e-6)


def test_zero_tokens_are_tokens_and_normalize_is_only_on_request():
    x0 = np.zeros((4, 2))
    x0[1:] = [[3.0, 0.0], [0.0, -2.0], [1.0, 1.0]]
    model = af.Attention(beta=1.0, mask="full", norm="flat")
    traj = af.simulate(model, x0, 0.5, method="rk4", dt=0.05)
    np.testing.assert_array_equal(traj.states[0], x0)
    assert np.all(np.isfinite(traj.final))
    with pytest.raises(ValueError, match="x0"):
        af.simulate(model, x0, 0.5, normalize=True)
    unit = af.simulate(model, x0[1:], 0.5, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit.states[0], axis=-1), 1.0)


def test_the_record_round_trips(tmp_path):
    x0 = RNG.normal(size=(2, N, D))
    model = af.Attention(Q, K, V, beta=BETA, mask="full", norm="flat")
    traj = af.simulate(model, x0, 0.5, method="rk4", dt=0.05)
    back = af.load(traj.save(tmp_path / "flat.nc"))
    assert back.model.norm == "flat" and isinstance(back.model.scheme, Flat)
    np.testing.assert_array_equal(back.states, traj.states)
    np.testing.assert_array_equal(back.model.field(x0), model.field(x0))
    assert SCHEMES["flat"] is Flat
    assert isinstance(make_scheme("flat"), Flat) and Flat().text() == "flat"


def test_the_cli_and_the_sweep_axis_take_norm_flat(tmp_path):
    out = tmp_path / "cli.nc"
    res = CliRunner().invoke(app, ["simulate", "--n", "8", "--d", "3", "--t-end", "1",
                                   "--norm", "flat", "--mask", "full", "--beta", "2",
                                   "--no-progress", "--out", str(out)])
    assert res.exit_code == 0, res.output
    traj = af.load(out)
    assert traj.model.norm == "flat"
    assert np.ptp(np.linalg.norm(traj.final, axis=-1)) > 1e-3  # left the sphere
    np.testing.assert_allclose(traj.final, af.simulate(
        af.Attention(beta=2.0, mask="full", norm="flat"), traj.states[0], 1.0,
        save_at=traj.times, method=traj.integrator["method"], dt=traj.integrator["dt"]).final,
        rtol=1e-12)
    from attnflow.sweeps.spec import parse_spec

    spec = parse_spec({"grid": {"beta": 1.0, "n": 6, "d": 3, "t_end": 0.5, "seeds": [0],
                                "norm": ["post", "flat"]}})
    assert spec.values("norm") == ("post", "flat")


@pytest.mark.parametrize("kwargs, argument", [
    ({"memory": (np.eye(3)[:1], np.ones(1))}, "memory"),
    ({"backend": "harmonic"}, "backend"),
    ({"backend": "harmonic:1e-9"}, "backend"),
])
def test_options_made_for_unit_tokens_are_refused(kwargs, argument):
    with pytest.raises(ValueError, match=f"^{argument}: expected .*norm 'flat'"):
        af.Attention(beta=1.0, norm="flat", **kwargs)


def test_the_geodesic_method_is_refused_and_masks_of_r_d_are_not():
    x0 = RNG.normal(size=(N, D))
    with pytest.raises(ValueError, match="^method: expected a method for states in R"):
        af.simulate(af.Attention(beta=1.0, norm="flat"), x0, 1.0, method="geodesic")
    for mask in ("causal", "full", "window:2"):
        assert np.all(np.isfinite(af.Attention(beta=1.0, mask=mask, norm="flat").field(x0)))
    res = CliRunner().invoke(app, ["simulate", "--n", "8", "--d", "3", "--norm", "flat",
                                   "--method", "geodesic", "--no-progress"])
    assert res.exit_code == 2 and "method" in res.output and "R^d" in res.output


def test_a_flat_block_with_an_mlp_has_the_exact_jacobian_of_its_field():
    x = RNG.normal(size=(4, D))
    model = af.Attention(Q, K, V, beta=BETA, mask="causal", norm="flat",
                         mlp=af.MLP.random(D, 8, "gelu", seed=1))
    assert model.mlp_scheme.kind == "flat" and model.has_exact_jacobian
    J, h = model.jacobian(x), 1e-6
    for k in range(4):
        for b in range(D):
            e = np.zeros_like(x)
            e[k, b] = h
            np.testing.assert_allclose(J[:, :, k, b],
                                       (model.field(x + e) - model.field(x - e)) / (2 * h),
                                       atol=1e-7)
