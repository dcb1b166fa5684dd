"""`kernels._keysums.key_sums`, the AVX-512 key loop with its table exp, against independent
truth: 2^x in extended precision (numpy's longdouble exp2), and the sums over keys done
in numpy. It runs only where numba's target has AVX-512; elsewhere the fused kernel does not
use it (`has_table_exp`), which the last test checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

import numpy as np
import pytest
from numba import njit

from attnflow.kernels._keysums import has_table_exp, key_sums

needs_avx512 = pytest.mark.skipif(not has_table_exp(), reason="numba's target has no AVX-512")


@cache
def _sums_of(e: int, lanes: int):
    @njit
    def sums(qi, kt, vt, offset, lo, hi, total, acc):
        key_sums(qi, kt, vt, offset, lo, hi, total, acc, e, lanes)

    return sums


def two_to(x: np.ndarray) -> np.ndarray:
    """2^x with key_sums, one key per lane: offset x, a zero query."""
    dtype, lanes = x.dtype, x.size
    total, acc = np.zeros(lanes, dtype), (np.zeros(lanes, dtype),)
    ones = np.ones((1, 1, lanes), dtype)
    _sums_of(1, lanes)(np.zeros((1, lanes), dtype), ones, ones, x, 0, 1, total, acc)
    assert np.array_equal(acc[0], total)  # the value is 1
    return total


@needs_avx512
@pytest.mark.parametrize("dtype, lowest", [(np.float64, -1022.0), (np.float32, -126.0)])
def test_table_exp_is_accurate_to_two_ulps(dtype, lowest):
    """The bound from the error budget of the module docstring, in units of eps: the
    table's rounding (eps / 2), the polynomial's evaluation (about eps / 2: the last add),
    the final product (eps / 2) and the approximation (< eps / 10): at most 2 eps."""
    eps = np.finfo(dtype).eps
    lanes = 512
    x = np.concatenate([np.linspace(lowest + 0.01, 0, 100 * lanes - 3),
                        [-0.5 / 8, 0.5 / 8, -1 / 16]]).astype(dtype)  # the ends of |t| <= 1/2
    got = np.concatenate([two_to(chunk) for chunk in x.reshape(-1, lanes)])
    exact = np.exp2(x.astype(np.longdouble))
    assert np.finfo(np.longdouble).eps < eps / 1000 or dtype == np.float32
    assert np.abs(got / exact - 1).max() <= 2 * eps


@needs_avx512
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_table_exp_is_zero_below_the_normal_range(dtype):
    lowest = -1022.0 if dtype == np.float64 else -126.0
    lanes = 16
    x = np.full(lanes, lowest - 0.6, dtype)
    x[1], x[2], x[3] = -np.inf, 3 * lowest, lowest + 0.1
    got = two_to(x)
    assert (got[[0, 1, 2]] == 0).all() and got[3] > 0 and np.isfinite(got).all()
    assert (got[4:] == 0).all()


@needs_avx512
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("e, f, lo, hi", [(2, 2, 0, 37), (3, 1, 5, 6), (1, 4, 3, 3)])
def test_sums_over_keys_match_numpy(dtype, rtol, e, f, lo, hi):
    """total and acc against the same sums in float64 numpy, for bands of many, one and no
    keys (no keys: zeros), and head sizes e, f of 1 to 4."""
    lanes = 32 if dtype == np.float64 else 64
    rng = np.random.default_rng(3)
    qi = rng.standard_normal((e, lanes)).astype(dtype)
    kt = rng.standard_normal((40, e, lanes)).astype(dtype)
    vt = rng.standard_normal((40, f, lanes)).astype(dtype)
    offset = -np.abs(rng.standard_normal(lanes)).astype(dtype) * 3
    total = np.full(lanes, np.nan, dtype)
    acc = tuple(np.full(lanes, np.nan, dtype) for _ in range(f))
    _sums_of(e, lanes)(qi, kt, vt, offset, lo, hi, total, acc)
    w = np.exp2(offset + np.einsum("cl,jcl->jl", qi, kt[lo:hi]).astype(float))
    want_total = w.sum(axis=0)
    want_acc = np.einsum("jl,jcl->cl", w, vt[lo:hi].astype(float))
    scale = np.einsum("jl,jcl->cl", w, np.abs(vt[lo:hi]).astype(float))  # no cancellation
    np.testing.assert_allclose(total, want_total, rtol=rtol, atol=0)
    for c in range(f):
        assert np.all(np.abs(acc[c] - want_acc[c]) <= rtol * scale[c])


PERMUTES = r"""
import json, re
import numpy as np
from attnflow.kernels import fused
x = np.random.default_rng(0).standard_normal((64, 12, 2))
found = {}
for biased in (False, True):
    fused.attend(x, x, x, 2.0, "causal", bias=np.zeros((12, 12)) if biased else None)
    kernel = fused._compile(2, 2, biased, fused.tile_runs(np.float64, 64))
    asm = kernel.inspect_asm(kernel.signatures[0])  # a fresh cache: compiled, inspectable
    found[str(biased)] = bool(re.search(r"vpermpd\s+%zmm", asm))
print(json.dumps(found))
"""


def test_fused_kernel_uses_the_table_loop_exactly_where_the_target_has_avx512(tmp_path):
    """The kernel compiled without score offsets permutes zmm registers (the table of
    key_sums) iff has_table_exp(); with a score bias it never does. In a child process
    with an empty numba cache, so that the code is compiled here and can be read."""
    child = subprocess.run([sys.executable, "-c", PERMUTES], capture_output=True, text=True,
                           env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found == {"False": has_table_exp(), "True": False}
