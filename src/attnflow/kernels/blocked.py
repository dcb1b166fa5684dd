"""The blocked, streaming attention kernel for long sequences (flash-attention style).

Scores are never held for the whole sequence: for each block of queries the keys are visited
in blocks, and a running row maximum M, running sum L and running output O are updated

    S = beta Q_b K_c^T (+ mask / log-weights),   M' = max(M, rowmax S),
    P = exp(S - M'),   L <- e^{M - M'} L + rowsum P,   O <- e^{M - M'} O + P V_c,

and the output is O / L (the online softmax of Milakov & Gimelshein 2018, "Online normalizer
calculation for softmax", as used by Dao et al. 2022, FlashAttention). Memory is
O(block^2 + n (e + f)) instead of O(n^2): at n = 65 536 a dense float64 score matrix needs
34 GB, this kernel a few MB of blocks. Key blocks entirely outside the mask are skipped (a
causal mask visits about half of them); the products are BLAS matrix products (both cores);
the exp pass is a numba kernel over rows on both cores (`attnflow.kernels._threads`).

Every mask: causal, full, ("window", w) (bands, per-row ranges inside each block) and boolean
arrays (an additive 0 / -inf bias, block by block). Memory tokens are one more key block.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from attnflow._checks import fail
from attnflow.kernels._threads import parallel_ranges
from attnflow.kernels._vexp import vexp
from attnflow.kernels.fused import band
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.types import Memory

__all__ = ["BLOCK", "attend"]

BLOCK = 512  # queries and keys per block: S blocks of 2 MB in float64 stay in L2 cache


@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, cache=True)
def _online_softmax(s, row_max, top, total, scale, r0, r1):
    """Rows r0..r1 of a score block s (rows, cols; masked entries -inf), in place: s becomes
    P = exp(s - M') with M' = max(M, row_max); the running maximum top (M -> M'), the running
    sum total (L -> e^{M - M'} L + rowsum P) and scale = e^{M - M'}, by which the caller
    rescales its running output, are updated."""
    zero = s.dtype.type(0)
    for r in range(r0, r1):
        row = s[r]
        new = max(top[r], row_max[r])
        if new == -np.inf:  # nothing allowed so far: keep the empty state
            row[:] = zero
            scale[r] = 1
            continue
        scale[r] = math.exp(top[r] - new)  # math.exp: the one vexp call site stays inlined
        top[r] = new
        acc = zero
        for j in range(row.size):
            w = vexp(row[j] - new)
            row[j] = w
            acc += w
        total[r] = total[r] * scale[r] + acc


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
    block: int = BLOCK,
) -> np.ndarray:
    """Masked softmax attention, same contract as `attnflow.kernels.dense.attend`, in
    O(block^2) working memory per run. Leading axes broadcast and are looped over.
    Computed in float32 when all inputs are float32, else float64. Returns (..., n, f)."""
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if dtype not in (np.float32, np.float64):
        raise fail("q, k, v", "float32 or float64 arrays", f"dtype {dtype}")
    if int(block) != block or block < 1:
        raise fail("block", "an integer >= 1", repr(block))
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, f = q.shape[-2], v.shape[-1]
    q, k, v = (np.broadcast_to(a, (*lead, n, a.shape[-1])) for a in (q, k, v))
    out = np.empty((*lead, n, f), dtype)
    lo, hi, bias = band(mask, n)
    for idx in np.ndindex(*lead):
        qb = np.ascontiguousarray(q[idx], dtype) * dtype.type(beta)
        out[idx] = _one_run(qb, np.ascontiguousarray(k[idx], dtype),
                            np.ascontiguousarray(v[idx], dtype), lo, hi, bias, memory, block)
    return out


def _one_run(qb, k, v, lo, hi, bias, memory, block):
    """Attention of one run; qb already multiplied by beta."""
    n, f = qb.shape[0], v.shape[1]
    dtype = qb.dtype
    out = np.empty((n, f), dtype)
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        rows = i1 - i0
        top = np.full(rows, -np.inf, dtype)
        total = np.zeros(rows, dtype)
        scale = np.empty(rows, dtype)
        acc = np.zeros((rows, f), dtype)
        first, last = int(lo[i0:i1].min()), int(hi[i0:i1].max())
        for j0 in range(first - first % block, last, block):
            j1 = min(n, j0 + block)
            s = qb[i0:i1] @ k[j0:j1].T
            if bias is not None:
                s += bias[i0:i1, j0:j1]
            if lo[i0:i1].max() > j0 or hi[i0:i1].min() < j1:  # the block crosses the band
                cols = np.arange(j0, j1)
                s[(cols < lo[i0:i1, None]) | (cols >= hi[i0:i1, None])] = -np.inf
            _update(s, top, total, scale, acc, v[j0:j1])
        if memory is not None:
            s = qb[i0:i1] @ memory.k.astype(dtype).T + memory.log_weights.astype(dtype)
            _update(s, top, total, scale, acc, memory.v.astype(dtype))
        out[i0:i1] = acc / total[:, None]
    return out


def _update(s, top, total, scale, acc, v_block) -> None:
    """One online-softmax step: fold the score block s into (top, total, acc)."""
    rows, cols = s.shape
    row_max = s.max(axis=1)  # numpy's vectorised max (numba's max reduction is scalar)
    parallel_ranges(lambda r0, r1: _online_softmax(s, row_max, top, total, scale, r0, r1),
                    rows, cost=rows * cols * 30)
    acc *= scale[:, None]
    acc += s @ v_block
