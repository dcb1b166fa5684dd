"""The Triton program of `attnflow.kernels.triton_fused` (imports triton: load it lazily).

Whether it is compiled for the GPU or run by Triton's interpreter (numpy on the CPU) is fixed
when this module is first imported, by Triton's own rule: TRITON_INTERPRET=1 in the
environment at that moment selects the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The MASK codes of the program (constexpr: a kernel reads no other globals); the caller
# passes their .value.
FULL, CAUSAL, WINDOW = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def attend_kernel(Q, K, V, X, OUT, BIAS, MK, MV, MLOG,
                  n, m, window, blocks,
                  sqb, sqn, skb, skn, svb, svn, sxb, sxn, sob, son,
                  MASK: tl.constexpr, HAS_BIAS: tl.constexpr, PROJECT: tl.constexpr,
                  E: tl.constexpr, F: tl.constexpr, FP: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One block of BLOCK_M queries of one run: out_i = sum_j 2^(s_ij - M_i) v_j / sum_j
    2^(s_ij - M_i) over the allowed keys and then the m memory keys, s_ij = <q_i, k_j> in base-2
    units (beta log2 e folded into q, the bias and the log-weights by the caller), M_i the
    running maximum (online softmax); then out_i - <out_i, x_i> x_i when PROJECT.

    E: the head size of q and k (scores summed column by column, no padding); F: that of v,
    padded to FP (a power of two) inside the program. Programs are numbered run-major with
    the row blocks in reverse, so that a causal mask's longest rows start first.
    """
    pid = tl.program_id(0)
    run = (pid // blocks).to(tl.int64)
    blk = blocks - 1 - pid % blocks
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < n
    cf = tl.arange(0, FP)
    fmask = cf < F
    q_at = Q + run * sqb + rows * sqn
    dtype = Q.dtype.element_ty

    m_i = tl.full([BLOCK_M], float("-inf"), dtype)
    l_i = tl.zeros([BLOCK_M], dtype)
    acc = tl.zeros([BLOCK_M, FP], dtype)
    k_at = K + run * skb
    v_at = V + run * svb
    if MASK == FULL:
        for start in range(0, n, BLOCK_N):
            m_i, l_i, acc = _key_block(q_at, k_at, v_at, BIAS, start, rows, live, cf, n,
                                       window, skn, svn, m_i, l_i, acc, MASK, True, HAS_BIAS,
                                       E, F, BLOCK_M, BLOCK_N)
    else:
        diagonal = blk * BLOCK_M  # key blocks before it lie wholly below every row's diagonal
        lo = 0
        if MASK == WINDOW:
            lo = tl.maximum(0, diagonal - window + 1)
            lo = lo - lo % BLOCK_N  # key blocks aligned, whichever lo
        else:
            for start in range(0, diagonal, BLOCK_N):  # causal: every key allowed, no test
                m_i, l_i, acc = _key_block(q_at, k_at, v_at, BIAS, start, rows, live, cf, n,
                                           window, skn, svn, m_i, l_i, acc, MASK, False,
                                           HAS_BIAS, E, F, BLOCK_M, BLOCK_N)
            lo = diagonal
        for start in range(lo, tl.minimum(n, diagonal + BLOCK_M), BLOCK_N):
            m_i, l_i, acc = _key_block(q_at, k_at, v_at, BIAS, start, rows, live, cf, n,
                                       window, skn, svn, m_i, l_i, acc, MASK, True, HAS_BIAS,
                                       E, F, BLOCK_M, BLOCK_N)
    for start in range(0, m, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s = tl.zeros([BLOCK_M, BLOCK_N], dtype)
        for c in tl.static_range(E):
            qc = tl.load(q_at + c, mask=live, other=0.0)
            kc = tl.load(MK + cols * E + c, mask=cols < m, other=0.0)
            s += qc[:, None] * kc[None, :]
        s += tl.load(MLOG + cols, mask=cols < m, other=0.0)[None, :]
        s = tl.where((cols[None, :] < m) & live[:, None], s, float("-inf"))
        m_i, l_i, acc = _absorb(s, MV, cols, F, m, cf, m_i, l_i, acc, F)

    out = acc / tl.where(live, l_i, 1.0)[:, None]  # a live row without keys: 0 / 0, NaN
    if PROJECT:
        x = tl.load(X + run * sxb + rows[:, None] * sxn + cf[None, :],
                    mask=live[:, None] & fmask[None, :], other=0.0)
        out = out - tl.sum(out * x, axis=1)[:, None] * x
    tl.store(OUT + run * sob + rows[:, None] * son + cf[None, :], out,
             mask=live[:, None] & fmask[None, :])


@triton.jit
def _key_block(q_at, k_at, v_at, BIAS, start, rows, live, cf, n, window, skn, svn,
               m_i, l_i, acc, MASK: tl.constexpr, CHECK: tl.constexpr, HAS_BIAS: tl.constexpr,
               E: tl.constexpr, F: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """The keys start..start + BLOCK_N - 1 of one run joined to the rows' running sums. CHECK:
    test each pair against n and the mask's band (False: the caller knows every key of the
    block is allowed for every row, a causal block below the diagonal)."""
    cols = start + tl.arange(0, BLOCK_N)
    s = tl.zeros([BLOCK_M, BLOCK_N], m_i.dtype)
    for c in tl.static_range(E):
        qc = tl.load(q_at + c, mask=live, other=0.0)
        kc = tl.load(k_at + cols * skn + c, mask=cols < n, other=0.0)
        s += qc[:, None] * kc[None, :]
    allowed = live[:, None] & (cols[None, :] < n)
    if CHECK:
        if MASK != FULL:
            allowed = allowed & (cols[None, :] <= rows[:, None])
        if MASK == WINDOW:
            allowed = allowed & (cols[None, :] > rows[:, None] - window)
    if HAS_BIAS:
        s += tl.load(BIAS + rows[:, None].to(tl.int64) * n + cols[None, :], mask=allowed,
                     other=0.0)
    if CHECK:
        s = tl.where(allowed, s, float("-inf"))
    return _absorb(s, v_at, cols, svn, n, cf, m_i, l_i, acc, F)


@triton.jit
def _absorb(s, v_at, cols, svn, nk, cf, m_i, l_i, acc, F: tl.constexpr):
    """The online softmax's step: the block of scores s (BLOCK_M, BLOCK_N), base 2, -inf where
    not allowed, and the keys' values (rows `cols` < nk of v_at, row stride svn) join the
    running maximum m_i, normaliser l_i and weighted sum acc (BLOCK_M, FP). A row that has
    seen no allowed key keeps m_i = -inf and zeros (its shift is taken as 0, never
    -inf - -inf). The values are summed one column at a time, (BLOCK_M, BLOCK_N) products
    reduced over the keys: a (BLOCK_M, BLOCK_N, FP) product would not fit in registers."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - shift)
    p = tl.exp2(s - shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    for c in tl.static_range(F):
        vc = tl.load(v_at + cols * svn + c, mask=cols < nk, other=0.0)
        acc += tl.where(cf[None, :] == c, tl.sum(p * vc[None, :], axis=1)[:, None], 0.0)
    return m_new, l_i, acc


@triton.jit
def exp2_chain(X, iters, BLOCK: tl.constexpr):
    """The device's exp floor as benchmarks/gpu.py measures it: each element of X chains
    `iters` dependent x <- 2^-x (the fused kernel's op; x stays in [1/2, 1]) in registers,
    many independent chains hiding the latency; X is overwritten with the results."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    for _ in range(iters):
        x = tl.exp2(-x)
    tl.store(X + offs, x)
