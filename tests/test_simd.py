"""`wide_vectors()` marks its caller, and only its caller, for 512-bit vectorisation;
`arrays_do_not_overlap()` marks its caller's array data pointers noalias."""

from __future__ import annotations

import numpy as np
from numba import njit

from attnflow.kernels._simd import ATTRIBUTES, arrays_do_not_overlap, wide_vectors


@njit
def dot_wide(a, b):
    wide_vectors()
    total = 0.0
    for i in range(a.size):
        total += a[i] * b[i]
    return total


@njit
def dot_plain(a, b):
    total = 0.0
    for i in range(a.size):
        total += a[i] * b[i]
    return total


def test_wide_vectors_sets_the_attributes_of_its_caller_only():
    a = np.arange(100.0)
    assert dot_wide(a, a) == dot_plain(a, a) == float(a @ a)
    wide = next(iter(dot_wide.inspect_llvm().values()))
    plain = next(iter(dot_plain.inspect_llvm().values()))
    for attribute in ATTRIBUTES:
        assert attribute in wide
        assert attribute not in plain


@njit
def scale_into(out, x, pair, c):
    arrays_do_not_overlap()
    for i in range(x.size):
        out[i] = c * x[i] + pair[0][i] * pair[1][i]


def _signature_line(fn) -> str:
    ir = fn.inspect_llvm(fn.signatures[0])
    return next(line for line in ir.splitlines()
                if line.startswith("define") and "scale_into" in line)


def test_arrays_do_not_overlap_marks_the_data_pointers_only():
    x = np.arange(8.0)
    out = np.empty(8)
    scale_into(out, x, (x, x), 2.0)  # the same array read three times: allowed
    np.testing.assert_array_equal(out, 2 * x + x * x)
    args = {}
    for part in _signature_line(scale_into).split("(", 1)[1].split(","):
        words = part.split()
        if words and words[-1].startswith("%arg."):
            args[words[-1][1:]] = words[:-1]
    for name in ("arg.out.4", "arg.x.4", "arg.pair.0.4", "arg.pair.1.4"):  # data pointers
        assert "noalias" in args[name], (name, args[name])
    for name in ("arg.out.0", "arg.x.0", "arg.x.1", "arg.pair.1.0"):  # meminfo, parent
        assert "noalias" not in args[name], (name, args[name])


def test_fused_scratch_arrays_start_on_a_cache_line():
    from attnflow.kernels.fused import ALIGN, _aligned_zeros

    for shape, dtype in (((200, 2, 64), np.float32), ((7, 3, 32), np.float64), (5, np.float64)):
        a = _aligned_zeros(shape, dtype)
        assert a.ctypes.data % ALIGN == 0
        assert a.shape == (shape if isinstance(shape, tuple) else (shape,))
        assert a.dtype == dtype and a.flags.c_contiguous and not a.any()


def test_fused_results_do_not_depend_on_the_kept_scratch(monkeypatch):
    """A thread keeps the fused kernel's scratch for its next call of the same sizes: filled
    with NaN by a call on NaN tokens, it leaves the next results exact, for a batch whose
    last tile has empty lanes, also where the rows need the exact-maximum pass (queries
    apart from the keys, scores spread beyond SAFE_SPREAD)."""
    import itertools

    from attnflow.kernels import dense, fused

    monkeypatch.setenv("ATTNFLOW_THREADS", "1")
    rng = np.random.default_rng(5)
    lanes = fused.tile_runs(np.float64, 64)
    for dtype, beta in itertools.product((np.float64, np.float32), (2.0, 400.0)):
        full = np.full((2 * lanes, 9, 3), np.nan, dtype)
        fused.attend(full, full, full, beta, "causal")  # every lane of the scratch NaN
        q, k, v = rng.standard_normal((3, lanes + 3, 9, 3)).astype(dtype)
        got = fused.attend(q, k, v, beta, "causal")
        want = dense.attend(q, k, v, beta, "causal")
        # Scores carry rounding of about eps |s|, |s| <= beta max|q| max|k|: the weights'
        # and so the output's error (times max|v|), with a factor 4 of slack.
        norm = np.linalg.norm
        scale = beta * norm(q, axis=-1).max() * norm(k, axis=-1).max() + 1
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=0,
                                   atol=4 * np.finfo(dtype).eps * scale * np.abs(v).max())
