"""The vector-Jacobian product of the fused kernel's softmax attention (numba), run by run,
never holding the n x n weights.

For run b, query i, allowed keys j (the mask's band [lo_i, hi_i), then the m memory keys)
with scores s_ij = beta <q_i, k_j> + b_ij (b: the score bias, -inf where a boolean mask
forbids a key; log a_j on memory columns), weights p_ij = softmax_j(s_ij) and the forward's
output o_i = sum_j p_ij v_j, the gradient of a loss with dL/do_i = g_i is

    dv_j = sum_i p_ij g_i,                ds_ij = p_ij (<g_i, v_j> - <g_i, o_i>),
    dq_i = beta sum_j ds_ij k_j,          dk_j = beta sum_i ds_ij q_i,
    d log a_j = sum_i ds_ij (memory),     d slope = -sum_ij ds_ij |i - j| (ALiBi's LinearBias)

(memory keys and values: dk_j, dv_j of their columns, summed over the runs). One pass per
row like the forward: each weight recomputed from its score and the row's log-sum-exp,
lse_i = log sum_j exp(s_ij), which the forward saved (`fused.attend_lse`): p_ij =
exp(s_ij - lse_i), then every term above in the same loop over keys. As in the forward,
runs are the SIMD lanes (tiles of `fused.tile_runs` runs, lane-last), tiles shared among
threads (`attnflow.parallel`); exp is `_vexp.vexp` (2.9e-16 in float64). float32 and
float64 are computed in their own dtype.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import njit

from attnflow.kernels._simd import arrays_do_not_overlap, wide_vectors
from attnflow.kernels._vexp import vexp
from attnflow.kernels.fused import _aligned_zeros as aligned_zeros
from attnflow.kernels.fused import band, tile_runs
from attnflow.kernels.masks import MaskSpec
from attnflow.parallel import parallel_ranges

__all__ = ["attend_backward", "score_rows"]

# Reductions over keys need "reassoc" to vectorise (as in `attnflow.kernels.fused`).
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def score_rows(mask: MaskSpec, n: int, bias: np.ndarray | None, log_weights: np.ndarray,
               dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The band lo, hi (n,) of each query's keys (`fused.band`) and the additive score rows
    (rows: one per query, or one for all; columns: n tokens, then the m memory tokens) in
    dtype: the bias (0 without one, -inf where a boolean mask forbids a key) and log a_j;
    and whether any score is offset (the kernel then adds the rows)."""
    lo, hi, token_bias = band(mask, n, bias)
    m = len(log_weights)
    rows = np.empty((1 if token_bias is None else n, n + m), dtype)
    rows[:, :n] = 0 if token_bias is None else token_bias
    rows[:, n:] = log_weights
    return lo, hi, rows, token_bias is not None or m > 0


@cache
def _compile(e: int, f: int, biased: bool, slope: bool, lanes: int):
    """The backward kernel for head sizes e (queries, keys), f (values) and tiles of `lanes`
    runs, fixed at compile time so that the loops over them unroll and the lane loops
    vectorise; `biased`: add the score rows; `slope`: accumulate sum_ij ds_ij |i - j| (the
    gradient of ALiBi's slope)."""

    # error_model "numpy": a row whose weights are all 0 gives NaN, as the forward does
    @njit(nogil=True, fastmath=FASTMATH, cache=True, error_model="numpy")
    def kernel(q, k, v, out, lse, g, mem_k, mem_v, rows, lo, hi, beta,
               dq, dk, dv, dmem_k, dmem_v, dmem_w, dslope,
               qt, kt, vt, gt, dot, lset, dkt, dvt, dwt, acc, distance, dsj, tile0, tile1):
        wide_vectors()
        arrays_do_not_overlap()
        runs, n = q.shape[0], q.shape[1]
        m = mem_k.shape[0]
        zero = q.dtype.type(0)
        # Lane-last tiles as in `fused`: rows n.. of kt, vt hold the memory, the same in
        # every lane; empty lanes of a batch's last tile hold zeros (their ds_ij are 0).
        for j in range(m):
            for c in range(e):
                kt[n + j, c] = mem_k[j, c]
            for c in range(f):
                vt[n + j, c] = mem_v[j, c]
        for tile in range(tile0, tile1):
            b0 = tile * lanes
            used = min(lanes, runs - b0)
            qt[:] = zero
            kt[:n] = zero
            vt[:n] = zero
            gt[:] = zero
            dot[:] = zero
            lset[:] = zero
            dkt[:] = zero
            dvt[:] = zero
            dwt[:] = zero
            distance[:] = zero
            for l in range(used):
                for j in range(n):
                    for c in range(e):
                        qt[j, c, l] = beta * q[b0 + l, j, c]
                        kt[j, c, l] = k[b0 + l, j, c]
                    for c in range(f):
                        vt[j, c, l] = v[b0 + l, j, c]
                        gt[j, c, l] = g[b0 + l, j, c]
                        dot[j, l] += g[b0 + l, j, c] * out[b0 + l, j, c]
                    lset[j, l] = lse[b0 + l, j]
            for i in range(n):
                row = rows[i if rows.shape[0] > 1 else 0]
                qi, gi, doti, lse_i = qt[i], gt[i], dot[i], lset[i]
                width = hi[i] - lo[i]
                acc[:] = zero
                for r in range(width + m):  # r: allowed tokens lo[i].., then memory
                    j = lo[i] + r if r < width else n + r - width
                    kj, vj, dkj, dvj = kt[j], vt[j], dkt[j], dvt[j]
                    b_j = row[j] if biased else zero
                    far = q.dtype.type(abs(i - j))
                    for l in range(lanes):  # one pass: the weight from the forward's lse
                        x = b_j - lse_i[l]
                        for c in range(e):
                            x += qi[c, l] * kj[c, l]
                        p = vexp(x)
                        t = -doti[l]
                        for c in range(f):
                            t += gi[c, l] * vj[c, l]
                            dvj[c, l] += p * gi[c, l]
                        ds = p * t
                        for c in range(e):
                            dkj[c, l] += ds * qi[c, l]
                            acc[c, l] += ds * kj[c, l]
                        dsj[l] = ds
                    if slope and j < n:
                        for l in range(lanes):
                            distance[l] += dsj[l] * far
                    if j >= n:
                        dw = dwt[j - n]
                        for l in range(lanes):
                            dw[l] += dsj[l]
                for l in range(used):
                    for c in range(e):
                        dq[b0 + l, i, c] = beta * acc[c, l]
            for l in range(used):
                for j in range(n):
                    for c in range(e):
                        dk[b0 + l, j, c] = dkt[j, c, l]
                    for c in range(f):
                        dv[b0 + l, j, c] = dvt[j, c, l]
                for j in range(m):
                    for c in range(e):
                        dmem_k[b0 + l, j, c] = dkt[n + j, c, l]
                    for c in range(f):
                        dmem_v[b0 + l, j, c] = dvt[n + j, c, l]
                    dmem_w[b0 + l, j] = dwt[j, l]
                dslope[b0 + l] = -distance[l]

    return kernel


def _scratch(n: int, m: int, e: int, f: int, lanes: int, dtype: np.dtype
             ) -> tuple[np.ndarray, ...]:
    """One share's lane-last scratch (`fused._aligned_zeros`): beta q qt (n, e, lanes), keys
    kt (n + m, e, lanes) and values vt (n + m, f, lanes) (rows n..: the memory), dL/do gt
    (n, f, lanes), <dL/do_i, o_i> dot and the forward's lse (n, lanes), the gradients dkt,
    dvt of kt, vt and dwt (m, lanes) of the log-weights, and per-lane rows: dq_i acc
    (e, lanes), sum ds_ij |i - j| distance and one key's ds_ij (lanes,)."""
    z = lambda *shape: aligned_zeros(shape, dtype)  # noqa: E731
    return (z(n, e, lanes), z(n + m, e, lanes), z(n + m, f, lanes), z(n, f, lanes),
            z(n, lanes), z(n, lanes), z(n + m, e, lanes), z(n + m, f, lanes),
            z(max(m, 1), lanes), z(e, lanes), z(lanes), z(lanes))


def attend_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                    lse: np.ndarray, g: np.ndarray, beta: float, mask: MaskSpec, mem_k: np.ndarray,
                    mem_v: np.ndarray, log_weights: np.ndarray, bias: np.ndarray | None,
                    slope: bool = False) -> tuple[np.ndarray, ...]:
    """The gradients of softmax attention (module docstring) at one call of the fused kernel.

    q, k : (runs, n, e), v, out (the forward's output), g (dL/dout) : (runs, n, f), lse :
    (runs, n) the forward's log-sum-exp of each row's scores (`fused.attend_lse`), all
    C-contiguous in one dtype (float32 or float64). beta : a finite real. mask : the call's
    mask. mem_k (m, e), mem_v (m, f), log_weights (m,) : the memory (m = 0: none).
    bias : None or the (n, n) score bias (finite or -inf). slope : also return the gradient
    of the slope of a LinearBias (bias = -slope |i - j|).

    Returns dq, dk (runs, n, e), dv (runs, n, f), dmem_k (m, e), dmem_v (m, f), d log a
    (m,) (summed over the runs) and d slope (a 0-d array; 0 unless `slope`).
    """
    runs, n, e = q.shape
    f = v.shape[-1]
    dtype = q.dtype
    lo, hi, rows, biased = score_rows(mask, n, bias, log_weights, dtype)
    m = len(log_weights)
    dq, dk = np.empty_like(q), np.empty_like(k)
    dv = np.empty_like(v)
    dmem_k = np.zeros((runs, m, e), dtype)
    dmem_v = np.zeros((runs, m, f), dtype)
    dmem_w = np.zeros((runs, m), dtype)
    dslope = np.zeros(runs, dtype)
    lanes = tile_runs(dtype, runs)
    kernel = _compile(e, f, biased, slope, lanes)
    args = (q, k, v, out, lse, g, np.ascontiguousarray(mem_k, dtype),
            np.ascontiguousarray(mem_v, dtype), rows, lo, hi, dtype.type(beta),
            dq, dk, dv, dmem_k, dmem_v, dmem_w, dslope)
    if runs and n:
        tiles = -(-runs // lanes)
        keys = int(np.mean(hi - lo)) + m  # per query

        def run(t0: int, t1: int) -> None:
            kernel(*args, *_scratch(n, m, e, f, lanes, dtype), t0, t1)

        parallel_ranges(run, tiles, cost=tiles * lanes * n * keys * (3 * e + 3 * f + 8))
    return (dq, dk, dv, dmem_k.sum(0), dmem_v.sum(0), dmem_w.sum(0),
            dslope.sum(dtype=dtype))
