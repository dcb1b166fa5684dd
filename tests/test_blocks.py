"""Blocks of the composable family: the feed-forward term, the two time-stepping forms,
QK-norm, RMSNorm schemes, factored heads, and the errors for bad parts.

Independent truths: plain-numpy layers written here (softmax attention, MLPs from math's erf
and tanh), central finite differences, scipy's DOP853 at tight tolerances."""

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.analysis import energy
from attnflow.family import MLP, Block, Peri, Pre, QKNorm, RMSNorm, SelfAttention

RNG = np.random.default_rng(7)


def _mlp(d=4, h=6, activation="swiglu", seed=1):
    return MLP.random(d, h, activation, seed=seed)


def _silu(z):
    return z / (1 + math.exp(-z))


def _gelu(z):
    return z * 0.5 * (1 + math.erf(z / math.sqrt(2)))


def _gelu_tanh(z):
    return 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "gelu", "relu"])
def test_mlp_is_the_textbook_feed_forward_layer(activation):
    m = _mlp(activation=activation)
    u = RNG.normal(size=(3, 5, 4))
    act = {"swiglu": _silu, "geglu": _gelu_tanh, "gelu": _gelu, "relu": lambda z: max(z, 0.0)}
    expected = np.empty_like(u)
    for idx in np.ndindex(u.shape[:-1]):
        x = u[idx]
        z = m.W_up @ x
        if m.W_gate is None:
            hidden = np.array([act[activation](v) for v in z])
        else:
            hidden = np.array([act[activation](v) for v in m.W_gate @ x]) * z
        expected[idx] = m.W_down @ hidden
    np.testing.assert_allclose(m(u), expected, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "gelu"])
def test_mlp_jacobian_against_central_differences(activation):
    m = _mlp(activation=activation)
    u = RNG.normal(size=(2, 4))
    J = m.jacobian(u)  # (2, 4, 4)
    eps = 1e-6
    for i in range(2):
        for b in range(4):
            du = np.zeros_like(u)
            du[i, b] = eps
            col = (m(u + du) - m(u - du))[i] / (2 * eps)
            np.testing.assert_allclose(J[i, :, b], col, rtol=1e-7, atol=1e-8)


def _attn_reference(u, Q, K, V, beta, causal=True):
    """softmax(beta <Q u_i, K u_j>) weighted sum of V u_j, row by row."""
    n = u.shape[0]
    out = np.zeros_like(u)
    for i in range(n):
        js = range(i + 1) if causal else range(n)
        s = np.array([beta * (Q @ u[i]) @ (K @ u[j]) for j in js])
        w = np.exp(s - s.max())
        w /= w.sum()
        out[i] = sum(wj * (V @ u[j]) for wj, j in zip(w, js))
    return out


def _rms(x, g, eps):
    return g * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def test_sequential_euler_step_one_is_the_pre_ln_transformer_layer():
    d = 4
    Q, K, V = (RNG.normal(size=(d, d)) / 2 for _ in range(3))
    g1, g2 = RNG.uniform(0.5, 1.5, d), RNG.uniform(0.5, 1.5, d)
    m = _mlp(d)
    block = af.Attention(Q, K, V, beta=0.7, norm=Pre(RMSNorm(g1, 1e-5)), mlp=m,
                         mlp_norm=Pre(RMSNorm(g2, 1e-5)), form="sequential", backend="dense")
    x = RNG.normal(size=(6, d))
    traj = af.simulate(block, x, 1.0, save_at=[0.0, 1.0], method="euler", dt=1.0)
    y = x + _attn_reference(_rms(x, g1, 1e-5), Q, K, V, 0.7)
    expected = y + m(_rms(y, g2, 1e-5))
    np.testing.assert_allclose(traj.states[-1], expected, rtol=1e-12)
    # the continuous form's Euler step adds both sublayers at the same state instead
    cont = af.Attention(Q, K, V, beta=0.7, norm=Pre(RMSNorm(g1, 1e-5)), mlp=m,
                        mlp_norm=Pre(RMSNorm(g2, 1e-5)), backend="dense")
    one = af.simulate(cont, x, 1.0, save_at=[0.0, 1.0], method="euler", dt=1.0).states[-1]
    np.testing.assert_allclose(one, x + _attn_reference(_rms(x, g1, 1e-5), Q, K, V, 0.7)
                               + m(_rms(x, g2, 1e-5)), rtol=1e-12)
    assert np.abs(one - expected).max() > 1e-3  # the two forms differ at dt = 1


def _ode_reference(block, x0, t_end):
    n, d = x0.shape

    def f(t, y):
        return block.field(y.reshape(n, d)).ravel()

    sol = solve_ivp(f, (0, t_end), x0.ravel(), method="DOP853", rtol=1e-13, atol=1e-13)
    return sol.y[:, -1].reshape(n, d)


def test_continuous_block_with_mlp_rk4_has_order_four_and_sequential_converges_to_it():
    d = 3
    block = af.Attention(beta=2.0, norm="pre", mlp=_mlp(d, 5, "geglu", seed=3),
                         backend="dense")
    x0 = RNG.normal(size=(5, d))
    exact = _ode_reference(block, x0, 1.0)
    # (asymptotic regime: at dt = 0.2 the observed order is still about 3.5)
    errs = [np.abs(af.simulate(block, x0, 1.0, save_at=[0.0], method="rk4", dt=dt).final
                   - exact).max() for dt in (0.1, 0.05, 0.025)]
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(orders - 4) < 0.4), orders
    seq = af.Attention(beta=2.0, norm="pre", mlp=block.mlp, form="sequential",
                       backend="dense")
    errs = [np.abs(af.simulate(seq, x0, 1.0, save_at=[0.0], method="euler", dt=dt).final
                   - exact).max() for dt in (0.02, 0.01, 0.005)]
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(orders - 1) < 0.2), orders  # Lie-Trotter splitting: first order
    with pytest.raises(ValueError, match="method: expected 'euler'"):
        af.simulate(seq, x0, 1.0, method="rk4")


def test_post_ln_block_with_mlp_has_the_exact_jacobian():
    d = 3
    block = af.Attention(RNG.normal(size=(d, d)), None, RNG.normal(size=(d, d)) / 2, beta=1.5,
                         mlp=_mlp(d, 4, "swiglu"), backend="dense")
    assert block.has_exact_jacobian
    x = af.sphere.uniform(4, d, seed=2)
    J = block.jacobian(x)
    eps = 1e-6
    for k in range(4):
        for b in range(d):
            dx = np.zeros_like(x)
            dx[k, b] = eps
            col = (block.field(x + dx) - block.field(x - dx)) / (2 * eps)
            np.testing.assert_allclose(J[:, :, k, b], col, rtol=1e-6, atol=1e-7)
    traj = af.simulate(block, x, 5.0, method="bdf", rtol=1e-8, atol=1e-10)
    ref = af.simulate(block, x, 5.0, method="rk4", dt=0.01)
    np.testing.assert_allclose(traj.final, ref.final, atol=1e-6)
    assert traj.integrator["n_jacobians"] > 0
    pre = af.Attention(norm="pre", mlp=_mlp(d))
    assert not pre.has_exact_jacobian
    with pytest.raises(ValueError, match="method: expected an explicit method for blocks with "
                       "a feed-forward term outside post-LN"):
        af.simulate(pre, x, 1.0, method="radau")


def test_qk_norm_normalises_queries_and_keys_per_head_before_rope():
    d, e = 4, 4
    Q, K = RNG.normal(size=(e, d)), RNG.normal(size=(e, d))
    gq, gk = RNG.uniform(0.5, 2, e), RNG.uniform(0.5, 2, e)
    layer = af.Attention(Q, K, None, beta=1.0, qk_norm=QKNorm(gq, gk, eps=1e-6),
                         mask="full", backend="dense")
    x = af.sphere.uniform(5, d, seed=4)
    q, k = _rms(x @ Q.T, gq, 1e-6), _rms(x @ K.T, gk, 1e-6)
    s = q @ k.T
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(layer.attention_matrix(x), w, rtol=1e-12)
    A = w @ x
    np.testing.assert_allclose(layer.field(x), A - np.sum(A * x, axis=1, keepdims=True) * x,
                               rtol=1e-12, atol=1e-15)


def test_factored_heads_and_sandwich_norms_match_a_numpy_layer():
    d, e = 6, 2
    Wq, Wk, Wv = (RNG.normal(size=(e, d)) for _ in range(3))
    O = RNG.normal(size=(d, e))
    g_in, g_out = RNG.uniform(0.5, 2, d), RNG.uniform(0.5, 2, d)
    block = af.Attention(heads=[(Wq, Wk, Wv, O)], beta=0.5, backend="dense",
                         norm=Peri(RMSNorm(g_in, 1e-6), RMSNorm(g_out, 1e-6)))
    x = RNG.normal(size=(5, d))
    u = _rms(x, g_in, 1e-6)
    expected = _rms(_attn_reference(u, Wq, Wk, O @ Wv, 0.5), g_out, 1e-6)
    np.testing.assert_allclose(block.field(x), expected, rtol=1e-12)


def test_a_mixed_stack_saves_and_loads_bit_identically_and_has_an_energy(tmp_path):
    d = 4
    layers = [af.Attention(beta=1.0, norm="pre", mlp=_mlp(d, 4, "relu")),
              af.Attention(beta=2.0, norm=Pre(RMSNorm(RNG.uniform(0.5, 1, d), 1e-5))),
              af.Attention(beta=0.5, norm="peri", rope=af.RoPE(100.0, "adjacent"),
                           heads=[(None, None, None)] * 2),
              af.Attention(beta=1.0, norm="pre", mlp=_mlp(d, 3, "swiglu", 5),
                           qk_norm=QKNorm(eps=1e-6), form="sequential")]
    stack = af.Stack(layers)
    x0 = RNG.normal(size=(2, 4, d))
    traj = af.simulate(stack, x0, 4.0, method="euler", dt=0.25)
    for suffix in (".nc", ".zarr"):
        back = af.load(traj.save(tmp_path / f"mixed{suffix}"))
        again = af.simulate(back.model, x0, 4.0, method="euler", dt=0.25)
        np.testing.assert_array_equal(again.states, traj.states)
        assert [type(la.mlp).__name__ for la in back.model.layers] == \
            ["MLP", "NoneType", "NoneType", "MLP"]
    with pytest.raises(ValueError, match="one \\(Q, K, V\\) head each"):
        traj.energy()  # layer 2 has two heads
    single = af.Stack(layers[:2])
    two = af.simulate(single, x0, 2.0, save_at=[0.0, 0.5, 1.5, 2.0], method="euler", dt=0.25)
    expected = [energy.energy(two.directions[i], layer.beta) for i, layer in
                zip(range(4), [layers[0], layers[0], layers[1], layers[1]])]
    np.testing.assert_allclose(two.energy(), np.array(expected), rtol=1e-13)


@pytest.mark.parametrize("build,pattern", [
    (lambda: MLP(np.ones((5, 4)), np.ones((3, 5)), np.ones((5, 4))),
     r"mlp.W_down: expected shape \(4, 5\) to match W_up \(5, 4\), received"),
    (lambda: MLP.random(4, 5, "swish"), r"mlp.activation: expected one of .*received 'swish'"),
    (lambda: af.Attention(mlp=MLP.random(3, 5), V=np.eye(4)),
     r"mlp: expected weights for tokens of dimension d = 4"),
    (lambda: af.Attention(np.ones((2, 4)), np.ones((2, 4)), qk_norm=QKNorm(np.ones(3))),
     r"qk_norm.gain_q: expected a gain of shape \(2,\) \(the head size\), received"),
    (lambda: af.Stack([af.Attention(V=np.eye(3)), af.Attention(V=np.eye(4))]),
     r"layers: expected layers of one dimension d"),
    (lambda: af.Attention(rope=100.0, parts=[af.RoPE(10.0)]),
     r"rope: expected one encoding of each kind \(a part given once\)"),
    (lambda: af.Attention(attention="unnormalised", parts=[af.family.Weighting("softmax")]),
     r"attention: expected one value \(a part given once\)"),
    (lambda: af.Attention(norm=Pre(RMSNorm(np.ones(3))), V=np.eye(4)),
     r"norm.norm.gain: expected a gain of shape \(4,\)"),
    (lambda: af.Attention(norm="pre", mlp=MLP.random(2, 3), mlp_norm="post"),
     r"mlp_norm: expected a scheme on the euclidean like norm 'pre'"),
    (lambda: Block(SelfAttention([(None, None, None)]), form="split"),
     r"form: expected one of \('continuous', 'sequential'\), received 'split'"),
])
def test_bad_parts_name_the_argument(build, pattern):
    with pytest.raises(ValueError, match=pattern):
        build()


def test_cli_simulates_a_saved_mixed_stack_and_builds_family_flags(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    d = 4
    stack = af.Stack([af.Attention(beta=1.0, norm="pre", mlp=_mlp(d, 3, "relu")),
                      af.Attention(beta=2.0, norm="peri", form="sequential",
                                   mlp=_mlp(d, 5, "swiglu", 2))])
    saved = tmp_path / "stack.nc"
    af.simulate(stack, RNG.normal(size=(3, d)), 2.0, method="euler", dt=0.5).save(saved)
    out = tmp_path / "cli.nc"
    run = CliRunner().invoke(app, ["simulate", "--layers", str(saved), "--n", "6", "--t-end",
                                   "2", "--method", "euler", "--dt", "0.25", "--seed", "3",
                                   "--no-progress", "--out", str(out)])
    assert run.exit_code == 0, run.output
    traj = af.load(out)
    again = af.simulate(af.load(saved).model, af.sphere.uniform(6, d, 3), 2.0,
                        save_at=traj.times, method="euler", dt=0.25)
    np.testing.assert_array_equal(traj.states, again.states)
    bad = CliRunner().invoke(app, ["simulate", "--layers", str(saved), "--mlp", "relu:3",
                                   "--out", str(tmp_path / "x.nc")])
    assert bad.exit_code == 2 and "--mlp: expected no value with --layers .nc" in bad.output
    out2 = tmp_path / "flags.nc"
    run = CliRunner().invoke(app, ["simulate", "--n", "5", "--d", "4", "--t-end", "0.5",
                                   "--norm", "pre", "--mlp", "geglu:8:1", "--qk-norm", "rms",
                                   "--no-progress", "--out", str(out2)])
    assert run.exit_code == 0, run.output
    model = af.load(out2).model
    assert model.mlp.activation == "geglu" and model.mlp.width == 8
    np.testing.assert_array_equal(model.mlp.W_up, MLP.random(4, 8, "geglu", 1).W_up)
    assert model.qk_norm is not None and model.norm == "pre"
    for flag, text, pattern in (("--mlp", "swish:4", "--mlp: expected none or ACT:WIDTH"),
                                ("--qk-norm", "l2", "--qk-norm: expected none, rms or rms:EPS")):
        bad = CliRunner().invoke(app, ["simulate", flag, text, "--out", str(tmp_path / "y.nc")])
        assert bad.exit_code == 2 and pattern in bad.output, bad.output
