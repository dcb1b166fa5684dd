"""The fused attention-dynamics kernel in Triton, for small heads (d = 2..16) on a GPU
(optional extra ``attnflow[gpu]``; triton is imported on the first call).

One pass per block of queries of one run computes the scores, the online (streaming)
softmax, the weighted sum of the values and, when asked, the tangent projection of the
output, out_i - <out_i, x_i> x_i, without ever holding the n x n scores:

    s_ij = beta <q_i, k_j> (+ bias_ij; memory keys: beta <q_i, k_m> + log a_m),
    out_i = sum_j exp(s_ij - M_i) v_j / sum_j exp(s_ij - M_i)          (docs/science.md §1)

with M_i the running maximum over the key blocks seen so far (any beta, of either sign).
Masks "full", "causal", ("window", w) are bands (a causal row block visits only its keys
up to the diagonal, a window's only the last w); a boolean (n, n) array becomes an additive
0 / -inf bias over the full band. Memory tokens are extra keys with log-weights. Scores are
summed column by column over the head size (no padding of q and k); v and the output are
padded to a power of two inside the kernel, never by the caller. float32 and float64 are
computed in their own dtype; weights are 2^(s log2 e - M) (beta log2 e folded into q).

On CUDA tensors the program is compiled; on CPU tensors it runs in Triton's interpreter,
which must be selected by TRITON_INTERPRET=1 before the first call (tests, and
``benchmarks/gpu.py --device cpu``): slow, for checking only.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from attnflow._checks import describe, fail
from attnflow.kernels.masks import MaskSpec, check_mask
from attnflow.kernels.types import Memory

__all__ = ["MIN_HEAD", "MAX_HEAD_CHOSEN", "attend_or_sdpa", "available", "attend_tensor",
           "covers"]

LOG2E = 1.4426950408889634
MAX_HEAD = 64  # beyond this the column-by-column scores lose to a matrix unit (SDPA)
# Head sizes `attnflow.kernels.auto.choose_tensor` gives to this kernel on CUDA (below 2 and
# above 16 SDPA, padded to 8 columns, keeps them).
MIN_HEAD, MAX_HEAD_CHOSEN = 2, 16


def available() -> bool:
    """True when triton can be imported (the optional extra ``attnflow[gpu]``)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _program() -> Any:
    """The Triton program (`attnflow.kernels._triton_attend`), imported on first use; refused
    when it would be interpreted by a triton imported before TRITON_INTERPRET was set (whose
    own functions were then compiled, not interpreted: Triton fails obscurely)."""
    try:
        import triton.language as tl

        from attnflow.kernels import _triton_attend
    except ImportError as err:
        raise ImportError("the Triton kernels need triton: pip install 'attnflow[gpu]' "
                          f"({err})") from None
    interpreted = type(_triton_attend.attend_kernel).__name__ == "InterpretedFunction"
    if interpreted and type(tl.zeros).__name__ != "InterpretedFunction":
        raise RuntimeError("TRITON_INTERPRET=1 was set after triton was first imported: set it "
                           "before (Triton reads it when it loads)")
    return _triton_attend


def attend_tensor(q: Any, k: Any, v: Any, beta: float, mask: MaskSpec,
                  memory: Memory | None = None, bias: Any = None, *,
                  tangent: Any = None, block_m: int | None = None,
                  block_n: int | None = None, num_warps: int | None = None) -> Any:
    """Masked softmax attention on torch tensors, fused in one Triton pass.

    q, k : (..., n, e) queries and keys, e <= 64 (2..16 is what it is for).
    v : (..., n, f) values, f <= 64. Leading axes (runs) broadcast.
    beta : a finite real (either sign, or 0). mask : "full", "causal", ("window", w) or a
        boolean (n, n) array. memory : optional keys (m, e), values (m, f), log-weights (m,).
    bias : optional (n, n) score bias (finite or -inf; numpy or torch).
    tangent : optional points x (..., n, f): the output is projected onto their tangent
        spaces, out - <out, x> x (x unit: the sphere's field P_x(attention)).
    block_m, block_n, num_warps : queries and keys per block (powers of two >= 16, block_n
        dividing block_m) and warps per program; defaults from n, the head and the dtype
        (`_blocks`).

    Returns (..., n, f) on q's device, in q's dtype (float32 or float64; k, v and tangent in
    the same dtype and on the same device).
    """
    import torch

    if not (isinstance(beta, (int, float, np.number)) and math.isfinite(beta)):
        raise fail("beta", "a finite number for the Triton kernel (hardmax: another kernel)",
                   repr(beta))
    mask = check_mask(mask)
    _check_tensors(q, k, v, tangent)
    n, e, f = q.shape[-2], q.shape[-1], v.shape[-1]
    if q.device.type != "cuda" and not _interpreted():
        raise fail("q", "a CUDA tensor for the Triton kernel (or TRITON_INTERPRET=1 set before "
                   "the first call, to run Triton's interpreter on the CPU)", str(q.device))
    program = _program()
    dtype, device = q.dtype, q.device
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                  *(() if tangent is None else (tangent.shape[:-2],)))
    runs = math.prod(lead)
    flat = lambda a: a.expand(*lead, *a.shape[-2:]).reshape(runs, *a.shape[-2:])  # noqa: E731
    qs = flat(q * (float(beta) * LOG2E)).contiguous()  # beta and log2 e folded into q
    ks = flat(k).contiguous()
    vs = flat(v).contiguous()
    xs = vs if tangent is None else flat(tangent).contiguous()
    out = torch.empty((runs, n, f), dtype=dtype, device=device)

    code = ({"full": program.FULL, "causal": program.CAUSAL}.get(mask, program.WINDOW)
            if not isinstance(mask, np.ndarray) else program.FULL).value
    window = mask[1] if isinstance(mask, tuple) else 0
    bias_t = _bias(bias, mask, n, dtype, device)
    mk, mv, mlog = _memory(memory, e, f, dtype, device)
    plain = code != program.WINDOW.value and bias_t is None
    bm, bn, num_warps = _blocks(n, e, f, dtype, plain, q.device.type == "cuda", block_m,
                                block_n, num_warps)
    if bm % bn:
        raise fail("block_n", f"a divisor of block_m = {bm} (key blocks aligned with the "
                   "diagonal)", repr(bn))
    blocks = -(-n // bm)
    if runs and n:
        program.attend_kernel[(runs * blocks,)](
            qs, ks, vs, xs, out, bias_t if bias_t is not None else qs, mk, mv, mlog,
            n, mk.shape[0] if memory is not None else 0, window, blocks,
            qs.stride(0), qs.stride(1), ks.stride(0), ks.stride(1), vs.stride(0),
            vs.stride(1), xs.stride(0), xs.stride(1), out.stride(0), out.stride(1),
            MASK=code, HAS_BIAS=bias_t is not None, PROJECT=tangent is not None,
            E=e, F=f, FP=_next_power_of_2(f), BLOCK_M=bm, BLOCK_N=bn, num_warps=num_warps)
    return out.reshape(*lead, n, f)


def covers(x: Any, e: int, f: int, bias: Any = None, normalization: Any = "softmax",
           beta: Any = None) -> bool:
    """Whether `attend_or_sdpa` may run calls on tokens like x (..., n, d) with heads of
    sizes e, f, this score bias (None, an array, or a LinearBias of a number) and canonical
    normalization on the Triton kernel: CUDA float32/float64 tokens, MIN_HEAD <= e, f <=
    MAX_HEAD_CHOSEN, softmax at a finite beta of either kind, and triton importable."""
    import torch

    from attnflow.kernels.options import LinearBias

    if isinstance(bias, LinearBias):
        bias = bias.slope
    return (x.device.type == "cuda" and x.dtype in (torch.float32, torch.float64)
            and MIN_HEAD <= min(e, f) and max(e, f) <= MAX_HEAD_CHOSEN
            and normalization == "softmax" and not isinstance(bias, torch.Tensor)
            and (isinstance(beta, torch.Tensor) or beta is None or math.isfinite(beta))
            and available())


def attend_or_sdpa(q: Any, k: Any, v: Any, beta: Any, mask: MaskSpec,
                   memory: Memory | None = None, bias: Any = None,
                   normalization: Any = "softmax") -> Any:
    """The `Kernel` contract of `attnflow.kernels.torch.attend_tensor` on the tensors' device:
    the Triton kernel (`attend_tensor`) for calls that take no gradient (grad mode off, or no
    input requiring one), torch's SDPA (`attnflow.kernels.torch.attend_tensor`, with its
    backward) for those that do, and for tensors of torch.func transforms or forward-mode AD:
    this kernel has no backward. What
    `attnflow.kernels.auto.choose_tensor` gives CUDA tokens with heads of 2 to 16."""
    import torch

    from attnflow.kernels import torch as torch_kernel
    from attnflow.kernels.fused_torch import plain_tensors
    from attnflow.kernels.options import LinearBias

    inputs = (q, k, v, beta, *(memory or ()))
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in inputs)
    if (grad or not plain_tensors(*inputs) or normalization != "softmax"
            or isinstance(bias, torch.Tensor)
            or (isinstance(bias, LinearBias) and isinstance(bias.slope, torch.Tensor))):
        return torch_kernel.attend_tensor(q, k, v, beta, mask, memory, bias, normalization)
    if isinstance(bias, LinearBias):
        bias = bias.matrix(q.shape[-2])
    if isinstance(beta, torch.Tensor):
        beta = float(beta)
    return attend_tensor(q, k, v, beta, mask, memory, bias)


def _blocks(n: int, e: int, f: int, dtype: Any, plain: bool, cuda: bool, block_m: int | None,
            block_n: int | None, num_warps: int | None) -> tuple[int, int, int]:
    """(block_m, block_n, num_warps), the caller's where given. On a GPU: 64 x 64 with 8 warps
    for float32 heads up to 4 without window or bias (`plain`), else 32 x 32 with 4
    (compiled for sm_90 with triton 3.9: 176 to 255 and 164 to 246 registers a thread, no
    spills; 64 x 64 with 4 warps spilled, and with 8 for a window with a bias); in the
    interpreter, whose cost is per block operation, up to 256 x 256. Never above n's power
    of two (at least 16)."""
    import torch

    if not cuda:
        bm, bn, warps = 256, 256, 4
    elif dtype == torch.float32 and max(e, f) <= 4 and plain:
        bm, bn, warps = 64, 64, 8
    else:
        bm, bn, warps = 32, 32, 4
    top = max(16, _next_power_of_2(n))
    return block_m or min(bm, top), block_n or min(bn, top), num_warps or warps


def _next_power_of_2(x: int) -> int:
    """The least power of two >= x (>= 1)."""
    return 1 << max(0, int(x) - 1).bit_length()


def _interpreted() -> bool:
    """True when Triton runs its interpreter (TRITON_INTERPRET=1 when the program was, or will
    be, loaded)."""
    import sys

    loaded = sys.modules.get("attnflow.kernels._triton_attend")
    if loaded is not None:
        return type(loaded.attend_kernel).__name__ == "InterpretedFunction"
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_tensors(q: Any, k: Any, v: Any, tangent: Any) -> None:
    """q, k, v (and tangent) torch tensors of one float dtype on one device, with the shapes
    of `attend_tensor`."""
    import torch

    named = (("q", q), ("k", k), ("v", v)) + ((("tangent", tangent),) if tangent is not None
                                              else ())
    for name, a in named:
        if not isinstance(a, torch.Tensor) or a.ndim < 2:
            raise fail(name, "a torch tensor (..., n, .)", describe(a))
        if a.dtype not in (torch.float32, torch.float64) or a.dtype != q.dtype:
            raise fail(name, f"float32 or float64, the dtype of q ({q.dtype})", str(a.dtype))
        if a.device != q.device:
            raise fail(name, f"a tensor on q's device ({q.device})", str(a.device))
    n, e = q.shape[-2], q.shape[-1]
    if k.shape[-2:] != (n, e):
        raise fail("k", f"(..., {n}, {e}), the shape of q's rows", tuple(k.shape))
    if v.shape[-2] != n:
        raise fail("v", f"(..., {n}, f), one row per query", tuple(v.shape))
    if not (1 <= e <= MAX_HEAD and 1 <= v.shape[-1] <= MAX_HEAD):
        raise fail("q", f"head sizes 1..{MAX_HEAD} for the Triton kernel (larger: SDPA)",
                   f"e = {e}, f = {v.shape[-1]}")
    if tangent is not None and tangent.shape[-2:] != v.shape[-2:]:
        raise fail("tangent", f"(..., {n}, {v.shape[-1]}), the shape of v's rows",
                   tuple(tangent.shape))


def _bias(bias: Any, mask: MaskSpec, n: int, dtype: Any, device: Any) -> Any:
    """The (n, n) additive score bias in base-2 units on the device, with a boolean mask
    array's forbidden entries at -inf; None when there is neither."""
    import torch

    if bias is None and not isinstance(mask, np.ndarray):
        return None
    if bias is None:
        b = torch.zeros((n, n), dtype=dtype, device=device)
    else:
        b = torch.as_tensor(np.asarray(bias) if not isinstance(bias, torch.Tensor) else bias,
                            dtype=dtype, device=device)
        if b.shape != (n, n):
            raise fail("bias", f"an ({n}, {n}) score bias", tuple(b.shape))
        b = b * LOG2E
    if isinstance(mask, np.ndarray):
        if mask.shape != (n, n):
            raise fail("mask", f"a boolean ({n}, {n}) array for n = {n} tokens", describe(mask))
        b = b.masked_fill(~torch.as_tensor(mask, device=device), -torch.inf)
    return b.contiguous()


def _memory(memory: Memory | None, e: int, f: int, dtype: Any, device: Any
            ) -> tuple[Any, Any, Any]:
    """The memory keys (m, e), values (m, f) and log-weights in base 2 (m,) on the device
    (one row of zeros when there is no memory: the program reads none of it)."""
    import torch

    as_t = lambda a: torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a,  # noqa: E731
                                     dtype=dtype, device=device).contiguous()
    if memory is None:
        return (torch.zeros((1, e), dtype=dtype, device=device),
                torch.zeros((1, f), dtype=dtype, device=device),
                torch.zeros(1, dtype=dtype, device=device))
    mk, mv, mlog = as_t(memory.k), as_t(memory.v), as_t(memory.log_weights)
    m = mlog.shape[0]
    if mk.shape != (m, e) or mv.shape != (m, f) or mlog.ndim != 1:
        raise fail("memory", f"keys (m, {e}), values (m, {f}) and log-weights (m,)",
                   f"{tuple(mk.shape)}, {tuple(mv.shape)}, {tuple(mlog.shape)}")
    return mk, mv, mlog * LOG2E
