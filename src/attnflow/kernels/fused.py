"""The fused attention kernel (numba) for ensembles: many independent runs of small head
dimension (the paper's Fig. 3: 5000 runs, n = 200, d = 2).

For each run b and query i, with allowed keys j in [lo_i, hi_i) (the mask's band) plus the
m memory keys:

    s_j = beta <q_i, k_j> (+ bias_ij, + log a_j for memory),   w_j = exp(s_j - max_j s_j),
    out_i = sum_j w_j v_j / sum_j w_j                                  (docs/science.md §1)

What makes it fast (benchmarks/RESULTS.md):
* the masked half of the scores is never computed (a causal row i visits i + 1 keys, not n);
* runs are the SIMD lanes: `tile_runs` runs, four vector registers of them (AVX-512: 32 in
  float64, 64 in float32; AVX2: 16 and 32), are transposed into a lane-last tile
  (n, e, lanes), and every inner loop runs over those lanes with a trip count fixed at
  compile time, so all of them vectorise without remainder loops or horizontal reductions
  (measured: two registers or eight ran 10-25% slower per pair than four, on both);
* one row of scores for the tile (n + m, lanes) stays in L1/L2 cache instead of (B, n, n)
  temporaries being allocated every call;
* scores are kept in base-2 units (log2 e folded into beta and the bias) so that the weight
  is `vexp2`, 2^s, one operation cheaper than exp (vectorised by LLVM, no subnormal slow
  path); on AVX-512, rows without score offsets use `_keysums.key_sums` instead, an explicit
  vector loop whose 2^s reads a table by in-register permutes (fewer polynomial terms:
  1.2x in float64, 1.3x in float32); LLVM is asked for 512-bit
  vectors where the CPU has them (`attnflow.kernels._simd`: 1.5x here);
* the tiles and the running sums are arguments, allocated on cache lines (`_aligned_zeros`),
  whose data pointers the kernel declares non-overlapping (`_simd.arrays_do_not_overlap`):
  LLVM then keeps the row's queries, shifts and sums in registers across the keys instead of
  reloading and storing them for every key (measured on an AVX-512 Zen 5, one
  thread, interleaved in one process: float64 0.54-0.58 -> 0.48-0.51 ns per causal pair,
  float32 0.27-0.30 -> 0.21-0.23; with AVX2 even);
* tiles are shared among threads (`attnflow.parallel`), both cores.

Every mask: causal, full and ("window", w) as bands; boolean arrays as the band [0, n) plus
an additive 0 / -inf bias. A float score bias (n, n) (ALiBi, `attnflow.kernels.options`)
joins that additive bias; the fixed shift then takes each row's largest allowed bias into
account, so the bias never forces the exact-maximum pass. One pass per row where the
Cauchy-Schwarz bound on the scores may be the shift: when the row's spread, the bound less
the score of the row's last allowed key (in self-attention the query's own, which reaches
the bound), is below SAFE_SPREAD (W1 at beta 64 in float32: spread 0, not 2 beta = 128 > 60).
float64 and float32 inputs are computed in their own dtype.
With fewer runs than a tile the unused lanes are wasted work: `attnflow.kernels.auto` then
picks another kernel.
"""

from __future__ import annotations

import math
import threading
from functools import cache, lru_cache

import numpy as np
from numba import njit

from attnflow._checks import fail
from attnflow.kernels._keysums import has_table_exp, key_sums
from attnflow.kernels._simd import arrays_do_not_overlap, vector_bytes, wide_vectors
from attnflow.kernels._vexp import vexp2
from attnflow.kernels.masks import MaskSpec, mask_matrix
from attnflow.kernels.options import check_options
from attnflow.kernels.types import Memory, Normalization
from attnflow.parallel import parallel_ranges

__all__ = ["LANES", "SUPPORTS", "attend", "attend_lse", "band", "row_top", "tile_runs"]

SUPPORTS = frozenset({"bias"})  # options beside softmax (`attnflow.kernels.options`)

LANES = 64  # runs per share of work that keeps whole tiles in every dtype (`tile_runs`)
ALIGN = 64  # bytes: the start of every scratch array of the kernel (`_aligned_zeros`)
TILE_REGISTERS = 4  # vector registers of one coordinate of a tile (see the module docstring)
# Largest spread of a row's scores for which the Cauchy-Schwarz bound may replace the row
# maximum: exp(-spread - 37) (float64) / exp(-spread - 17) (float32) must stay normal.
SAFE_SPREAD = {np.float64: 600.0, np.float32: 60.0}
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# Reductions need "reassoc" to vectorise; vexp keeps its own exact flags (see _vexp.py).
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def band(mask: MaskSpec, n: int, bias: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The keys each query may attend to, as a band and an optional additive score bias.

    Returns (lo, hi, token_bias): query i attends to tokens j in [lo[i], hi[i]) (int64 arrays
    of shape (n,)); token_bias is None for "causal", "full" and ("window", w) without a score
    `bias`, else the (n, n) float64 matrix `bias` (0 if None) with -inf where a boolean array
    mask forbids a key (its band is [0, n)).
    """
    i = np.arange(n, dtype=np.int64)
    if isinstance(mask, np.ndarray):
        allowed = mask_matrix(mask, n)
        base = np.zeros((n, n)) if bias is None else bias.astype(np.float64)
        return np.zeros(n, np.int64), np.full(n, n, np.int64), np.where(allowed, base, -np.inf)
    bias = None if bias is None else bias.astype(np.float64, copy=False)
    if mask == "full":
        return np.zeros(n, np.int64), np.full(n, n, np.int64), bias
    if mask == "causal":
        return np.zeros(n, np.int64), i + 1, bias
    return np.maximum(i - mask[1] + 1, 0), i + 1, bias


def row_top(lo: np.ndarray, hi: np.ndarray, token_bias: np.ndarray | None,
            log_weights: np.ndarray) -> np.ndarray:
    """The largest score offset each query's allowed keys carry, (n,): the token bias over
    the band [lo_i, hi_i) (0 without one) and the memory log-weights; -inf for a row with no
    allowed key. Row i's maximum score is at least this minus beta |q_i| max_j |k_j|
    (Cauchy-Schwarz), which bounds the spread of the kernels' fixed shifts."""
    n = len(lo)
    if token_bias is None:
        top = np.where(hi > lo, 0.0, -np.inf)
    else:
        j = np.arange(n)
        inside = (j >= lo[:, None]) & (j < hi[:, None])
        top = np.max(np.where(inside, token_bias, -np.inf), axis=1, initial=-np.inf)
    return np.maximum(top, log_weights.max(initial=-np.inf))


def tile_runs(dtype: np.dtype | type, runs: int) -> int:
    """Runs per SIMD tile of the kernel in `dtype` (float32 or float64) for a batch of `runs`:
    TILE_REGISTERS vector registers (`_simd.vector_bytes`) of a coordinate, halved for
    batches that would leave half of such a tile empty. Divides LANES."""
    lanes = min(LANES, TILE_REGISTERS * vector_bytes() // np.dtype(dtype).itemsize)
    return lanes // 2 if runs <= lanes // 2 else lanes


@njit(cache=True)
def _base2_bias(token_bias, lo, hi, log_weights, out, top):
    """out[:, :n] = log2(e) token_bias, out[:, n:] = log2(e) log_weights (every row), and
    top[i] = log2(e) `row_top` of row i: the kernel's bias rows in one pass."""
    n, m = token_bias.shape[0], log_weights.shape[0]
    mem_top = -np.inf
    for j in range(m):
        mem_top = max(mem_top, log_weights[j])
    for i in range(n):
        row, b = out[i], token_bias[i]
        t = mem_top
        for j in range(n):
            row[j] = LOG2E * b[j]
        for j in range(lo[i], hi[i]):
            t = max(t, b[j])
        for j in range(m):
            row[n + j] = LOG2E * log_weights[j]
        top[i] = LOG2E * t


def _aligned_zeros(shape: int | tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros whose data start on a cache line (64 bytes): every row of a tile is a whole
    number of vector registers, so no vector load or store then spans two cache lines (numpy
    aligns to 16 bytes; misaligned tiles measured up to 2x slower in float32 on AVX2)."""
    size = int(np.prod(shape))
    raw = np.zeros(size * np.dtype(dtype).itemsize + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + size * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


@cache
def _compile(e: int, f: int, biased: bool, lanes: int):
    """The kernel for head sizes e (queries/keys) and f (values) and tiles of `lanes` runs,
    fixed at compile time so the loops over them unroll and the lane loops vectorise;
    without a score bias (`biased` False: no boolean mask, no memory) the exp loop skips
    adding it, and on AVX-512 is `_keysums.key_sums` (its table exp: 1.2x in float64, 1.3x
    in float32, benchmarks/RESULTS.md)."""
    tabled = not biased and has_table_exp()

    # error_model "numpy": a row whose weights are all 0 or NaN (NaN tokens) gives NaN, as
    # in numpy, not a ZeroDivisionError
    @njit(nogil=True, fastmath=FASTMATH, cache=True, error_model="numpy")
    def kernel(q, k, v, mem_k, mem_v, bias, top, safe, lo, hi, beta, out, lse, acc,
               qt, kt, vt, k_max, offset, total, tile0, tile1):
        wide_vectors()
        arrays_do_not_overlap()
        runs, n = q.shape[0], q.shape[1]
        m = mem_k.shape[0]
        zero = q.dtype.type(0)
        # Lane-last tiles (token, coordinate, lane); rows n.. of kt and vt hold the memory
        # keys/values, the same in every lane; lanes past the last run stay zero. Inner loops
        # index only views taken outside them (kt[j], acc[c]) with range variables, so LLVM
        # sees non-negative indices and no aliasing, and vectorises them.
        for j in range(m):
            for c in range(e):
                kt[n + j, c] = mem_k[j, c]
            for c in range(f):
                vt[n + j, c] = mem_v[j, c]
        for tile in range(tile0, tile1):
            b0 = tile * lanes
            used = min(lanes, runs - b0)
            if used < lanes:  # the batch's last tile: its empty lanes compute on zeros, not
                # on what a kept scratch (`_scratch`) held from an earlier call
                qt[:, :, used:] = zero
                kt[:n, :, used:] = zero
                vt[:n, :, used:] = zero
            for l in range(used):
                for j in range(n):
                    for c in range(e):
                        qt[j, c, l] = beta * q[b0 + l, j, c]
                        kt[j, c, l] = k[b0 + l, j, c]
                    for c in range(f):
                        vt[j, c, l] = v[b0 + l, j, c]
            k_max[:] = zero
            for j in range(n + m):
                kj = kt[j]
                for l in range(lanes):
                    x = zero
                    for c in range(e):
                        x += kj[c, l] * kj[c, l]
                    k_max[l] = max(k_max[l], x)
            k_max[:] = np.sqrt(k_max)
            for i in range(n):
                row = bias[i if bias.shape[0] > 1 else 0]
                top_i = top[i if top.shape[0] > 1 else 0]  # the row's largest allowed bias
                qi = qt[i]
                width = hi[i] - lo[i]
                # Shift: every score is <= U = beta |q_i| max|k_j| + top_i (Cauchy-Schwarz),
                # and the row maximum >= L, the larger of top_i - beta |q_i| max|k_j| and the
                # score of one allowed key, the probe (the row's last: in self-attention the
                # query's own, where L = U); if the spread U - L is small no weight that
                # matters underflows and U replaces the row maximum (softmax is
                # shift-invariant). A forbidden probe (boolean mask) scores -inf: no help.
                spread = zero if top_i > -np.inf else np.inf  # -inf: no allowed key
                probe = hi[i] - 1 if width > 0 else min(n, n + m - 1)  # (n: memory's first)
                kp = kt[probe]
                p0 = row[probe] if biased else zero
                for l in range(lanes):
                    x = zero
                    p = p0
                    for c in range(e):
                        x += qi[c, l] * qi[c, l]
                        p += qi[c, l] * kp[c, l]
                    bound = np.sqrt(x) * k_max[l]
                    offset[l] = -(bound + top_i)
                    spread = max(spread, min(2 * bound, bound + top_i - p))
                if spread > safe:  # rare: one more pass for the exact row maximum
                    offset[:] = np.inf
                    for r in range(width + m):  # r: allowed tokens lo[i].., then memory
                        j = lo[i] + r if r < width else n + r - width
                        kj = kt[j]
                        for l in range(lanes):
                            x = row[j]
                            for c in range(e):
                                x += qi[c, l] * kj[c, l]
                            offset[l] = min(offset[l], -x)
                if tabled:  # AVX-512 without score offsets: the IR loop (`_keysums`)
                    key_sums(qi, kt, vt, offset, lo[i], hi[i], total, acc, e, lanes)
                    for l in range(used):
                        for c in range(f):
                            out[b0 + l, i, c] = acc[c][l] / total[l]
                    if lse.shape[0]:  # log2 sum_j 2^(s_j): total is sum_j 2^(s_j + offset)
                        for l in range(used):
                            lse[b0 + l, i] = np.log2(total[l]) - offset[l]
                    continue
                total[:] = zero
                for c in range(f):
                    acc[c][:] = zero
                for r in range(width + m):
                    j = lo[i] + r if r < width else n + r - width
                    kj = kt[j]
                    vj = vt[j]
                    b_j = row[j] if biased else zero
                    for l in range(lanes):  # the one exp loop (one inlined, vectorised vexp2)
                        x = offset[l] + b_j if biased else offset[l]
                        for c in range(e):
                            x += qi[c, l] * kj[c, l]
                        w = vexp2(x)
                        total[l] += w
                        for c in range(f):
                            acc[c][l] += w * vj[c, l]
                for l in range(used):
                    for c in range(f):
                        out[b0 + l, i, c] = acc[c][l] / total[l]
                if lse.shape[0]:
                    for l in range(used):
                        lse[b0 + l, i] = np.log2(total[l]) - offset[l]

    return kernel


def _rows(mask: MaskSpec, n: int, e: int, f: int, dtype: np.dtype, memory: Memory | None,
          bias: np.ndarray | None) -> tuple:
    """The kernel's row data for a mask, memory and score bias: the band lo, hi (`band`), the
    additive score bias in base-2 units (2^(log2(e) s) = e^s; rows: one per query, or one
    for all; columns: tokens then memory), top (each row's largest allowed bias: one, or
    one per query), the memory keys and values in dtype, and whether any score is offset
    (a score bias or memory tokens: the kernel then adds the bias rows)."""
    if memory is None:
        memory = Memory(np.zeros((0, e)), np.zeros((0, f)), np.zeros(0))
    mem_k, mem_v = (np.ascontiguousarray(a, dtype) for a in memory[:2])
    lo, hi, token_bias = band(mask, n, bias)
    scores = np.empty((1 if token_bias is None else n, n + len(memory.log_weights)), dtype)
    if token_bias is None:
        scores[:, :n] = 0
        scores[:, n:] = memory.log_weights * LOG2E
        top = (row_top(lo[:1], hi[:1], None, memory.log_weights) * LOG2E).astype(dtype)
    else:  # one compiled pass: the per-call cost stays small beside a share of a few tiles
        top = np.empty(n, dtype)
        _base2_bias(token_bias, lo, hi, np.asarray(memory.log_weights, np.float64), scores,
                    top)
    return lo, hi, scores, top, mem_k, mem_v, token_bias is not None or len(mem_k) > 0


@lru_cache(maxsize=64)
def _plain_rows(mask: str | tuple, n: int, e: int, f: int, dtype: np.dtype
                ) -> tuple:
    """`_rows` without memory or score bias, kept for the next call with the same mask and
    sizes (an ensemble steps the same ones every call; the kernel only reads them)."""
    return _rows(mask, n, e, f, dtype, None, None)


_THREAD = threading.local()  # .scratch: (sizes, arrays) of this thread's last kernel call
SCRATCH_KEPT = 1 << 22  # bytes: scratch up to this size is kept for the thread's next call


def _scratch(n: int, m: int, e: int, f: int, lanes: int, dtype: np.dtype) -> tuple:
    """The kernel's scratch for n tokens, m memory tokens and tiles of `lanes` runs: acc (f
    arrays (lanes,): sum_r w_r v_rc for each c, separate so that LLVM vectorises each row's
    update), qt (n, e, lanes) (beta * queries), kt (n + m, e, lanes) and vt (n + m, f, lanes)
    (rows n..: the memory keys and values), k_max, offset, total (lanes,). This thread's
    arrays of its last call when the sizes match and they are small (SCRATCH_KEPT), else new
    ones: allocating and zeroing them took 100 us of a 4.4 ms call of 256 W1 runs, right
    after a kernel call (AVX-512 AMD EPYC). The kernel writes every lane it
    reads (it zeroes the empty lanes of a batch's last tile)."""
    sizes = (n, m, e, f, lanes, dtype)
    kept = getattr(_THREAD, "scratch", None)
    if kept is not None and kept[0] == sizes:
        return kept[1]
    arrays = (tuple(_aligned_zeros(lanes, dtype) for _ in range(f)),
              _aligned_zeros((n, e, lanes), dtype), _aligned_zeros((n + m, e, lanes), dtype),
              _aligned_zeros((n + m, f, lanes), dtype),
              *(_aligned_zeros(lanes, dtype) for _ in range(3)))
    if lanes * ((n + m) * (2 * e + f) + f + 3) * np.dtype(dtype).itemsize <= SCRATCH_KEPT:
        _THREAD.scratch = (sizes, arrays)
    return arrays


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
    bias: np.ndarray | None = None,
    normalization: Normalization = "softmax",
) -> np.ndarray:
    """Masked softmax attention, same contract as `attnflow.kernels.dense.attend`.

    q, k : (..., n, e); v : (..., n, f); leading axes broadcast. Computed in float32 when all
    inputs are float32, else float64. Returns (..., n, f).
    """
    return _attend(q, k, v, beta, mask, memory, bias, normalization, False)[0]


def attend_lse(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float, mask: MaskSpec,
               memory: Memory | None = None, bias: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """`attend` (softmax) and each row's log-sum-exp of its scores, log sum_j exp(s_ij)
    (..., n), in the output's dtype: what a backward pass needs to recompute the weights
    p_ij = exp(s_ij - lse_i) in one pass (`attnflow.kernels.fused_backward`)."""
    out, lse = _attend(q, k, v, beta, mask, memory, bias, "softmax", True)
    return out, lse * lse.dtype.type(LN2)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float, mask: MaskSpec,
            memory: Memory | None, bias: np.ndarray | None, normalization: Normalization,
            with_lse: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """`attend`, and with `with_lse` each row's log-sum-exp in base 2 (..., n)."""
    n, e, f = q.shape[-2], q.shape[-1], v.shape[-1]
    plain = (bias is None and isinstance(normalization, str) and normalization == "softmax"
             and math.isfinite(beta))
    if not plain:
        bias, normalization = check_options("fused", SUPPORTS, n, mask, memory, bias,
                                            normalization, beta)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if dtype not in (np.float32, np.float64):
        raise fail("q, k, v", "float32 or float64 arrays", f"dtype {dtype}")
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    runs = math.prod(lead)

    def runs_first(a: np.ndarray, width: int) -> np.ndarray:
        if a.shape == (*lead, n, width) and a.dtype == dtype and a.flags.c_contiguous:
            return a.reshape(runs, n, width)
        return np.ascontiguousarray(np.broadcast_to(a, (*lead, n, width)).reshape(runs, n, width),
                                    dtype)

    if memory is None and bias is None and isinstance(mask, (str, tuple)):
        lo, hi, bias, top, mem_k, mem_v, biased = _plain_rows(mask, n, e, f, dtype)
    else:
        lo, hi, bias, top, mem_k, mem_v, biased = _rows(mask, n, e, f, dtype, memory, bias)
    out = np.empty((runs, n, f), dtype)
    lse = np.empty((runs, n) if with_lse else (0, 0), dtype)
    if runs and n:
        lanes = tile_runs(dtype, runs)
        kernel = _compile(e, f, biased, lanes)
        args = (runs_first(q, e), runs_first(k, e), runs_first(v, f), mem_k, mem_v, bias, top,
                SAFE_SPREAD[dtype.type] * LOG2E, lo, hi, dtype.type(beta * LOG2E), out, lse)
        tiles = -(-runs // lanes)

        def run(t0: int, t1: int) -> None:
            kernel(*args, *_scratch(n, len(mem_k), e, f, lanes, dtype), t0, t1)

        parallel_ranges(run, tiles,
                        cost=tiles * lanes * n * bias.shape[1] * (e + f + 8))
    return out.reshape(*lead, n, f), lse.reshape(*lead, n) if with_lse else None
