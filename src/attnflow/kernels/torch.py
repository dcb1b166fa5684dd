"""Attention through torch: CPU threads, or a CUDA device when present (optional extra
``attnflow[torch]``).

`attend_tensor` works on torch tensors where they are (the GPU benchmark integrates on the
device with it); `attend` is the numpy-in, numpy-out kernel registered as backend "torch".
Both use `torch.nn.functional.scaled_dot_product_attention` with scale = beta: with
``is_causal`` for the causal and full masks without memory (torch's fused kernels then never
hold the n x n scores), and otherwise with an additive float mask over the n + m keys (the
score bias, or 0, where allowed, -inf elsewhere, log a_j for the memory columns), which holds
(n, n + m) numbers: for long sequences with such masks use the "blocked" kernel.
Every call goes to torch as (batch, 1, n, .) tensors: with fewer axes torch's CPU SDPA takes
its math path, which holds the n x n scores (measured 2026-12-02, n = 4096, d = 64, float32,
two threads: 0.8-0.9 s for (n, d) and (1, n, d) tensors, 0.11 s for (1, 1, n, d); at
n = 16 384, 33 s and 3.5 GB against 1.7 s and 0.2 GB).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnflow.kernels.masks import MaskSpec, mask_matrix
from attnflow.kernels.options import check_options
from attnflow.kernels.types import Memory, Normalization

__all__ = ["SUPPORTS", "attend", "attend_tensor"]

SUPPORTS = frozenset({"bias"})  # options beside softmax (`attnflow.kernels.options`)


def attend_tensor(q: Any, k: Any, v: Any, beta: float, mask: MaskSpec,
                  memory: Memory | None = None, bias: np.ndarray | None = None) -> Any:
    """Masked softmax attention on torch tensors q, k (..., n, e), v (..., n, f), on their
    device and in their dtype, with an optional (n, n) score bias (checked:
    `attnflow.kernels.options`); memory arrays and the bias are moved there. Returns
    (..., n, f)."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if beta <= 0:  # torch's fused CPU kernel returns NaN for scale 0 and for negative scales
        q, beta = q * beta, 1.0  # with is_causal (torch 2.13): the scale moves into q
    if memory is None and isinstance(mask, str) and bias is None:
        return _with_heads_axis(sdpa, q, k, v, is_causal=mask == "causal", scale=float(beta))
    n = q.shape[-2]
    allowed = torch.as_tensor(mask_matrix(mask, n), device=q.device)
    if bias is None:
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
    else:  # a copy: masked_fill_ below must not write into the caller's array
        bias = torch.tensor(np.asarray(bias), dtype=q.dtype, device=q.device)
    bias.masked_fill_(~allowed, -torch.inf)
    if memory is not None:
        as_t = lambda a: torch.as_tensor(np.asarray(a), dtype=q.dtype, device=q.device)  # noqa: E731
        mem_k, mem_v, log_w = as_t(memory.k), as_t(memory.v), as_t(memory.log_weights)
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        k = torch.cat([k.expand(*lead, *k.shape[-2:]), mem_k.expand(*lead, *mem_k.shape)], -2)
        v = torch.cat([v.expand(*lead, *v.shape[-2:]), mem_v.expand(*lead, *mem_v.shape)], -2)
        bias = torch.cat([bias, log_w.expand(n, -1)], -1)
    return _with_heads_axis(sdpa, q, k, v, attn_mask=bias, scale=float(beta))


def _with_heads_axis(sdpa: Any, q: Any, k: Any, v: Any, **options: Any) -> Any:
    """sdpa(q, k, v, **options) on (batch, 1, n, .) views of the broadcast leading axes (the
    layout of torch's fused CPU kernels, see the module docstring); returns (..., n, f)."""
    import torch

    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    batch = math.prod(lead)
    q, k, v = (a.expand(*lead, *a.shape[-2:]).reshape(batch, 1, *a.shape[-2:])
               for a in (q, k, v))
    return sdpa(q, k, v, **options).reshape(*lead, q.shape[-2], v.shape[-1])


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
    `attnflow.kernels.dense.attend` (float64 unless all inputs are float32)."""
    import torch

    bias, normalization = check_options("torch", SUPPORTS, q.shape[-2], mask, memory, bias,
                                        normalization, beta)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(a, dtype)) for a in (q, k, v))
    return attend_tensor(q, k, v, beta, mask, memory, bias).numpy()
