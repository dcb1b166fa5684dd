"""The harmonic kernel's fused circle path (`attnflow.kernels._circle`: values = keys, complex
moments M_0..M_{K+1}) against independent truth: direct sums in long double, the dense
kernel, and the general harmonic path (real features times (v, 1), `_harmonic`)."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.kernels import _circle, dense, harmonic
from attnflow.kernels.types import Memory
from attnflow.sphere import uniform


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the calls of the fused path's row loop (that the path under test ran)."""
    calls = []
    rows = _circle.rows

    def spy(*args):
        calls.append(args[4])  # causal
        return rows(*args)

    monkeypatch.setattr(_circle, "rows", spy)
    return calls


def direct(x: np.ndarray, beta: float, i: int, mask: str) -> np.ndarray:
    """Row i of softmax attention with q = k = v = x, summed directly in long double."""
    xl = x[: i + 1 if mask == "causal" else len(x)].astype(np.longdouble)
    s = beta * (xl @ x[i].astype(np.longdouble))
    w = np.exp(s - s.max())
    return ((w @ xl) / w.sum()).astype(float)


@pytest.mark.parametrize("beta", [1.0, 16.0, 64.0, 256.0])
@pytest.mark.parametrize("mask", ["causal", "full"])
def test_rows_at_2e4_tokens_against_long_double_sums(beta, mask, fused_calls):
    """n = 2e4 (16 segments, each lane starting from the segments before its own): sampled
    rows, the first and last of segments among them, to 1e-13."""
    n = 20_000
    x = uniform(n, 2, seed=11)
    got = harmonic.attend(x, x, x, beta, mask)
    assert fused_calls
    rng = np.random.default_rng(0)
    rows = np.r_[0, 1, 77, 1249, 1250, n // 2 - 1, n // 2, n // 2 + 1, n - 2, n - 1,
                 rng.integers(0, n, 8)]
    for i in rows:
        np.testing.assert_allclose(got[i], direct(x, beta, i, mask), rtol=0, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 9, 300])
def test_small_and_batched_runs_against_dense(n, fused_calls):
    """Leading axes (2, 3), beta of either sign and 0, both masks, every normalisation."""
    x = uniform((2, 3, n), 2, seed=n)
    for beta in (0.0, 1.0, 16.0, 64.0, 256.0, -9.0):
        for mask in ("causal", "full"):
            for norm in ("softmax", "unnormalised", "positional"):
                got = harmonic.attend(x, x, x, beta, mask, normalization=norm)
                ref = dense.attend(x, x, x, beta, mask, normalization=norm)
                # softmax at beta >= 0: values of norm 1, to 1e-13; else to the documented
                # bound, 2 tol (softmax) or tol relative to each row's size (the general path
                # errs alike: 1.6e-13 at beta = -9, 1.1e-13 unnormalised at beta = 256)
                tol = harmonic.DEFAULT_TOL
                bound = ((1e-13 if beta >= 0 else 2 * tol) if norm == "softmax"
                         else tol * np.abs(ref).max(-1, keepdims=True))
                assert (np.abs(got - ref) <= bound).all(), (beta, mask, norm)
    assert len(fused_calls) >= 36


def test_equals_the_general_path_and_does_not_depend_on_threads(monkeypatch, fused_calls):
    """Three packs of 16 segments of 62 or 63 rows (SEGMENTS 48, SEGMENT_ROWS 50: segments
    of unequal length, each past MERGE steps): the fused path agrees with the general path
    (real features times (v, 1), forced here) to 1e-14, and is bit for bit the same on 1
    and 2 threads."""
    x = uniform(3000, 2, seed=4)
    monkeypatch.setattr(harmonic, "SEGMENTS", 48)
    monkeypatch.setattr(harmonic, "SEGMENT_ROWS", 50)
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("ATTNFLOW_THREADS", threads)
        got[threads] = [harmonic.attend(x, x, x, 64.0, m) for m in ("causal", "full")]
    for a, b in zip(got["1"], got["2"]):
        np.testing.assert_array_equal(a, b)
    calls = len(fused_calls)
    monkeypatch.setattr(harmonic, "_circle_affine", lambda *args: None)
    general = [harmonic.attend(x, x, x, 64.0, m) for m in ("causal", "full")]
    assert len(fused_calls) == calls  # the general path ran
    for a, b in zip(got["2"], general):
        assert np.abs(a - b).max() <= 1e-14
    q = 1.5 * x @ np.array([[0.6, -0.8], [0.8, 0.6]]).T  # queries with their own powers
    for mask in ("causal", "full"):
        got = harmonic.attend(q, x, x, 40.0, mask)
        assert np.abs(got - dense.attend(q, x, x, 40.0, mask)).max() <= 1e-13


def test_queries_other_than_the_keys_memory_and_rows_summed_directly(fused_calls):
    """q a rotation of k (its own powers), memory tokens, and rows far from every key they
    see (summed directly) against dense."""
    n = 500
    x = uniform(n, 2, seed=2)
    rot = np.array([[0.6, -0.8], [0.8, 0.6]])
    mem = Memory(k=uniform(3, 2, seed=3), v=uniform(3, 2, seed=4),
                 log_weights=np.log([1.0, 2.0, 5.0]))
    for mask in ("causal", "full"):
        got = harmonic.attend(1.5 * x @ rot.T, x, x, 40.0, mask, mem)
        ref = dense.attend(1.5 * x @ rot.T, x, x, 40.0, mask, mem)
        assert np.abs(got - ref).max() <= 1e-13
        far = harmonic.attend(-x, x, x, 400.0, mask)  # every weight ~ e^-800 of the scale
        np.testing.assert_allclose(far, dense.attend(-x, x, x, 400.0, mask), atol=1e-12)
    assert fused_calls


def test_values_other_than_the_keys_take_the_general_path(fused_calls):
    x = uniform(400, 2, seed=5)
    v = np.random.default_rng(1).normal(size=(400, 3))
    got = harmonic.attend(x, x, v, 16.0, "causal")
    assert not fused_calls
    assert np.abs(got - dense.attend(x, x, v, 16.0, "causal")).max() <= 1e-12


def test_the_model_with_v_equal_to_k_takes_the_fused_path(fused_calls):
    """af.Attention on the circle (Q = K = V = I) hands the kernel v is k: the field by the
    harmonic backend runs the fused path and equals the dense backend's."""
    import attnflow as af

    x = uniform(700, 2, seed=6)
    fields = [af.Attention(beta=64.0, mask="causal", backend=b).field(x)
              for b in ("harmonic", "dense")]
    assert fused_calls
    assert np.abs(fields[0] - fields[1]).max() <= 1e-13


def test_a_run_alone_equals_itself_beside_other_runs(fused_calls, monkeypatch):
    """Segments depend on n alone: a run's rows are bit for bit the same alone, in a batch of
    3 and in a batch of 70 (ensemble pieces step a run with any number of runs beside it)."""
    x = uniform((70, 1000), 2, seed=3)
    for mask in ("causal", "full"):
        alone = harmonic.attend(x[:1], x[:1], x[:1], 64.0, mask)
        for R in (3, 70):
            np.testing.assert_array_equal(harmonic.attend(x[:R], x[:R], x[:R], 64.0, mask)[:1],
                                          alone)
    assert fused_calls


def test_an_ensemble_in_pieces_equals_the_whole_batch_with_the_harmonic_kernel(monkeypatch):
    """RK4 on the circle with the harmonic backend: 6 runs stepped as pieces of one run each
    equal stepping the 6 together, bit for bit."""
    import attnflow as af
    from attnflow import ensembles
    from attnflow.integrate import Drift, integrate

    monkeypatch.setattr(ensembles, "PIECE_BYTES", 1)
    model = af.Attention(beta=9.0, mask="causal", backend="harmonic")
    x0 = uniform((6, 300), 2, seed=4)
    field = model.tangent_field
    times = np.array([0.0, 0.1, 0.2])
    whole = integrate(Drift(field), x0, times, "rk4", 0.05)
    pieces = integrate(Drift(field, runs_independent=True), x0, times, "rk4", 0.05, grain=1)
    assert np.array_equal(pieces.states, whole.states)


def test_keys_whose_squared_norm_underflows_take_the_general_path(fused_calls):
    """Tokens of norm 1e-170 (|x|^2 underflows to 0, so the common norm reads 0): the values
    are not 0 times the key directions, and the result is dense's, not zeros."""
    x = 1e-170 * uniform(50, 2, seed=1)
    for mask in ("causal", "full"):
        got = harmonic.attend(x, x, x, 3.0, mask)
        ref = dense.attend(x, x, x, 3.0, mask)
        assert np.abs(got - ref).max() <= 1e-13 * np.abs(ref).max()
    assert not fused_calls
