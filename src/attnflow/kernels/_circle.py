"""The numba loops of the harmonic kernel's fused circle path (`attnflow.kernels.harmonic`).

On the circle a key direction w = (cos phi, sin phi) is z = e^{i phi}, and its harmonic
features are the powers z^k. When the values are an affine function of the key directions,
v_j = a_0 + A^T w_j (V = I, or any V: the tokens' keys and values are then both linear in
the token), every sum a row needs is a combination of the complex moments

    M_k = sum_j z_j^k,   k = 0 .. K + 1   (M_{-k} = conj(M_k)),

over the keys it sees, instead of (f + 1) (2K + 1) real moments of (v_j, 1) times features:
with q = e^{i alpha} and c_k the expansion's coefficients (c_{-k} = c_k),

    Z = sum_{|k| <= K} c_k conj(q^k) M_k,
    N = sum_j e^{B <u, w_j> - |B|} z_j = sum_{|k| <= K} c_k conj(q^k) M_{k+1}

(N as a complex number: the weighted sum of the key directions), and the row's sums of
(v_j, 1) are (a_0 Z + A^T N, Z).

Lanes. The rows of the runs are cut into segments of consecutive rows (as many per run for
every run of a call, so that a run's result does not depend on the runs beside it), and
one loop advances a pack of LANES segments together, one row of each per step: lane b holds
its segment's moments, and every loop over a lane's numbers is a loop over the LANES lanes,
which the compiler vectorises (SIMD across tokens: a token's powers, moment update and read
are each a chain over the orders, which vectorised across the orders would wait on latency;
across tokens they do not). Causal: `totals` first sums each segment's moments (unless each
is a whole run); a lane then starts from the sum of its run's segments before its own and
adds its keys as it goes (`rows`). Full: every lane reads the total of its run's segments.

Row layout. One work array W holds, for each group of ORDERS orders (a row of FIELDS x LANES
numbers), the lanes' powers P (re, im), the plain sums L of their last <= MERGE keys, the
compensated sums G and their compensations C (Kahan), the lanes' z^4 and, when queries are
not keys, the queries' powers and q^4. Powers: z^k = z^(k - 4) z^4 from the row before, so
z^k is a chain of at most 3 + k / 4 rounded products (its error a few times that many units
of 2^-53); the read carries its three sums from row to row. Every MERGE steps (and at the
end) L is added to (G, C) and cleared: a moment errs by about MERGE eps per key merged plus
the compensated sum's eps, which does not grow with the number of keys. Offsets are the
constant LANES times a field's index, and indices are unsigned, so the compiler sees the
dependences between fields (constant distances, no wraparound); the lane loops run to a
bound passed at run time (`nl`, always LANES), which keeps them loops for the vectoriser
instead of unrolled straight code. (Measured, n = 1e6, beta = 64, causal, one thread: rows
0.06-0.07 s plus segment totals 0.03-0.04 s, against 0.14-0.17 s of rows one token at a
time; benchmarks/RESULTS.md.)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

__all__ = ["LANES", "ORDERS", "rows", "totals"]

_JIT = dict(cache=True, nogil=True, error_model="numpy")

LANES = 16  # segments advanced together (SIMD lanes: two AVX-512 vectors of float64)
ORDERS = 4  # orders per row of the work array
MERGE = 32  # steps between merges of the plain sums L into the compensated sums (G, C)
# fields of a row, in units of LANES numbers: 4 real then 4 imaginary parts (one per order)
_P, _L, _G, _C, _Z4, _ACC, _Q, _Q4 = 0, 8, 16, 24, 32, 34, 37, 45
FIELDS = 47

_U = uint64(LANES)
_ROW = uint64(FIELDS * LANES)


def _field(f: int) -> np.uint64:
    return np.uint64(f * LANES)


_PR, _PI, _LR, _LI, _GR, _GI, _CR, _CI = (_field(f) for f in (_P, _P + 4, _L, _L + 4, _G,
                                                                _G + 4, _C, _C + 4))
_ZR, _ZI, _A0, _A1, _A2 = (_field(f) for f in (_Z4, _Z4 + 1, _ACC, _ACC + 1, _ACC + 2))
_QR, _QI, _YR, _YI = (_field(f) for f in (_Q, _Q + 4, _Q4, _Q4 + 1))


@njit(**_JIT, inline="always")
def _seed(x: np.ndarray, runs: np.ndarray, starts: np.ndarray, lens: np.ndarray, t: int,
          W: np.ndarray, nl: int, pr_: np.uint64, pi_: np.uint64, zr_: np.uint64,
          zi_: np.uint64) -> None:
    """Row 1 (orders 0..3) of the lanes' powers at step t, and z^4: z the direction of
    x[runs[b], starts[b] + t] ((1, 0) for a zero row); a lane past its segment's end gets z = 0 and
    z^0 = 0, which adds nothing."""
    o = _ROW
    for b in range(nl):
        ub = uint64(b)
        if t < lens[b]:
            c, s = float(x[runs[b], starts[b] + t, 0]), float(x[runs[b], starts[b] + t, 1])
            h = math.sqrt(c * c + s * s)
            if h == 0.0:
                c, s, h = 1.0, 0.0, 1.0
            c, s, one = c / h, s / h, 1.0
        else:
            c, s, one = 0.0, 0.0, 0.0
        c2, s2 = c * c - s * s, 2.0 * c * s
        W[o + pr_ + ub], W[o + pi_ + ub] = one, 0.0
        W[o + pr_ + _U + ub], W[o + pi_ + _U + ub] = c, s
        W[o + pr_ + uint64(2) * _U + ub], W[o + pi_ + uint64(2) * _U + ub] = c2, s2
        W[o + pr_ + uint64(3) * _U + ub] = c2 * c - s2 * s
        W[o + pi_ + uint64(3) * _U + ub] = c2 * s + s2 * c
        W[o + zr_ + ub], W[o + zi_ + ub] = c2 * c2 - s2 * s2, 2.0 * c2 * s2


@njit(**_JIT, inline="always")
def _advance(W: np.ndarray, o: np.uint64, p: np.uint64, pr_: np.uint64, pi_: np.uint64,
             zr_: np.uint64, zi_: np.uint64, jj: np.uint64, first: bool) -> tuple[float, float]:
    """The power of order 4g + j at o (row g): read when first (the seed row), else made from
    the row before (p) times z^4 and stored."""
    if first:
        return W[o + pr_ + jj], W[o + pi_ + jj]
    zr, zi = W[p + zr_], W[p + zi_]
    qr, qi = W[p + pr_ + jj], W[p + pi_ + jj]
    pr, pi = qr * zr - qi * zi, qr * zi + qi * zr
    W[o + pr_ + jj], W[o + pi_ + jj] = pr, pi
    return pr, pi


@njit(**_JIT, inline="always")
def _group(W: np.ndarray, c: np.ndarray, g: int, nl: int, first: bool, update: bool,
           read: bool, same: bool) -> None:
    """Row g (orders 4g .. 4g + 3) of one step for every lane: the powers (`_advance`), L +=
    the key powers (update), and the three sums of the read against G + L (read)."""
    cur = uint64(g + 1) * _ROW
    pre = cur - _ROW
    k0, k1, k2, k3 = c[12 * g], c[12 * g + 1], c[12 * g + 2], c[12 * g + 3]
    m0, m1, m2, m3 = c[12 * g + 4], c[12 * g + 5], c[12 * g + 6], c[12 * g + 7]
    n0, n1, n2, n3 = c[12 * g + 8], c[12 * g + 9], c[12 * g + 10], c[12 * g + 11]
    for b in range(nl):
        ub = uint64(b)
        o, p = cur + ub, pre + ub
        if not first:
            W[o + _ZR], W[o + _ZI] = W[p + _ZR], W[p + _ZI]
            if not same:
                W[o + _YR], W[o + _YI] = W[p + _YR], W[p + _YI]
        if read:
            if first:
                a0 = a1 = a2 = 0.0
            else:
                a0, a1, a2 = W[p + _A0], W[p + _A1], W[p + _A2]
        for j in range(ORDERS):
            jj = uint64(j) * _U
            pr, pi = _advance(W, o, p, _PR, _PI, _ZR, _ZI, jj, first)
            if update:
                lr = W[o + _LR + jj] + pr
                li = W[o + _LI + jj] + pi
                W[o + _LR + jj], W[o + _LI + jj] = lr, li
            if read:
                if same:
                    qr, qi = pr, pi
                else:
                    qr, qi = _advance(W, o, p, _QR, _QI, _YR, _YI, jj, first)
                mr, mi = W[o + _GR + jj], W[o + _GI + jj]
                if update:
                    mr, mi = mr + lr, mi + li
                a = qr * mr + qi * mi
                e = qr * mi - qi * mr
                if j == 0:
                    a0, a1, a2 = a0 + k0 * a, a1 + m0 * a, a2 + n0 * e
                elif j == 1:
                    a0, a1, a2 = a0 + k1 * a, a1 + m1 * a, a2 + n1 * e
                elif j == 2:
                    a0, a1, a2 = a0 + k2 * a, a1 + m2 * a, a2 + n2 * e
                else:
                    a0, a1, a2 = a0 + k3 * a, a1 + m3 * a, a2 + n3 * e
        if read:
            W[o + _A0], W[o + _A1], W[o + _A2] = a0, a1, a2


@njit(**_JIT, inline="always")
def _merge(W: np.ndarray, groups: int, nl: int) -> None:
    """(G, C) += L, Kahan-compensated, and L = 0, for every row and lane."""
    for g in range(groups):
        cur = uint64(g + 1) * _ROW
        for i in range(ORDERS * nl):
            o = cur + uint64(i)
            y = W[o + _LR] - W[o + _CR]
            t = W[o + _GR] + y
            W[o + _CR] = (t - W[o + _GR]) - y
            W[o + _GR] = t
            y = W[o + _LI] - W[o + _CI]
            t = W[o + _GI] + y
            W[o + _CI] = (t - W[o + _GI]) - y
            W[o + _GI] = t
            W[o + _LR] = 0.0
            W[o + _LI] = 0.0


@njit(**_JIT, inline="always")
def _steps(q: np.ndarray, k: np.ndarray, runs: np.ndarray, starts: np.ndarray, lens: np.ndarray,
           c: np.ndarray, groups: int, W: np.ndarray, update: bool, read: bool, same: bool,
           affine: np.ndarray, out: np.ndarray) -> None:
    """Every step of one group of lanes (module docstring); out as in `rows`."""
    nl = starts.size
    f = affine.shape[1]
    last = uint64(groups) * _ROW
    for t in range(lens.max()):
        if update or same:
            _seed(k, runs, starts, lens, t, W, nl, _PR, _PI, _ZR, _ZI)
        if not same:
            _seed(q, runs, starts, lens, t, W, nl, _QR, _QI, _YR, _YI)
        _group(W, c, 0, nl, True, update, read, same)
        for g in range(1, groups):
            _group(W, c, g, nl, False, update, read, same)
        if update and (t + 1) % MERGE == 0:
            _merge(W, groups, nl)
        if read:
            for b in range(nl):
                if t < lens[b]:
                    ub = uint64(b)
                    qr = W[_ROW + (_PR if same else _QR) + _U + ub]
                    qi = W[_ROW + (_PI if same else _QI) + _U + ub]
                    z, ar, ai = W[last + _A0 + ub], W[last + _A1 + ub], W[last + _A2 + ub]
                    nr, ni = qr * ar - qi * ai, qi * ar + qr * ai
                    r, i = runs[b], starts[b] + t
                    for col in range(f):
                        out[r, i, col] += (affine[0, col] * z + affine[1, col] * nr
                                           + affine[2, col] * ni)
                    out[r, i, f] += z
    if update:
        _merge(W, groups, nl)


@njit(**_JIT)
def totals(k: np.ndarray, runs: np.ndarray, starts: np.ndarray, lens: np.ndarray, groups: int,
           out: np.ndarray) -> None:
    """out (LANES, 2, groups * ORDERS) = (Re, Im) of each lane's sum_j z_j^m over its segment
    (rows starts[b] .. starts[b] + lens[b] - 1 of run runs[b] of k (R, n, 2)), m = 0 .. 4
    groups - 1, compensated (G - C)."""
    W = np.zeros((groups + 1) * FIELDS * LANES)  # the seed row, then one per row of orders
    nl = starts.size
    _steps(k, k, runs, starts, lens, np.zeros(12 * groups), groups, W, True, False, True,
           np.zeros((3, 0)), np.zeros((0, 0, 1)))
    for g in range(groups):
        cur = uint64(g + 1) * _ROW
        for j in range(ORDERS):
            for b in range(nl):
                o = cur + uint64(j) * _U + uint64(b)
                out[b, 0, ORDERS * g + j] = W[o + _GR] - W[o + _CR]
                out[b, 1, ORDERS * g + j] = W[o + _GI] - W[o + _CI]


def _rows_for(causal: bool, same: bool):  # noqa: ANN202 (a numba dispatcher)
    """`rows` compiled for one (causal, same): the flags are constants there, so the compiler
    drops their branches from the lane loops (passed at run time, they kept the loops from
    vectorising: 4x slower)."""

    @njit(**_JIT)
    def rows_for(q, k, coef, runs, starts, lens, S0, affine, out):  # noqa: ANN001, ANN202
        groups = coef.shape[0]
        nl = starts.size
        W = np.zeros((groups + 1) * FIELDS * LANES)  # the seed row, then one per row of orders
        for g in range(groups):
            cur = uint64(g + 1) * _ROW
            for j in range(ORDERS):
                for b in range(nl):
                    o = cur + uint64(j) * _U + uint64(b)
                    W[o + _GR] = S0[b, 0, ORDERS * g + j]
                    W[o + _GI] = S0[b, 1, ORDERS * g + j]
        _steps(q, k, runs, starts, lens, coef.ravel(), groups, W, causal, True, same, affine,
               out)

    return rows_for


_ROWS = {(causal, same): _rows_for(causal, same) for causal in (False, True)
         for same in (False, True)}


def rows(q: np.ndarray, k: np.ndarray, coef: np.ndarray, same: bool, causal: bool,
         runs: np.ndarray, starts: np.ndarray, lens: np.ndarray, S0: np.ndarray,
         affine: np.ndarray, out: np.ndarray) -> None:
    """Rows starts[b] .. starts[b] + lens[b] - 1 of run runs[b], for each lane b: out[r, i] +=
    (a_0 Z_i + A^T N_i, Z_i) (module docstring) from the lane's moments S0[b] plus,
    when causal, those of its keys up to i. q, k (R, n, 2) queries and keys (any norm: their
    directions are used); coef (groups, 12): per row of ORDERS orders, the weights of Z's
    a_m, of Re(N conj q)'s a_m and of its b_m (`harmonic._circle_coefficients`, zero past
    K + 1); same: q is k; S0 (LANES, 2, groups * ORDERS) (Re, Im); affine (3, f) the rows
    a_0, A; out (R, n, f + 1)."""
    _ROWS[bool(causal), bool(same)](q, k, coef, runs, starts, lens, S0, affine, out)
