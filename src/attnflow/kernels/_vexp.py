"""A vectorisable exp for numba kernels: `vexp(x)` for float64 and float32 scalars.

numba compiles `math.exp` to a scalar libm call (about 4 ns per element here; numba's
vectorised SVML path needs an SVML-patched LLVM that the PyPI wheels do not ship), which
would make exp, not arithmetic, the cost of a fused attention kernel. `vexp` is plain
arithmetic that LLVM vectorises inside a loop (AVX2/AVX-512 lanes):

    exp(x) = 2^n * exp(r),   n = round(x / ln 2),   r = x - n ln 2  (|r| <= ln 2 / 2),

with n ln 2 subtracted in two parts (Cody & Waite, *Software Manual for the Elementary
Functions*, 1980; the split constants of fdlibm's e_exp.c), exp(r) by a polynomial in Horner
form with fused multiply-adds and 2^n built directly in the exponent bits. n by the
"shifter" trick (adding 1.5 * 2^52, float64, or 1.5 * 2^23, float32, rounds x / ln 2 to an
integer held in the low bits of the sum, which also give 2^n's exponent: no round or convert
instructions, and integer work of the float's own width, so float32 keeps twice float64's
lanes on AVX2 as on AVX-512). float64: the degree-10 interpolant of exp at the Chebyshev
points of [-ln 2 / 2, ln 2 / 2] (near-minimax: error 2.9e-16, computed in 40-digit arithmetic
with mpmath; two multiply-adds fewer than the degree-12 Taylor polynomial of the same
accuracy). float32: the degree-6 Chebyshev interpolant (error 2.5e-9, 1.0e-7 evaluated in
float32; one multiply-add fewer than the degree-7 Taylor polynomial it replaced).
Inputs below the smallest normal result (-708.39 in float64, -87.33 in float32) and -inf
return exactly 0: the kernels only exponentiate scores minus their row maximum (<= 0), where
such terms are below rounding of the sum, and flushing them avoids the slow subnormal path
(measured in benchmarks/RESULTS.md). Inputs are assumed
<= 709 (float64) or <= 88 (float32); NaN is not propagated.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
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
SHIFTER_32 = np.float32(12582912.0)  # 1.5 * 2^23
_CHEBYSHEV2_32 = (  # 2^f ~ sum_i c_i f^i on |f| <= 1/2 (interpolant at Chebyshev points)
    1.0000000000000009, 0.6931472067028335, 0.24022650922288294, 0.05550327226668675,
    0.009618056678553505, 0.00134004281782533, 0.00015461444693294768)
POLY2_32 = tuple(np.float32(c) for c in _CHEBYSHEV2_32)
POLY32 = tuple(np.float32(c / math.log(2) ** i)  # exp(r) = 2^(r / ln 2) on |r| <= ln 2 / 2
               for i, c in enumerate(_CHEBYSHEV2_32))
MIN32 = np.float32(-87.33654)  # log of the smallest normal float32
MIN2_32 = np.float32(-126.0)  # log2 of the smallest normal float32


@intrinsic
def _pow2_of_shifted(typingctx, shifted):
    """2^n from shifted = SHIFTER + n (float64) / SHIFTER_32 + n (float32), |n| below the
    exponent range: the bits of `shifted` are those of SHIFTER plus n; shifted left by the
    mantissa width (52 / 23) only n's remain, in the exponent field (mod 2^64 / 2^32); adding
    the exponent bias's gives the bits of 2^n. All in integers of the float's own width, so
    that both dtypes stay in vector lanes of their width (numba's typing would widen int32
    arithmetic to int64, which AVX2 can only convert from float32 one element at a time)."""
    if not isinstance(shifted, types.Float) or shifted.bitwidth not in (32, 64):
        return None
    bits, mantissa, bias = (64, 52, 1023) if shifted.bitwidth == 64 else (32, 23, 127)

    def codegen(context, builder, signature, args):
        word = ir.IntType(bits)
        n = builder.shl(builder.bitcast(args[0], word), ir.Constant(word, mantissa))
        exponent = builder.add(n, ir.Constant(word, bias << mantissa))
        return builder.bitcast(exponent, context.get_value_type(shifted))

    return shifted(shifted), codegen


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp64(x):
    shifted = x * LOG2E + SHIFTER  # = 1.5 * 2^52 + n, n = round(x / ln 2)
    n = shifted - SHIFTER
    r = (x - n * LN2_HI) - n * LN2_LO
    return _horner(POLY64, r) * _pow2_of_shifted(shifted) if x > MIN64 else 0.0


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp2_64(y):
    shifted = y + SHIFTER  # = 1.5 * 2^52 + n, n = round(y)
    f = y - (shifted - SHIFTER)  # exact, |f| <= 1/2
    return _horner(POLY2_64, f) * _pow2_of_shifted(shifted) if y > MIN2_64 else 0.0


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp32(x):
    shifted = x * LOG2E_32 + SHIFTER_32  # = 1.5 * 2^23 + n, n = round(x / ln 2)
    n = shifted - SHIFTER_32
    r = (x - n * LN2_HI_32) - n * LN2_LO_32
    return _horner(POLY32, r) * _pow2_of_shifted(shifted) if x > MIN32 else np.float32(0.0)


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _exp2_32(y):
    shifted = y + SHIFTER_32  # = 1.5 * 2^23 + n, n = round(y)
    f = y - (shifted - SHIFTER_32)  # exact, |f| <= 1/2
    return _horner(POLY2_32, f) * _pow2_of_shifted(shifted) if y > MIN2_32 else np.float32(0.0)


@njit(fastmath=EXACT_FASTMATH, cache=True)
def _horner(coeffs, r):
    """sum_i coeffs[i] r^i by Horner's rule (fused multiply-adds)."""
    p = coeffs[-1]
    for c in coeffs[-2::-1]:
        p = p * r + c
    return p


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
