"""The model family (docs/science.md §6): normalisation schemes, positional encodings,
attention normalisations, stacks of layers; checked against closed forms and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.sphere import uniform

SCHEMES = ("post", "pre", "peri", "ngpt")


def equiangular(n: int, d: int, rho: float) -> np.ndarray:
    """n unit vectors with all pairwise inner products rho (n <= d - 1)."""
    X = np.zeros((n, d))
    X[:, 0] = np.sqrt(rho)
    X[np.arange(n), np.arange(1, n + 1)] = np.sqrt(1 - rho)
    return X


def mean_inner(X: np.ndarray) -> np.ndarray:
    """Mean off-diagonal inner product of the directions, (T, n, d) -> (T,)."""
    theta = X / np.linalg.norm(X, axis=-1, keepdims=True)
    G = theta @ np.swapaxes(theta, -1, -2)
    n = X.shape[-2]
    return (G.sum(axis=(-1, -2)) - n) / (n * (n - 1))


# ---------------------------------------------------------------- equiangular closed forms
def rho_softmax(t, rho, beta, n):
    e = np.exp(beta * (rho - 1))  # e^{beta rho} / e^{beta}, stable
    return 2 * e * (1 - rho) * ((n - 1) * rho + 1) / (1 + (n - 1) * e)


def rho_unnormalised(t, rho, beta, n):
    return (2 / n) * np.exp(beta * rho) * (1 - rho) * ((n - 1) * rho + 1)


@pytest.mark.parametrize("attention, rhs", [("softmax", rho_softmax),
                                            ("unnormalised", rho_unnormalised)])
def test_equiangular_inner_product_follows_its_ode(attention, rhs):
    n, d, beta, rho0 = 4, 6, 2.0, 0.1
    times = np.linspace(0, 3, 7)
    model = af.Attention(beta=beta, mask="full", attention=attention, backend="dense")
    traj = af.simulate(model, equiangular(n, d, rho0), 3.0, save_at=times, method="dopri5",
                       rtol=1e-12, atol=1e-13)
    ref = solve_ivp(rhs, (0, 3), [rho0], t_eval=times, args=(beta, n), method="DOP853",
                    rtol=1e-13, atol=1e-14).y[0]
    G = traj.states @ np.swapaxes(traj.states, -1, -2)
    off = G[:, ~np.eye(n, dtype=bool)]
    assert np.ptp(off, axis=1).max() < 1e-9  # stays equiangular
    assert np.max(np.abs(mean_inner(traj.states) - ref)) < 1e-8


def _fit(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(x, y, 1)[0])


def test_post_ln_collapses_at_rate_two_and_pre_ln_like_t_to_the_minus_two():
    n, d, beta, rho0 = 3, 4, 1.0, 0.2
    X0 = equiangular(n, d, rho0)
    post = af.simulate(af.Attention(beta=beta, mask="full"), X0, 8.0,
                       save_at=np.linspace(4, 8, 9), dt=0.01)
    rate = -_fit(post.times, np.log(1 - mean_inner(post.states)))
    assert rate == pytest.approx(2.0, rel=0.05)
    t = np.geomspace(200, 1000, 9)
    pre = af.simulate(af.Attention(beta=beta, mask="full", norm="pre"), X0, 1000.0, save_at=t,
                      method="dopri5", rtol=1e-10, atol=1e-12)
    power = -_fit(np.log(pre.times), np.log(1 - mean_inner(pre.states)))
    assert power == pytest.approx(2.0, rel=0.05)
    radius = pre.radii[-1].mean() / pre.times[-1]
    assert 0.5 < radius < 1.5  # the radius grows linearly (|A| -> 1 once collapsed)


@pytest.mark.parametrize("norm", SCHEMES)
def test_every_scheme_ends_in_one_cluster(norm):
    X0 = uniform(6, 3, seed=1)
    traj = af.simulate(af.Attention(beta=1.0, mask="causal", norm=norm), X0, 400.0,
                       save_at=[50.0, 100.0, 200.0, 400.0], dt=0.2)
    spread = [1 - np.min(theta @ theta.T) for theta in traj.directions]
    assert np.all(np.diff(spread) < 1e-12) and spread[-1] < 0.02  # (pre/peri: slowly, ~ 1/t)
    if norm in ("post", "ngpt"):
        assert np.allclose(np.linalg.norm(traj.states, axis=-1), 1, atol=1e-12)


@pytest.mark.parametrize("norm", SCHEMES)
def test_euler_step_of_size_one_is_the_transformer_layer(norm):
    X0 = uniform(5, 4, seed=2) * np.array([[1.0], [2.0], [0.5], [1.5], [1.0]])
    if norm in ("post", "ngpt"):
        X0 = X0 / np.linalg.norm(X0, axis=-1, keepdims=True)
    model = af.Attention(beta=2.0, mask="causal", norm=norm, alpha=0.3)
    out = af.simulate(model, X0, 1.0, save_at=[1.0], method="euler", dt=1.0).final
    theta = X0 / np.linalg.norm(X0, axis=-1, keepdims=True)
    attn = model.attention_output(theta)  # attention reads the normalised tokens

    def unit(y):
        return y / np.linalg.norm(y, axis=-1, keepdims=True)

    layer = {"post": unit(X0 + attn), "pre": X0 + attn, "peri": X0 + unit(attn),
             "ngpt": unit(X0 + 0.3 * unit(attn))}[norm]
    np.testing.assert_allclose(out, layer, rtol=1e-14, atol=1e-14)


# ---------------------------------------------------------------- causality, every option
OPTIONS = [dict(norm=s) for s in SCHEMES] + [
    dict(rope=af.RoPE(10.0)), dict(rope=af.RoPE(10.0, "adjacent", offset=3.0)),
    dict(alibi=None, rope=None, attention="unnormalised"), dict(alibi=af.ALiBi()),
    dict(alibi=0.5, norm="pre", rope=af.RoPE(100.0)), dict(mask=("window", 3), alibi=0.2)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}" for k in o))
def test_perturbing_token_k_leaves_earlier_tokens_bit_identical(options):
    options = {"mask": "causal", **options}
    rng = np.random.default_rng(3)
    heads = [tuple(rng.normal(size=(4, 4)) / 2 for _ in range(3)) for _ in range(2)]
    model = af.Attention(heads=heads, beta=2.0, **options)
    X0 = uniform(7, 4, seed=4)
    Y0 = X0.copy()
    Y0[4] = uniform(1, 4, seed=5)[0]
    a = af.simulate(model, X0, 2.0, dt=0.1).states
    b = af.simulate(model, Y0, 2.0, dt=0.1).states
    assert np.array_equal(a[:, :4], b[:, :4])
    assert not np.array_equal(a[:, 4:], b[:, 4:])


# ---------------------------------------------------------------- positions
def test_rope_depends_on_position_differences_only():
    X0 = uniform((3, 8), 4, seed=6)
    base = af.simulate(af.Attention(beta=3.0, rope=af.RoPE(10.0)), X0, 2.0, dt=0.1).states
    shifted = af.simulate(af.Attention(beta=3.0, rope=af.RoPE(10.0, offset=17.0)), X0, 2.0,
                          dt=0.1).states
    np.testing.assert_allclose(shifted, base, atol=1e-12)
    plain = af.simulate(af.Attention(beta=3.0), X0, 2.0, dt=0.1).states
    assert np.abs(plain - base).max() > 1e-3  # RoPE itself does change the dynamics


def test_rope_pairings_agree_after_permuting_query_and_key_rows():
    e, d = 4, 6
    rng = np.random.default_rng(7)
    Q, K, V = rng.normal(size=(e, d)), rng.normal(size=(e, d)), rng.normal(size=(d, d)) / 3
    perm = np.array([0, 2, 1, 3])  # halves pairs (0,2),(1,3) -> adjacent (0,1),(2,3)
    X0 = uniform(9, d, seed=8)
    halves = af.Attention(Q, K, V, beta=1.0, rope=af.RoPE(50.0, "halves"))
    adjacent = af.Attention(Q[perm], K[perm], V, beta=1.0, rope=af.RoPE(50.0, "adjacent"))
    np.testing.assert_allclose(adjacent.field(X0), halves.field(X0), atol=1e-13)


def test_rope_with_huge_base_rotates_only_the_first_pair():
    """omega_p = base^(-2p/e): pair 0 turns at frequency 1 for every base, so base -> infinity
    is the plain model with that one pair rotated (not the plain model)."""
    e = 4
    X0 = uniform(6, e, seed=9)
    huge = af.Attention(beta=2.0, rope=af.RoPE(1e300), mask="full")
    m = np.arange(6.0)
    R = np.zeros((6, e, e))  # the rotation of pair (0, 2) by angle m, others fixed
    R[:, 0, 0] = R[:, 2, 2] = np.cos(m)
    R[:, 0, 2], R[:, 2, 0] = -np.sin(m), np.sin(m)
    R[:, 1, 1] = R[:, 3, 3] = 1.0
    q = np.einsum("kab,kb->ka", R, X0)
    S = 2.0 * q @ q.T
    W = np.exp(S - S.max(1, keepdims=True))
    W /= W.sum(1, keepdims=True)
    F = W @ X0
    F -= np.sum(F * X0, -1, keepdims=True) * X0
    np.testing.assert_allclose(huge.field(X0), F, atol=1e-13)


def test_alibi_with_slope_zero_is_the_plain_model_and_biases_recency():
    X0 = uniform((2, 10), 3, seed=10)
    plain = af.Attention(beta=4.0)
    np.testing.assert_allclose(af.Attention(beta=4.0, alibi=0.0).field(X0), plain.field(X0),
                               atol=1e-14)
    W = af.Attention(beta=0.0, alibi=1.0).attention_matrix(X0)[0]
    np.testing.assert_allclose(W[5, :6], np.exp(-np.arange(5, -1, -1.0)) / np.exp(
        -np.arange(6.0)).sum(), atol=1e-14)


def test_default_alibi_slopes_are_powers_of_two_per_head():
    heads = [(None, None, None)] * 4
    model = af.Attention(heads=heads, beta=0.0, alibi=af.ALiBi())
    for h in range(4):
        b = model.score_bias(3, h).matrix(3)  # kept structured (a LinearBias) for the kernels
        assert b[2, 0] == -2 * 2.0 ** (-8 * (h + 1) / 4)


def test_memory_tokens_work_beside_positions():
    mem = (uniform(2, 4, seed=11), np.array([2.0, 3.0]))
    X0 = uniform(5, 4, seed=12)
    model = af.Attention(beta=2.0, memory=mem, rope=af.RoPE(10.0), alibi=0.3)
    W = model.attention_matrix(X0)
    assert W.shape == (5, 7)
    np.testing.assert_allclose(W.sum(-1), 1.0, atol=1e-14)
    traj = af.simulate(model, X0, 1.0, dt=0.1)
    assert np.isfinite(traj.states).all()


def test_sinkhorn_weights_are_doubly_stochastic():
    X0 = uniform(6, 3, seed=13)
    W = af.Attention(beta=3.0, mask="full", attention=("sinkhorn", 200)).attention_matrix(X0)
    np.testing.assert_allclose(W.sum(0), 1.0, atol=1e-9)
    np.testing.assert_allclose(W.sum(1), 1.0, atol=1e-9)


# ---------------------------------------------------------------- stacks
def test_a_stack_of_identical_layers_is_the_tied_model():
    rng = np.random.default_rng(14)
    layer = af.Attention(rng.normal(size=(4, 4)), None, None, beta=2.0, rope=af.RoPE(20.0))
    X0 = uniform((2, 6), 4, seed=15)
    tied = af.simulate(layer, X0, 4.0, save_at=[1, 2.5, 4], dt=0.05)
    stack = af.simulate(af.Stack([layer] * 4), X0, 4.0, save_at=[1, 2.5, 4], dt=0.05)
    np.testing.assert_array_equal(stack.states, tied.states)


def test_a_stack_applies_layer_l_on_l_to_l_plus_one():
    a, b = af.Attention(beta=1.0), af.Attention(beta=9.0, mask="full")
    X0 = uniform(5, 3, seed=16)
    two = af.simulate(af.Stack([a, b]), X0, 2.0, save_at=[1.0, 2.0], method="euler", dt=1.0)
    first = af.simulate(a, X0, 1.0, save_at=[1.0], method="euler", dt=1.0).final
    second = af.simulate(b, first, 1.0, save_at=[1.0], method="euler", dt=1.0).final
    np.testing.assert_array_equal(two.states[0], first)
    np.testing.assert_array_equal(two.states[1], second)


@pytest.mark.parametrize("path", ["run.nc", "run.zarr"])
def test_every_option_survives_save_and_load(tmp_path, path):
    rng = np.random.default_rng(17)
    Kshared, Vshared = rng.normal(size=(4, 6)), rng.normal(size=(6, 6)) / 4
    gqa = [(rng.normal(size=(4, 6)), Kshared, Vshared) for _ in range(2)]
    layers = [af.Attention(heads=gqa, beta=0.5, norm="pre", rope=af.RoPE(1e4, "adjacent", 2.0),
                           alibi=(0.1, 0.2)),
              af.Attention(beta=2.0, norm="pre", mask="full", attention="unnormalised",
                           bias=rng.normal(size=(5, 5)))]
    X0 = uniform(5, 6, seed=18) * 2.0
    traj = af.simulate(af.Stack(layers), X0, 2.0, dt=0.1, noise=0.1, seed=3, method="euler")
    traj.save(tmp_path / path)
    back = af.load(tmp_path / path)
    np.testing.assert_array_equal(back.states, traj.states)
    again = af.simulate(back.model, X0, 2.0, dt=0.1, noise=0.1, seed=3, method="euler")
    np.testing.assert_array_equal(again.states, traj.states)
    assert back.integrator["noise"] == 0.1


# ---------------------------------------------------------------- bad input
BAD = [
    (dict(rope=af.RoPE(10.0)), {"Q": np.ones((3, 3))}, "rope"),
    (dict(alibi=(0.1, 0.2, 0.3)), {}, "alibi"),
    (dict(attention="sinkhorn"), {}, "attention"),
    (dict(attention="softmax2"), {}, "attention"),
    (dict(norm="middle"), {}, "norm"),
    (dict(norm="ngpt", alpha=-1.0), {}, "alpha"),
    (dict(alibi=-1.0), {}, "alibi"),
    (dict(bias=np.ones((2, 3))), {}, "bias"),
    (dict(attention="unnormalised", backend="fused"), {}, "backend"),
    (dict(mask=np.zeros((3, 3), bool)), {}, "mask"),
]


@pytest.mark.parametrize("kwargs, matrices, name", BAD)
def test_bad_options_name_the_argument(kwargs, matrices, name):
    with pytest.raises(ValueError, match=rf"^{name}\b.*expected.*received"):
        af.Attention(beta=1.0, **matrices, **kwargs)


def test_bad_pairing_and_base():
    with pytest.raises(ValueError, match="rope.pairing: expected one of"):
        af.RoPE(10.0, "interleaved")
    with pytest.raises(ValueError, match="rope.base: expected"):
        af.RoPE(0.0)


def test_stack_layers_must_agree():
    with pytest.raises(ValueError, match="layers: expected layers of one dimension"):
        af.Stack([af.Attention(np.eye(2)), af.Attention(np.eye(3))])
    with pytest.raises(ValueError, match="layers: expected layers on one state space"):
        af.Stack([af.Attention(norm="post"), af.Attention(norm="pre")])
    with pytest.raises(ValueError, match="t_end: expected a time <= 2"):
        af.simulate(af.Stack([af.Attention()] * 2), uniform(3, 2, seed=0), 3.0)


def test_geodesic_needs_the_sphere():
    with pytest.raises(ValueError, match="method: expected a method for states in R"):
        af.simulate(af.Attention(norm="pre"), uniform(3, 2, seed=0), 1.0, method="geodesic")


def test_mask_row_with_memory_is_allowed():
    mask = np.zeros((3, 3), bool)
    model = af.Attention(mask=mask, memory=(uniform(1, 2, seed=0), np.ones(1)))
    assert np.isfinite(model.field(uniform(3, 2, seed=1))).all()


# ---------------------------------------------------------------- text forms, sweeps
def test_sweep_grid_over_the_family_matches_direct_simulation():
    from attnflow.sweeps import parse_spec
    from attnflow.sweeps import sweep as sweep_fn

    spec = {"grid": {"beta": 2.0, "n": 6, "d": 4, "norm": ["post", "pre"],
                     "rope": ["none", "100:adjacent"], "alibi": "0.5", "method": "euler",
                     "dt": 0.1, "noise": 0.2, "t_end": 1.0, "save_at": [0.0, 0.5, 1.0],
                     "seeds": 2},
            "keep": {"metrics": ["max_distance_to_first"], "states": True}}
    ds = sweep_fn(parse_spec(spec), scheduler="serial").load()
    assert (ds.status.values == 1).all()
    pre = ds.sel(norm="pre", rope="100:adjacent")
    post = ds.sel(norm="post", rope="100:adjacent")
    final = pre.states.isel(time=-1).values  # (seed, token, coord)
    assert np.abs(np.linalg.norm(final, axis=-1) - 1).max() > 1e-3  # pre-LN: radii move
    np.testing.assert_allclose(np.linalg.norm(post.states.values, axis=-1), 1.0, atol=1e-12)
    # the same run again, seed 0: tokens and Brownian key from the sweep's seed streams
    again = sweep_fn(parse_spec(spec), scheduler="serial").load()
    np.testing.assert_array_equal(again.states.values, ds.states.values)
    assert not np.array_equal(ds.states.values[..., 0, :, :, :], ds.states.values[..., 1, :, :, :])


@pytest.mark.parametrize("field, value", [("norm", "middle"), ("rope", "ten"),
                                          ("alibi", "x"), ("attention", "sinkhorn:0"),
                                          ("noise", -1.0)])
def test_sweep_grid_rejects_bad_family_values(field, value):
    from attnflow.sweeps import parse_spec

    spec = {"grid": {"beta": 1.0, "n": 4, "d": 2, field: value, "t_end": 1.0, "seeds": 1}}
    with pytest.raises(ValueError, match=rf"grid\.{field}.*expected"):
        parse_spec(spec)


def test_layers_from_npz_is_a_stack_with_grouped_query_heads(tmp_path):
    from attnflow.family.text import layers_from_npz

    rng = np.random.default_rng(20)
    K = rng.normal(size=(3, 1, 4, 6)).repeat(2, axis=1)  # 2 query heads share a key head
    np.savez(tmp_path / "w.npz", Q=rng.normal(size=(3, 2, 4, 6)), K=K,
             V=rng.normal(size=(3, 2, 6, 6)) / 5)
    stack = layers_from_npz(tmp_path / "w.npz", beta=0.5, norm="pre", rope=af.RoPE(100.0))
    assert len(stack) == 3 and stack.manifold.name == "euclidean"
    assert np.array_equal(stack.layers[2].heads[0][1], stack.layers[2].heads[1][1])
    with pytest.raises(ValueError, match="layers: expected arrays of shape"):
        np.savez(tmp_path / "bad.npz", Q=np.ones((2, 1, 4, 6)), K=np.ones((3, 1, 4, 6)))
        layers_from_npz(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="layers: expected a readable .npz"):
        layers_from_npz(tmp_path / "missing.npz")


def test_cli_simulates_a_noisy_pre_ln_rope_stack_and_records_it(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    rng = np.random.default_rng(21)
    np.savez(tmp_path / "w.npz", Q=rng.normal(size=(2, 2, 4, 6)),
             K=rng.normal(size=(2, 2, 4, 6)), V=rng.normal(size=(2, 2, 6, 6)) / 5)
    out = tmp_path / "run.nc"
    args = ["simulate", "--layers", str(tmp_path / "w.npz"), "--norm", "pre", "--rope",
            "100:adjacent", "--alibi", "default", "--noise", "0.1", "--method", "euler",
            "--dt", "0.1", "--t-end", "2", "--n", "7", "--batch", "2", "--beta", "0.5",
            "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    traj = af.load(out)
    assert isinstance(traj.model, af.Stack) and len(traj.model) == 2
    layer = traj.model.layers[1]
    assert layer.norm == "pre" and layer.encodings[0] == af.RoPE(100.0, "adjacent")
    assert traj.integrator["noise"] == 0.1 and traj.states.shape == (21, 2, 7, 6)
    x0 = traj.states[0]
    again = af.simulate(traj.model, x0, 2.0, save_at=traj.times, method="euler", dt=0.1,
                        noise=0.1, seed=traj.seed)
    np.testing.assert_array_equal(again.states, traj.states)


@pytest.mark.parametrize("args, message", [
    (["--norm", "middle"], "--norm: expected one of post, pre, peri, ngpt"),
    (["--rope", "ten"], "--rope: expected none or BASE"),
    (["--alibi", "0.1,0.2"], "--alibi: expected 1 slopes"),
    (["--attention", "sinkhorn"], "--attention: expected 'sinkhorn' with mask='full'"),
    (["--noise", "0.1"], "--method: expected one of euler, geodesic with --noise"),
    (["--noise", "-1", "--method", "euler"], "--noise: expected sigma >= 0"),
    (["--norm", "pre", "--method", "geodesic"], "--method: expected a method for states in R^d"),
])
def test_cli_family_options_fail_in_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from attnflow.cli import app

    result = CliRunner().invoke(app, ["simulate", "--n", "4", "--t-end", "1", "--out",
                                      str(tmp_path / "r.nc"), *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r.nc").exists()


@pytest.mark.parametrize("options", [dict(norm="pre"), dict(norm="ngpt"), dict(alibi=0.5)])
def test_implicit_methods_without_an_exact_jacobian_use_finite_differences(options):
    model = af.Attention(beta=1.0, **options)
    assert not model.has_exact_jacobian
    X0 = uniform(5, 3, seed=22)
    implicit = af.simulate(model, X0, 3.0, save_at=[3.0], method="bdf", rtol=1e-8, atol=1e-10)
    reference = af.simulate(model, X0, 3.0, save_at=[3.0], method="rk4", dt=0.005)
    np.testing.assert_allclose(implicit.final, reference.final, atol=1e-6)
    with pytest.raises(ValueError, match="model: expected post-LN softmax attention"):
        model.jacobian(X0)
