"""Attention through torch: CPU threads, or a CUDA device when present (optional extra
``attnflow[torch]``).

`attend_tensor` works on torch tensors where they are (the GPU benchmark integrates on the
device with it); `attend` is the numpy-in, numpy-out kernel registered as backend "torch".
Both use `torch.nn.functional.scaled_dot_product_attention` with scale = beta: with
``is_causal`` for the causal and full masks without memory (torch's fused kernels then never
hold the n x n scores), and otherwise with an additive float mask over the n + m keys (the
score bias, or 0, where allowed, -inf elsewhere, log a_j for the memory columns), which holds
(n, n + m) numbers: for long sequences with such masks use the "blocked" kernel.
"""

from __future__ import annotations

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

    if memory is None and isinstance(mask, str) and bias is None:
        return sdpa(q, k, v, is_causal=mask == "causal", scale=float(beta))
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
    return sdpa(q, k, v, attn_mask=bias, scale=float(beta))


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
                                        normalization)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(a, dtype)) for a in (q, k, v))
    return attend_tensor(q, k, v, beta, mask, memory, bias).numpy()
