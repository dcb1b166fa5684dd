"""The harmonic kernels: attention on the circle and on S^2 in O(n K) instead of O(n^2).

When every query has the same norm |q_i| = a and every key the same norm |k_j| = b (Q and K
each a multiple of an orthogonal matrix, on tokens of the sphere; RoPE keeps this), the score
is beta a b <u_i, w_j> with unit directions u, w, and exp(B <u, w>), B = beta a b, expands in
harmonics of u and w: Jacobi-Anger on the circle (order K), the addition theorem of spherical
harmonics on S^2 (degree L, also called K below) (docs/science.md, "Harmonic kernels").
Every sum over the keys a row sees becomes a combination of the keys' harmonic moments over
that set: prefix sums for the causal mask, prefix sums over the last w keys for a window,
one total for the full mask; a score bias -slope |i - j| (ALiBi, `options.LinearBias`)
becomes a decay e^{-slope} per step of those sums. V factors out. On the circle, where the
values are the keys (V = K, e.g. Q = K = V = I), causal or full without a bias, a fused path
(`attnflow.kernels._circle`) keeps K + 2 complex moments of the key directions instead of
the (f + 1)(2K + 1) real moments of (v, 1) (docs/science.md, "Harmonic kernels").

Accuracy, proven and checked per row. Weights are computed as exp(score - |B|) (scaled
Bessel functions, scipy.special.ive), so nothing overflows at any B. The expansion's tail is
bounded per pair by T(K) = sum_{|k| > K} |c_k| (circle) or sum_{l > L} (2l + 1) |e^{-|B|} i_l(B)|
(S^2), since |cos|, |P_l| <= 1. The order is the least K with T(K) <= tol * ETA. After the
sums, each row's bound on the error of its normaliser Z_i (the sum of its weights),
relative to Z_i, is count_i T(K) / Z_i, count_i the (decayed) number of keys it sees; rows
whose bound exceeds `tol` (a query far from every key it sees) are summed directly, so every
row meets it: the output's error is at most 2 tol max_j |v_j| (softmax), or tol times the row's
weight sum times max_j |v_j| (unnormalised). Round-off: moments are Kahan-compensated sums
(`attnflow.kernels._harmonic`), whose error does not grow with the number of keys; windows
rebuild their sums every w rows; a decay's error is bounded by 1 / slope steps.

Applies to masks "full", "causal" and ("window", w), softmax, unnormalised and positional
weights (each row's exp(score) over its decayed number of keys plus the memory), any
values v, beta of either sign or zero, memory tokens (summed directly), a `LinearBias`;
float32 inputs are computed in float64 and returned in float32. Anything else is refused
with the reason (`check`), and so is a score scale |B| = |beta| a b above MAX_B = 1e6: the
order grows like sqrt|B| (about 7400 on the circle at 1e6, 15 000 features per token, 5.5e7
on S^2), and the coefficient table like |B|, so a legal beta such as 1e308 has no truncation
to compute; backend "auto" then uses the blocked or dense kernel, which take any beta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from scipy.special import ive

from attnflow._checks import describe, fail
from attnflow.kernels import _circle, _harmonic
from attnflow.kernels.masks import MaskSpec, check_mask
from attnflow.kernels.options import LinearBias, check_normalization
from attnflow.kernels.types import Memory, Normalization
from attnflow.parallel import parallel_ranges

__all__ = ["DEFAULT_TOL", "ETA", "MAX_B", "MIN_TOL", "SUPPORTS", "Harmonic", "attend", "check",
           "coefficients", "features", "log_energy", "order", "sums", "tail"]

SUPPORTS = frozenset({"bias", "unnormalised", "positional"})  # bias: a LinearBias only
DEFAULT_TOL = 1e-12
# Below this the round-off of the sums (a few eps of float64 per term, times the order)
# dominates the truncation: no K can promise it.
MIN_TOL = 1e-14
MAX_B = 1e6  # the largest score scale |beta a b| taken (module docstring)
# The mean weight Z_i / count_i from which a row meets tol by the a priori order; rows below
# it are checked against their own bound (module docstring).
ETA = 2.0 ** -10
BLOCK = 4096  # rows of one share of the threads (its moments start from the block totals)
# The fused circle path's segments per run (`_circle_segments`): one per SEGMENT_ROWS rows, at
# most SEGMENTS (8 packs of lanes: shares for the threads from n = 16384). Whole runs below
# 256 rows (no pass of segment totals: 256 runs of 200 rows 2.2x faster than 64-row segments).
SEGMENT_ROWS, SEGMENTS = 128, 128


@dataclass(frozen=True)
class Harmonic:
    """The harmonic kernel with tolerance `tol` (the `Kernel` signature; backend
    "harmonic" or "harmonic:TOL")."""

    tol: float = DEFAULT_TOL
    reads_directions: ClassVar[bool] = True  # on a sphere scheme, the model passes x / |x|

    def __post_init__(self) -> None:
        check_tol(self.tol)

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float,
                 mask: MaskSpec, memory: Memory | None = None, bias: Any = None,
                 normalization: Normalization = "softmax") -> np.ndarray:
        return attend(q, k, v, beta, mask, memory, bias, normalization, tol=self.tol)


def check_tol(tol: Any) -> float:
    """tol as a float in [MIN_TOL, 1)."""
    if (isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.number))
            or not MIN_TOL <= float(tol) < 1):
        raise fail("tol", f"a tolerance in [{MIN_TOL:g}, 1) (below {MIN_TOL:g} the round-off "
                   "of float64 sums dominates)", repr(tol))
    return float(tol)


# ---------------------------------------------------------------------- the expansion
@lru_cache(maxsize=64)
def coefficients(B: float, d: int) -> np.ndarray:
    """c (K_max + 1,): the expansion coefficients of exp(B <u, w> - |B|) by order, as far as
    they are above 1e-300 of the first: circle c_k = ive(k, B) (each counted for k and -k);
    S^2 e^{-|B|} i_l(B) = sqrt(pi / (2 |B|)) ive(l + 1/2, |B|) (-1)^l for B < 0."""
    if abs(B) < 1e-200:  # exp(B <u, w>) = 1 to 1e-200 (and sqrt(pi / 2|B|) would overflow)
        return _read_only(np.ones(1))
    check_scale(B)
    a = abs(B)
    top = int(a + 40 * math.sqrt(a) + 60)
    orders = np.arange(top + 1, dtype=float)
    if d == 2:
        c = ive(orders, a)
    else:
        c = math.sqrt(math.pi / (2 * a)) * ive(orders + 0.5, a)
    keep = np.flatnonzero(c > 1e-300 * c[0])
    c = c[: keep[-1] + 1]
    if B < 0:
        c = c * (-1.0) ** np.arange(c.size)
    return _read_only(c)


def _read_only(a: np.ndarray) -> np.ndarray:
    """a, made read-only: the cache hands out the same array to every caller."""
    a.setflags(write=False)
    return a


@lru_cache(maxsize=64)
def tail(B: float, d: int) -> np.ndarray:
    """T (K_max + 1,): T[K] bounds |exp(B <u, w> - |B|) - its expansion to order K| for all
    unit u, w: the sum over the orders above K of |c_k| (circle: twice, for k and -k) or
    (2 l + 1) |c_l| (S^2), since |cos| and |P_l| are at most 1."""
    c = np.abs(coefficients(B, d))
    per_order = (2 * np.arange(c.size) + 1) * c if d == 3 else np.where(
        np.arange(c.size) > 0, 2 * c, c)
    from_order = np.cumsum(per_order[::-1])[::-1]  # sum over the orders >= K
    return _read_only(np.concatenate([from_order[1:], [0.0]]))  # beyond: 1e-300 of c_0


def order(B: float, d: int, tol: float) -> int:
    """K: the least order whose tail T(K) is at most tol * ETA."""
    return int(np.argmax(tail(B, d) <= tol * ETA))


def features(B: float, d: int, tol: float = DEFAULT_TOL) -> int:
    """H: the harmonic features per token at score scale B on S^{d-1} (2K + 1 on the circle,
    (K + 1)^2 on S^2): the kernel's cost per token is proportional to H."""
    return _harmonic.feature_count(d, order(B, d, tol))


# ---------------------------------------------------------------------- applicability
def check_scale(B: float) -> float:
    """B, refused when |B| > MAX_B (module docstring)."""
    if not abs(B) <= MAX_B:
        raise fail("beta", f"a score scale |beta a b| <= {MAX_B:g} for the harmonic kernel "
                   "(its order grows like sqrt|B|, its coefficient table like |B|; the "
                   "blocked and dense kernels take any beta)", f"{B:g}")
    return B


def check(q: np.ndarray, k: np.ndarray, mask: Any, bias: Any, normalization: Any,
          beta: float | None = None
          ) -> tuple[MaskSpec, LinearBias | None, Normalization, float, float]:
    """Whether the harmonic kernel applies to a call (at `beta`, when given), with the
    reason when not; returns the canonical mask, bias and normalization and the common norms
    a = |q_i|, b = |k_j|."""
    mask = check_mask(mask)
    if isinstance(mask, np.ndarray):
        raise fail("mask", "'full', 'causal' or ('window', w) for the harmonic kernel (sums "
                   "over prefixes; a boolean array has no such structure)", describe(mask))
    normalization = check_normalization(normalization)
    if isinstance(normalization, tuple):
        raise fail("normalization", "'softmax', 'unnormalised' or 'positional' for the "
                   "harmonic kernel",
                   repr(normalization))
    if bias is not None and not isinstance(bias, LinearBias):
        raise fail("bias", "None or a LinearBias (-slope |i - j|, ALiBi's) for the harmonic "
                   "kernel: an (n, n) array has no prefix structure", describe(np.asarray(bias)))
    for name, x in (("q", q), ("k", k)):
        if x.shape[-1] not in (2, 3) or x.shape[-1] != q.shape[-1]:
            raise fail(name, "queries and keys of one size, 2 (the circle) or 3 (S^2), for the "
                       f"harmonic kernel (Q, K mapping to R^2 or R^3; q has {q.shape[-1]})",
                       describe(x))
    a = _common_norm("q", q)
    b = a if k is q else _common_norm("k", k)
    if beta is not None:
        check_scale(float(beta) * a * b)
    return mask, bias, normalization, a, b


def _norm_range(x: np.ndarray) -> tuple[float, float]:
    """(min, max) of the Euclidean norms of the rows of x (m, d), on the threads."""
    parts: list[tuple[float, float]] = []

    def run(start: int, stop: int) -> None:
        parts.append(_harmonic.norm_range(x[start:stop]))  # list.append: atomic

    parallel_ranges(run, x.shape[0], float(x.size) * 4)
    return min(p[0] for p in parts), max(p[1] for p in parts)


def _ratios(N: np.ndarray, Z: np.ndarray, out: np.ndarray) -> None:
    """out (m, f) = N (m, f) / Z (m,) row by row, on the threads."""
    parallel_ranges(lambda a, z: _harmonic.ratios(N[a:z], Z[a:z], out[a:z]), Z.shape[0],
                    float(N.size) * 8)


def _common_norm(name: str, x: np.ndarray) -> float:
    """The norm every row of x shares (Q or K a multiple of an orthogonal matrix on tokens
    of the sphere), read from its first row; refused when they differ beyond round-off."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.dtype in (np.float32, np.float64) and flat.shape[0]:
        low, top = _norm_range(np.ascontiguousarray(flat))  # one pass, no temporaries
        norms = np.sqrt(np.einsum("i,i->", flat[0], flat[0], dtype=float))[None]
    else:
        norms = np.sqrt(np.einsum("...i,...i->...", flat, flat, dtype=float))
        top, low = float(norms.max()), float(norms.min())
    slack = 64 * np.finfo(x.dtype if np.issubdtype(x.dtype, np.floating) else float).eps
    if top - low > slack * max(top, 1.0):
        which = "Q" if name == "q" else "K"
        raise fail(name, f"rows of one common norm for the harmonic kernel ({which} a multiple "
                   "of an orthogonal matrix, tokens on the sphere)",
                   f"norms from {low:.6g} to {top:.6g}")
    return float(norms[0])  # the first token's: later tokens never change earlier rows


# ---------------------------------------------------------------------- the kernel
def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
    bias: LinearBias | None = None,
    normalization: Normalization = "softmax",
    tol: float = DEFAULT_TOL,
) -> np.ndarray:
    """Masked attention by harmonic moments (module docstring); the contract of
    `attnflow.kernels.dense.attend` for the calls `check` accepts, to within `tol`.

    q, k : (..., n, e) queries and keys, e = 2 or 3, each of one common norm.
    v : (..., n, f) values. beta : any real. Returns (..., n, f) in v's float dtype.
    """
    tol = check_tol(tol)
    if not (isinstance(beta, (int, float, np.number)) and math.isfinite(beta)):
        raise fail("beta", "a finite number", repr(beta))
    n = q.shape[-2]
    for name, x in (("k", k), ("v", v)):
        if x.ndim < 2 or x.shape[-2] != n:
            raise fail(name, f"{n} rows, one per query", describe(x))
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    if not all(np.isfinite(x).all() for x in {id(x): x for x in (q, k, v)}.values()):
        # NaN out, as the other kernels give, so that an integrator reports the state
        shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), n, v.shape[-1])
        return np.full(shape, np.nan, dtype)
    mask, bias, normalization, a, b = check(q, k, mask, bias, normalization, beta)
    N, Z, shift = sums(q, k, v, beta, mask, memory, bias, tol, (a, b))
    if normalization == "softmax" and dtype in (np.float32, np.float64):
        out = np.empty(N.shape, dtype)  # N / Z in one pass over the strided views
        f = N.shape[-1]
        _ratios(N.reshape(-1, f), Z.reshape(-1), out.reshape(-1, f))
        return out
    if normalization == "softmax":
        out = N / Z[..., None]
    else:
        count = (0.0 if memory is None else float(np.exp(memory.log_weights).sum())) + (
            _counts(n, mask, 1.0 if bias is None else math.exp(-bias.slope))
            if normalization == "positional" else n)
        with np.errstate(over="ignore"):
            scale = np.exp(shift - np.log(count))[..., None]
        out = np.where(N == 0, 0.0, N * scale)  # (never 0 * inf)
    return out.astype(dtype, copy=False)


def log_energy(q: np.ndarray, k: np.ndarray, beta: float, tol: float = DEFAULT_TOL
               ) -> np.ndarray:
    """log E_beta = log((1 / (2 beta n^2)) sum_{i,j} exp(beta <q_i, k_j>)) in O(n K)
    (`attnflow.analysis.energy` in O(n^2)): the full mask's normalisers, to within tol.

    q, k : (..., n, e) queries and keys, e = 2 or 3, each of one common norm; beta > 0.
    Returns (...)."""
    tol = check_tol(tol)
    if not (isinstance(beta, (int, float, np.number)) and beta > 0):
        raise fail("beta", "a number > 0 (the energy's 1 / (2 beta))", repr(beta))
    _, _, _, a, b = check(q, k, "full", None, "softmax", beta)
    n = q.shape[-2]
    _, Z, s = sums(q, k, np.zeros((*q.shape[:-1], 0)), beta, "full", None, None, tol, (a, b))
    top = s.max(axis=-1, keepdims=True)  # rows summed directly carry their own shift
    return (top[..., 0] + np.log((Z * np.exp(s - top)).sum(axis=-1))
            - math.log(2.0 * beta * n * n))


def sums(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float, mask: MaskSpec,
         memory: Memory | None, bias: LinearBias | None, tol: float,
         norms: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, float]:
    """(N (..., n, f), Z (..., n), s (..., n)): each row's sum over the keys it sees of
    exp(score - s_i) v_j and of exp(score - s_i), to within tol relative to Z: s_i = |beta a b|
    for the rows summed by harmonics, the row's largest score for those summed directly
    (whose weights exp(score - |B|) may all underflow, e.g. at beta = -700). Inputs as
    checked by `check` (norms: its a, b)."""
    a, b = norms
    B = float(beta) * a * b
    d = q.shape[-1]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n, f = q.shape[-2], v.shape[-1]
    qf = _runs(q, lead)
    kf = qf if k is q else _runs(k, lead)
    K = order(B, d, tol)
    slope = 0.0 if bias is None else bias.slope
    gamma = math.exp(-slope)  # 0.0 from slope 745 on: each row's own key only
    acc = np.zeros((qf.shape[0], n, f + 1))
    affine = (_circle_affine(k, v, b) if d == 2 and mask in ("causal", "full")
              and gamma == 1.0 else None)
    vv = None
    if affine is not None:
        _circle_scan(qf, kf, _circle_coefficients(B, K), kf is qf,
                     mask == "causal", affine, acc)
    else:
        u = _directions(qf, a)
        w = u if kf is qf else _directions(kf, b)
        vv = _values(v, lead, n, f)
        degree = _harmonic.degrees(d, K)
        lam = coefficients(B, d)[degree] * (np.where(degree > 0, 2.0, 1.0) if d == 2 else 1.0)
        _scan(u, w, vv, lam, K, u is w, mask, gamma, acc)
    s = abs(B)
    if memory is not None:
        acc += _memory_sums(qf.astype(float, copy=False), memory, float(beta), s, f)
    count = _counts(n, mask, gamma)
    T = float(tail(B, d)[K])
    Z = acc[..., f]
    bad = _harmonic.beyond_bound(Z, count, T, tol)  # count T > tol Z, NaN-safe
    shift = np.full(acc.shape[:-1], s)
    if bad is not None:
        _direct_rows(acc, shift, bad, qf.astype(float, copy=False),
                     kf.astype(float, copy=False),
                     _values(v, lead, n, f) if vv is None else vv, float(beta), mask, slope,
                     memory)
    acc = acc.reshape(*lead, n, f + 1)
    return acc[..., :f], acc[..., f], shift.reshape(*lead, n)


def _runs(x: np.ndarray, lead: tuple) -> np.ndarray:
    """x (..., n, e) broadcast to the runs `lead` as (R, n, e) in a float dtype (a view
    where it can be)."""
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(float)
    if x.shape[:-2] != lead:
        x = np.broadcast_to(x, (*lead, *x.shape[-2:]))
    return np.ascontiguousarray(x).reshape(-1, *x.shape[-2:])


def _values(v: np.ndarray, lead: tuple, n: int, f: int) -> np.ndarray:
    """(R, n, f + 1): the values as float64 with a column of ones."""
    return np.concatenate([np.broadcast_to(v, (*lead, n, f)).astype(float),
                           np.ones((*lead, n, 1))], axis=-1).reshape(-1, n, f + 1)


def _directions(x: np.ndarray, norm: float) -> np.ndarray:
    """The rows of x as unit float64 vectors, each divided by its own norm (their common
    norm `norm` is in B); any direction where norm = 0 (then B = 0 and only the constant
    harmonic is used)."""
    x = np.asarray(x, dtype=float)
    if norm == 0:
        out = np.zeros_like(x)
        out[..., 0] = 1.0
        return out
    return x / np.sqrt(np.einsum("...i,...i->...", x, x))[..., None]


def _scan(u: np.ndarray, w: np.ndarray, vv: np.ndarray, lam: np.ndarray, K: int, same: bool,
          mask: MaskSpec, gamma: float, acc: np.ndarray) -> None:
    """acc (R, n, F) += each row's harmonic sums (block shares on the threads; the blocks'
    starting moments from a first pass of block totals)."""
    R, n, F = vv.shape
    H = lam.size
    rec = _harmonic.recurrence(u.shape[-1], K)
    blocks = -(-n // BLOCK)
    bounds = [(i * BLOCK, min(n, (i + 1) * BLOCK)) for i in range(blocks)]
    units = [(r, lo, hi) for r in range(R) for lo, hi in bounds]
    cost = float(R) * n * H * F * 8
    window = mask[1] if isinstance(mask, tuple) else 0
    decayed = [gamma ** (hi - lo) for lo, hi in bounds]
    starts = ends = None  # (R, blocks, F, H): moments before each block / after it
    if not window and blocks > 1:
        totals = _totals(w, vv, K, rec, units, gamma, False, cost)
        starts = np.zeros_like(totals)
        for j in range(1, blocks):
            starts[:, j] = starts[:, j - 1] * decayed[j - 1] + totals[:, j - 1]
        if mask == "full" and gamma != 1.0:
            totals = _totals(w, vv, K, rec, units, gamma, True, cost)
            ends = np.zeros_like(totals)
            for j in range(blocks - 2, -1, -1):
                ends[:, j] = totals[:, j + 1] + ends[:, j + 1] * decayed[j + 1]
    whole = None
    if mask == "full" and gamma == 1.0:  # one total of all keys per run
        whole = (starts[:, -1] * decayed[-1] + totals[:, -1] if starts is not None
                 else np.stack([_whole(w[r], vv[r], K, rec, H) for r in range(R)]))

    def run(start: int, stop: int) -> None:
        for r, lo, hi in units[start:stop]:
            j = lo // BLOCK
            if whole is not None:
                _harmonic.apply_total(u[r], lam, K, rec, lo, hi, whole[r], acc[r])
                continue
            S0 = starts[r, j] if starts is not None else np.zeros((F, H))
            _harmonic.forward(u[r], w[r], vv[r], lam, K, rec, same, lo, hi, gamma, window, S0,
                              acc[r])
            if mask == "full":  # gamma < 1: the later keys, decayed the other way
                B0 = ends[r, j] * gamma if ends is not None else np.zeros((F, H))
                _harmonic.backward(u[r], w[r], vv[r], lam, K, rec, lo, hi, gamma, B0, acc[r])

    parallel_ranges(run, len(units), cost)


# A key's norm may differ from the common norm b by this many units of its precision for the
# fused circle path to take v = k as b times the key directions (its error, relative).
AFFINE_SLACK = 16


def _circle_affine(k: np.ndarray, v: np.ndarray, b: float) -> np.ndarray | None:
    """(3, f): the rows a_0, A of v_j = a_0 + A^T w_j (w_j = k_j / |k_j|), where the values
    are the keys themselves (then A = b I) to within AFFINE_SLACK units of k's precision;
    None otherwise (the general path)."""
    if not (v is k or (v.shape == k.shape and v.dtype == k.dtype and np.array_equal(v, k))):
        return None
    if not b > 0:  # keys of norm 0, or below ~1e-162 (whose squares underflow): v is not b w
        return None
    low, top = _norm_range(np.ascontiguousarray(k).reshape(-1, 2))
    if top - low > AFFINE_SLACK * np.finfo(k.dtype if k.dtype.kind == "f" else float).eps * top:
        return None
    return np.array([[0.0, 0.0], [b, 0.0], [0.0, b]])


@lru_cache(maxsize=64)
def _circle_coefficients(B: float, K: int) -> np.ndarray:
    """(rows, 12) the fused circle path's weights (`_circle.rows`) from the circle
    expansion's c_0..c_K at score scale B: for each row of ORDERS orders m, those of Z's a_m
    (c_0, 2 c_1, .., 2 c_K, 0), of Re(N conj q)'s a_m, c_{m-1} + c_{m+1}, and of its b_m,
    c_{m-1} - c_{m+1} (c_{-1} = c_1; 0 beyond K; b_0 = 0), zero past order K + 1."""
    c = coefficients(B, 2)[: K + 1]
    ext = np.zeros(K + 3)  # c_{m-1} at m + 0: c_{-1}, c_0, .., c_K, 0
    ext[1:K + 2] = c
    ext[0] = c[1] if K >= 1 else 0.0
    above = np.zeros(K + 2)  # c_{m+1}
    above[: K] = c[1:]
    below = ext[: K + 2]
    rows = -(-(K + 2) // _circle.ORDERS)
    out = np.zeros((3, rows * _circle.ORDERS))
    out[0, : K + 1] = c * np.where(np.arange(K + 1) > 0, 2.0, 1.0)
    out[1, : K + 2] = below + above
    out[2, : K + 2] = below - above
    out[1, 0] = ext[0]  # m = 0: only k = -1
    out[2, 0] = 0.0
    return _read_only(np.ascontiguousarray(out.reshape(3, rows, _circle.ORDERS)
                                           .transpose(1, 0, 2).reshape(rows, 3 * _circle.ORDERS)))


@lru_cache(maxsize=64)
def _circle_segments(R: int, n: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(m, runs, starts, lens), each (packs, LANES): the fused circle path's segments, m per
    run of n rows, segment s of run r in lane (r m + s) of the packs of LANES (lanes past the
    last segment have no rows). m depends on n alone, so that a run's result does not depend
    on the runs beside it (ensemble pieces, `attnflow.ensembles`) nor on the threads: one
    segment per SEGMENT_ROWS rows, at most SEGMENTS."""
    m = max(1, min(SEGMENTS, n // SEGMENT_ROWS))
    lanes = _circle.LANES
    cuts = (np.arange(m + 1) * n) // m
    packs = -(-R * m // lanes)
    runs, starts, lens = (np.zeros(packs * lanes, np.int64) for _ in range(3))
    runs[: R * m] = np.repeat(np.arange(R), m)
    starts[: R * m] = np.tile(cuts[:-1], R)
    lens[: R * m] = np.tile(np.diff(cuts), R)
    return m, *(_read_only(a.reshape(packs, lanes)) for a in (runs, starts, lens))


def _circle_scan(q: np.ndarray, k: np.ndarray, coef: np.ndarray, same: bool, causal: bool,
                 affine: np.ndarray, acc: np.ndarray) -> None:
    """acc (R, n, f + 1) += each row's sums by the fused circle path (`_circle`), keys
    j <= i (causal) or all. The runs are cut into segments (`_circle_segments`); the threads
    first sum every segment's moments (`_circle.totals`; not needed when causal and each
    segment is a whole run), then run the packs' rows (`_circle.rows`), each lane from the
    moments of its run's segments before its own (causal) or of all of them (full)."""
    R, n, _ = q.shape
    lanes = _circle.LANES
    m, runs, starts, lens = _circle_segments(R, n)
    packs = runs.shape[0]
    orders = coef.shape[0] * _circle.ORDERS
    cost = float(R) * n * orders * 16
    S0 = np.zeros((packs * lanes, 2, orders))  # each segment's starting moments
    if m > 1 or not causal:
        parts = np.zeros_like(S0)  # each segment's own

        def sums_of_segments(start: int, stop: int) -> None:
            for p in range(start, stop):
                _circle.totals(k, runs[p], starts[p], lens[p], coef.shape[0],
                               parts[p * lanes:(p + 1) * lanes])

        parallel_ranges(sums_of_segments, packs, cost / 3)
        seg = parts[: R * m].reshape(R, m, 2, orders)
        before = S0[: R * m].reshape(R, m, 2, orders)
        if causal:  # the segments before each one (never its own or a later one), in order
            for s in range(1, m):  # (np.cumsum over this axis: 4x slower at R = 64, m = 31)
                np.add(before[:, s - 1], seg[:, s - 1], out=before[:, s])
        else:
            before[:] = seg.sum(axis=1, keepdims=True)

    def run(start: int, stop: int) -> None:
        for p in range(start, stop):
            _circle.rows(q, k, coef, same, causal, runs[p], starts[p], lens[p],
                         S0[p * lanes:(p + 1) * lanes], affine, acc)

    parallel_ranges(run, packs, cost)


def _totals(w: np.ndarray, vv: np.ndarray, K: int, rec: np.ndarray, units: list,
            gamma: float, reverse: bool, cost: float) -> np.ndarray:
    """(R, blocks, F, H): each block's moments, decayed to its last (first, reverse) key."""
    R, n, F = vv.shape
    blocks = len(units) // R
    out = np.zeros((R, blocks, F, _harmonic.feature_count(w.shape[-1], K)))

    def run(start: int, stop: int) -> None:
        for r, lo, hi in units[start:stop]:
            _harmonic.block_totals(w[r], vv[r], K, rec, lo, hi, gamma, reverse, out[r, lo // BLOCK])

    parallel_ranges(run, len(units), cost / 2)
    return out


def _whole(w: np.ndarray, vv: np.ndarray, K: int, rec: np.ndarray, H: int) -> np.ndarray:
    T = np.zeros((vv.shape[-1], H))
    _harmonic.block_totals(w, vv, K, rec, 0, w.shape[0], 1.0, False, T)
    return T


def _counts(n: int, mask: MaskSpec, gamma: float) -> np.ndarray:
    """(n,) each row's decayed number of keys: sum over the keys it sees of gamma^|i - j|."""
    if gamma == 1.0 and mask == "causal":  # one pass each, for n = 1e6 per field evaluation
        return np.arange(1.0, n + 1.0)
    if gamma == 1.0 and mask == "full":
        return np.full(n, float(n))
    i = np.arange(n, dtype=float)
    before = np.minimum(i + 1, mask[1]) if isinstance(mask, tuple) else i + 1  # j <= i
    after = n - 1 - i if mask == "full" else np.zeros(n)  # j > i
    if gamma == 1.0:
        return before + after
    return ((1 - gamma ** before) + gamma * (1 - gamma ** after)) / (1 - gamma)


def _memory_sums(q: np.ndarray, memory: Memory, beta: float, s: float, f: int) -> np.ndarray:
    """(R, n, F): sum over the memory keys of exp(beta <q_i, k_m> + log a_m - s) (v_m, 1)."""
    scores = beta * (q @ np.asarray(memory.k, float).T) + np.asarray(memory.log_weights, float)
    with np.errstate(over="ignore"):
        wts = np.exp(scores - s)
    mv = np.concatenate([np.asarray(memory.v, float), np.ones((memory.v.shape[0], 1))], axis=1)
    return wts @ mv


def _direct_rows(acc: np.ndarray, shift: np.ndarray, bad: np.ndarray, q: np.ndarray,
                 k: np.ndarray, vv: np.ndarray, beta: float, mask: MaskSpec, slope: float,
                 memory: Memory | None) -> None:
    """Replace the rows marked `bad` (R, n) of acc by their direct sums, each shifted by its
    largest score (recorded in `shift`) (module docstring): O(n) per row, compiled."""
    n, F = q.shape[1], vv.shape[-1]
    runs, rows = np.nonzero(bad)
    i = rows.astype(np.int64)
    lo = np.zeros_like(i) if mask in ("full", "causal") else np.maximum(0, i - mask[1] + 1)
    hi = np.full_like(i, n) if mask == "full" else i + 1
    if memory is None:
        mk, mv, mlog = np.zeros((0, q.shape[-1])), np.zeros((0, F)), np.zeros(0)
    else:
        mk = np.asarray(memory.k, float)
        mv = np.concatenate([np.asarray(memory.v, float), np.ones((len(mk), 1))], axis=1)
        mlog = np.asarray(memory.log_weights, float)
    _harmonic.direct_rows(q, k, vv, float(beta), float(slope), runs.astype(np.int64), i, lo,
                          hi, mk, mv, mlog, acc, shift)
