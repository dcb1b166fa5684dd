"""The numba loops of the harmonic kernels (`attnflow.kernels.harmonic`).

A token's direction u (unit, d = 2 or 3) has H real features phi_h(u) such that

    exp(b <u, w> - |b|) = sum_h lam_h phi_h(u) phi_h(w)   (up to a tail the caller bounds),

on the circle (H = 2K + 1) phi = (1, cos k theta, sin k theta for k = 1..K), lam = (c_0, 2 c_k,
2 c_k), c_k = ive(k, b) (Jacobi-Anger); on S^2 (H = (L + 1)^2) the real spherical harmonics
normalised so that sum_m Y_lm(u) Y_lm(w) = (2l + 1) P_l(<u, w>), lam = e^{-|b|} i_l(b) (the
addition theorem). A row's sums over the keys it sees, sum_j exp(b <u_i, w_j> - |b|) vv_j, are
then sum_h lam_h phi_h(u_i) S_h with moments S_h = sum_j phi_h(w_j) vv_j over those keys:
prefix sums for causal masks (with a decay gamma = e^{-slope} per step for a bias -slope |i - j|),
prefix sums rebuilt every w tokens for a window of w, one total for the full mask.

Moments are kept as (F, H) arrays (F: the value columns and a column of ones, whose sum is
the softmax normaliser), updated with Kahan's compensation, so that their round-off does not
grow with the number of tokens summed (docs/science.md, "Harmonic kernels").
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit

__all__ = ["apply_total", "backward", "beyond_bound", "block_totals", "degrees", "direct_rows",
           "feature_count", "forward", "norm_range", "ratios", "recurrence"]

_JIT = dict(cache=True, nogil=True, error_model="numpy")


def feature_count(d: int, K: int) -> int:
    """H: the number of features of a token on S^{d-1} (d = 2 or 3) truncated at order K."""
    return 2 * K + 1 if d == 2 else (K + 1) ** 2


@njit(**_JIT)
def _features(u: np.ndarray, K: int, rec: np.ndarray, out: np.ndarray) -> None:
    """The H features of the unit vector u (d,) into out (H,) (module docstring); rec: the
    S^2 recurrence's coefficients (`recurrence`)."""
    out[0] = 1.0
    if u.shape[0] == 2:
        # z^k = (cos k theta, sin k theta): eight powers by multiplication, then blocks of
        # eight from the previous block times z^8 (a chain of K / 8, not K, dependent steps).
        zr, zi = u[0], u[1]
        pr, pi = 1.0, 0.0
        for k in range(1, min(K, 8) + 1):
            pr, pi = pr * zr - pi * zi, pr * zi + pi * zr
            out[2 * k - 1] = pr
            out[2 * k] = pi
        if K > 8:
            er, ei = out[15], out[16]  # z^8
            for k in range(9, K + 1):
                ar, ai = out[2 * k - 17], out[2 * k - 16]  # z^(k - 8)
                out[2 * k - 1] = ar * er - ai * ei
                out[2 * k] = ar * ei + ai * er
        return
    # S^2: for each m, A_lm = N_lm P_l^m(t) / rho^m by the fully normalised recurrences in l
    # (coefficients from `recurrence`), times Re, Im (x + i y)^m = rho^m (cos m phi, sin m phi):
    # no division by rho.
    x, y, t = u[0], u[1], u[2]
    h = 0
    p = 0
    cr, ci = 1.0, 0.0  # (x + i y)^m
    for m in range(K + 1):
        if m >= 1:
            cr, ci = cr * x - ci * y, cr * y + ci * x
        a2 = 0.0
        a1 = rec[p, 0]  # A_mm
        for ell in range(m, K + 1):
            if ell > m:
                a2, a1 = a1, rec[p, 0] * t * a1 - rec[p, 1] * a2
            p += 1
            if m == 0:
                out[h] = a1
                h += 1
            else:
                out[h] = a1 * cr
                out[h + 1] = a1 * ci
                h += 2


@lru_cache(maxsize=16)
def recurrence(d: int, K: int) -> np.ndarray:
    """(P, 2) the coefficients of `_features`' recurrence on S^2, one row per (m, l), m-major:
    A_mm for l = m, else (a_lm, b_lm) of A_lm = a_lm t A_(l-1)m - b_lm A_(l-2)m
    (fully normalised associated Legendre functions); (1, 2) zeros on the circle."""
    if d == 2:
        return np.zeros((1, 2))
    rows = []
    amm = 1.0
    for m in range(K + 1):
        if m == 1:
            amm = math.sqrt(3.0)
        elif m >= 2:
            amm *= math.sqrt((2.0 * m + 1.0) / (2.0 * m))
        rows.append((amm, 0.0))
        for ell in range(m + 1, K + 1):
            lm = (ell - m) * (ell + m)
            a = math.sqrt((2.0 * ell - 1.0) * (2.0 * ell + 1.0) / lm)
            b = 0.0 if ell == m + 1 else math.sqrt(
                (2.0 * ell + 1.0) * (ell + m - 1.0) * (ell - m - 1.0) / (lm * (2.0 * ell - 3.0)))
            rows.append((a, b))
    return np.asarray(rows)


def degrees(d: int, K: int) -> np.ndarray:
    """The order k (circle) or degree l (S^2) of each of the H features, in `_features`'
    order: the coefficient lam_h of feature h is that of its order."""
    if d == 2:
        return np.concatenate([[0], np.repeat(np.arange(1, K + 1), 2)])
    out = []
    for m in range(K + 1):
        for ell in range(m, K + 1):
            out += [ell] if m == 0 else [ell, ell]
    return np.asarray(out, dtype=np.int64)


@njit(**_JIT)
def _add(S: np.ndarray, C: np.ndarray, f: np.ndarray, vrow: np.ndarray, scale: float) -> None:
    """S += scale * f vrow^T (F, H), Kahan-compensated with C."""
    for c in range(S.shape[0]):
        a = scale * vrow[c]
        for h in range(S.shape[1]):
            y = a * f[h] - C[c, h]
            t = S[c, h] + y
            C[c, h] = (t - S[c, h]) - y
            S[c, h] = t


@njit(**_JIT)
def _decay(S: np.ndarray, C: np.ndarray, gamma: float) -> None:
    if gamma != 1.0:
        for c in range(S.shape[0]):
            for h in range(S.shape[1]):
                S[c, h] *= gamma
                C[c, h] *= gamma


@njit(**_JIT, fastmath={"reassoc", "contract"})  # a dot product: vectorised, any order
def _read(S: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """out[c] += sum_h g_h S[c, h]."""
    for c in range(S.shape[0]):
        acc = 0.0
        for h in range(S.shape[1]):
            acc += g[h] * S[c, h]
        out[c] += acc


@njit(**_JIT)
def _query(q: np.ndarray, lam: np.ndarray, K: int, rec: np.ndarray, fq: np.ndarray,
           g: np.ndarray) -> None:
    """g = lam * phi(q) (fq: phi(q))."""
    _features(q, K, rec, fq)
    for h in range(g.shape[0]):
        g[h] = lam[h] * fq[h]


@njit(**_JIT)
def block_totals(k: np.ndarray, vv: np.ndarray, K: int, rec: np.ndarray, lo: int, hi: int,
                 gamma: float, reverse: bool, S: np.ndarray) -> None:
    """S (F, H) = sum_{lo <= j < hi} gamma^e_j phi(k_j) vv_j^T, e_j = hi - 1 - j (forward:
    the decay to the block's last token) or j - lo (reverse: to its first)."""
    C = np.zeros_like(S)
    f = np.empty(S.shape[1])
    for step in range(hi - lo):
        j = lo + step if not reverse else hi - 1 - step
        _decay(S, C, gamma)
        _features(k[j], K, rec, f)
        _add(S, C, f, vv[j], 1.0)


@njit(**_JIT)
def forward(q: np.ndarray, k: np.ndarray, vv: np.ndarray, lam: np.ndarray, K: int,
            rec: np.ndarray, same: bool,
            lo: int, hi: int, gamma: float, w: int, S0: np.ndarray, out: np.ndarray) -> None:
    """Rows lo..hi-1 of a causal (w = 0) or windowed (w >= 1) mask with decay gamma:
    out[i] += sum_h lam_h phi_h(q_i) S_h(i), S(i) = sum_{j <= i, i - j < w} gamma^(i - j)
    phi(k_j) vv_j^T. S0: S(lo - 1) (causal only; windows rebuild S every w rows from their
    keys, which bounds the round-off by w terms instead of i)."""
    F, H = S0.shape
    S = S0.copy()
    C = np.zeros_like(S)
    fk = np.empty(H)
    fq = np.empty(H)
    g = np.empty(H)
    fw = np.empty(H)
    gw = gamma ** w if w > 0 else 0.0
    for i in range(lo, hi):
        if w > 0 and (i - lo) % w == 0:  # rebuild S(i) from the window's keys
            S[:, :] = 0.0
            C[:, :] = 0.0
            for j in range(max(0, i - w + 1), i + 1):
                _decay(S, C, gamma)
                _features(k[j], K, rec, fk)
                _add(S, C, fk, vv[j], 1.0)
        else:
            _decay(S, C, gamma)
            _features(k[i], K, rec, fk)
            _add(S, C, fk, vv[i], 1.0)
            if w > 0 and i - w >= 0:
                _features(k[i - w], K, rec, fw)
                _add(S, C, fw, vv[i - w], -gw)
        if same:
            for h in range(H):
                g[h] = lam[h] * fk[h]
        else:
            _query(q[i], lam, K, rec, fq, g)
        _read(S, g, out[i])


@njit(**_JIT)
def backward(q: np.ndarray, k: np.ndarray, vv: np.ndarray, lam: np.ndarray, K: int,
             rec: np.ndarray,
             lo: int, hi: int, gamma: float, S0: np.ndarray, out: np.ndarray) -> None:
    """Rows lo..hi-1 of the strictly later keys with decay gamma (the full mask's other half
    under a bias -slope |i - j|): out[i] += sum_h lam_h phi_h(q_i) B_h(i), B(i) = sum_{j > i}
    gamma^(j - i) phi(k_j) vv_j^T; S0 = B(hi - 1)."""
    F, H = S0.shape
    S = S0.copy()
    C = np.zeros_like(S)
    fk = np.empty(H)
    fq = np.empty(H)
    g = np.empty(H)
    for i in range(hi - 1, lo - 1, -1):
        _query(q[i], lam, K, rec, fq, g)
        _read(S, g, out[i])
        _features(k[i], K, rec, fk)
        _add(S, C, fk, vv[i], 1.0)
        _decay(S, C, gamma)


@njit(**_JIT)
def apply_total(q: np.ndarray, lam: np.ndarray, K: int, rec: np.ndarray, lo: int, hi: int,
                T: np.ndarray, out: np.ndarray) -> None:
    """Rows lo..hi-1 of the full mask without bias: out[i] += sum_h lam_h phi_h(q_i) T_h."""
    H = T.shape[1]
    fq = np.empty(H)
    g = np.empty(H)
    for i in range(lo, hi):
        _query(q[i], lam, K, rec, fq, g)
        _read(T, g, out[i])


@njit(**_JIT)
def _dot(a: np.ndarray, b: np.ndarray) -> float:
    acc = 0.0
    for c in range(a.shape[0]):
        acc += a[c] * b[c]
    return acc


@njit(**_JIT)
def direct_rows(q: np.ndarray, k: np.ndarray, vv: np.ndarray, beta: float, slope: float,
                runs: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                mk: np.ndarray, mv: np.ndarray, mlog: np.ndarray, acc: np.ndarray,
                shift: np.ndarray) -> None:
    """For each (run r, row i) given: acc[r, i] = sum over the keys lo_i <= j < hi_i of
    exp(s_j - top) vv[r, j] plus the memory keys' exp(s_m - top) mv_m, s_j = beta <q_i, k_j>
    - slope |i - j|, s_m = beta <q_i, mk_m> + mlog_m, top the largest of them (shift[r, i])."""
    F = vv.shape[2]
    scores = np.empty(k.shape[1] + mk.shape[0])
    for t in range(rows.size):
        r, i = runs[t], rows[t]
        m0 = hi[t] - lo[t]
        top = -np.inf
        for j in range(lo[t], hi[t]):
            s = beta * _dot(q[r, i], k[r, j]) - slope * abs(i - j)
            scores[j - lo[t]] = s
            top = max(top, s)
        for m in range(mk.shape[0]):
            s = beta * _dot(q[r, i], mk[m]) + mlog[m]
            scores[m0 + m] = s
            top = max(top, s)
        for c in range(F):
            acc[r, i, c] = 0.0
        for j in range(lo[t], hi[t]):
            w = math.exp(scores[j - lo[t]] - top)
            for c in range(F):
                acc[r, i, c] += w * vv[r, j, c]
        for m in range(mk.shape[0]):
            w = math.exp(scores[m0 + m] - top)
            for c in range(F):
                acc[r, i, c] += w * mv[m, c]
        shift[r, i] = top


@njit(**_JIT)
def norm_range(x: np.ndarray) -> tuple[float, float]:
    """(min, max) of the Euclidean norms of the rows of x (m, d)."""
    low = np.inf
    top = -np.inf
    for i in range(x.shape[0]):
        acc = 0.0
        for c in range(x.shape[1]):
            acc += float(x[i, c]) * float(x[i, c])
        h = math.sqrt(acc)
        low = min(low, h)
        top = max(top, h)
    return low, top


@njit(**_JIT)
def _beyond(Z: np.ndarray, count: np.ndarray, T: float, tol: float) -> np.ndarray:
    bad = np.zeros(Z.shape, dtype=np.bool_)
    for r in range(Z.shape[0]):
        for i in range(Z.shape[1]):
            bad[r, i] = not (count[i] * T <= tol * Z[r, i])  # NaN-safe: NaN Z fails
    return bad


@njit(**_JIT)
def _any_beyond(Z: np.ndarray, count: np.ndarray, T: float, tol: float) -> bool:
    for r in range(Z.shape[0]):
        for i in range(Z.shape[1]):
            if not (count[i] * T <= tol * Z[r, i]):
                return True
    return False


def beyond_bound(Z: np.ndarray, count: np.ndarray, T: float, tol: float) -> np.ndarray | None:
    """The rows (R, n) whose error bound count_i T exceeds tol Z (a non-positive or NaN Z
    fails), or None where there are none (one pass, no temporaries)."""
    count = np.ascontiguousarray(count, dtype=float)
    if not _any_beyond(Z, count, float(T), float(tol)):
        return None
    return _beyond(Z, count, float(T), float(tol))


@njit(**_JIT)
def ratios(N: np.ndarray, Z: np.ndarray, out: np.ndarray) -> None:
    """out (m, f) = N (m, f) / Z (m,) row by row (softmax's normalisation)."""
    for i in range(N.shape[0]):
        for c in range(N.shape[1]):
            out[i, c] = N[i, c] / Z[i]
