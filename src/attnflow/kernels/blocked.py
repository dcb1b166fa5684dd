"""The blocked, streaming attention kernel for long sequences (flash-attention style).

Scores are never held for the whole sequence: for each block of queries the keys are visited
in blocks, and a running row shift M, running sum L and running output O are updated

    S = beta Q_b K_c^T (+ mask / log-weights),   M' = max(M, rowmax S),
    P = exp(S - M'),   L <- e^{M - M'} L + rowsum P,   O <- e^{M - M'} O + P V_c,

and the output is O / L (the online softmax of Milakov & Gimelshein 2018, "Online normalizer
calculation for softmax", as used by Dao et al. 2022, FlashAttention). Memory is
O(threads block^2 + n (e + f)) instead of O(n^2): at n = 65 536 a dense float64 score matrix
needs 34 GB, this kernel a few MB of blocks.

What makes it fast (W2 in benchmarks/run.py, n = 65 536, d = 64, causal, counting 2 n^2 d
flops: 0.67-0.80 of the GEMM rate of its dtype on a 2-core AVX2 AMD EPYC; on an AVX-512
Zen 5 0.70-0.82 with OpenBLAS's AVX2 kernels, 0.61-0.81 with its AVX-512 ones, whose GEMMs
run 1.7-2x faster, benchmarks/RESULTS.md):
* key blocks entirely outside the mask are skipped (a causal mask visits about half of
  them); blocks crossing the band's edge are masked row by row inside the exp pass;
* the two products per block pair are BLAS products (about 70% of one core's GEMM rate;
  the exp pass takes about a tenth of the time), called as np.dot from one numba function
  per thread's share of query blocks (`_query_blocks`): no Python, no GIL between block
  pairs (with a Python loop over query blocks, n = 256 and 1024, d = 2 and 64, medians of
  100 alternating calls, ran 1.07-1.12x slower on two threads and 0.98-1.04x on one, on a
  2-core AVX-512 AMD EPYC);
* threads share whole query blocks of every run at once (`attnflow.parallel`, heaviest
  first; units of (query block, run), so that several heads of one or two blocks each still
  fill both cores: 9 heads of 128-512 tokens, d = 64, 1.25-1.42x faster than run by run on
  two threads, 2-core AVX-512 AMD EPYC), each with
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
* scores are kept in base-2 units (log2 e folded into beta, the bias and the memory
  log-weights), so that the weight is `vexp2`, 2^s, one operation cheaper than exp
  (vectorised by LLVM with 512-bit registers where there are any, `_simd.wide_vectors`; no
  subnormal slow path), fused with the row sums;
* for heads of at most SMALL_HEAD coordinates (the paper's d = 2) the two products are
  vectorised numba loops over the keys instead of BLAS calls, whose inner dimension of a few
  made them cost more than the exp pass (measured on an AVX2 AMD EPYC, one
  thread, n = 4096: d = 2 float64 2.20 -> 1.61 ns per causal pair, float32 0.91 -> 0.73;
  d = 4 about even, d = 8 BLAS 20-30% faster).

Every mask: causal, full, ("window", w) (bands, per-row ranges inside each block) and boolean
arrays (an additive 0 / -inf bias, block by block). A float score bias (n, n) (ALiBi,
`attnflow.kernels.options`) is added the same way, per key block. Memory tokens are one more
key block.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from functools import cache

import numpy as np
from numba import njit
from threadpoolctl import ThreadpoolController

from attnflow._checks import fail, integer
from attnflow.kernels._simd import wide_vectors
from attnflow.kernels._vexp import vexp2
from attnflow.kernels.fused import LOG2E, SAFE_SPREAD, band
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.options import check_options
from attnflow.kernels.types import Memory, Normalization
from attnflow.parallel import in_share, parallel_ranges

__all__ = ["BLOCK", "SUPPORTS", "attend"]

SUPPORTS = frozenset({"bias"})  # options beside softmax (`attnflow.kernels.options`)

SMALL_HEAD = 4  # head sizes up to which the products are numba loops, not BLAS
BLOCK = 256  # keys per block, queries too below LONGER: 512 kB float64 score blocks, in L2
# Below LONG tokens, BLAS products (heads above SMALL_HEAD) take blocks of SHORT_BLOCK: twice
# the query blocks to share among threads. Measured on the 2-core AVX2 AMD EPYC,
# d = 64, two threads, another session's load on the machine (best / median of 7-15,
# alternating, benchmarks/RESULTS.md): n = 1024 float64 5.9 / 7.3 ms against 8.1 / 12.1 with
# 256, float32 even; n = 2048 float64 20.5 / 27.5 against 28.3 / 30.0, float32 12.5 / 14.8
# against 16.0 / 19.8; from n = 4096 (16 blocks of 256) 256 was faster (one thread: 256
# 5-10% faster at every n).
LONG, SHORT_BLOCK = 4096, 128
# From LONGER tokens such heads take query blocks of LONGER_BLOCK against key blocks of BLOCK
# (keys per block are never more than BLOCK): each key block's products then serve twice the
# queries. Measured on a 2-core AVX-512 AMD EPYC (Zen 5), d = 64, causal, two
# threads, benchmarks/RESULTS.md: n = 65 536 float32 0.57 -> 0.71 of the GEMM rate with
# OpenBLAS's AVX-512 kernels, float64 0.69 -> 0.72; n = 16 384 with its AVX2 kernels float32
# 0.85 -> 0.86, float64 0.79 -> 0.82.
LONGER, LONGER_BLOCK = 16384, 512


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
                scale = 2.0 ** (shift - new)  # scalar: the one vexp2 call site stays inlined
                total[r] *= scale
                acc[r] *= scale
                top[r] = shift = new
        t = zero
        for j in range(seg.size):
            w = vexp2(seg[j] - shift)
            seg[j] = w
            t += w
        total[r] += t


@cache
def _controller() -> ThreadpoolController:
    import scipy.linalg.cython_blas  # noqa: F401  the BLAS of numba's np.dot: list it too

    return ThreadpoolController()


def _blas_on_one_thread() -> AbstractContextManager:
    """BLAS on one thread (a process-wide setting) until the context exits, when called from
    the main thread outside a share of `parallel_ranges`; elsewhere nothing changes: OpenBLAS
    (numpy's 0.3.31, scipy's 0.3.30) ignores thread counts set from other threads once the
    main thread has set one, so a count set there might never be undone, and inside a share
    other threads may be in BLAS calls."""
    if threading.current_thread() is threading.main_thread() and not in_share():
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
    block: int | None = None,
) -> np.ndarray:
    """Masked softmax attention, same contract as `attnflow.kernels.dense.attend`, in
    O(block^2) working memory per thread. Leading axes broadcast (each run is copied, as
    contiguous (runs, n, .) arrays, before the threads share its query blocks).
    Computed in float32 when all inputs are float32, else float64. Returns (..., n, f).
    Called from the main thread, BLAS runs single-threaded (process-wide) during the call.
    block: queries per block, and keys per block up to BLOCK; None: BLOCK, or for heads that
    take the BLAS products (above SMALL_HEAD) SHORT_BLOCK below LONG tokens and LONGER_BLOCK
    from LONGER tokens on."""
    n, f = q.shape[-2], v.shape[-1]
    bias, normalization = check_options("blocked", SUPPORTS, n, mask, memory, bias,
                                        normalization, beta)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if dtype not in (np.float32, np.float64):
        raise fail("q, k, v", "float32 or float64 arrays", f"dtype {dtype}")
    if block is None:
        block = _default_block(n, _small(q.shape[-1], f))
    block = integer("block", block, 1)
    lead = q.shape[:-2]
    if not lead == k.shape[:-2] == v.shape[:-2]:  # equal ones skip ~40 us of broadcasting
        lead = np.broadcast_shapes(lead, k.shape[:-2], v.shape[:-2])
        q, k, v = (np.broadcast_to(a, (*lead, n, a.shape[-1])) for a in (q, k, v))
    out = np.empty((*lead, n, f), dtype)
    # Scores in base-2 units (log2 e folded into beta, the bias and the memory log-weights):
    # the weights are 2^s (`vexp2`, one operation cheaper than exp).
    lo, hi, bias = band(mask, n, bias)
    bias = None if bias is None else (bias * LOG2E).astype(dtype, copy=False)
    if memory is None:
        memory = Memory(np.zeros((0, q.shape[-1]), dtype), np.zeros((0, f), dtype),
                        np.zeros(0, dtype))
    else:
        memory = Memory(*(np.ascontiguousarray(a, dtype) for a in memory[:2]),
                        np.ascontiguousarray(np.asarray(memory.log_weights) * LOG2E, dtype))
    block, small = int(block), _small(q.shape[-1], f)
    bias = np.zeros((0, 0), dtype) if bias is None else bias
    m = len(memory.v)
    mem_bias = np.empty((block, m), dtype)
    mem_bias[:] = memory.log_weights
    # Every run at once, (runs, n, .): threads share (query block, run) units, so that several
    # heads of a few blocks each still fill both cores.
    qb, k, v = (np.ascontiguousarray(a, dtype).reshape(-1, n, a.shape[-1]) for a in (q, k, v))
    qb = qb * dtype.type(beta * LOG2E)
    runs = len(qb)
    exact, shift = np.empty((runs, n), np.bool_), np.empty((runs, n), dtype)
    pairs = _run_shifts(qb, k, memory.k, lo, hi, bias, memory.log_weights,
                        SAFE_SPREAD[dtype.type] * LOG2E, exact, shift)
    keys, values, mem_k, mem_v = k, v, memory.k, memory.v
    if small:  # transposed, for `_small_scores` and `_small_values`
        keys, values = (np.ascontiguousarray(a.transpose(0, 2, 1)) for a in (k, v))
        mem_k, mem_v = (np.ascontiguousarray(a.T) for a in (mem_k, mem_v))
    out_runs = out.reshape(runs, n, f)

    def share(u0: int, u1: int) -> None:
        _query_blocks(u0, u1, block, min(block, BLOCK), qb, keys, values, bias, lo, hi, exact,
                      shift, mem_k, mem_v, mem_bias, small, out_runs)

    cost = runs * pairs * (2 * (q.shape[-1] + f) + 30)
    with _blas_on_one_thread():
        parallel_ranges(share, runs * -(-n // block), cost=cost)
    return out


def _default_block(n: int, small: bool) -> int:
    """Queries per block for n tokens: BLOCK for `small` heads (numba loops, no BLAS); for
    heads that take the BLAS products SHORT_BLOCK below LONG tokens, LONGER_BLOCK from LONGER
    on, BLOCK between."""
    if small or LONG <= n < LONGER:
        return BLOCK
    return SHORT_BLOCK if n < LONG else LONGER_BLOCK


def _small(e: int, f: int) -> bool:
    """Whether heads of e (queries, keys) and f (values) coordinates take the numba loops
    (`_small_scores`, `_small_values`) instead of BLAS products."""
    return 0 < e and max(e, f) <= SMALL_HEAD


@njit(nogil=True, cache=True)
def _run_shifts(qb, k, mem_k, lo, hi, bias, log_weights, safe_spread, exact, shift):
    """`_shifts` of every run (qb, k (runs, n, e), exact and shift (runs, n)); returns the
    pairs of one run, sum_i (hi_i - lo_i + m). bias: (n, n) or (0, 0); log_weights: the
    memory's (m,). One compiled call for the whole preparation: between kernel calls each
    numpy call cost several microseconds."""
    top_offset = _row_tops(lo, hi, bias, log_weights)
    for r in range(qb.shape[0]):
        _shifts(qb[r], k[r], mem_k, lo, hi, bias, top_offset, safe_spread, exact[r], shift[r])
    return (hi - lo).sum() + lo.shape[0] * log_weights.shape[0]


@njit(nogil=True, cache=True)
def _row_tops(lo, hi, bias, log_weights):
    """`fused.row_top` in numba: each row's largest offset (n,) among the bias (n, n) over
    its band [lo_i, hi_i) (0 for an empty bias (0, 0)) and the memory log_weights (m,);
    -inf for a row with no allowed key."""
    mem_top = -np.inf
    for j in range(log_weights.shape[0]):
        mem_top = max(mem_top, log_weights[j])
    top = np.empty(lo.shape[0])
    for i in range(lo.shape[0]):
        t = mem_top
        if bias.shape[0]:
            for j in range(lo[i], hi[i]):
                t = max(t, bias[i, j])
        elif hi[i] > lo[i]:
            t = max(t, 0.0)
        top[i] = t
    return top


@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def _shifts(qb, k, mem_k, lo, hi, bias, top_offset, safe_spread, exact, shift):
    """The fixed Cauchy-Schwarz shift of each row into shift (n,), or -inf with exact set
    where the running maximum is needed (sums in float64). Row i's scores are at most
    bound_i + top_i, bound_i = |q_i| max_j |k_j| over keys and memory keys (top_i: top_offset,
    the largest offset, score bias or memory log-weight, among its allowed keys), and its
    maximum is at least the larger of top_i - bound_i and the probe, the score of its last
    allowed token (in self-attention the query's own, which reaches the bound). The shift
    holds where the spread between the two is at most safe_spread. bias: (n, n) or (0, 0)."""
    k_max = np.sqrt(max(_max_square_norm(k), _max_square_norm(mem_k)))
    for i in range(qb.shape[0]):
        top = top_offset[i]
        if top == -np.inf:  # no allowed key: nothing to bound
            exact[i], shift[i] = True, -np.inf
            continue
        q2, probe = 0.0, -np.inf
        for c in range(qb.shape[1]):
            q2 += float(qb[i, c]) * float(qb[i, c])
        if hi[i] > lo[i]:
            last = hi[i] - 1
            probe = 0.0
            for c in range(qb.shape[1]):
                probe += float(qb[i, c]) * float(k[last, c])
            if bias.shape[0]:
                probe += bias[i, last]
        bound = np.sqrt(q2) * k_max
        exact[i] = not bound + top - max(top - bound, probe) <= safe_spread
        shift[i] = -np.inf if exact[i] else bound + top


@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def _max_square_norm(a):
    """max_j |a_j|^2 over the rows of a (0 for none), summed in float64."""
    top = 0.0
    for j in range(a.shape[0]):
        t = 0.0
        for c in range(a.shape[1]):
            t += float(a[j, c]) * float(a[j, c])
        top = max(top, t)
    return top


@njit(nogil=True, cache=True)
def _query_blocks(u0, u1, block, key_block, qb, keys, values, bias, lo, hi, exact, shift,
                  mem_k, mem_v, mem_bias, small, out):
    """Units u0..u1 - 1 into out (runs, n, f); unit u is query block u // runs, counted from
    the last (the heaviest first under a causal mask), of run u % runs. Each sweeps its keys
    (`_sweep`, blocks of key_block aligned to multiples of it), then the memory keys mem_k,
    mem_v (m, e), (m, f) (mem_bias: their log-weights, (block, m)), and is normalised.
    qb, keys, values, exact, shift: per run (runs, n, .); bias: (n, n), or (0, 0) for none.
    One compiled loop per thread's share: no Python between query blocks."""
    runs, n, f, m = qb.shape[0], qb.shape[1], out.shape[2], mem_bias.shape[1]
    dtype = qb.dtype
    blocks = -(-n // block)
    buffer = np.empty(block * max(key_block, m), dtype)
    product = np.empty((block, f), dtype)
    mem_lo, mem_hi = np.zeros(block, np.int64), np.full(block, m, np.int64)
    for u in range(u0, u1):
        b, run = blocks - 1 - u // runs, u % runs
        i0, i1 = b * block, min(n, (b + 1) * block)
        r = i1 - i0
        lo_rows, hi_rows, exact_rows = lo[i0:i1], hi[i0:i1], exact[run, i0:i1]
        top = shift[run, i0:i1].copy()
        total, acc = np.zeros(r, dtype), np.zeros((r, f), dtype)
        first, last = lo_rows.min(), hi_rows.max()
        _sweep(qb[run, i0:i1], keys[run], values[run], bias[i0:i1] if bias.shape[0] else bias,
               first - first % key_block, last, key_block, lo_rows, hi_rows, exact_rows, top,
               total, acc, buffer, product[:r], small)
        if m:  # every query attends to every memory key
            _sweep(qb[run, i0:i1], mem_k, mem_v, mem_bias[:r], 0, m, m, mem_lo[:r], mem_hi[:r],
                   exact_rows, top, total, acc, buffer, product[:r], small)
        for i in range(r):
            out[run, i0 + i] = acc[i] / total[i]


@njit(nogil=True, cache=True)
def _sweep(q_rows, keys, values, bias, j_start, j_stop, block, lo, hi, exact, top, total, acc,
           buffer, product, small):
    """The key blocks j_start, j_start + block, .. (< j_stop) folded into the online softmax
    of the queries q_rows: S = q_rows keys^T (+ bias columns, unless bias is empty) into the
    buffer, `_online_softmax`, acc += P values (through product). The products are numba's
    np.dot (scipy's BLAS): no Python runs between blocks; for `small` heads they are
    `_small_scores` and `_small_values` instead, with keys and values given transposed
    ((e, n), (f, n))."""
    wide_vectors()
    r = q_rows.shape[0]
    n_keys = keys.shape[1] if small else keys.shape[0]
    for j0 in range(j_start, j_stop, block):
        j1 = min(n_keys, j0 + block)
        s = buffer[:r * (j1 - j0)].reshape(r, j1 - j0)
        if small:
            _small_scores(q_rows, keys, j0, s)
        else:
            np.dot(q_rows, keys[j0:j1].T, s)
        if bias.shape[0]:
            s += bias[:, j0:j1]
        _online_softmax(s, j0, lo, hi, exact, top, total, acc)
        if small:
            _small_values(s, values, j0, acc)
        else:
            np.dot(s, values[j0:j1], product)
            acc += product


@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def _small_scores(q_rows, keys_t, j0, s):
    """s = q_rows keys_t[:, j0:j0 + cols]: one vectorised pass over each row per coordinate
    (BLAS products with an inner dimension of a few cost several times the exp pass)."""
    wide_vectors()
    cols = s.shape[1]
    for r in range(s.shape[0]):
        row = s[r]
        k0 = keys_t[0, j0:j0 + cols]
        q0 = q_rows[r, 0]
        for j in range(cols):
            row[j] = q0 * k0[j]
        for c in range(1, q_rows.shape[1]):
            kc = keys_t[c, j0:j0 + cols]
            qc = q_rows[r, c]
            for j in range(cols):
                row[j] += qc * kc[j]


@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def _small_values(p, values_t, j0, acc):
    """acc += p values_t[:, j0:j0 + cols]^T: a vectorised dot product per row and value
    coordinate."""
    wide_vectors()
    cols = p.shape[1]
    for c in range(values_t.shape[0]):
        vc = values_t[c, j0:j0 + cols]
        for r in range(p.shape[0]):
            row = p[r]
            t = p.dtype.type(0)
            for j in range(cols):
                t += row[j] * vc[j]
            acc[r, c] += t
