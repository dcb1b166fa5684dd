"""The exact Jacobian of the attention field against central finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_matrix

import attnflow as af
from attnflow.sphere import uniform

N, D = 7, 3


def finite_differences(model, X, eps=1e-6):
    """dF/dX (..., n, d, n, d) by central differences (error ~ eps^2 |F'''| ~ 1e-11)."""
    J = np.zeros(X.shape + X.shape[-2:])
    for k in range(X.shape[-2]):
        for b in range(X.shape[-1]):
            E = np.zeros_like(X)
            E[..., k, b] = eps
            J[..., :, :, k, b] = (model.field(X + E) - model.field(X - E)) / (2 * eps)
    return J


def models(rng):
    M = lambda: random_matrix(rng, D)  # noqa: E731
    memory = (uniform(3, D, rng), np.array([1.0, 2.0, 5.0]))
    mask = rng.random((N, N)) < 0.6
    np.fill_diagonal(mask, True)
    return {
        "identity causal": af.Attention(beta=4.0),
        "Q K V causal": af.Attention(M(), M(), M(), beta=2.0),
        "full": af.Attention(V=M(), mask="full"),
        "window": af.Attention(Q=M(), mask=("window", 3), beta=3.0),
        "bool mask": af.Attention(M(), M(), None, mask=mask),
        "memory": af.Attention(M(), M(), M(), memory=memory),
        "two heads, mean": af.Attention(heads=[(M(), M(), M()), (None, M(), None)],
                                        combine="mean", beta=3.0),
    }


@pytest.mark.parametrize("name", list(models(np.random.default_rng(0))))
def test_jacobian_matches_finite_differences(name):
    model = models(np.random.default_rng(0))[name]
    X = uniform((2, N), D, 1)  # two runs: leading axes broadcast
    J = model.jacobian(X)
    assert J.shape == (2, N, D, N, D)
    np.testing.assert_allclose(J, finite_differences(model, X), rtol=0, atol=1e-8)


def test_causal_jacobian_is_block_lower_triangular(rng):
    model = af.Attention(random_matrix(rng, D), random_matrix(rng, D), random_matrix(rng, D))
    J = model.jacobian(uniform(N, D, rng))
    later = np.triu(np.ones((N, N), bool), 1)  # k > i: token i must not see token k
    assert np.all(J.transpose(0, 2, 1, 3)[later] == 0)
    assert np.abs(J.transpose(0, 2, 1, 3)[~later]).max() > 0


def test_jacobian_of_the_normal_component(rng):
    """<x_i, F_i> = <x_i, a_i>(1 - |x_i|^2) (F = P_x a on all of R^d), so on the sphere
    x_i^T dF_i/dx_k = [i = k] (-F_i - 2 <x_i, a_i> x_i)^T: an identity the formula does not
    use."""
    model = af.Attention(random_matrix(rng, D), random_matrix(rng, D), random_matrix(rng, D))
    X = uniform(N, D, rng)
    J, F, a = model.jacobian(X), model.field(X), model.attention_output(X)
    xJ = np.einsum("ia,iakb->ikb", X, J)
    want = np.zeros_like(xJ)
    want[np.arange(N), np.arange(N)] = -F - 2 * np.sum(X * a, -1, keepdims=True) * X
    np.testing.assert_allclose(xJ, want, atol=1e-12)
