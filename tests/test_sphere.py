"""Geometry of the sphere: closed forms and hypothesis property tests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnflow import sphere


def _vector(d: int) -> st.SearchStrategy:
    return arrays(np.float64, (d,), elements=st.floats(-10, 10, allow_nan=False))


# Two vectors of one dimension d in 2..6 (d drawn once per example).
pairs = st.integers(2, 6).flatmap(lambda d: st.tuples(_vector(d), _vector(d)))


def _nonzero(v: np.ndarray) -> bool:
    return np.linalg.norm(v) > 1e-3


@pytest.mark.parametrize("a", [1e-12, 1e-8, 1e-4, 0.3, 2.0, np.pi - 1e-4, np.pi - 1e-9])
def test_geodesic_distance_is_accurate_near_0_and_pi(a):
    x = np.array([1.0, 0.0, 0.0])
    y = np.array([np.cos(a), np.sin(a), 0.0])
    assert sphere.geodesic_distance(x, y) == pytest.approx(a, rel=1e-7, abs=1e-15)


def test_pairwise_geodesic_matches_pairs(rng):
    X = sphere.uniform(7, 4, rng)
    Y = sphere.uniform(5, 4, rng)
    D = sphere.pairwise_geodesic(X, Y)
    ref = sphere.geodesic_distance(X[:, None, :], Y[None, :, :])
    np.testing.assert_allclose(D, ref, atol=1e-7)


def test_uniform_is_reproducible_and_uniform():
    a = sphere.uniform((3, 50), 3, seed=7)
    b = sphere.uniform((3, 50), 3, seed=7)
    assert a.shape == (3, 50, 3)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), 1.0, atol=1e-15)
    big = sphere.uniform(200_000, 3, seed=1)
    # E[x] = 0 and E[x x^T] = I/3 for the uniform law on S^2 (standard errors ~ 1e-3).
    np.testing.assert_allclose(big.mean(axis=0), 0.0, atol=6e-3)
    np.testing.assert_allclose(big.T @ big / len(big), np.eye(3) / 3, atol=6e-3)


def test_uniform_rejects_bad_dimension():
    with pytest.raises(ValueError, match="d: expected an integer >= 1"):
        sphere.uniform(3, 0)


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_projection_is_tangent_and_idempotent(pair):
    x, y = pair
    assume(_nonzero(x))
    x = sphere.normalize(x)
    p = sphere.project(x, y)
    assert abs(p @ x) <= 1e-12 * max(1.0, np.abs(y).sum())
    np.testing.assert_allclose(sphere.project(x, p), p, atol=1e-12 * max(1.0, np.abs(y).sum()))


@settings(max_examples=60, deadline=None)
@given(pairs, st.floats(0.0, 3.0))
def test_exp_map_walks_the_geodesic(pair, length):
    x, v = pair
    assume(_nonzero(x))
    x = sphere.normalize(x)
    t = sphere.project(x, v)
    assume(np.linalg.norm(t) >= 1e-6)
    t = length * t / np.linalg.norm(t)
    y = sphere.exp_map(x, t)
    assert np.linalg.norm(y) == pytest.approx(1.0, abs=1e-14)
    assert sphere.geodesic_distance(x, y) == pytest.approx(length, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(pairs)
def test_geodesic_distance_is_symmetric_and_rotation_invariant(pair):
    x, y = pair
    assume(_nonzero(x) and _nonzero(y))
    x, y = sphere.normalize(x), sphere.normalize(y)
    d = len(x)
    R = np.linalg.qr(np.random.default_rng(d).standard_normal((d, d)))[0]
    dist = sphere.geodesic_distance(x, y)
    assert dist == pytest.approx(sphere.geodesic_distance(y, x), abs=1e-15)
    assert dist == pytest.approx(sphere.geodesic_distance(R @ x, R @ y), abs=1e-12)
    assert 0.0 <= dist <= np.pi


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 2, 3, 8, 9, 64])
def test_batched_projection_matches_the_formula(d, dtype):
    """The one-pass projection (d fixed at compile time up to sphere.SMALL_D, read at run time
    above) against y - <x, y> x written out in float64."""
    rng = np.random.default_rng(d)
    x = sphere.normalize(rng.standard_normal((5, 7, d))).astype(dtype)
    y = rng.standard_normal((5, 7, d)).astype(dtype)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    want = y64 - (x64 * y64).sum(-1, keepdims=True) * x64
    got = sphere.project(x, y)
    assert got.dtype == dtype and got.shape == y.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * d * np.finfo(dtype).eps)
