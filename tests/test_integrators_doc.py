"""One RK4 step of the package reproduced by code written from docs/guide/integrators.md
("What a step computes") alone: softmax attention read from the state as it is, projected
on each row's tangent, stages not renormalised, the result normalised once."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af

N, D, BETA, H = 6, 3, 2.0, 0.1


def heads():
    rng = np.random.default_rng(3)
    return [np.eye(D) + 0.3 * rng.standard_normal((D, D)) for _ in range(3)]


def field(x, Q, K, V):
    """F_i = a_i - <a_i, x_i> x_i, a_i = sum_{j <= i} w_ij V x_j, w_i = softmax_j of
    beta <Q x_i, K x_j> (causal), all read from x as it is."""
    s = BETA * (x @ Q.T) @ (x @ K.T).T
    s[np.triu_indices(len(x), 1)] = -np.inf
    w = np.exp(s - s.max(1, keepdims=True))
    a = (w / w.sum(1, keepdims=True)) @ (x @ V.T)
    return a - np.sum(a * x, -1, keepdims=True) * x


def documented_rk4_step(x, Q, K, V):
    k1 = field(x, Q, K, V)
    k2 = field(x + (H / 2) * k1, Q, K, V)
    k3 = field(x + (H / 2) * k2, Q, K, V)
    k4 = field(x + H * k3, Q, K, V)
    y = x + (H / 6) * (((k1 + 2 * k2) + 2 * k3) + k4)
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def test_one_rk4_step_to_round_off():
    Q, K, V = heads()
    x0 = af.sphere.uniform(N, D, seed=4)
    model = af.Attention(Q=Q, K=K, V=V, beta=BETA, mask="causal", backend="dense")
    got = af.simulate(model, x0, H, save_at=[H], dt=H).states[-1]
    want = documented_rk4_step(x0, Q, K, V)
    assert np.max(np.abs(got - want)) <= 2e-16
    # the stages lie off the sphere: renormalising them would give another step
    n = lambda y: y / np.linalg.norm(y, axis=-1, keepdims=True)  # noqa: E731
    k1 = field(x0, Q, K, V)
    k2 = field(n(x0 + (H / 2) * k1), Q, K, V)
    k3 = field(n(x0 + (H / 2) * k2), Q, K, V)
    k4 = field(n(x0 + H * k3), Q, K, V)
    renormalised = n(x0 + (H / 6) * (((k1 + 2 * k2) + 2 * k3) + k4))
    assert np.max(np.abs(got - renormalised)) > 1e-9


def test_one_rk4_step_on_tensors_to_round_off():
    torch = pytest.importorskip("torch")
    Q, K, V = heads()
    x0 = af.sphere.uniform(N, D, seed=4)
    model = af.Attention(Q=Q, K=K, V=V, beta=BETA, mask="causal")
    got = af.simulate(model, torch.from_numpy(x0), H, save_at=[H], dt=H).states[-1].numpy()
    assert np.max(np.abs(got - documented_rk4_step(x0, Q, K, V))) <= 1e-15
