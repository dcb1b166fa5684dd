"""`attnflow.influence`: d x_target(t) / d x_j(0) from one backward pass, against central
differences of the numpy engine, against an independent RK4 with renormalisation written
here in torch (its Jacobian by torch.autograd.functional), causality, and its input checks."""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnflow as af  # noqa: E402
from attnflow.sensitivity import Influence, influence  # noqa: E402

DT = 0.125


def tangent_basis(x):
    """Two orthonormal tangent vectors (..., 2, 3) at points x (..., 3) of S^2."""
    a = np.where(np.abs(x[..., :1]) < 0.9, [1.0, 0, 0], [0, 1.0, 0])
    e1 = a - np.sum(a * x, -1, keepdims=True) * x
    e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
    return np.stack([e1, np.cross(x, e1)], axis=-2)


def final_target(model, x0, t, target):
    return af.simulate(model, x0, t, save_at=[t], dt=DT).states[-1][..., target, :]


def test_the_circle_against_central_differences_of_the_numpy_engine():
    n, t, h, target = 7, 1.5, 1e-5, 4
    theta0 = np.random.default_rng(1).uniform(0, 2 * np.pi, n)
    circle = lambda th: np.stack([np.cos(th), np.sin(th)], -1)  # noqa: E731
    dense = af.Attention(beta=2.0, mask="causal", backend="dense")
    angle = lambda th: np.arctan2(*final_target(dense, circle(th), t, target)[::-1])  # noqa: E731
    fd = np.zeros(n)
    for j in range(n):
        up, down = theta0.copy(), theta0.copy()
        up[j] += h
        down[j] -= h
        fd[j] = np.angle(np.exp(1j * (angle(up) - angle(down)))) / (2 * h)
    res = influence(af.Attention(beta=2.0, mask="causal"), circle(theta0), t, target=target,
                    dt=DT)
    assert isinstance(res, Influence) and res.circle and res.blocks.shape == (1, n)
    assert np.max(np.abs(res.blocks[0] - fd)) < 1e-8 * np.max(np.abs(fd))
    np.testing.assert_array_equal(res.norms, np.abs(res.blocks))
    assert np.all(fd[target + 1:] == 0) and np.all(fd[:target + 1] != 0)


def test_s2_blocks_and_tangent_norms_against_central_differences():
    n, t, h, target = 6, 1.0, 1e-5, -1
    x0 = af.sphere.uniform(n, 3, seed=2)
    dense = af.Attention(beta=3.0, mask="full", backend="dense")
    basis = tangent_basis(x0)  # (n, 2, 3)
    res = influence(af.Attention(beta=3.0, mask="full"), x0, t, target=target, dt=DT)
    assert not res.circle and res.blocks.shape == (1, n, 3, 3) and res.norms.shape == (1, n)
    y = final_target(dense, x0, t, target)
    np.testing.assert_allclose(res.target_states[0], y, rtol=0, atol=1e-14)
    target_basis = tangent_basis(y)
    for j in range(n):
        columns = []
        for e in basis[j]:  # a tangent perturbation of x_j(0), kept on the sphere
            up, down = x0.copy(), x0.copy()
            up[j] = af.sphere.normalize(x0[j] + h * e)
            down[j] = af.sphere.normalize(x0[j] - h * e)
            fd = (final_target(dense, up, t, target) - final_target(dense, down, t, target))
            columns.append(fd / (2 * h))
            assert np.max(np.abs(res.blocks[0, j] @ e - columns[-1])) < 1e-8
        tangent = target_basis @ np.stack(columns, -1)  # (2, 2) in orthonormal bases
        assert abs(res.norms[0, j] - np.linalg.svd(tangent, compute_uv=False)[0]) < 1e-8


def field(x, beta, causal):
    """Q = K = V = I softmax attention projected on the tangent at each row (the ambient
    extension: scores and projection read x as it is)."""
    s = beta * x @ x.transpose(-1, -2)
    if causal:
        n = x.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    a = torch.softmax(s, -1) @ x
    return a - (a * x).sum(-1, keepdim=True) * x


def rk4(x, beta, causal, h, steps):
    """Classical RK4 stages on the ambient field, the state renormalised after each step."""
    for _ in range(steps):
        k1 = field(x, beta, causal)
        k2 = field(x + h / 2 * k1, beta, causal)
        k3 = field(x + h / 2 * k2, beta, causal)
        k4 = field(x + h * k3, beta, causal)
        x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        x = x / x.norm(dim=-1, keepdim=True)
    return x


@pytest.mark.parametrize("d, mask", [(2, "causal"), (3, "causal"), (4, "full")])
def test_against_an_independent_torch_rk4(d, mask):
    n, t, beta, target = 6, 1.0, 2.5, 3
    x0 = af.sphere.uniform(n, d, seed=5)
    times = [0.5, 1.0]
    res = influence(af.Attention(beta=beta, mask=mask), x0, t, target=target,
                    save_at=times, dt=DT)
    np.testing.assert_array_equal(res.times, times)
    for i, ti in enumerate(times):
        steps = round(ti / DT)
        jac = torch.autograd.functional.jacobian(
            lambda x, s=steps: rk4(x, beta, mask == "causal", DT, s)[target],
            torch.from_numpy(x0)).numpy()  # (d, n, d)
        blocks = np.moveaxis(jac, 1, 0)  # (n, d, d)
        if d == 2:
            y = res.target_states[i]
            want = np.einsum("a,jab,jb->j", [-y[1], y[0]], blocks,
                             np.stack([-x0[:, 1], x0[:, 0]], -1))
            assert np.max(np.abs(res.blocks[i] - want)) < 1e-13
        else:
            assert np.max(np.abs(res.blocks[i] - blocks)) < 1e-13


def test_causal_mask_later_tokens_have_exactly_zero_influence():
    n, target = 8, 3
    x0 = af.sphere.uniform(n, 3, seed=6)
    causal = influence(af.Attention(beta=4.0, mask="causal"), x0, 2.0, target=target, dt=DT)
    assert np.all(causal.blocks[:, target + 1:] == 0) and np.all(causal.norms[:, target + 1:] == 0)
    assert np.all(causal.norms[:, :target + 1] > 0)
    full = influence(af.Attention(beta=4.0, mask="full"), x0, 2.0, target=target, dt=DT)
    assert np.all(full.norms[:, target + 1:] > 0)


def test_runs_are_independent_and_a_tensor_x0_is_left_alone():
    model = af.Attention(beta=2.0, mask="causal")
    x0 = np.stack([af.sphere.uniform(5, 2, seed=s) for s in (7, 8)])
    both = influence(model, x0, 1.0, dt=DT)
    assert both.blocks.shape == (1, 2, 5) and both.target == 4
    for r in range(2):
        alone = influence(model, x0[r], 1.0, dt=DT)
        np.testing.assert_allclose(both.blocks[:, r], alone.blocks, rtol=0, atol=1e-15)
    tensor = torch.from_numpy(x0)
    again = influence(model, tensor, 1.0, dt=DT)
    assert tensor.grad is None and not tensor.requires_grad
    np.testing.assert_array_equal(again.blocks, both.blocks)
    assert both.record["model"]["mask"] == "causal" and both.record["integrator"]["dt"] == DT
    assert repr(both).startswith("Influence(times=[1.], blocks=array(1, 2, 5) float64")


def test_r_d_blocks_are_whole_against_central_differences():
    # pre-LN: the state is in R^d, every column of a block is the flow's
    n, t, h = 4, 0.5, 1e-5
    x0 = 1.5 * af.sphere.uniform(n, 3, seed=9)
    model = af.Attention(beta=1.0, mask="causal", norm="pre")
    res = influence(model, x0, t, dt=DT)
    for j in range(n):
        for b in range(3):
            up, down = x0.copy(), x0.copy()
            up[j, b] += h
            down[j, b] -= h
            fd = (final_target(model, up, t, -1) - final_target(model, down, t, -1)) / (2 * h)
            assert np.max(np.abs(res.blocks[0, j, :, b] - fd)) < 1e-8
    np.testing.assert_allclose(res.norms[0], np.linalg.svd(res.blocks[0], compute_uv=False)[:, 0],
                               rtol=1e-13)


def test_bad_input_is_one_line(monkeypatch):
    model = af.Attention(beta=1.0)
    x0 = af.sphere.uniform(4, 2, seed=0)
    for bad in (4, -5, 1.0, True):
        with pytest.raises(ValueError, match=r"^target: expected an integer token index in "
                           r"\[-4, 4\) \(n = 4 tokens\), received "):
            influence(model, x0, 1.0, target=bad)
    with pytest.raises(ValueError, match=r"^x0: expected floating tokens of shape \(\.\.\., n, "
                       r"d\), received "):
        influence(model, np.ones(3), 1.0)
    with pytest.raises(ValueError, match=r"^x0: expected tokens of shape .*a real numeric"):
        influence(model, np.array([["a", "b"]]), 1.0)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"^influence needs torch .*: pip install "
                       r"'attnflow\[torch\]'$"):
        influence(model, x0, 1.0)


def test_af_influence_is_the_helper():
    assert af.influence is influence and "influence" in af.__all__


def test_simulate_options_pass_through():
    model = af.Attention(beta=3.0, mask="causal")
    x0 = af.sphere.uniform(6, 3, seed=10)
    plain = influence(model, x0, 1.0, dt=DT)
    chunked = influence(model, x0, 1.0, dt=DT, checkpoint=2)  # recomputed in the backward
    np.testing.assert_allclose(chunked.blocks, plain.blocks, rtol=0, atol=1e-14)
    assert chunked.record["integrator"]["checkpoint"] == 2
    single = influence(model, x0.astype(np.float32), 1.0, dt=DT)
    assert single.blocks.dtype == np.float32
    np.testing.assert_allclose(single.blocks, plain.blocks, rtol=0, atol=1e-5)
