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
(v_j, 1) are (a_0 Z + A^T N, Z). The loops never hold a token's features in memory: each
row makes its key's powers, adds them to the moments (K + 2 complex numbers and their
Kahan compensations, in L1) and reads its query's sums at once.

Powers: z^1..z^8 by multiplication, z^k = z^(k - 8) z^8 up to k = 64 and z^k = z^(k - 64)
z^64 beyond, so that z^k is a chain of at most 16 + k / 64 rounded complex products (its
error a few times that many units of 2^-53), and the loops over k vectorise (dependences at
distance 8 and 64). (Measured: a tree of products to z^16, or doubling z^(h + j) = z^j z^h,
ran 1.2-1.6x slower.)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["block_moments", "rows"]

_JIT = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_JIT, inline="always")
def _unit(x: np.ndarray, r: int, i: int) -> tuple[float, float]:
    """The direction of x[r, i] (2,) as (cos, sin); (1, 0) for a zero row."""
    a, b = float(x[r, i, 0]), float(x[r, i, 1])
    h = math.sqrt(a * a + b * b)
    if h == 0.0:
        return 1.0, 0.0
    return a / h, b / h


@njit(**_JIT, inline="always")
def _powers(c: float, s: float, top: int, Pr: np.ndarray, Pi: np.ndarray) -> None:
    """(Pr, Pi)[k] = Re, Im of (c + i s)^k for k = 0 .. top (module docstring)."""
    Pr[0], Pi[0] = 1.0, 0.0
    pr, pi = 1.0, 0.0
    for k in range(1, min(top, 8) + 1):
        pr, pi = pr * c - pi * s, pr * s + pi * c
        Pr[k], Pi[k] = pr, pi
    _stride(Pr, Pi, 8, 9, min(top, 64))
    _stride(Pr, Pi, 64, 65, top)


@njit(**_JIT, inline="always")
def _stride(Pr: np.ndarray, Pi: np.ndarray, h: int, lo: int, hi: int) -> None:
    """P[k] = P[k - h] z^h for k = lo .. hi (a dependence at distance h: vectorised)."""
    if hi < lo:
        return
    er, ei = Pr[h], Pi[h]
    for k in range(lo, hi + 1):
        Pr[k] = Pr[k - h] * er - Pi[k - h] * ei
        Pi[k] = Pr[k - h] * ei + Pi[k - h] * er


@njit(**_JIT, inline="always")
def _add(Mr: np.ndarray, Mi: np.ndarray, Cr: np.ndarray, Ci: np.ndarray, Pr: np.ndarray,
         Pi: np.ndarray) -> None:
    """M += P, Kahan-compensated with C (real and imaginary parts)."""
    for k in range(Mr.size):
        y = Pr[k] - Cr[k]
        t = Mr[k] + y
        Cr[k] = (t - Mr[k]) - y
        Mr[k] = t
        y = Pi[k] - Ci[k]
        t = Mi[k] + y
        Ci[k] = (t - Mi[k]) - y
        Mi[k] = t


@njit(**_JIT, fastmath={"reassoc", "contract"})  # dot products: vectorised, any order
def _read(Qr: np.ndarray, Qi: np.ndarray, Mr: np.ndarray, Mi: np.ndarray, c0: np.ndarray,
          c1: np.ndarray, c2: np.ndarray) -> tuple[float, float, float]:
    """(Z, Re, Im of N conj(q)) of a query with powers Q against the moments M (module
    docstring): with a_m + i b_m = conj(q^m) M_m, sums of c0 a, c1 a, c2 b (the rows of
    `coef`, passed as 1-d arrays: a 2-d index kept the loop from vectorising, 1.35x slower)."""
    z = 0.0
    c = 0.0
    s = 0.0
    for m in range(Mr.size):
        a = Qr[m] * Mr[m] + Qi[m] * Mi[m]
        b = Qr[m] * Mi[m] - Qi[m] * Mr[m]
        z += c0[m] * a
        c += c1[m] * a
        s += c2[m] * b
    return z, c, s


@njit(**_JIT)
def block_moments(k: np.ndarray, r: int, lo: int, hi: int, out: np.ndarray) -> None:
    """out (2, K + 2) += (Re, Im) of sum_{lo <= j < hi} z_j^m, m = 0 .. K + 1, z_j the
    direction of k[r, j] (Kahan-compensated)."""
    top = out.shape[1] - 1
    Mr, Mi = out[0], out[1]
    Cr = np.zeros(top + 1)
    Ci = np.zeros(top + 1)
    Pr = np.empty(top + 1)
    Pi = np.empty(top + 1)
    for j in range(lo, hi):
        c, s = _unit(k, r, j)
        _powers(c, s, top, Pr, Pi)
        _add(Mr, Mi, Cr, Ci, Pr, Pi)


@njit(**_JIT)
def rows(q: np.ndarray, k: np.ndarray, coef: np.ndarray, same: bool, causal: bool, r: int,
         lo: int, hi: int, S0: np.ndarray, affine: np.ndarray, out: np.ndarray) -> None:
    """Rows lo..hi-1 of run r: out[r, i] += (a_0 Z_i + A^T N_i, Z_i) (module docstring) with
    the moments S0 (2, K + 2) (Re, Im), plus, when causal, those of the keys lo..i (which
    then leaves S0 = the moments of S0 and the keys lo..hi-1, Kahan-compensated from S0).
    q, k (R, n, 2) queries and keys (any norm: their directions are used); coef (3, K + 2)
    (module docstring); same: q is k; affine (3, f) the rows a_0, A; out (R, n, f + 1)."""
    top = coef.shape[1] - 1
    f = affine.shape[1]
    Mr, Mi = S0[0], S0[1]
    Cr = np.zeros(top + 1)
    Ci = np.zeros(top + 1)
    Pr = np.empty(top + 1)
    Pi = np.empty(top + 1)
    Qr = Pr if same else np.empty(top + 1)
    Qi = Pi if same else np.empty(top + 1)
    c0, c1, c2 = coef[0].copy(), coef[1].copy(), coef[2].copy()
    for i in range(lo, hi):
        if causal:
            c, s = _unit(k, r, i)
            _powers(c, s, top, Pr, Pi)
            _add(Mr, Mi, Cr, Ci, Pr, Pi)
        if not (same and causal):
            c, s = _unit(q, r, i)
            _powers(c, s, top, Qr, Qi)
        z, cc, ss = _read(Qr, Qi, Mr, Mi, c0, c1, c2)
        nr = c * cc - s * ss
        ni = s * cc + c * ss
        for col in range(f):
            out[r, i, col] += affine[0, col] * z + affine[1, col] * nr + affine[2, col] * ni
        out[r, i, f] += z
