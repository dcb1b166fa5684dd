"""The attention field against independent formulas (docs/science.md §1)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_matrix
from scipy.special import softmax

import attnflow as af
from attnflow.sphere import project, uniform


def textbook_field(X, Q, K, V, beta, allowed, memory=None):
    """Token by token, with scipy's softmax: the definition written out."""
    n, d = X.shape
    F = np.zeros_like(X)
    for k in range(n):
        keys = [X[j] for j in range(n) if allowed[k, j]]
        logw = [0.0] * len(keys)
        if memory is not None:
            keys += list(memory[0])
            logw += list(np.log(memory[1]))
        keys = np.array(keys)
        w = softmax(beta * (keys @ K.T @ Q @ X[k]) + np.array(logw))
        F[k] = project(X[k], (keys @ V.T).T @ w)
    return F


MASKS = {
    "causal": lambda n: np.tril(np.ones((n, n), bool)),
    "full": lambda n: np.ones((n, n), bool),
    ("window", 3): lambda n: np.tril(np.ones((n, n), bool)) & ~np.tril(np.ones((n, n), bool), -3),
}


@pytest.mark.parametrize("mask", list(MASKS), ids=str)
def test_field_matches_textbook_definition(rng, mask):
    n, d, beta = 9, 4, 2.5
    Q, K, V = (random_matrix(rng, d) for _ in range(3))
    X = uniform(n, d, rng)
    got = af.Attention(Q, K, V, beta=beta, mask=mask).field(X)
    np.testing.assert_allclose(got, textbook_field(X, Q, K, V, beta, MASKS[mask](n)), atol=1e-13)


def test_boolean_mask_and_memory_match_textbook(rng):
    n, d, beta = 8, 3, 1.7
    Q, K, V = (random_matrix(rng, d) for _ in range(3))
    X = uniform(n, d, rng)
    allowed = rng.random((n, n)) < 0.5
    np.fill_diagonal(allowed, True)
    memory = (uniform(3, d, rng), np.array([1.0, 2.5, 7.0]))
    got = af.Attention(Q, K, V, beta=beta, mask=allowed, memory=memory).field(X)
    np.testing.assert_allclose(got, textbook_field(X, Q, K, V, beta, allowed, memory), atol=1e-13)


def test_heads_are_summed_or_averaged(rng):
    d = 3
    X = uniform((2, 6), d, rng)
    heads = [tuple(random_matrix(rng, d) for _ in range(3)) for _ in range(3)]
    single = [af.Attention(*h, beta=2.0).field(X) for h in heads]
    total = af.Attention(heads=heads, beta=2.0).field(X)
    mean = af.Attention(heads=heads, beta=2.0, combine="mean").field(X)
    np.testing.assert_allclose(total, sum(single), atol=1e-14)
    np.testing.assert_allclose(mean, sum(single) / 3, atol=1e-14)


def test_circle_field_equals_angular_form():
    """d = 2, Q = K = V = I: dphi_k/dt = (1/Z_k) sum_{j<k} h(phi_j - phi_k) (docs/science.md §1)."""
    beta, n = 5.0, 12
    phi = np.random.default_rng(3).uniform(0, 2 * np.pi, n)
    X = np.stack([np.cos(phi), np.sin(phi)], axis=-1)
    F = af.Attention(beta=beta).field(X)
    # Angular velocity = <F, tangent direction (-sin phi, cos phi)>.
    dphi = -F[:, 0] * np.sin(phi) + F[:, 1] * np.cos(phi)
    expected = np.empty(n)
    for k in range(n):
        diff = phi[:k + 1] - phi[k]
        Z = np.sum(np.exp(beta * (np.cos(diff) - 1)))
        expected[k] = np.sum(np.exp(beta * (np.cos(diff) - 1)) * np.sin(diff)) / Z
    np.testing.assert_allclose(dphi, expected, atol=1e-12)
    # The field is tangent: no radial part.
    np.testing.assert_allclose(np.sum(F * X, axis=-1), 0.0, atol=1e-15)


@pytest.mark.parametrize("beta", [1e3, 1e4])
def test_huge_beta_is_finite_and_correct(rng, beta):
    d, n = 3, 10
    Q, K, V = (random_matrix(rng, d) for _ in range(3))
    X = uniform(n, d, rng)
    got = af.Attention(Q, K, V, beta=beta, mask="full").field(X)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, textbook_field(X, Q, K, V, beta, MASKS["full"](n)),
                               atol=1e-12)


def test_full_attention_is_permutation_equivariant_and_causal_is_not(rng):
    d, n = 3, 10
    Q, K, V = (random_matrix(rng, d) for _ in range(3))
    X = uniform(n, d, rng)
    perm = rng.permutation(n)
    full = af.Attention(Q, K, V, beta=3.0, mask="full")
    np.testing.assert_allclose(full.field(X[perm]), full.field(X)[perm], atol=1e-14)
    causal = af.Attention(Q, K, V, beta=3.0)
    assert not np.allclose(causal.field(X[perm]), causal.field(X)[perm], atol=1e-6)


def test_attention_matrix_rows_are_laws_and_causal(rng):
    X = uniform(7, 3, rng)
    A = af.Attention(beta=2.0).attention_matrix(X)
    np.testing.assert_allclose(A.sum(axis=-1), 1.0, atol=1e-15)
    assert np.all(np.triu(A, 1) == 0)


def test_record_round_trip(rng):
    d = 3
    heads = [tuple(random_matrix(rng, d) for _ in range(3)), (None, None, np.eye(d))]
    model = af.Attention(heads=heads, beta=2.0, mask=("window", 2), combine="mean",
                         memory=(uniform(2, d, rng), np.array([1.0, 3.0])))
    again = af.Attention.from_record(*model.to_record())
    X = uniform(5, d, rng)
    assert np.array_equal(again.field(X), model.field(X))
    assert again.to_record()[0] == model.to_record()[0]
