"""The kernels' options (attnflow.kernels.options): a score bias, unnormalised and Sinkhorn
attention. dense against naive formulas written out here; every fast kernel with an option
against dense to 1e-12 (float64); clear errors for options a kernel lacks; auto's choices."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.kernels import SUPPORTS, auto, blocked, dense, fused, get_kernel
from attnflow.kernels.masks import mask_matrix
from attnflow.kernels.types import Memory


def inputs(rng: np.random.Generator, lead: tuple, n: int, e: int = 2, f: int = 2):
    return (rng.standard_normal((*lead, n, e)), rng.standard_normal((*lead, n, e)),
            rng.standard_normal((*lead, n, f)))


def some_memory(rng: np.random.Generator, e: int = 2, f: int = 2) -> Memory:
    return Memory(rng.standard_normal((3, e)), rng.standard_normal((3, f)),
                  np.log(rng.uniform(1.0, 5.0, 3)))


def random_bias(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gaussian entries with some -inf (never a whole row: the diagonal stays finite)."""
    b = rng.standard_normal((n, n))
    b[(rng.random((n, n)) < 0.2) & ~np.eye(n, dtype=bool)] = -np.inf
    return b


def alibi(n: int, slope: float) -> np.ndarray:
    """b_ij = -slope (i - j) for j <= i (ALiBi; the mask forbids j > i when causal)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return np.where(j <= i, -slope * (i - j), 0.0)


def naive_scores(q, k, beta, mask, memory, bias):
    """Scores (..., n, n + m) entry by entry: -inf where the mask forbids a key."""
    n = q.shape[-2]
    allowed = mask_matrix(mask, n)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q, k = np.broadcast_to(q, (*lead, *q.shape[-2:])), np.broadcast_to(k, (*lead, *k.shape[-2:]))
    m = 0 if memory is None else len(memory.log_weights)
    s = np.full((*lead, n, n + m), -np.inf)
    for idx in np.ndindex(*lead):
        for i in range(n):
            for j in range(n):
                if allowed[i, j]:
                    s[idx][i, j] = beta * float(np.dot(q[idx][i], k[idx][j])) + (
                        0.0 if bias is None else bias[i, j])
            for j in range(m):
                s[idx][i, n + j] = beta * float(np.dot(q[idx][i], memory.k[j])) \
                    + memory.log_weights[j]
    return s


def with_memory_values(v, memory):
    if memory is None:
        return v
    return np.concatenate([v, np.broadcast_to(memory.v, (*v.shape[:-2], *memory.v.shape))], -2)


MASKS = ["causal", "full", ("window", 3), "array"]


def the_mask(spec, n, rng):
    return (rng.random((n, n)) < 0.5) | np.eye(n, dtype=bool) if spec == "array" else spec


# ---------------------------------------------------------------- dense against naive formulas
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("with_memory", [False, True])
def test_dense_bias_and_unnormalised_against_naive(mask, with_memory):
    rng = np.random.default_rng(10)
    n = 9
    q, k, v = inputs(rng, (2,), n)
    mask = the_mask(mask, n, rng)
    mem = some_memory(rng) if with_memory else None
    for bias in (None, random_bias(rng, n), alibi(n, 0.3)):
        s = naive_scores(q, k, 1.7, mask, mem, bias)
        values = with_memory_values(v, mem)
        w = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
        np.testing.assert_allclose(dense.attention_weights(q, k, 1.7, mask, mem, bias), w,
                                   rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(dense.attend(q, k, v, 1.7, mask, mem, bias=bias), w @ values,
                                   rtol=0, atol=1e-13)
        count = n + (0 if mem is None else np.exp(mem.log_weights).sum())
        u = np.exp(s) / count
        got_w = dense.attention_weights(q, k, 1.7, mask, mem, bias, "unnormalised")
        np.testing.assert_allclose(got_w, u, rtol=1e-13, atol=0)
        got = dense.attend(q, k, v, 1.7, mask, mem, bias=bias, normalization="unnormalised")
        np.testing.assert_allclose(got, u @ values, rtol=1e-13, atol=1e-14)


def test_dense_unnormalised_overflows_to_inf_not_nan():
    """exp(score) beyond the float range: weights and outputs +-inf (0 where the value is 0),
    never NaN; a result whose factors overflow but whose product does not stays finite."""
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    v = np.array([[2.0, 0.0], [-1.0, 0.0]])
    beta = 800.0  # exp(800) = inf in float64
    w = dense.attention_weights(x, x, beta, "full", normalization="unnormalised")
    assert w[0, 0] == np.inf and w[0, 1] == 0.5 and not np.isnan(w).any()
    out = dense.attend(x, x, v, beta, "full", normalization="unnormalised")
    assert out[0, 0] == np.inf and out[1, 0] == -np.inf
    assert out[0, 1] == 0.0 and out[1, 1] == 0.0
    # exp(800) * 1e-300 / 2 = 1.4e47: finite although exp(800) is not
    tiny = dense.attend(x, x, v * 1e-300, beta, "full", normalization="unnormalised")
    np.testing.assert_allclose(tiny[0, 0], np.exp(800.0 - 300 * np.log(10) + np.log(2 / 2)),
                               rtol=1e-12)
    x32, v32 = x.astype(np.float32), v.astype(np.float32)  # e^100 overflows float32
    out32 = dense.attend(x32, x32, v32, 100.0, "full", normalization="unnormalised")
    assert out32.dtype == np.float32 and out32.tolist() == [[np.inf, 0.0], [-np.inf, 0.0]]


def naive_sinkhorn(s: np.ndarray, iterations: int) -> np.ndarray:
    """exp(s) with columns, then rows, divided by their sums, `iterations` times."""
    w = np.exp(s)
    for _ in range(iterations):
        w = w / w.sum(-2, keepdims=True)
        w = w / w.sum(-1, keepdims=True)
    return w


def test_dense_sinkhorn_against_naive_and_doubly_stochastic():
    rng = np.random.default_rng(11)
    n = 8
    q, k, v = inputs(rng, (3,), n)
    for bias in (None, random_bias(rng, n)):
        s = naive_scores(q, k, 2.0, "full", None, bias)
        for it in (1, 3):
            w = dense.attention_weights(q, k, 2.0, "full", bias=bias,
                                        normalization=("sinkhorn", it))
            np.testing.assert_allclose(w, naive_sinkhorn(s, it), rtol=1e-12, atol=1e-15)
            got = dense.attend(q, k, v, 2.0, "full", bias=bias, normalization=("sinkhorn", it))
            np.testing.assert_allclose(got, naive_sinkhorn(s, it) @ v, rtol=0, atol=1e-13)
    # enough iterations: doubly stochastic, also where every exp(score) overflows (> e^709)
    x = q / np.linalg.norm(q, axis=-1, keepdims=True)
    near = np.array([1.0, 0.0]) + 0.01 * x  # scores 800 <y_i, y_j> within ~20 of 800
    y = near / np.linalg.norm(near, axis=-1, keepdims=True)
    for beta, z in ((2.0, x), (800.0, y)):
        w = dense.attention_weights(z, z, beta, "full", normalization=("sinkhorn", 300))
        assert np.isfinite(w).all()
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-10)
        np.testing.assert_allclose(w.sum(-2), 1.0, rtol=0, atol=1e-10)


# ---------------------------------------------------------------- errors and auto's choices
def test_bad_options_are_clear_errors():
    rng = np.random.default_rng(12)
    q, k, v = inputs(rng, (), 5)
    for bad in ("sinkhorn", ("sinkhorn", 0), ("sinkhorn", 2.5), ("sinkhorn", True), "softmx",
                None):
        with pytest.raises(ValueError, match="normalization: expected 'softmax', 'unnormalised'"):
            dense.attend(q, k, v, 1.0, "full", normalization=bad)
    for mask, mem in (("causal", None), (("window", 2), None), ("full", some_memory(rng))):
        with pytest.raises(ValueError, match="normalization: expected .*only with mask 'full'"):
            dense.attend(q, k, v, 1.0, mask, mem, normalization=("sinkhorn", 3))
    for bad in (np.zeros((4, 5)), np.zeros((5, 5), bool), np.full((5, 5), np.nan),
                np.full((5, 5), np.inf)):
        with pytest.raises(ValueError, match="bias: expected"):
            dense.attend(q, k, v, 1.0, "causal", bias=bad)


@pytest.mark.parametrize("name", ["fused", "blocked", "torch"])
def test_kernel_without_an_option_names_backend_and_option(name):
    rng = np.random.default_rng(13)
    q, k, v = inputs(rng, (2,), 6)
    for option, kw in (("unnormalised", dict(normalization="unnormalised")),
                       ("positional", dict(normalization="positional")),
                       ("sinkhorn", dict(normalization=("sinkhorn", 2))),
                       ("bias", dict(bias=np.zeros((6, 6))))):
        if option in SUPPORTS[name]:
            continue
        with pytest.raises(ValueError, match=f"backend: expected a kernel with the option\\(s\\) "
                                             f"\\['{option}'\\].*received '{name}'"):
            get_kernel(name)(q, k, v, 1.0, "full", **kw)


def test_supports_table():
    assert SUPPORTS["dense"] == SUPPORTS["auto"] == {"bias", "unnormalised", "positional",
                                                     "sinkhorn", "hardmax"}
    assert set(SUPPORTS) == {"auto", "dense", "fused", "blocked", "torch", "harmonic"}


def test_auto_never_picks_a_kernel_without_the_option():
    ensemble, long = np.zeros((5000, 200, 2)), np.zeros((1, 500, 64))
    for q in (ensemble, long):
        for norm in ("unnormalised", ("sinkhorn", 5)):
            assert auto.choose(q, q, normalization=norm) is dense.attend
        picked = auto.choose(q, q, bias=np.zeros((q.shape[-2],) * 2))
        name = {fused.attend: "fused", blocked.attend: "blocked", dense.attend: "dense"}[picked]
        assert "bias" in SUPPORTS[name]
    assert auto.choose(ensemble, ensemble) is fused.attend
    assert auto.choose(long, long) is blocked.attend


# ---------------------------------------------------------------- fast kernels with a bias
def bias_kernels() -> dict:
    out = {"fused": fused.attend, "blocked": lambda *a, **kw: blocked.attend(*a, **kw, block=7),
           "auto": auto.attend}
    if "bias" in SUPPORTS["torch"] and __import__("importlib").util.find_spec("torch"):
        out["torch"] = get_kernel("torch")
    return out


BIAS_KERNELS = bias_kernels()


@pytest.mark.parametrize("name", sorted(BIAS_KERNELS))
@pytest.mark.parametrize("with_memory", [False, True])
def test_bias_equals_dense_every_mask(name, with_memory):
    """Random biases with -inf entries, ALiBi, and a row offset far below the others (the fast
    kernels' fixed shift must follow each row's largest bias), on 37 runs (not a multiple of
    fused.LANES) of 23 tokens: every kernel equals dense to 1e-12."""
    rng = np.random.default_rng(14)
    n = 23
    q, k, v = inputs(rng, (37 if name in ("fused", "auto") else 3,), n)
    mem = some_memory(rng) if with_memory else None
    far = np.zeros((n, n))
    far[5] = -1000.0  # row 5 shifted by far more than fused.SAFE_SPREAD
    for spec in MASKS:
        mask = the_mask(spec, n, rng)
        for bias in (random_bias(rng, n), alibi(n, 0.5), far):
            for beta in (0.0, 9.0):
                want = dense.attend(q, k, v, beta, mask, mem, bias=bias)
                got = BIAS_KERNELS[name](q, k, v, beta, mask, mem, bias=bias)
                assert got.shape == want.shape and got.dtype == np.float64
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(BIAS_KERNELS))
def test_bias_with_leading_axes_large_beta_and_float32(name):
    rng = np.random.default_rng(15)
    n = 17
    q = rng.standard_normal((2, 3, n, 3))
    k = rng.standard_normal((1, 3, n, 3))  # broadcasts over the first axis
    v = rng.standard_normal((2, 1, n, 2))  # and over the second
    mem = some_memory(rng, 3, 2)
    x = q / np.linalg.norm(q, axis=-1, keepdims=True)
    bias = random_bias(rng, n)
    for mask in ("causal", ("window", 4), "full"):
        want = dense.attend(q, k, v, 2.0, mask, mem, bias=bias)
        got = BIAS_KERNELS[name](q, k, v, 2.0, mask, mem, bias=bias)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        # beta |q| |k| beyond the safe spread: the exact row maximum, beside the bias
        want = dense.attend(x, x, x, 400.0, mask, bias=alibi(n, 3.0))
        got = BIAS_KERNELS[name](x, x, x, 400.0, mask, bias=alibi(n, 3.0))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    if name in ("fused", "auto"):
        return  # float32 in fused: one more compilation (seconds); tests/test_kernels.py has it
    x32, b32 = x.astype(np.float32), alibi(n, 0.5).astype(np.float32)
    got = BIAS_KERNELS[name](x32, x32, x32, 9.0, "causal", bias=b32)
    assert got.dtype == np.float32
    assert np.abs(got - dense.attend(x, x, x, 9.0, "causal", bias=alibi(n, 0.5))).max() < 1e-5


def test_zero_bias_is_the_plain_kernel_and_bias_keeps_causality():
    x = af.sphere.uniform((40, 20), 2, seed=16)
    plain = fused.attend(x, x, x, 9.0, "causal")
    np.testing.assert_allclose(fused.attend(x, x, x, 9.0, "causal", bias=np.zeros((20, 20))),
                               plain, rtol=0, atol=1e-13)
    y = x.copy()
    y[5, 12] = af.sphere.normalize(y[5, 12] + 0.3)
    b = alibi(20, 0.25)
    for name, kernel in BIAS_KERNELS.items():
        changed = np.any(kernel(x, x, x, 9.0, "causal", bias=b)
                         != kernel(y, y, y, 9.0, "causal", bias=b), axis=-1)
        assert changed[5, 12:].all() and not changed[5, :12].any(), name
        assert not np.delete(changed, 5, axis=0).any(), name


def test_blocked_row_tops_equal_the_numpy_row_top():
    """The blocked kernel's row offsets (numba) equal `fused.row_top` (numpy) for every band,
    with and without a bias (with -inf entries) and memory log-weights."""
    from attnflow.kernels.blocked import _row_tops
    from attnflow.kernels.fused import band, row_top

    rng = np.random.default_rng(17)
    n = 9
    for mask in ("causal", "full", ("window", 3)):
        for bias in (None, random_bias(rng, n)):
            for log_weights in (np.zeros(0), rng.standard_normal(2)):
                lo, hi, token_bias = band(mask, n, bias)
                got = _row_tops(lo, hi, np.zeros((0, 0)) if token_bias is None else token_bias,
                                log_weights)
                np.testing.assert_array_equal(got, row_top(lo, hi, token_bias, log_weights))
