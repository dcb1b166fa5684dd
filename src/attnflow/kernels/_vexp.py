"""A vectorisable exp for numba kernels: `vexp(x)` for float64 and float32 scalars.

numba compiles `math.exp` to a scalar libm call (about 4 ns per element here; numba's
vectorised SVML path needs an SVML-patched LLVM that the PyPI wheels do not ship), which
would make exp, not arithmetic, the cost of a fused attention kernel. `vexp` is plain
arithmetic that LLVM vectorises inside a loop (AVX2/AVX-512 lanes):

    exp(x) = 2^n * exp(r),   n = round(x / ln 2),   r = x - n ln 2  (|r| <= ln 2 / 2),

with n ln 2 subtracted in two parts (Cody & Waite, *Software Manual for the Elementary
Functions*, 1980; the split constants of fdlibm's e_exp.c), exp(r) by a polynomial in Horner
form with fused multiply-adds and 2^n built directly in the exponent bits. float64: n by the
"shifter" trick (adding 1.5 * 2^52 rounds x / ln 2 to an integer held in the low bits of the
sum, which also give 2^n's exponent: no round or convert instructions), and the degree-10
interpolant of exp at the Chebyshev points of [-ln 2 / 2, ln 2 / 2] (near-minimax: error
2.9e-16, computed in 40-digit arithmetic with mpmath; two multiply-adds fewer than the
degree-12 Taylor polynomial of the same accuracy). float32: floor(x / ln 2 + 1/2) and the
Taylor polynomial of degree 7 (truncation error below 1.3e-7).
Inputs below the smallest normal result (-708.39 in float64, -87.33 in float32) and -inf
return exactly 0: the kernels only exponentiate scores minus their row maximum (<= 0), where
such terms are below rounding of the sum, and flushing them avoids the slow subnormal path
(measured in benchmarks/RESULTS.md). Inputs are assumed
<= 709 (float64) or <= 88 (float32); NaN is not propagated.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

__all__ = ["vexp", "vexp2"]

# No "reassoc": it would let LLVM merge the two-part subtraction of n ln 2 and lose digits.
EXACT_FASTMATH = {"contract", "nsz", "arcp"}

LOG2E = 1.4426950408889634
SHIFTER = 6755399441055744.0  # 1.5 * 2^52
LN2_HI = 6.93147180369123816490e-01  # fdlibm e_exp.c: ln2HI[0], low 32 bits zero
LN2_LO = 1.90821492927058770002e-10  # ln2LO[0]
POLY64 = (  # exp(r) ~ sum_i POLY64[i] r^i on |r| <= ln 2 / 2 (Chebyshev interpolant)
    1.0, 1.0000000000000067, 0.5000000000000006, 0.16666666666554406, 0.04166666666657314,
    0.008333333385667782, 0.0013888888932488599, 0.00019841170270440067,
    2.4801504346997686e-05, 2.764018079620985e-06, 2.7626357241447223e-07,
)
MIN64 = -708.3964185322641  # log of the smallest normal float64
POLY2_64 = tuple(c * math.log(2) ** i for i, c in enumerate(POLY64))  # 2^f = exp(f ln 2)
MIN2_64 = -1022.0  # log2 of the smallest normal float64

LOG2E_32 = np.float32(1.442695)
LN2_HI_32 = np.float32(0.693359375)  # 355/512, exact in a few bits
LN2_LO_32 = np.float32(-2.12194440e-4)  # ln 2 - 355/512 (Cephes expf)
TAYLOR32 = tuple(np.float32(1.0 / math.factorial(i)) for i in range(8))
MIN32 = np.float32(-87.33654)  # log of the smallest normal float32
POLY2_32 = tuple(np.float32(math.log(2) ** i / math.factorial(i)) for i in range(8))
MIN2_32 = np.float32(-126.0)  # log2 of the smallest normal float32


@intrinsic
def _int_bits_as_float(typingctx, bits):
    """Reinterpret the bits of an int64 (int32) as a float64 (float32)."""
    if bits == types.int64:
        target = types.float64
    elif bits == types.int32:
        target = types.float32
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(target))

    return target(bits), codegen


@intrinsic
def _float_bits_as_int(typingctx, value):
    """Reinterpret the bits of a float64 as an int64."""
    if value != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(value), codegen


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp64(x):
    shifted = x * LOG2E + SHIFTER  # = 1.5 * 2^52 + n, n = round(x / ln 2)
    n = shifted - SHIFTER
    r = (x - n * LN2_HI) - n * LN2_LO
    return _horner(POLY64, r) * _pow2_64(shifted) if x > MIN64 else 0.0


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp2_64(y):
    shifted = y + SHIFTER  # = 1.5 * 2^52 + n, n = round(y)
    f = y - (shifted - SHIFTER)  # exact, |f| <= 1/2
    return _horner(POLY2_64, f) * _pow2_64(shifted) if y > MIN2_64 else 0.0


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp32(x):
    n = np.floor(x * LOG2E_32 + np.float32(0.5))
    r = (x - n * LN2_HI_32) - n * LN2_LO_32
    return _horner(TAYLOR32, r) * _pow2_32(n) if x > MIN32 else np.float32(0.0)


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp2_32(y):
    n = np.floor(y + np.float32(0.5))
    f = y - n  # exact, |f| <= 1/2
    return _horner(POLY2_32, f) * _pow2_32(n) if y > MIN2_32 else np.float32(0.0)


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _horner(coeffs, r):
    """sum_i coeffs[i] r^i by Horner's rule (fused multiply-adds)."""
    p = coeffs[-1]
    for c in coeffs[-2::-1]:
        p = p * r + c
    return p


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _pow2_64(shifted):
    """2^n from shifted = 1.5 * 2^52 + n: the bits of `shifted` are those of 1.5 * 2^52 plus
    n; shifted left by 52 only n's remain, in the exponent field (mod 2^64); adding 1023's
    gives the bits of 2^n."""
    return _int_bits_as_float((_float_bits_as_int(shifted) << 52) + (1023 << 52))


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _pow2_32(n):
    """2^n for a float32 holding an integer n, built in the exponent bits."""
    return _int_bits_as_float(np.int32((np.int64(n) + 127) << 23))  # numba widens int32 ops


def vexp2(y: float) -> float:
    """2^y for y <= 1023 (float64) / 127 (float32), 0 below -1022 / -126 (the normal range).
    Relative error about 1e-15 (float64) / 2e-7 (float32) against the correctly rounded 2^y.
    One operation fewer than vexp (y - round(y) is exact: no two-part reduction), for
    kernels that keep scores in base-2 units. Callable from numba code (vectorises in
    loops); from Python it is `2.0 ** y`."""
    return 2.0**y


def vexp(x: float) -> float:
    """exp(x) for x <= 709 (float64) / 88 (float32), 0 below the normal range. Relative
    error about 1e-15 (float64) / 2e-7 (float32) against the correctly rounded exp.
    Callable from numba code (vectorises in loops); from Python it is `math.exp`."""
    return math.exp(x)


def _implement(python_fn, float32_fn, float64_fn) -> None:
    """Make numba compile calls of python_fn to float32_fn / float64_fn by argument type."""

    @overload(python_fn, jit_options={"fastmath": EXACT_FASTMATH})
    def _by_type(x):
        if isinstance(x, types.Float) and x.bitwidth == 32:
            return lambda x: float32_fn(x)
        if isinstance(x, types.Float):
            return lambda x: float64_fn(x)
        return None


_implement(vexp, _exp32, _exp64)
_implement(vexp2, _exp2_32, _exp2_64)
