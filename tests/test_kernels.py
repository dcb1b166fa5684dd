"""Every fast kernel against the dense reference (kernels/dense.py), to 1e-12 in float64:
random inputs, every mask, memory tokens, several heads, broadcasting, float32, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import attnflow as af
from attnflow import parallel
from attnflow.kernels import KERNELS, auto, blocked, dense, fused, get_kernel
from attnflow.kernels import torch as torch_kernel
from attnflow.kernels._vexp import vexp, vexp2
from attnflow.kernels.types import Memory

FAST = {
    "fused": fused.attend,
    "blocked": lambda *a: blocked.attend(*a, block=7),  # small blocks: many edge cases
    "auto": auto.attend,
}
if "torch" in KERNELS and __import__("importlib").util.find_spec("torch") is not None:
    FAST["torch"] = torch_kernel.attend


def masks(n: int, rng: np.random.Generator) -> list:
    arr = (rng.random((n, n)) < 0.4) | np.eye(n, dtype=bool)
    return ["causal", "full", ("window", 3), arr]


def memory(rng: np.random.Generator, e: int, f: int) -> Memory:
    return Memory(rng.standard_normal((3, e)), rng.standard_normal((3, f)),
                  np.log(rng.uniform(1.0, 5.0, 3)))


@pytest.mark.parametrize("name", sorted(FAST))
@pytest.mark.parametrize("with_memory", [False, True])
def test_equals_dense_every_mask(name, with_memory):
    rng = np.random.default_rng(0)
    runs, n, e, f = 37, 23, 2, 2  # runs not a multiple of fused.LANES: padded lanes
    q, k, v = rng.standard_normal((runs, n, e)), rng.standard_normal((runs, n, e)), \
        rng.standard_normal((runs, n, f))
    mem = memory(rng, e, f) if with_memory else None
    for mask in masks(n, rng):
        for beta in (0.0, 1.0, 9.0, -0.7, -9.0):  # beta < 0: repulsive attention
            want = dense.attend(q, k, v, beta, mask, mem)
            got = FAST[name](q, k, v, beta, mask, mem)
            assert got.shape == want.shape and got.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(FAST))
def test_unequal_head_sizes_and_broadcast(name):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 17, 3))
    k = rng.standard_normal((1, 3, 17, 3))  # broadcasts over the first axis
    v = rng.standard_normal((2, 1, 17, 2))  # and over the second
    mem = memory(rng, 3, 2)
    for mask in ("causal", ("window", 4)):
        want = dense.attend(q, k, v, 2.0, mask, mem)
        np.testing.assert_allclose(FAST[name](q, k, v, 2.0, mask, mem), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention", ["self", "cross"])
def test_fused_at_large_beta(attention):
    """beta |q| |k| far beyond the safe spread. Self-attention (q = k, causal): the probe
    key (the query's own) scores the Cauchy-Schwarz bound, so the bound stays the shift;
    cross-attention: rows whose probe does not help take the exact row maximum, the others
    the bound."""
    rng = np.random.default_rng(2)
    x = af.sphere.uniform((40, 30), 2, seed=rng)
    keys = x if attention == "self" else af.sphere.uniform((40, 30), 2, seed=rng)
    beta = 400.0
    assert 2 * beta > fused.SAFE_SPREAD[np.float64]
    probe = beta * np.einsum("brc,brc->br", x, keys)  # causal: the last allowed key is own
    spread = beta - probe  # U - L with |q| = |k| = 1
    if attention == "cross":  # both paths taken
        assert (spread > fused.SAFE_SPREAD[np.float64]).any()
        assert (spread < fused.SAFE_SPREAD[np.float64]).any()
    else:
        assert np.abs(spread).max() < 1e-9
    want = dense.attend(x, keys, x, beta, "causal")
    np.testing.assert_allclose(fused.attend(x, keys, x, beta, "causal"), want, rtol=0,
                               atol=1e-12)
    got32 = fused.attend(*(a.astype(np.float32) for a in (x, keys, x)), beta, "causal")
    # float32 rounding of the inputs (6e-8) amplified by beta |dscore| ~ 400 * 2 * 6e-8
    assert np.abs(got32 - want).max() < 1e-3


def test_blocked_exact_maximum_rows_beside_bounded_ones():
    """Rows whose spread 2 beta |q_i| max_j |k_j| exceeds the safe one take the exact running
    maximum, the others keep the Cauchy-Schwarz shift; in the same blocks both equal dense."""
    rng = np.random.default_rng(8)
    n, beta = 40, 400.0
    x = af.sphere.uniform(n, 3, seed=rng)
    q = x * np.where(np.arange(n) % 3 == 0, 1.0, 0.01)[:, None]
    mem = memory(rng, 3, 3)
    mem = mem._replace(k=4 * mem.k)  # the bound far above the row maximum: exp would underflow
    spread = 2 * beta * np.linalg.norm(q, axis=1) * np.linalg.norm(mem.k, axis=1).max()
    assert (spread > blocked.SAFE_SPREAD[np.float64]).any()
    assert (spread < blocked.SAFE_SPREAD[np.float64] / 10).any()
    for mask in masks(n, rng):
        for m in (None, mem):
            want = dense.attend(q, x, x, beta, mask, m)
            got = blocked.attend(q, x, x, beta, mask, m, block=7)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_blocked_query_blocks_longer_than_key_blocks(rng):
    """Query blocks above blocked.BLOCK meet key blocks of BLOCK (the default from
    blocked.LONGER tokens): every mask, with memory, against the dense reference."""
    n = blocked.BLOCK * 2 + 37
    x = af.sphere.uniform(n, 8, seed=rng)
    q = x * rng.uniform(0.5, 2.0, (n, 1))
    mem = memory(rng, 8, 8)
    for mask in ("causal", "full", ("window", blocked.BLOCK + 5)):
        for m in (None, mem):
            want = dense.attend(q, x, x, 3.0, mask, m)
            got = blocked.attend(q, x, x, 3.0, mask, m, block=blocked.BLOCK * 2)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_blocked_heads_share_threads_by_query_block(rng, monkeypatch):
    """Several runs of BLAS-sized heads, with memory and a score bias, split across threads
    by (query block, run): equal to the dense reference, and bit-identical on one thread."""
    runs, n, e, f = 5, 61, 16, 12
    q, k = rng.standard_normal((2, runs, n, e))
    v = rng.standard_normal((runs, n, f))
    mem = memory(rng, e, f)
    bias = rng.standard_normal((n, n))
    monkeypatch.setattr(parallel, "MIN_COST", 0)  # thread even these small calls
    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    for mask in ("causal", ("window", 9)):
        want = dense.attend(q, k, v, 1.5, mask, mem, bias=bias)
        got = blocked.attend(q, k, v, 1.5, mask, mem, bias=bias, block=8)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        monkeypatch.setenv("ATTNFLOW_THREADS", "1")
        assert np.array_equal(blocked.attend(q, k, v, 1.5, mask, mem, bias=bias, block=8), got)
        monkeypatch.setenv("ATTNFLOW_THREADS", "2")


def test_blocked_float32_close_to_float64():
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((300, 8)) for _ in range(3))
    got = blocked.attend(*(a.astype(np.float32) for a in (q, k, v)), 2.0, "causal", block=64)
    assert got.dtype == np.float32
    assert np.abs(got - dense.attend(q, k, v, 2.0, "causal")).max() < 1e-4


def test_blocked_blas_on_one_thread_from_the_main_thread_only():
    """Called from the main thread, the blocked kernel runs BLAS on one thread and gives the
    thread counts back after; from other threads it leaves them alone."""
    def threads():  # BLAS only: torch, once imported, also lists its OpenMP runtime
        return [lib["num_threads"] for lib in blocked._controller().info()
                if lib["user_api"] == "blas"]

    before, seen = threads(), []
    with blocked._blas_on_one_thread():
        assert set(threads()) == {1}
    assert threads() == before

    def other() -> None:
        with blocked._blas_on_one_thread():
            seen.append(threads())

    call = threading.Thread(target=other)
    call.start()
    call.join()
    assert seen == [before] and threads() == before


def test_blocked_long_sequence_equals_dense():
    """The W2 check: n = 2048, d = 64, random Q, K, V, the default block size."""
    rng = np.random.default_rng(3)
    n, d = 2048, 64
    q, k, v = (rng.standard_normal((n, d)) / d**0.25 for _ in range(3))
    want = dense.attend(q, k, v, 1.0, "causal")
    np.testing.assert_allclose(blocked.attend(q, k, v, 1.0, "causal"), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", sorted(FAST))
def test_several_heads_and_memory_through_the_model(backend):
    rng = np.random.default_rng(4)
    d = 3
    heads = [(rng.standard_normal((d, d)), rng.standard_normal((d, d)), rng.standard_normal((d, d)))
             for _ in range(3)]
    points = af.sphere.uniform(2, d, seed=5)
    x = af.sphere.uniform((6, 15), d, seed=6)
    for combine in ("sum", "mean"):
        kw = dict(heads=heads, beta=3.0, memory=(points, [1.0, 4.0]), combine=combine)
        want = af.Attention(backend="dense", **kw).field(x)
        got = af.Attention(backend=backend, **kw).field(x)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_fused_float32_close_to_float64():
    x = af.sphere.uniform((64, 200), 2, seed=7)
    x32 = x.astype(np.float32)
    got = fused.attend(x32, x32, x32, 64.0, "causal")
    assert got.dtype == np.float32
    want = dense.attend(x, x, x, 64.0, "causal")
    # float32 rounding of inputs (6e-8) amplified by beta |dscore| ~ 64 * 2 * 6e-8, plus sums
    assert np.abs(got - want).max() < 1e-4
    assert np.abs(got - want).max() > 0  # computed in float32 indeed


def test_fused_is_causal_and_runs_are_independent():
    """Perturbing token k changes no earlier token; perturbing one run changes no other."""
    x = af.sphere.uniform((40, 20), 2, seed=8)
    y = x.copy()
    y[5, 12] = af.sphere.normalize(y[5, 12] + 0.3)
    a, b = fused.attend(x, x, x, 9.0, "causal"), fused.attend(y, y, y, 9.0, "causal")
    changed = np.any(a != b, axis=-1)
    assert changed[5, 12:].all() and not changed[5, :12].any()
    assert not np.delete(changed, 5, axis=0).any()


def test_results_do_not_depend_on_threads(monkeypatch):
    x = af.sphere.uniform((300, 30), 2, seed=9)
    many = fused.attend(x, x, x, 9.0, "causal")
    monkeypatch.setenv("ATTNFLOW_THREADS", "1")
    assert np.array_equal(fused.attend(x, x, x, 9.0, "causal"), many)


@pytest.mark.parametrize("fn, exact, lowest64, highest64, lowest32", [
    (vexp, np.exp, -708.39, 700, -87.3),  # exp: 0 below the normal range
    (vexp2, np.exp2, -1021.9, 1000, -125.9),  # 2^y
], ids=["vexp", "vexp2"])
def test_vectorisable_exp_accuracy(fn, exact, lowest64, highest64, lowest32):
    from numba import njit

    @njit
    def apply(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = fn(x[i])
        return out

    x = np.concatenate([np.linspace(lowest64, 0, 100_001), np.linspace(0, highest64, 1001)])
    assert (np.abs(apply(x) / exact(x) - 1)).max() < 1e-15
    below = [lowest64 - 0.6, 3 * lowest64, -np.inf]
    assert apply(np.array(below)).tolist() == [0.0, 0.0, 0.0]
    x32 = np.linspace(lowest32, 0, 10_001).astype(np.float32)
    got = apply(x32)
    assert got.dtype == np.float32
    assert (np.abs(got / exact(x32.astype(float)) - 1)).max() < 3e-7
    assert apply(np.array([lowest32 - 0.6, -np.inf], np.float32)).tolist() == [0.0, 0.0]
    assert fn(1.0) == exact(1.0)  # from Python: math.exp / 2.0 ** y


def test_auto_choice():
    small = np.zeros((1, 32, 3))
    assert auto.choose(small, small) is dense.attend
    assert auto.choose(np.zeros((1, 500, 64)), np.zeros((1, 500, 64))) is blocked.attend
    ensemble = np.zeros((5000, 200, 2))
    assert auto.choose(ensemble, ensemble) is fused.attend
    assert af.Attention().backend == "auto"


def test_bad_backend_and_dtype():
    with pytest.raises(ValueError, match="backend: expected one of"):
        get_kernel("fast")
    with pytest.raises(ValueError, match="backend"):
        af.Attention(backend="nope")
    z = np.zeros((2, 3, 2), dtype=np.float16)
    with pytest.raises(ValueError, match="q, k, v: expected float32 or float64"):
        fused.attend(z.astype(np.complex64), z, z, 1.0, "causal")
    with pytest.raises(ValueError, match="block: expected an integer >= 1"):
        blocked.attend(z, z, z, 1.0, "causal", block=0)


@pytest.mark.parametrize("name", [*sorted(FAST), "harmonic"])
def test_negative_beta_on_the_sphere_against_dense(name):
    """Repulsive attention (beta < 0) down to -700, where the weights exp(beta <x_i, x_j>)
    span e^{1400}: every kernel against dense, on tokens of the circle (the harmonic kernel's
    domain), causal, full and windowed, with and without memory."""
    kernel = get_kernel("harmonic") if name == "harmonic" else FAST[name]
    rng = np.random.default_rng(3)
    x = af.sphere.uniform((9, 60), 2, seed=4)
    v = rng.standard_normal((9, 60, 2))
    mem = Memory(af.sphere.uniform(2, 2, seed=5), rng.standard_normal((2, 2)), np.log([1., 3.]))
    for beta in (-0.5, -64.0, -700.0):
        for mask in ("causal", "full", ("window", 5)):
            for m in (None, mem):
                np.testing.assert_allclose(kernel(x, x, v, beta, mask, m),
                                           dense.attend(x, x, v, beta, mask, m),
                                           rtol=0, atol=1e-11)
