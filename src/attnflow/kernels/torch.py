"""Attention through torch: CPU threads, or a CUDA device when present (optional extra
``attnflow[torch]``).

`attend_tensor` works on torch tensors where they are, with autograd: it is the kernel
`attnflow.kernels.auto.choose_tensor` gives to tensor tokens (`attnflow.simulate` on a
device); `attend` is the kernel registered as backend "torch" (numpy in, numpy out; tensors
go to `attend_tensor`). Softmax uses `torch.nn.functional.scaled_dot_product_attention`
with scale = beta: with ``is_causal`` for the causal and full masks without memory
(torch's fused kernels then never hold the n x n scores), and otherwise with an additive
float mask over the n + m keys (the score bias, or 0, where allowed, -inf elsewhere, log a_j
for the memory columns), which holds (n, n + m) numbers: for long sequences with such masks
use the "blocked" kernel.
Every call goes to torch as (batch, 1, n, .) tensors: with fewer axes torch's CPU SDPA takes
its math path, which holds the n x n scores (measured at n = 4096, d = 64, float32,
two threads: 0.8-0.9 s for (n, d) and (1, n, d) tensors, 0.11 s for (1, 1, n, d); at
n = 16 384, 33 s and 3.5 GB against 1.7 s and 0.2 GB).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnflow._array import is_tensor, like
from attnflow._checks import fail
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.options import LinearBias, check_normalization, check_options, is_hardmax
from attnflow.kernels.types import Memory, Normalization

__all__ = ["SUPPORTS", "TENSOR_SUPPORTS", "attend", "attend_tensor"]

SUPPORTS = frozenset({"bias"})  # options beside softmax (`attnflow.kernels.options`)
# What `attend_tensor` has on tensors: every option but hardmax (beta = +-inf).
TENSOR_SUPPORTS = frozenset({"bias", "unnormalised", "positional", "sinkhorn"})
# Head sizes below this are padded with zero columns inside the kernel on CUDA: SDPA's fused
# kernels want a multiple of 8 (H200: a causal evaluation at d = 2, n = 1e5 took
# 0.227 s as (n, 2) and 0.035 s padded to 8 columns; at n = 1e6 the unpadded call asked for
# 931 GiB). Zero columns change no score and no value.
PAD_HEAD = 8


def attend_tensor(q: Any, k: Any, v: Any, beta: Any, mask: MaskSpec,
                  memory: Memory | None = None, bias: Any = None,
                  normalization: Normalization = "softmax") -> Any:
    """Masked attention on torch tensors q, k (..., n, e), v (..., n, f), on their device and
    in their dtype, with autograd: the `Kernel` contract of `attnflow.kernels.dense.attend`
    without hardmax. beta may be a 0-d tensor (it then scales q, so gradients reach it); the
    bias an (n, n) array or tensor or a `LinearBias` (built on the device: its slope may be
    a tensor); memory arrays move to the device. Softmax goes to torch's
    scaled_dot_product_attention (with ``is_causal`` for the causal and full masks without
    bias or memory; otherwise an additive (n, n + m) float mask); unnormalised, positional
    and Sinkhorn weights are computed from the (n, n + m) scores as in the dense kernel.
    Returns (..., n, f)."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    normalization = check_normalization(normalization)
    if is_hardmax(beta):
        raise fail("beta", "a finite beta for torch tensors (hardmax, beta = +-inf, runs on "
                   "numpy arrays: pass x0 as a numpy array)", repr(beta))
    if isinstance(normalization, tuple) and (mask != "full" or memory is not None):
        raise fail("normalization", "('sinkhorn', iterations) only with mask 'full' and no "
                   "memory", f"mask {mask if isinstance(mask, (str, tuple)) else 'array'!r}")
    if is_tensor(beta) or beta <= 0:
        # torch's fused CPU kernel returns NaN for scale 0 and for negative scales with
        # is_causal (torch 2.13); a tensor beta must stay in the graph: it moves into q.
        q, beta = q * beta, 1.0
    beta = float(beta)
    n = q.shape[-2]
    if (memory is None and bias is None and isinstance(mask, str)
            and normalization == "softmax"):
        return _padded(sdpa, q, k, v, is_causal=mask == "causal", scale=beta)
    offsets = _offsets(q, mask, bias, n)  # (n, n): the bias where allowed, -inf elsewhere
    position = offsets
    if memory is not None:
        mem_k, mem_v, log_w = (like(a, q) for a in memory)
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        k = torch.cat([k.expand(*lead, *k.shape[-2:]), mem_k.expand(*lead, *mem_k.shape)], -2)
        v = torch.cat([v.expand(*lead, *v.shape[-2:]), mem_v.expand(*lead, *mem_v.shape)], -2)
        offsets = torch.cat([offsets, log_w.expand(n, -1)], -1)
    if normalization == "softmax":
        return _padded(sdpa, q, k, v, attn_mask=offsets, scale=beta)
    scores = beta * (q @ k.transpose(-1, -2)) + offsets
    if isinstance(normalization, tuple):  # Sinkhorn, in log space
        for _ in range(normalization[1]):
            scores = scores - torch.logsumexp(scores, -2, keepdim=True)
            scores = scores - torch.logsumexp(scores, -1, keepdim=True)
        return scores.exp() @ v
    extra = 0.0 if memory is None else log_w.exp().sum()
    if normalization == "positional":  # P_i: the row's position factors, plus the memory's
        count = torch.logsumexp(position, -1, keepdim=True).exp() + extra
    else:
        count = n + extra
    top = scores.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return ((scores - top).exp() @ v) * ((top - torch.log(torch.as_tensor(
        count, dtype=q.dtype, device=q.device))).exp())


def _offsets(q: Any, mask: MaskSpec, bias: Any, n: int) -> Any:
    """The additive (n, n) score offsets on q's device and dtype: the bias (0 without one)
    where the mask allows a key, -inf elsewhere."""
    import torch

    i = torch.arange(n, device=q.device)
    if isinstance(mask, np.ndarray):
        allowed = like(mask, torch.ones((), dtype=torch.bool, device=q.device))
    elif mask == "full":
        allowed = None
    else:
        allowed = i[None, :] <= i[:, None]
        if isinstance(mask, tuple):
            allowed = allowed & (i[None, :] > i[:, None] - mask[1])
    if bias is None:
        offsets = torch.zeros((n, n), dtype=q.dtype, device=q.device)
    elif isinstance(bias, LinearBias):
        distance = (i[:, None] - i[None, :]).abs().to(q.dtype)
        offsets = -like(bias.slope, q) * distance if is_tensor(bias.slope) \
            else -bias.slope * distance
    else:
        offsets = like(bias, q)
    if allowed is None:
        return offsets
    return offsets.masked_fill(~allowed, -torch.inf)


def _padded(sdpa: Any, q: Any, k: Any, v: Any, pad: bool | None = None, **options: Any
            ) -> Any:
    """`_with_heads_axis`, with heads narrower than PAD_HEAD padded by zero columns when
    `pad` (default: on CUDA, for SDPA's fused kernels; the padding changes no score and no
    value) and the output cut back to v's width."""
    import torch

    pad = q.device.type == "cuda" if pad is None else pad
    if not pad or max(q.shape[-1], v.shape[-1]) >= PAD_HEAD:
        return _with_heads_axis(sdpa, q, k, v, **options)
    f = v.shape[-1]
    q, k, v = (torch.nn.functional.pad(a, (0, PAD_HEAD - a.shape[-1])) for a in (q, k, v))
    return _with_heads_axis(sdpa, q, k, v, **options)[..., :f]


def _with_heads_axis(sdpa: Any, q: Any, k: Any, v: Any, **options: Any) -> Any:
    """sdpa(q, k, v, **options) on (batch, 1, n, .) views of the broadcast leading axes (the
    layout of torch's fused CPU kernels, see the module docstring); returns (..., n, f)."""
    import torch

    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    batch = math.prod(lead)
    q, k, v = (a.expand(*lead, *a.shape[-2:]).reshape(batch, 1, *a.shape[-2:])
               for a in (q, k, v))
    try:
        out = sdpa(q, k, v, **options)
    except NotImplementedError:  # forward-mode AD (torch.func.jvp): SDPA's fused kernels
        out = _softmax_attention(q, k, v, **options)  # have no JVP; the scores do
    except torch.OutOfMemoryError:
        raise MemoryError(_out_of_memory(q, k, v, options)) from None
    return out.reshape(*lead, q.shape[-2], v.shape[-1])


def _out_of_memory(q: Any, k: Any, v: Any, options: dict[str, Any]) -> str:
    """One line for an out-of-memory error of SDPA: the call's size and what would fit."""
    batch, _, n, e = q.shape
    keys = k.shape[-2]
    held = "" if options.get("attn_mask") is None else (
        f"; its additive mask holds {n} x {keys} scores: mask 'causal' or 'full' without a "
        "score bias or memory lets SDPA's fused kernels hold none")
    return (f"attention on {q.device}: out of memory for {batch} runs x n = {n} tokens x head "
            f"size {e} in {str(q.dtype).removeprefix('torch.')} (torch SDPA, kernel "
            f"attnflow.kernels.torch.attend_tensor){held}; fewer runs per call fit")


def _softmax_attention(q: Any, k: Any, v: Any, scale: float, is_causal: bool = False,
                       attn_mask: Any = None) -> Any:
    """softmax(scale q k^T + attn_mask) v from the (n, n) scores (SDPA's math, written out)."""
    import torch

    scores = scale * (q @ k.transpose(-1, -2))
    if is_causal:
        n = q.shape[-2]
        scores = scores.masked_fill(
            torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -torch.inf)
    if attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores, -1) @ v


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
    """Masked softmax attention through torch on CPU threads, same contract as
    `attnflow.kernels.dense.attend` (float64 unless all inputs are float32). Tensors go to
    `attend_tensor` as they are (on their device, with autograd)."""
    import torch

    if is_tensor(q):
        return attend_tensor(q, k, v, beta, mask, memory, bias, normalization)
    bias, normalization = check_options("torch", SUPPORTS, q.shape[-2], mask, memory, bias,
                                        normalization, beta)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(a, dtype)) for a in (q, k, v))
    return attend_tensor(q, k, v, beta, mask, memory, bias).numpy()
