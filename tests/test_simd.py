"""`wide_vectors()` marks its caller, and only its caller, for 512-bit vectorisation."""

from __future__ import annotations

import numpy as np
from numba import njit

from attnflow.kernels._simd import ATTRIBUTES, wide_vectors


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
