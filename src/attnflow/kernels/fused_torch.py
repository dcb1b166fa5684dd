"""The fused kernel (numba) on CPU torch tensors, with autograd: forward by
`attnflow.kernels.fused.attend`, backward by `attnflow.kernels.fused_backward` (one pass per
row, never the n x n weights), both on the tensors' memory without copies where they are
contiguous. torch is imported on first call.

`attend_tensor` has the `Kernel` contract of `attnflow.kernels.torch.attend_tensor` for the
calls it covers (`covers`: CPU float32/float64 tensors, heads up to MAX_HEAD, softmax at a
finite beta, masks "causal", "full", ("window", w) and boolean arrays, memory, a score bias
as an array or ALiBi's `LinearBias`); gradients reach q, k, v, beta (a 0-d tensor), the
memory keys, values and log-weights, and a LinearBias slope given as a tensor. Calls it
does not cover go to SDPA (`attnflow.kernels.torch.attend_tensor`) unchanged, as do calls on
tensors of torch.func transforms or forward-mode AD (dual tensors), which have no storage
for numba to read. A double backward (create_graph=True) is refused: SDPA has it
(backend="torch").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnflow._array import is_tensor, like
from attnflow.kernels import fused, fused_backward
from attnflow.kernels import torch as torch_kernel
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.options import LinearBias
from attnflow.kernels.types import Memory, Normalization

__all__ = ["MAX_HEAD", "attend_tensor", "covers", "plain_tensors"]

MAX_HEAD = 16  # head sizes e, f up to which the fused kernel's unrolled loops pay (auto.py)
DOUBLE_BACKWARD = ("create_graph: a second derivative through the fused CPU kernel is not "
                   "implemented; the SDPA path has it: pass backend='torch' to the attention")


def covers(x: Any, e: int, f: int, bias: Any = None, normalization: Normalization = "softmax",
           beta: Any = None) -> bool:
    """Whether `attend_tensor` computes calls on tokens like x (..., n, d) with heads of sizes
    e (queries, keys) and f (values), this score bias and normalization (canonical) and beta
    itself (else it passes them to SDPA)."""
    import torch

    if not (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and max(e, f) <= MAX_HEAD and normalization == "softmax"):
        return False
    if is_tensor(beta):
        if beta.device.type != "cpu":
            return False
    elif beta is not None and not math.isfinite(beta):
        return False
    if isinstance(bias, LinearBias):
        return not is_tensor(bias.slope) or bias.slope.device.type == "cpu"
    return bias is None or not is_tensor(bias) or not bias.requires_grad


def attend_tensor(q: Any, k: Any, v: Any, beta: Any, mask: MaskSpec,
                  memory: Memory | None = None, bias: Any = None,
                  normalization: Normalization = "softmax") -> Any:
    """Masked softmax attention on CPU tensors q, k (..., n, e), v (..., n, f) by the fused
    kernel, with its fused backward (module docstring); returns (..., n, f) in q's dtype.
    Calls it does not cover go to `attnflow.kernels.torch.attend_tensor`."""
    import torch

    if not (covers(q, q.shape[-1], v.shape[-1], bias, normalization, beta)
            and plain_tensors(q, k, v, beta, bias, *(memory or ()))):
        return torch_kernel.attend_tensor(q, k, v, beta, mask, memory, bias, normalization)
    if is_tensor(beta):  # a tensor beta stays in the graph: it scales q (autograd's product)
        q, beta = q * beta, 1.0
    slope, fixed = None, bias
    if isinstance(bias, LinearBias):
        slope = like(bias.slope, q) if is_tensor(bias.slope) else None
        fixed = LinearBias(float(bias.slope.detach()) if is_tensor(bias.slope) else bias.slope)
    elif is_tensor(bias):
        fixed = bias.detach().numpy()
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    runs = math.prod(lead)
    n, f = q.shape[-2], v.shape[-1]
    q, k, v = (a.to(q.dtype).expand(*lead, *a.shape[-2:]).reshape(runs, *a.shape[-2:])
               .contiguous() for a in (q, k, v))
    mem = (None, None, None) if memory is None else tuple(like(a, q) for a in memory)
    out = _FusedAttention.apply(q, k, v, *mem, slope, float(beta), mask, fixed)
    return out.reshape(*lead, n, f)


def plain_tensors(*tensors: Any) -> bool:
    """Whether every tensor among `tensors` is an ordinary one with storage: not wrapped by a
    torch.func transform, not a dual tensor of forward-mode AD."""
    import torch
    from torch.autograd.forward_ad import unpack_dual

    return not any(is_tensor(t) and (torch._C._functorch.is_functorch_wrapped_tensor(t)
                                     or unpack_dual(t).tangent is not None)
                   for t in tensors)


def _numpy(a: Any) -> np.ndarray:
    """The values of a CPU tensor as a numpy array (its memory when contiguous)."""
    return a.detach().numpy()


def _autograd_function() -> Any:
    """The torch.autograd.Function of the fused kernel (defined on first use: torch stays an
    optional import of this module)."""
    import torch

    class FusedAttention(torch.autograd.Function):
        """softmax(beta q k^T + bias) v by the fused kernel, its VJP by the fused backward."""

        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, mem_k: Any, mem_v: Any, log_w: Any,
                    slope: Any, beta: float, mask: MaskSpec, bias: Any) -> Any:
            qn = _numpy(q)
            memory = None if mem_k is None else Memory(*(_numpy(a) for a in (mem_k, mem_v,
                                                                              log_w)))
            mem_np = memory or (np.zeros((0, q.shape[-1]), qn.dtype),
                                np.zeros((0, v.shape[-1]), qn.dtype), np.zeros(0, qn.dtype))
            out, lse = (torch.from_numpy(a) for a in fused.attend_lse(
                qn, _numpy(k), _numpy(v), beta, mask, memory, bias))
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.extra = (mem_np, slope is not None, beta, mask,
                         bias.matrix(q.shape[-2]) if isinstance(bias, LinearBias) else bias)
            return out

        @staticmethod
        def backward(ctx: Any, g: Any) -> tuple[Any, ...]:
            if torch.is_grad_enabled():
                raise RuntimeError(DOUBLE_BACKWARD)
            q, k, v, out, lse = ctx.saved_tensors
            (mem_k, mem_v, log_w), slope, beta, mask, bias = ctx.extra
            grads = fused_backward.attend_backward(
                _numpy(q), _numpy(k), _numpy(v), _numpy(out), _numpy(lse), _numpy(g.contiguous()),
                beta,
                mask, mem_k, mem_v, log_w, bias, slope=slope)
            dq, dk, dv, dmk, dmv, dmw, dslope = (torch.from_numpy(np.asarray(a)) for a in grads)
            has_memory = len(log_w) > 0
            return (dq, dk, dv, *((dmk, dmv, dmw) if has_memory else (None,) * 3),
                    dslope if slope else None, None, None, None)

    return FusedAttention


class _Lazy:
    """`_FusedAttention.apply`, the class built on first use."""

    cls: Any = None

    def apply(self, *args: Any) -> Any:
        if _Lazy.cls is None:
            _Lazy.cls = _autograd_function()
        return _Lazy.cls.apply(*args)


_FusedAttention = _Lazy()
