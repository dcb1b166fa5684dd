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
