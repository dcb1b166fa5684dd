"""`key_sums`: the fused kernel's loop over one query row's keys, written as explicit vector
LLVM IR, with 2^x by an in-register table (AVX-512 only: `has_table_exp`).

For one query row of a tile of `lanes` runs (a lane-last tile, `attnflow.kernels.fused`):

    x_j = offset + sum_c q_c k_jc,   w_j = 2^(x_j),
    total = sum_j w_j,   acc_c = sum_j w_j v_jc,        j in [lo, hi)          (all (lanes,))

Why IR and not a numba loop: LLVM vectorises the numba loop, but then keeps the running sums
in memory (a store of every sum for every key) and rematerialises the exp's constants inside
the loop; here the sums are phi values held in registers across the keys. That alone ran no
faster (measured), the win is the exp it makes possible (benchmarks/RESULTS.md):

    2^x = 2^n * T[k] * 2^(t / L),  with L the lanes of one register (8 float64, 16 float32),
    m = round(L x) = L n + k (k in [0, L)),  t = L x - m  (exact, |t| <= 1/2),

T[k] = 2^(k / L) read by one permute of a register-resident table (vpermpd / vpermps zmm,
which use the index's low bits: k needs no masking), so the polynomial in t covers a range L
times narrower than `_vexp.vexp2`'s and needs fewer terms: degree 7 for float64 (10 in vexp2)
and 3 for float32 (6). m comes from the shifter trick of `_vexp`; 2^n * T[k] is built in
integers as bits(T'[k]) + (m << (mantissa - log2 L)) with T'[k] = bits(T[k]) - (k << (mantissa
- log2 L)) (the table stores T' so that k's bits, shifted into the mantissa by the same shift,
cancel). The polynomials are Chebyshev interpolants of 2^(t / L) on [-1/2, 1/2], computed in
40-digit arithmetic (mpmath): float64 degree 7, approximation error 6.4e-18 (evaluation in
float64 2.2e-16); float32 degree 3, evaluation in float32 6.2e-8. Results below 2^-1022 /
2^-126 are 0, as in vexp2.
"""

from __future__ import annotations

import struct
from functools import cache

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from attnflow.kernels._simd import vector_bytes
from attnflow.kernels._vexp import EXACT_FASTMATH, MIN2_32, MIN2_64, SHIFTER, SHIFTER_32

__all__ = ["has_table_exp", "key_sums"]

# Explicit flags on every float instruction: numba adds its function's fast-math flags
# (with "reassoc", which would cancel t = L x - (shifter + L x - shifter) to 0) only to
# instructions that have none.
FLAGS = tuple(sorted(EXACT_FASTMATH))
POLY_T64 = (1.0, 0.08664339756999316, 0.0037535391712362563, 0.00010840646223598261,
            2.348176045512937e-06, 4.0690790182539944e-08, 5.876374390751333e-10,
            7.273449414102458e-12)  # 2^(t / 8) ~ sum_i POLY_T64[i] t^i on |t| <= 1/2
POLY_T32 = (0.9999999988534117, 0.043321698775062194, 0.000938421483561896,
            1.3551125679403628e-05)  # 2^(t / 16), |t| <= 1/2 (rounded to float32 on use)


def _table(bits: int) -> list[float]:
    """T'[k] = the float whose bits are bits(2^(k / L)) - (k << (mantissa - log2 L)),
    k < L = 512 / bits (one AVX-512 register of float64 or float32)."""
    size = 512 // bits
    shift = (52 if bits == 64 else 23) - (size.bit_length() - 1)
    fmt, word = ("<d", "<q") if bits == 64 else ("<f", "<i")
    out = []
    for k in range(size):
        b = struct.unpack(word, struct.pack(fmt, 2.0 ** (k / size)))[0] - (k << shift)
        out.append(struct.unpack(fmt, struct.pack(word, b))[0])
    return out


@cache
def has_table_exp() -> bool:
    """Whether numba's target has AVX-512 (512-bit registers, `_simd.vector_bytes`), whose
    variable permutes `key_sums` needs; elsewhere the fused kernel keeps its numba loop."""
    return vector_bytes() == 64


def _declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(ret, args), name)


@intrinsic
def key_sums(typingctx, qi, kt, vt, offset, lo, hi, total, acc, e, lanes):
    """key_sums(qi, kt, vt, offset, lo, hi, total, acc, e, lanes) -> None, in numba code.

    qi (e, lanes) the row's query (scores in base 2, beta log2 e folded in); kt (tokens, e,
    lanes) and vt (tokens, f, lanes) the tile's keys and values, C-contiguous; offset
    (lanes,) the row's shift; keys j in [lo, hi) (int64); writes total (lanes,) and acc, a
    tuple of f arrays (lanes,) (module docstring). e and lanes: compile-time ints, lanes a
    multiple of 8 (float64) / 16 (float32). float64 or float32 throughout. Only for AVX-512
    targets (`has_table_exp`): typing fails elsewhere.
    """
    if not (isinstance(e, types.IntegerLiteral) and isinstance(lanes, types.IntegerLiteral)
            and isinstance(acc, types.UniTuple) and has_table_exp()):
        return None
    dtype = qi.dtype
    bits = dtype.bitwidth
    size = 512 // bits  # table entries = lanes of one register
    if lanes.literal_value % size:
        return None
    e_, f, lanes_ = e.literal_value, acc.count, lanes.literal_value
    mantissa = 52 if bits == 64 else 23
    shifter, lowest = (SHIFTER, MIN2_64) if bits == 64 else (SHIFTER_32, MIN2_32)
    poly = POLY_T64 if bits == 64 else tuple(float(np.float32(c)) for c in POLY_T32)

    def codegen(context, builder, signature, args):
        real = context.get_value_type(dtype)
        word = ir.IntType(bits)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        vec, ivec = ir.VectorType(real, lanes_), ir.VectorType(word, lanes_)
        reg, ireg = ir.VectorType(real, size), ir.VectorType(word, size)
        module = builder.module
        fmuladd = _declare(module, f"llvm.fmuladd.v{lanes_}f{bits}", vec, [vec] * 3)
        permute = _declare(module, f"llvm.x86.avx512.permvar.{'df' if bits == 64 else 'sf'}.512",
                           reg, [reg, ireg])
        q_ptr, k_ptr, v_ptr, off_ptr, total_ptr = (
            context.make_array(signature.args[a])(context, builder, args[a]).data
            for a in (0, 1, 2, 3, 6))
        acc_ptrs = [context.make_array(signature.args[7].dtype)(context, builder, a).data
                    for a in cgutils.unpack_tuple(builder, args[7], f)]
        lo_, hi_ = args[4], args[5]

        def splat(x: float) -> ir.Constant:
            return ir.Constant(vec, [x] * lanes_)

        def at(ptr, index) -> ir.Value:  # the (lanes,) vector at element `index` of ptr
            index = ir.Constant(i64, index) if isinstance(index, int) else index
            return builder.bitcast(builder.gep(ptr, [index]), vec.as_pointer())

        def load(ptr, index) -> ir.Value:
            return builder.load(at(ptr, index), align=bits // 8)

        # Scores scaled by L (exact: a power of 2), so that round(L x) is one shifter add.
        scale = splat(float(size))
        q = [builder.fmul(load(q_ptr, c * lanes_), scale, flags=FLAGS) for c in range(e_)]
        off = builder.fmul(load(off_ptr, 0), scale, flags=FLAGS)
        zero = splat(0.0)
        table = ir.Constant(reg, _table(bits))
        shift = ir.Constant(ivec, [mantissa - (size.bit_length() - 1)] * lanes_)

        entry = builder.block
        loop = builder.append_basic_block("keys")
        done = builder.append_basic_block("keys.done")
        builder.cbranch(builder.icmp_signed("<", lo_, hi_), loop, done)
        builder.position_at_end(loop)
        j = builder.phi(i64)
        sums = [builder.phi(vec) for _ in range(1 + f)]  # total, acc_0 .. acc_{f-1}
        x = off
        for c in range(e_):
            x = builder.call(fmuladd, [q[c], load(k_ptr, builder.add(
                builder.mul(j, ir.Constant(i64, e_ * lanes_)), ir.Constant(i64, c * lanes_))), x])
        shifted = builder.fadd(x, splat(shifter), flags=FLAGS)  # = shifter + m
        t = builder.fsub(x, builder.fsub(shifted, splat(shifter), flags=FLAGS), flags=FLAGS)
        p = splat(poly[-1])
        for coeff in poly[-2::-1]:
            p = builder.call(fmuladd, [p, t, splat(coeff)])
        m = builder.bitcast(shifted, ivec)
        parts = [builder.call(permute, [table, builder.shuffle_vector(
            m, m, ir.Constant(ir.VectorType(i32, size), list(range(r, r + size))))])
            for r in range(0, lanes_, size)]
        while len(parts) > 1:  # concatenate the registers' lookups back to (lanes,)
            width = 2 * parts[0].type.count
            parts = [builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, width),
                                                              list(range(width))))
                     for a, b in zip(parts[::2], parts[1::2])]
        pow2 = builder.bitcast(builder.add(builder.shl(m, shift),
                                           builder.bitcast(parts[0], ivec)), vec)
        w = builder.select(builder.fcmp_ordered(">", x, splat(lowest * size), flags=FLAGS),
                           builder.fmul(p, pow2, flags=FLAGS), zero)
        v_row = builder.mul(j, ir.Constant(i64, f * lanes_))
        new = [builder.fadd(sums[0], w, flags=FLAGS)] + [
            builder.call(fmuladd, [w, load(v_ptr, builder.add(v_row, ir.Constant(
                i64, c * lanes_))), sums[1 + c]]) for c in range(f)]
        j_next = builder.add(j, ir.Constant(i64, 1))
        body = builder.block
        j.add_incoming(lo_, entry)
        j.add_incoming(j_next, body)
        for phi, value in zip(sums, new):
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, body)
        builder.cbranch(builder.icmp_signed("<", j_next, hi_), loop, done)

        builder.position_at_end(done)
        finals = []
        for value in new:
            phi = builder.phi(vec)
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, body)
            finals.append(phi)
        for ptr, value in zip([total_ptr, *acc_ptrs], finals):
            builder.store(value, at(ptr, 0), align=bits // 8)
        return context.get_dummy_value()

    return types.none(qi, kt, vt, offset, lo, hi, total, acc, e, lanes), codegen
