"""The fused kernel on CPU tensors with its fused backward (kernels/fused_torch.py,
kernels/fused_backward.py) against autograd through a plain torch softmax written here:
values and every gradient (q, k, v, beta, memory keys, values and log-weights, ALiBi's
slope) to 1e-12 in float64 over masks, memory, biases, beta of either sign and head sizes;
torch.autograd.gradcheck; the double backward refused; simulate choosing it and matching
the SDPA path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnflow as af
from attnflow.kernels import fused_torch
from attnflow.kernels.options import LinearBias
from attnflow.kernels.types import Memory
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def reference(q, k, v, beta, mask, memory=None, bias=None):
    """softmax(beta q k^T + bias (+ log a for memory), masked) v from the dense scores."""
    n = q.shape[-2]
    s = beta * (q @ k.transpose(-1, -2))
    i = torch.arange(n)
    if isinstance(bias, LinearBias):
        s = s - bias.slope * (i[:, None] - i[None, :]).abs().to(q.dtype)
    elif bias is not None:
        s = s + torch.as_tensor(bias, dtype=q.dtype)
    if isinstance(mask, np.ndarray):
        allowed = torch.as_tensor(mask)
    elif mask == "full":
        allowed = torch.ones(n, n, dtype=torch.bool)
    else:
        allowed = i[None, :] <= i[:, None]
        if isinstance(mask, tuple):
            allowed = allowed & (i[None, :] > i[:, None] - mask[1])
    s = s.masked_fill(~allowed, -torch.inf)
    if memory is not None:
        mk, mv, lw = memory
        s = torch.cat([s, (beta * (q @ mk.T) + lw).expand(*s.shape[:-1], -1)], -1)
        v = torch.cat([v, mv.expand(*v.shape[:-2], *mv.shape)], -2)
    return torch.softmax(s, -1) @ v


@st.composite
def cases(draw):
    n = draw(st.integers(1, 9))
    e = draw(st.sampled_from([2, 3, 16]))  # (each head size compiles its kernels)
    f = e
    runs = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31))
    kind = draw(st.sampled_from(["causal", "full", "window", "array"]))
    rng = np.random.default_rng(seed)
    if kind == "window":
        mask = ("window", draw(st.integers(1, 4)))
    elif kind == "array":
        mask = rng.random((n, n)) < 0.6
        mask[np.arange(n), rng.integers(0, n, n)] = True  # every row allows a key
    else:
        mask = kind
    bias_kind = draw(st.sampled_from([None, "slope", "slope tensor", "array"]))
    m = draw(st.integers(0, 3))
    beta = draw(st.floats(-3.0, 3.0, allow_nan=False)) * (1 + 3 * (e == 2))
    return dict(n=n, e=e, f=f, runs=runs, rng=rng, mask=mask, bias_kind=bias_kind, m=m,
                beta=beta, tensor_beta=draw(st.booleans()))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_values_and_gradients_match_autograd_through_plain_softmax(c):
    rng, n, e, f, runs, m = c["rng"], c["n"], c["e"], c["f"], c["runs"], c["m"]
    leaf = lambda *shape: torch.tensor(rng.standard_normal(shape) / np.sqrt(e),  # noqa: E731
                                       requires_grad=True)
    q, k, v = leaf(runs, n, e), leaf(runs, n, e), leaf(runs, n, f)
    inputs = [q, k, v]
    memory = None
    if m:
        memory = Memory(leaf(m, e), leaf(m, f), leaf(m))
        inputs += list(memory)
    beta = c["beta"]
    if c["tensor_beta"]:
        beta = torch.tensor(beta, dtype=torch.float64, requires_grad=True)
        inputs.append(beta)
    bias = None
    if c["bias_kind"] == "slope":
        bias = LinearBias(float(rng.random()))
    elif c["bias_kind"] == "slope tensor":
        slope = torch.tensor(rng.random(), requires_grad=True)
        bias = LinearBias(slope)
        inputs.append(slope)
    elif c["bias_kind"] == "array":
        bias = rng.standard_normal((n, n))
    weights = torch.from_numpy(rng.standard_normal((runs, n, f)))
    out = fused_torch.attend_tensor(q, k, v, beta, c["mask"], memory, bias)
    want = reference(q, k, v, beta, c["mask"], memory, bias)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    got = torch.autograd.grad((out * weights).sum(), inputs)
    expected = torch.autograd.grad((want * weights).sum(), inputs)
    for name, a, b in zip(["q", "k", "v", "memory k", "memory v", "log a", "beta", "slope"],
                          got, expected):
        scale = 1 + float(b.abs().max())
        assert float((a - b).abs().max()) <= 1e-12 * scale, name


def test_float32_is_computed_in_float32_close_to_float64():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 20, 3))
    grads = {}
    for dtype in (torch.float32, torch.float64):
        q = torch.tensor(x, dtype=dtype, requires_grad=True)
        out = fused_torch.attend_tensor(q, q, q, 2.0, "causal")
        assert out.dtype == dtype
        (grads[dtype],) = torch.autograd.grad((out ** 2).sum(), q)
    assert grads[torch.float32].dtype == torch.float32
    torch.testing.assert_close(grads[torch.float32].double(), grads[torch.float64],
                               rtol=0, atol=1e-4)


def test_gradcheck_on_small_cases():
    rng = np.random.default_rng(4)
    leaf = lambda *shape: torch.tensor(rng.standard_normal(shape), requires_grad=True)  # noqa: E731
    q, k, v = leaf(2, 5, 3), leaf(2, 5, 3), leaf(2, 5, 2)
    mk, mv, lw = leaf(2, 3), leaf(2, 2), leaf(2)
    slope, beta = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (0.4, -1.3))

    def f(q, k, v, mk, mv, lw, slope, beta):
        return fused_torch.attend_tensor(q, k, v, beta, ("window", 3), Memory(mk, mv, lw),
                                         LinearBias(slope))

    assert torch.autograd.gradcheck(f, (q, k, v, mk, mv, lw, slope, beta))
    assert torch.autograd.gradcheck(
        lambda q, k, v: fused_torch.attend_tensor(q, k, v, 1.5, "full"), (q, k, v))


def test_double_backward_is_refused_in_one_line_naming_sdpa():
    q = torch.tensor(np.random.default_rng(5).standard_normal((2, 6, 2)), requires_grad=True)
    out = fused_torch.attend_tensor(q, q, q, 1.0, "causal")
    with pytest.raises(RuntimeError, match=r"^create_graph: .*backend='torch'[^\n]*$"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_calls_it_does_not_cover_go_to_sdpa_and_torch_func_passes_through():
    from torch.func import grad

    x = torch.tensor(np.random.default_rng(6).standard_normal((2, 6, 2)))
    assert not fused_torch.covers(x.to(torch.bfloat16), 2, 2)
    assert not fused_torch.covers(x, 2, 2, normalization="unnormalised")
    assert not fused_torch.covers(x, 17, 2)
    assert not fused_torch.covers(x, 2, 2, bias=torch.zeros(6, 6, requires_grad=True))
    assert fused_torch.covers(x, 2, 2, bias=LinearBias(torch.tensor(0.5)))
    # unnormalised weights: SDPA's path, same values as the dense reference
    out = fused_torch.attend_tensor(x, x, x, 1.0, "causal", normalization="unnormalised")
    dense = af.kernels.get_kernel("dense")
    torch.testing.assert_close(out, torch.from_numpy(dense(
        x.numpy(), x.numpy(), x.numpy(), 1.0, "causal", normalization="unnormalised")),
        rtol=0, atol=1e-12)
    # torch.func's wrapped tensors have no storage: the call goes to SDPA
    loss = lambda z: fused_torch.attend_tensor(z, z, z, 1.5, "causal").pow(2).sum()  # noqa: E731
    z = x.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(loss(z), z)
    torch.testing.assert_close(grad(loss)(x), plain, rtol=0, atol=1e-12)


def test_simulate_picks_it_on_cpu_and_matches_the_sdpa_path():
    X = torch.from_numpy(uniform((8, 60), 3, seed=7))  # 8 runs, 14 640 pairs: auto.py
    results = {}
    for backend in ("auto", "torch"):
        beta = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
        slope = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        Q = torch.eye(3, dtype=torch.float64, requires_grad=True)
        x = X.clone().requires_grad_(True)
        model = af.Attention(heads=[(Q, None, None)], beta=beta, mask="causal",
                             alibi=slope, backend=backend)
        run = af.simulate(model, x, 0.5, method="rk4", dt=0.05, save_at=[0.5])
        (run.states[-1] * torch.arange(3.0, dtype=torch.float64)).sum().backward()
        results[backend] = (run.integrator["kernel"], run.states[-1].detach(), x.grad,
                            beta.grad, slope.grad, Q.grad)
    assert results["auto"][0] == "fused" and results["torch"][0] == "torch"
    for a, b in zip(results["auto"][1:], results["torch"][1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * (1 + float(b.abs().max())))


@pytest.mark.parametrize("beta", [2.0, 400.0])  # 400: rows past fused.SAFE_SPREAD (exact max)
def test_forward_log_sum_exp_and_gradients_at_small_and_large_beta(beta):
    from attnflow.kernels import fused

    x = uniform((3, 30), 3, seed=12)
    out, lse = fused.attend_lse(x, x, x, beta, "causal", bias=LinearBias(0.1))
    t = torch.from_numpy(x)
    i = torch.arange(30)
    scores = beta * (t @ t.transpose(-1, -2)) - 0.1 * (i[:, None] - i[None, :]).abs().double()
    scores = scores.masked_fill(i[None, :] > i[:, None], -torch.inf)
    want = torch.logsumexp(scores, -1)
    assert float((torch.from_numpy(lse) - want).abs().max()) <= 1e-12 * (1 + beta)
    leaf = t.clone().requires_grad_(True)
    got = torch.autograd.grad(fused_torch.attend_tensor(leaf, leaf, leaf, beta, "causal")
                              .pow(2).sum(), leaf)[0]
    ref = torch.autograd.grad(reference(leaf, leaf, leaf, beta, "causal").pow(2).sum(),
                              leaf)[0]
    assert float((got - ref).abs().max()) <= 1e-12 * (1 + float(ref.abs().max()))
