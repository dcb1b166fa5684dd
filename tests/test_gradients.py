"""Gradients through `simulate` on torch tensors (float64, CPU): reverse mode against central
finite differences of the numpy engine, checkpointing against the plain graph, and forward
mode (Jacobian-vector products) against the exact Jacobian of `family/jacobian.py`."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

N, D, H = 5, 3, 6


def parameters(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    M = lambda r, c: rng.standard_normal((r, c)) / np.sqrt(c)  # noqa: E731
    return {"x0": rng.standard_normal((2, N, D)), "Q": M(D, D), "K": M(D, D), "V": M(D, D),
            "Q2": M(2, D), "beta": np.array(1.7), "slopes": np.array([0.3, 0.8]),
            "W_up": M(H, D), "W_down": M(D, H), "W_gate": M(H, D), "strength": np.array(1.4)}


def model(p: dict) -> af.Attention:
    """A post-LN block with two heads, ALiBi slopes, beta, strength and a SwiGLU MLP, from
    numpy arrays or tensors alike."""
    return af.Attention(heads=[(p["Q"], p["K"], p["V"]), (p["Q2"], p["Q2"], None)],
                        beta=p["beta"], alibi=p["slopes"], strength=p["strength"],
                        mlp=af.MLP(p["W_up"], p["W_down"], p["W_gate"]), mask="causal")


WEIGHTS = np.random.default_rng(9).standard_normal((2, N, D))


def loss(p: dict, **kwargs) -> object:
    """A scalar of the final state (weights fixed): numpy in, float out; tensors in, tensor."""
    run = af.simulate(model(p), p["x0"], 1.0, dt=0.1, save_at=[1.0], normalize=True,
                      **kwargs)
    final = run.states[-1]
    return (final * (torch.from_numpy(WEIGHTS) if isinstance(final, torch.Tensor)
                     else WEIGHTS)).sum()


def test_reverse_mode_matches_central_differences_of_the_numpy_engine():
    p = parameters()
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    loss(tensors).backward()
    rng = np.random.default_rng(1)
    eps = 1e-6
    for name in p:
        direction = rng.standard_normal(p[name].shape)
        plus = {**p, name: p[name] + eps * direction}
        minus = {**p, name: p[name] - eps * direction}
        numeric = (loss(plus) - loss(minus)) / (2 * eps)  # the numpy engine, no autograd
        grad = tensors[name].grad
        assert grad is not None, name
        analytic = float((grad.numpy() * direction).sum())
        assert abs(analytic - numeric) <= 1e-6 * max(abs(numeric), 1e-3), (name, analytic,
                                                                           numeric)


def test_checkpointed_gradients_equal_the_plain_graph():
    p = parameters(2)
    grads = []
    for checkpoint in (None, 3):
        tensors = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
        loss(tensors, checkpoint=checkpoint).backward()
        grads.append({k: t.grad.clone() for k, t in tensors.items()})
    for name in p:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-13)


def jacobian_models(rng):
    M = lambda: rng.standard_normal((D, D)) / np.sqrt(D)  # noqa: E731
    mask = rng.random((N, N)) < 0.6
    np.fill_diagonal(mask, True)
    memory = (uniform(3, D, rng), np.array([1.0, 2.0, 5.0]))
    return [af.Attention(beta=4.0),
            af.Attention(M(), M(), M(), beta=2.0, mask="full"),
            af.Attention(Q=M(), mask=("window", 3), beta=3.0),
            af.Attention(M(), M(), None, mask=mask),
            af.Attention(M(), M(), M(), memory=memory),
            af.Attention(heads=[(M(), M(), M()), (None, M(), None)], combine="mean"),
            af.Attention(M(), M(), M(), norm="flat", mask="full", strength=2.0),
            af.Attention(M(), None, M(), mlp=af.MLP.random(D, H, "gelu", seed=3))]


def test_jvp_of_the_field_matches_the_exact_jacobian():
    from torch.func import jvp

    rng = np.random.default_rng(5)
    for m in jacobian_models(rng):
        X = uniform((2, N), D, rng)
        if m.manifold != af.manifolds.SPHERE:
            X = X * rng.uniform(0.5, 2.0, X.shape[:-1])[..., None]
        T = rng.standard_normal(X.shape)
        _, tangent = jvp(m.tangent_field, (torch.from_numpy(X),), (torch.from_numpy(T),))
        exact = np.einsum("...iakb,...kb->...ia", m.jacobian(X), T)
        np.testing.assert_allclose(tangent.numpy(), exact, rtol=0, atol=1e-10)


def test_forward_mode_through_simulate_matches_central_differences():
    import torch.autograd.forward_ad as fwAD

    m = af.Attention(beta=3.0, mask="full", alibi=0.2)
    X = torch.from_numpy(uniform((2, N), D, seed=6))
    T = torch.from_numpy(np.random.default_rng(7).standard_normal(X.shape))

    def final(Z):
        return af.simulate(m, Z, 1.0, dt=0.05, save_at=[1.0], normalize=True).states[-1]

    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(final(fwAD.make_dual(X, T))).tangent
    eps = 1e-5
    numeric = (final(X + eps * T) - final(X - eps * T)) / (2 * eps)
    torch.testing.assert_close(tangent, numeric, rtol=0, atol=1e-8)


def test_torch_func_transforms_follow_simulate():
    """torch.func.jvp and torch.func.grad go through a whole run (the checks reduce to
    scalars on the device; functorch's wrapped tensors have no storage to copy to the host):
    the jvp equals central differences of the plain run, grad equals reverse mode."""
    from torch.func import grad, jvp

    m = af.Attention(beta=2.0, mask="causal")
    X = torch.from_numpy(uniform(N, D, seed=8))
    T = torch.from_numpy(np.random.default_rng(9).standard_normal(X.shape))

    def final(Z):
        return af.simulate(m, Z, 0.5, method="rk4", dt=0.05, save_at=[0.5],
                           normalize=True).states[-1]

    _, tangent = jvp(final, (X,), (T,))
    eps = 1e-5
    numeric = (final(X + eps * T) - final(X - eps * T)) / (2 * eps)
    torch.testing.assert_close(tangent, numeric, rtol=0, atol=1e-8)
    g = grad(lambda Z: final(Z)[-1, 0])(X)
    Xg = X.clone().requires_grad_(True)
    final(Xg)[-1, 0].backward()
    torch.testing.assert_close(g, Xg.grad, rtol=0, atol=1e-14)


def test_gradients_reach_memory_points_and_weights():
    """Memory tokens given as tensors keep their graph: the gradient of a final state with
    respect to the weights equals central differences, and with respect to the points along
    a tangent direction equals central differences of the renormalised points."""
    P = uniform(3, D, seed=10)
    w = np.array([1.0, 2.0, 5.0])
    X = torch.from_numpy(uniform(N, D, seed=11))

    def final(P_, w_):
        m = af.Attention(beta=2.0, mask="causal", memory=(P_, w_))
        return af.simulate(m, X, 0.5, method="rk4", dt=0.05, save_at=[0.5]).states[-1, -1, 0]

    Pt = torch.from_numpy(P).requires_grad_(True)
    wt = torch.from_numpy(w).requires_grad_(True)
    final(Pt, wt).backward()
    eps = 1e-6
    for k in range(3):
        e = eps * np.eye(3)[k]
        numeric = (float(final(P, w + e)) - float(final(P, w - e))) / (2 * eps)
        assert abs(float(wt.grad[k]) - numeric) <= 1e-6 * max(1.0, abs(numeric))
    T = np.random.default_rng(12).standard_normal(P.shape)
    T -= np.sum(T * P, axis=1, keepdims=True) * P

    def moved(h):
        Q = P + h * T
        return Q / np.linalg.norm(Q, axis=1, keepdims=True)

    numeric = (float(final(moved(eps), w)) - float(final(moved(-eps), w))) / (2 * eps)
    directional = float(np.sum(Pt.grad.numpy() * T))
    assert abs(directional - numeric) <= 1e-6 * max(1.0, abs(numeric))
