"""The blocked, streaming attention kernel for long sequences (flash-attention style).

Scores are never held for the whole sequence: for each block of queries the keys are visited
in blocks, and a running row shift M, running sum L and running output O are updated

    S = beta Q_b K_c^T (+ mask / log-weights),   M' = max(M, rowmax S),
    P = exp(S - M'),   L <- e^{M - M'} L + rowsum P,   O <- e^{M - M'} O + P V_c,

and the output is O / L (the online softmax of Milakov & Gimelshein 2018, "Online normalizer
calculation for softmax", as used by Dao et al. 2022, FlashAttention). Memory is
O(threads block^2 + n (e + f)) instead of O(n^2): at n = 65 536 a dense float64 score matrix
needs 34 GB, this kernel a few MB of blocks.

What makes it fast (W2 in benchmarks/run.py, n = 65 536, d = 64, causal: 55-60% of the
float64 GEMM rate, counting 2 n^2 d flops):
* key blocks entirely outside the mask are skipped (a causal mask visits about half of
  them); blocks crossing the band's edge are masked row by row inside the exp pass;
* the two products per block pair are BLAS products (about 70% of one core's GEMM rate;
  the exp pass takes about a tenth of the time), called as np.dot from one numba function
  per query block (`_sweep`): no Python, no GIL between block pairs;
* threads share whole query blocks (`attnflow.parallel`, heaviest first), each with
  single-threaded BLAS (threadpoolctl; for calls from the main thread): a score block stays
  in its core's L2 cache from Q_b K_c^T through the exp pass to P V_c, and threads never
  wait for each other inside a block (two-thread BLAS on each block plus a threaded exp
  pass ran at half this speed, and more than ten times slower when another process kept a
  core busy);
* no row maximum where a bound does: the scores of row i are at most B_i + t_i, with
  B_i = beta |q_i| max_j |k_j| (Cauchy-Schwarz) and t_i the largest offset (score bias,
  memory log-weight) among the row's allowed keys, and its maximum is at least L_i, the
  larger of t_i - B_i and the score of the row's last allowed token (the probe: in
  self-attention the query's own, which scores B_i itself). If the spread B_i + t_i - L_i is
  below `fused.SAFE_SPREAD`, no weight that matters underflows with B_i + t_i as the shift,
  fixed from the start (softmax is shift-invariant): no rescaling, and the exp pass is the
  only pass over S. Rows beyond it (huge beta, cross-attention) keep the exact running
  maximum;
* exp is `vexp` (vectorised by LLVM with 512-bit registers, `_simd.wide_vectors`; no
  subnormal slow path), fused with the row sums.

Every mask: causal, full, ("window", w) (bands, per-row ranges inside each block) and boolean
arrays (an additive 0 / -inf bias, block by block). A float score bias (n, n) (ALiBi,
`attnflow.kernels.options`) is added the same way, per key block. Memory tokens are one more
key block.
"""

from __future__ import annotations

import math
import threading
from contextlib import AbstractContextManager, nullcontext
from functools import cache

import numpy as np
from numba import njit
from threadpoolctl import ThreadpoolController

from attnflow._checks import fail
from attnflow.kernels._simd import wide_vectors
from attnflow.kernels._vexp import vexp
from attnflow.kernels.fused import SAFE_SPREAD, band, row_top
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.options import check_options
from attnflow.kernels.types import Memory, Normalization
from attnflow.parallel import parallel_ranges

__all__ = ["BLOCK", "SUPPORTS", "attend"]

SUPPORTS = frozenset({"bias"})  # options beside softmax (`attnflow.kernels.options`)

BLOCK = 256  # queries and keys per block: score blocks of 512 kB (float64) stay in L2 cache


@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def _online_softmax(s, j0, lo, hi, exact, top, total, acc):
    """One online-softmax step on a score block s (rows, cols) of keys j0.., in place: row r
    allows keys [lo[r], hi[r]); s becomes P (0 outside the band). Rows with exact[r] move
    their shift top[r] to the running maximum, rescaling total and acc; the others keep it."""
    wide_vectors()
    zero = s.dtype.type(0)
    cols = s.shape[1]
    for r in range(s.shape[0]):
        row = s[r]
        a = min(max(lo[r] - j0, 0), cols)
        b = max(min(hi[r] - j0, cols), a)
        row[:a] = zero
        row[b:] = zero
        seg = row[a:b]  # loops over range(seg.size): indices LLVM knows are >= 0 vectorise
        shift = top[r]
        if exact[r]:
            new = shift
            for j in range(seg.size):
                new = max(new, seg[j])
            if new == -np.inf:  # nothing allowed so far: keep the empty state
                seg[:] = zero
                continue
            if new > shift:
                scale = math.exp(shift - new)  # math.exp: the one vexp call site stays inlined
                total[r] *= scale
                acc[r] *= scale
                top[r] = shift = new
        t = zero
        for j in range(seg.size):
            w = vexp(seg[j] - shift)
            seg[j] = w
            t += w
        total[r] += t


@cache
def _controller() -> ThreadpoolController:
    import scipy.linalg.cython_blas  # noqa: F401  the BLAS of numba's np.dot: list it too

    return ThreadpoolController()


def _blas_on_one_thread() -> AbstractContextManager:
    """BLAS on one thread (a process-wide setting) until the context exits, when called from
    the main thread; from other threads nothing changes: OpenBLAS (numpy's 0.3.31, scipy's
    0.3.30) ignores thread counts set from other threads once the main thread has set one,
    so a count set there might never be undone."""
    if threading.current_thread() is threading.main_thread():
        return _controller().limit(limits=1, user_api="blas")
    return nullcontext()


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
    bias: np.ndarray | None = None,
    normalization: Normalization = "softmax",
    block: int = BLOCK,
) -> np.ndarray:
    """Masked softmax attention, same contract as `attnflow.kernels.dense.attend`, in
    O(block^2) working memory per thread. Leading axes broadcast and are looped over.
    Computed in float32 when all inputs are float32, else float64. Returns (..., n, f).
    Called from the main thread, BLAS runs single-threaded (process-wide) during the call."""
    n, f = q.shape[-2], v.shape[-1]
    bias, normalization = check_options("blocked", SUPPORTS, n, mask, memory, bias,
                                        normalization)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if dtype not in (np.float32, np.float64):
        raise fail("q, k, v", "float32 or float64 arrays", f"dtype {dtype}")
    if int(block) != block or block < 1:
        raise fail("block", "an integer >= 1", repr(block))
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (np.broadcast_to(a, (*lead, n, a.shape[-1])) for a in (q, k, v))
    out = np.empty((*lead, n, f), dtype)
    lo, hi, bias = band(mask, n, bias)
    bias = None if bias is None else bias.astype(dtype, copy=False)
    if memory is None:
        memory = Memory(np.zeros((0, q.shape[-1])), np.zeros((0, f)), np.zeros(0))
    memory = Memory(*(np.ascontiguousarray(a, dtype) for a in memory))
    top_offset = row_top(lo, hi, bias, memory.log_weights)
    with _blas_on_one_thread():
        for idx in np.ndindex(*lead):
            qb = np.ascontiguousarray(q[idx], dtype) * dtype.type(beta)
            out[idx] = _one_run(qb, np.ascontiguousarray(k[idx], dtype),
                                np.ascontiguousarray(v[idx], dtype), lo, hi, bias,
                                top_offset, memory, int(block))
    return out


def _one_run(qb, k, v, lo, hi, bias, top_offset, memory, block):
    """Attention of one run; qb already multiplied by beta; top_offset: `fused.row_top`."""
    n, f, m = qb.shape[0], v.shape[1], len(memory.v)
    dtype = qb.dtype
    # The Cauchy-Schwarz shift of each row, or -inf where the exact maximum is needed: row i's
    # scores are <= bound_i + top_i and its maximum >= top_i - bound_i (top_i: the largest
    # offset, score bias or memory log-weight, among its allowed keys).
    # Its maximum is also at least the score of the row's last allowed token (in
    # self-attention the query's own, which reaches the bound): the probe, -inf if forbidden.
    k_max = np.sqrt(max(np.einsum("ij,ij->i", a, a).max(initial=0) for a in (k, memory.k)))
    bound = np.sqrt(np.einsum("ij,ij->i", qb, qb)) * k_max
    last = np.maximum(hi - 1, 0)
    probe = np.einsum("ij,ij->i", qb, k[last])
    if bias is not None:
        probe = probe + bias[np.arange(n), last]
    probe = np.where(hi > lo, probe, -np.inf)
    with np.errstate(invalid="ignore"):  # rows without keys: -inf - -inf, exact anyway
        spread = bound + top_offset - np.maximum(top_offset - bound, probe)
    exact = ~(spread <= SAFE_SPREAD[dtype.type]) | (top_offset == -np.inf)
    shift = np.where(exact, -np.inf, bound + top_offset).astype(dtype)
    out = np.empty((n, f), dtype)
    blocks = -(-n // block)
    no_bias = np.zeros((0, 0), dtype)

    def run(b0: int, b1: int) -> None:
        buffer, product = np.empty(block * max(block, m), dtype), np.empty((block, f), dtype)
        for i0 in range((blocks - b1) * block, (blocks - b0) * block, block):  # heaviest first
            rows = slice(i0, min(n, i0 + block))
            q_rows, lo_rows, hi_rows, exact_rows = qb[rows], lo[rows], hi[rows], exact[rows]
            r = len(q_rows)
            top, total, acc = shift[rows].copy(), np.zeros(r, dtype), np.zeros((r, f), dtype)
            state = exact_rows, top, total, acc, buffer, product[:r]
            first, last = int(lo_rows.min()), int(hi_rows.max())
            _sweep(q_rows, k, v, no_bias if bias is None else bias[rows],
                   first - first % block, last, block, lo_rows, hi_rows, *state)
            if m:  # every query attends to every memory key
                _sweep(q_rows, memory.k, memory.v, np.tile(memory.log_weights, (r, 1)), 0, m, m,
                       np.zeros(r, np.int64), np.full(r, m), *state)
            out[rows] = acc / total[:, None]

    parallel_ranges(run, blocks, cost=float((hi - lo + m).sum()) * (2 * (qb.shape[1] + f) + 30))
    return out


@njit(nogil=True, cache=True)
def _sweep(q_rows, keys, values, bias, j_start, j_stop, block, lo, hi, exact, top, total, acc,
           buffer, product):
    """The key blocks j_start, j_start + block, .. (< j_stop) folded into the online softmax
    of the queries q_rows: S = q_rows keys^T (+ bias columns, unless bias is empty) into the
    buffer, `_online_softmax`, acc += P values (through product). The products are numba's
    np.dot (scipy's BLAS): no Python runs between blocks."""
    wide_vectors()
    r = q_rows.shape[0]
    for j0 in range(j_start, j_stop, block):
        j1 = min(keys.shape[0], j0 + block)
        s = buffer[:r * (j1 - j0)].reshape(r, j1 - j0)
        np.dot(q_rows, keys[j0:j1].T, s)
        if bias.shape[0]:
            s += bias[:, j0:j1]
        _online_softmax(s, j0, lo, hi, exact, top, total, acc)
        np.dot(s, values[j0:j1], product)
        acc += product
