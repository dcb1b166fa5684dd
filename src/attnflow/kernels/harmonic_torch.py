"""The harmonic kernels on torch tensors: attention on the circle and on S^2 in O(n K) on the
tensors' device (a GPU), with prefix sums by torch.cumsum (optional extra ``attnflow[torch]``).

The same expansion as `attnflow.kernels.harmonic` (docs/science.md §10): with every query of
one norm a and every key of one norm b, exp(B <u_i, w_j> - |B|), B = beta a b, is
sum_h lam_h phi_h(u_i) phi_h(w_j) up to a tail T(K) per pair (Jacobi-Anger on the circle,
2K + 1 features; the addition theorem on S^2, (K + 1)^2 features); the order K, the
coefficients and the tail bound are that module's (`order`, `coefficients`, `tail`), so both
kernels truncate alike. A row's sums over the keys it sees are sum_h lam_h phi_h(u_i) S_h(i)
with the moments S(i) = sum_j phi(w_j) (v_j, 1)^T over those keys: one total for the full
mask, prefix sums for the causal mask. After the sums every row's bound count_i T(K) / Z_i is
checked against tol, and the rows that fail (a query far from every key it sees) are summed
directly, as in the numpy kernel, so every row's output errs by at most 2 tol max|v| plus
round-off.

Round-off: the prefix sums are two-level, torch.cumsum within blocks of SCAN_BLOCK rows, then
over the blocks' totals (the running total carried across the chunks of rows that bound the
memory), in place; a row's moments thus err by about (SCAN_BLOCK + n / SCAN_BLOCK) eps
sum|terms| (at n = 10^7: 1e4 eps, 2e-12 of the sum) where the numpy kernel's compensated
running sums do not grow with n. Per chunk the moments are written once, scanned in place
and read once by a batched matrix-vector product (about six passes over R c F H float64).

Applies to masks "full" and "causal", softmax weights, beta of either sign or zero, memory
tokens (summed directly); computed in float64 on the device, returned in v's dtype. Torch
autograd differentiates it (the in-place scans included): gradients with respect to the
directions and the values match finite differences (tests/test_harmonic_torch.py).
Refused with the reason: windows, score biases, other normalizations (use the numpy kernel,
`attnflow.kernels.harmonic`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnflow._checks import describe, fail
from attnflow.kernels import _harmonic
from attnflow.kernels.harmonic import DEFAULT_TOL, check_tol, coefficients, order, tail
from attnflow.kernels.masks import MaskSpec, check_mask
from attnflow.kernels.types import Memory

__all__ = ["SCAN_BLOCK", "attend_tensor", "features"]

SCAN_BLOCK = 1024  # rows of one block of the two-level prefix sums (module docstring)
CHUNK_ELEMENTS = 2**27  # float64 numbers of one chunk's moments (1 GiB): bounds the memory
DIRECT_ELEMENTS = 2**24  # scores of one batch of directly summed rows


def attend_tensor(q: Any, k: Any, v: Any, beta: float, mask: MaskSpec,
                  memory: Memory | None = None, bias: Any = None, *,
                  tol: float = DEFAULT_TOL) -> Any:
    """Masked softmax attention by harmonic moments on torch tensors (module docstring); the
    contract of `attnflow.kernels.torch.attend_tensor` for the calls it accepts, to within tol.

    q, k : (..., n, e) queries and keys, e = 2 (circle) or 3 (S^2), each of one common norm.
    v : (..., n, f) values; leading axes broadcast. beta : any finite real.
    mask : "full" or "causal". memory : optional keys (m, e), values (m, f), log-weights (m,).
    bias : None only. Returns (..., n, f) on q's device in v's dtype.
    """
    import torch

    tol = check_tol(tol)
    if not (isinstance(beta, (int, float, np.number)) and math.isfinite(beta)):
        raise fail("beta", "a finite number", repr(beta))
    mask = check_mask(mask)
    if not (isinstance(mask, str) and mask in ("full", "causal")):
        raise fail("mask", "'full' or 'causal' for the torch harmonic kernel (windows and mask "
                   "arrays: the numpy kernel attnflow.kernels.harmonic)", describe(mask))
    if bias is not None:
        raise fail("bias", "None for the torch harmonic kernel (ALiBi's LinearBias: the numpy "
                   "kernel attnflow.kernels.harmonic)", describe(bias))
    n, d, f = q.shape[-2], q.shape[-1], v.shape[-1]
    for name, x in (("q", q), ("k", k)):
        if x.shape[-1] not in (2, 3) or x.shape[-1] != d:
            raise fail(name, "queries and keys of one size, 2 (the circle) or 3 (S^2), for the "
                       f"harmonic kernel (q has {d})", tuple(x.shape))
    for name, x in (("k", k), ("v", v)):
        if x.ndim < 2 or x.shape[-2] != n:
            raise fail(name, f"{n} rows, one per query", tuple(x.shape))
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    runs = math.prod(lead)
    flat = lambda x: x.expand(*lead, *x.shape[-2:]).reshape(runs, *x.shape[-2:]).double()  # noqa: E731
    qf = flat(q)
    kf = qf if k is q else flat(k)
    vv = torch.cat([flat(v), torch.ones((runs, n, 1), dtype=torch.float64, device=q.device)], -1)
    if not bool(torch.isfinite(qf).all() & torch.isfinite(kf).all() & torch.isfinite(vv).all()):
        return torch.full((*lead, n, f), math.nan, dtype=v.dtype, device=v.device)
    a, b = (_common_norm(name, x, torch.finfo(given.dtype).eps)
            for name, x, given in (("q", qf, q), ("k", kf, k)))
    B = float(beta) * a * b
    K = order(B, d, tol)
    degree = _harmonic.degrees(d, K)
    lam = coefficients(B, d)[degree] * (np.where(degree > 0, 2.0, 1.0) if d == 2 else 1.0)
    lam = torch.as_tensor(lam, dtype=torch.float64, device=q.device)
    u = _directions(qf, a)
    w = u if kf is qf else _directions(kf, b)
    acc = _total(u, w, vv, lam, K) if mask == "full" else _prefix(u, w, vv, lam, K)
    if memory is not None:
        acc = acc + _memory_sums(qf, memory, float(beta), abs(B))
    count = torch.arange(1, n + 1, dtype=torch.float64, device=q.device) if mask == "causal" \
        else torch.full((n,), float(n), dtype=torch.float64, device=q.device)
    Z = acc[..., f]
    out = acc[..., :f] / Z[..., None]
    bad = ~(count * float(tail(B, d)[K]) <= tol * Z)  # NaN-safe: a non-positive Z fails
    if bool(bad.any()):
        _direct_rows(out, bad, qf, kf, vv, float(beta), mask, memory)
    return out.reshape(*lead, n, f).to(v.dtype)


def features(u: Any, K: int) -> Any:
    """(..., H) the harmonic features phi(u) of unit vectors u (..., d) truncated at order K,
    in the order of `attnflow.kernels._harmonic` (its `degrees`): on the circle (1, cos k t,
    sin k t) for k = 1..K; on S^2 the real spherical harmonics with sum_m Y_lm(u) Y_lm(w) =
    (2l + 1) P_l(<u, w>), from the fully normalised Legendre recurrences times Re, Im
    (x + i y)^m (no division at the poles)."""
    import torch

    if u.shape[-1] == 2:
        one = torch.ones_like(u[..., :1])
        kt = torch.atan2(u[..., 1], u[..., 0])[..., None] * torch.arange(
            1, K + 1, dtype=u.dtype, device=u.device)
        pairs = torch.stack([torch.cos(kt), torch.sin(kt)], -1)  # (..., K, 2): cos, sin
        return torch.cat([one, pairs.reshape(*kt.shape[:-1], 2 * K)], -1)
    rec = _harmonic.recurrence(3, K)
    x, y, t = u[..., 0], u[..., 1], u[..., 2]
    cols = []
    p = 0
    cr, ci = torch.ones_like(x), torch.zeros_like(x)
    for m in range(K + 1):
        if m >= 1:
            cr, ci = cr * x - ci * y, cr * y + ci * x
        a2 = torch.zeros_like(t)
        a1 = torch.full_like(t, rec[p, 0])
        for ell in range(m, K + 1):
            if ell > m:
                a2, a1 = a1, rec[p, 0] * t * a1 - rec[p, 1] * a2
            p += 1
            cols += [a1] if m == 0 else [a1 * cr, a1 * ci]
    return torch.stack(cols, -1)


def _common_norm(name: str, x: Any, eps: float) -> float:
    """The norm every row of x shares, read from its first row; refused when they differ
    beyond the round-off of the given dtype (eps; as `attnflow.kernels.harmonic`)."""
    norms = x.detach().norm(dim=-1).reshape(-1)
    top, low = float(norms.max()), float(norms.min())
    if top - low > 64 * eps * max(top, 1.0):
        which = "Q" if name == "q" else "K"
        raise fail(name, f"rows of one common norm for the harmonic kernel ({which} a multiple "
                   "of an orthogonal matrix, tokens on the sphere)",
                   f"norms from {low:.6g} to {top:.6g}")
    return float(norms[0])


def _directions(x: Any, norm: float) -> Any:
    """The rows of x as unit vectors; the first axis where norm = 0 (then B = 0)."""
    import torch

    if norm == 0:
        out = torch.zeros_like(x)
        out[..., 0] = 1.0
        return out
    return x / x.norm(dim=-1, keepdim=True)


def _chunks(runs: int, n: int, F: int, H: int) -> tuple[range, int]:
    """(the chunks' first rows, rows per chunk): chunks whose moments (runs, rows, F, H) fit
    CHUNK_ELEMENTS, each a whole number of SCAN_BLOCKs."""
    rows = max(SCAN_BLOCK, CHUNK_ELEMENTS // max(1, runs * F * H) // SCAN_BLOCK * SCAN_BLOCK)
    return range(0, n, rows), rows


def _total(u: Any, w: Any, vv: Any, lam: Any, K: int) -> Any:
    """(R, n, F): every row's sums over all keys (the full mask): one total of moments,
    summed and read chunk by chunk of rows (`_chunks`)."""
    import torch

    R, n, F = vv.shape
    starts, rows = _chunks(R, n, F, _harmonic.feature_count(u.shape[-1], K))
    T = sum(torch.einsum("rch,rcf->rfh", features(w[:, lo:lo + rows], K), vv[:, lo:lo + rows])
            for lo in starts)
    out = torch.empty_like(vv)
    for lo in starts:
        g = features(u[:, lo:lo + rows], K) * lam
        out[:, lo:lo + rows] = torch.einsum("rch,rfh->rcf", g, T)
    return out


def _prefix(u: Any, w: Any, vv: Any, lam: Any, K: int) -> Any:
    """(R, n, F): every row's sums over the keys j <= i (the causal mask), by two-level
    prefix sums chunk by chunk, the running total carried between chunks (module docstring)."""
    import torch

    R, n, F = vv.shape
    H = _harmonic.feature_count(u.shape[-1], K)
    starts, rows = _chunks(R, n, F, H)
    out = torch.empty_like(vv)
    carry = torch.zeros((R, F, H), dtype=vv.dtype, device=vv.device)
    for lo in starts:
        hi = min(n, lo + rows)
        fw = features(w[:, lo:hi], K)
        S = vv[:, lo:hi, :, None] * fw[:, :, None, :]  # (R, c, F, H): the keys' terms
        carry = _prefix_sums_(S, carry)  # now the moments S(i)
        g = fw if u is w else features(u[:, lo:hi], K)
        out[:, lo:hi] = torch.matmul(S, (g * lam)[..., None])[..., 0]
    return out


def _prefix_sums_(S: Any, carry: Any) -> Any:
    """Replace the terms S (R, c, F, H) by their inclusive prefix sums along axis 1 plus
    carry (R, F, H), in place: cumsum within blocks of SCAN_BLOCK rows, plus the exclusive
    prefix sums of the blocks' totals (rows past the last whole block: one cumsum). Returns
    the new carry, S's last row."""
    R, c, F, H = S.shape
    whole = c - c % SCAN_BLOCK
    if whole:
        blocks = S[:, :whole].view(R, whole // SCAN_BLOCK, SCAN_BLOCK, F, H)
        blocks.cumsum_(2)
        totals = blocks[:, :, -1]
        before = totals.cumsum(1) - totals + carry[:, None]
        blocks += before[:, :, None]
        carry = S[:, whole - 1]
    if whole < c:
        rest = S[:, whole:]
        rest.cumsum_(1)
        rest += carry[:, None]
    return S[:, c - 1].clone()


def _memory_sums(q: Any, memory: Memory, beta: float, s: float) -> Any:
    """(R, n, F): sum over the memory keys of exp(beta <q_i, k_m> + log a_m - s) (v_m, 1)."""
    import torch

    as_t = lambda a: torch.as_tensor(np.asarray(a, float), device=q.device)  # noqa: E731
    mk, mv, mlog = as_t(memory.k), as_t(memory.v), as_t(memory.log_weights)
    weights = torch.exp(beta * (q @ mk.T) + mlog - s)
    return weights @ torch.cat([mv, torch.ones((mv.shape[0], 1), dtype=mv.dtype,
                                               device=mv.device)], 1)


def _direct_rows(out: Any, bad: Any, q: Any, k: Any, vv: Any, beta: float, mask: str,
                 memory: Memory | None) -> None:
    """Replace the rows marked `bad` (R, n) of out (R, n, f) by their direct softmax sums,
    in batches of DIRECT_ELEMENTS scores (O(n) per row)."""
    import torch

    runs, rows = torch.nonzero(bad, as_tuple=True)
    n, f = q.shape[1], out.shape[-1]
    if memory is not None:
        as_t = lambda a: torch.as_tensor(np.asarray(a, float), device=q.device)  # noqa: E731
        mk, mv, mlog = as_t(memory.k), as_t(memory.v), as_t(memory.log_weights)
    step = max(1, DIRECT_ELEMENTS // n)
    keys = torch.arange(n, device=q.device)
    for lo in range(0, runs.numel(), step):
        r, i = runs[lo:lo + step], rows[lo:lo + step]
        scores = beta * torch.einsum("be,bne->bn", q[r, i], k[r])
        if mask == "causal":
            scores = scores.masked_fill(keys[None, :] > i[:, None], -torch.inf)
        values = vv[r, :, :f]
        if memory is not None:
            scores = torch.cat([scores, beta * (q[r, i] @ mk.T) + mlog], 1)
            values = torch.cat([values, mv.expand(len(r), *mv.shape)], 1)
        out[r, i] = torch.einsum("bn,bnf->bf", torch.softmax(scores, -1), values)
