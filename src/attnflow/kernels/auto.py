"""Backend "auto": the fastest applicable numpy kernel for each call's shapes.

Measured on the 2-core development machine: the fused kernel wins from about 8 runs on (its
SIMD lanes are runs, 32 to a tile in float64, 64 in float32), as long as heads are small;
the blocked kernel wins for fewer runs from about a hundred tokens (BLAS products, no n x n
temporaries); the dense reference is fastest only for small ones, and takes the calls that
need an option the others lack (`attnflow.kernels.options`). The harmonic kernel wins on the
circle and S^2 from about 4 tokens per harmonic feature (`harmonic.features`: 133 on the
circle at beta = 64, 900 on S^2 at beta = 9), where it applies (queries and keys of one norm
each: checked per call, the blocked kernel taking the calls it refuses). For numpy arrays
torch is never chosen automatically (it is optional; ask for backend="torch"); torch
tensors always get a tensor kernel (`choose_tensor`: on CPU the fused kernel with its fused
backward for small heads, else SDPA).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.kernels import blocked, dense, fused, fused_torch, harmonic, triton_fused
from attnflow.kernels import torch as torch_kernel
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.options import ALL, LinearBias, check_normalization, needed
from attnflow.kernels.types import Kernel, Memory, Normalization

__all__ = ["SUPPORTS", "attend", "choose", "choose_tensor", "harmonic_or_blocked"]

SUPPORTS = ALL  # every option: calls that need one the fast kernels lack go to dense

# Thresholds measured (d = 2, causal, beta = 64, one call on 2 threads):
# fused vs blocked at 200 tokens: 4 runs 0.63 vs 0.34 ms, 6 runs 0.49 vs 0.47, 8 runs 0.53 vs
# 0.66, 12 runs 0.51 vs 0.85 (fused costs the same per tile of 32 runs, however full);
# 8 x 64 tokens: fused 0.09, blocked 0.32, dense 0.25 ms. Single runs: dense 0.060 vs blocked
# 0.087 ms at 80 tokens, 0.084 vs 0.086 at 96, 0.098 vs 0.088 at 112.
MIN_RUNS_FUSED = 8  # runs from which the fused kernel beats the others
MAX_HEAD_FUSED = 16  # head sizes e, f up to which its unrolled loops pay
# On CPU tensors, the fused kernel with its fused backward against SDPA with its own, one
# causal call forward + backward, B 32, n 200, beta 64, float64, better of 1 and 2 threads
# (benchmarks/gradients.py, AVX2, machine loaded: load 4): 0.63x at d = 2,
# 0.72x at 3, 0.57x at 8, 2.7x at 16 (its lane tiles of 16 coordinates spill).
MAX_HEAD_FUSED_TENSOR = 8
# Below this many pair evaluations per call a call is too small for the fused kernel's
# one-off compilation (seconds per head sizes and dtype, then cached on disk) to matter.
MIN_PAIRS_FUSED = 10_000
MIN_TOKENS_BLOCKED = 96  # tokens from which the blocked kernel beats the dense one
# Harmonic against blocked, one causal run, 2 threads (benchmarks/RESULTS.md):
# even at 3-4 tokens per feature on the circle (beta 64 and 1000) and about 4 on S^2 (beta 9).
MIN_TOKENS_PER_FEATURE = 4
# Against fused, 8 and 64 runs, same day (shared machine): even at 4-6 tokens per feature on
# the circle (beta 64) and S^2 (beta 9), harmonic 1.5-2.6x faster at 8.
MIN_TOKENS_PER_FEATURE_FUSED = 6


def choose(q: np.ndarray, v: np.ndarray, bias: np.ndarray | LinearBias | None = None,
           normalization: Normalization = "softmax", mask: MaskSpec | None = None,
           beta: float | None = None) -> Kernel:
    """The kernel `attend` uses for queries q (..., n, e) and values v (..., n, f), with the
    given score bias and normalization: never one that lacks an option the call needs. The
    harmonic kernel is considered when the mask and beta are given, |beta| <= harmonic.MAX_B
    (a larger score scale has no truncation to compute); beta = +-inf (hardmax) goes to the
    dense kernel, the one with that option."""
    need = needed(bias, check_normalization(normalization), beta)
    runs = int(np.prod(np.broadcast_shapes(q.shape[:-2], v.shape[:-2])))
    n = q.shape[-2]
    per_feature = 0.0  # tokens per harmonic feature, where the harmonic kernel may apply
    if (mask is not None and beta is not None and abs(beta) <= harmonic.MAX_B
            and q.shape[-1] in (2, 3)
            and isinstance(mask, (str, tuple)) and (bias is None or isinstance(bias, LinearBias))
            and need <= harmonic.SUPPORTS):
        per_feature = n / harmonic.features(beta, q.shape[-1])
    if (runs >= MIN_RUNS_FUSED and max(q.shape[-1], v.shape[-1]) <= MAX_HEAD_FUSED
            and runs * n * (n + 1) // 2 >= MIN_PAIRS_FUSED and need <= fused.SUPPORTS
            and per_feature < MIN_TOKENS_PER_FEATURE_FUSED):
        return fused.attend
    if per_feature >= MIN_TOKENS_PER_FEATURE:
        return harmonic_or_blocked
    if n >= MIN_TOKENS_BLOCKED and need <= blocked.SUPPORTS:
        return blocked.attend
    return dense.attend


def choose_tensor(x: Any, e: int, bias: Any = None, normalization: Normalization = "softmax",
                  mask: MaskSpec | None = None, beta: Any = None, memory: bool = False,
                  backend: str = "auto") -> Kernel:
    """The kernel for torch tensor tokens x (..., n, d) with heads of size e: the one place
    where a tensor's kernel is chosen. On CPU tensors `attnflow.kernels.fused_torch`'s (the
    numba fused kernel with its fused backward) where it covers the call
    (`fused_torch.covers`) and, as `choose` rules for numpy arrays, the batch fills its
    tiles (MIN_RUNS_FUSED runs, MIN_PAIRS_FUSED pairs) and heads are at most
    MAX_HEAD_FUSED_TENSOR. On CUDA tensors with heads of 2 to 16 (`triton_fused.covers`)
    `triton_fused.attend_or_sdpa`: the Triton fused kernel for calls that take no gradient,
    SDPA for those that do (the Triton kernel has no backward). Otherwise, and always with
    backend "torch", `attnflow.kernels.torch.attend_tensor` (SDPA on the tensor's device).
    Raises ValueError
    for hardmax (beta = +-inf), which runs on numpy arrays only."""
    need = needed(bias, check_normalization(normalization), None if beta is None or not
                  isinstance(beta, (int, float)) else beta)
    missing = need - torch_kernel.TENSOR_SUPPORTS
    if missing:
        raise fail("beta" if "hardmax" in missing else "backend",
                   f"options {sorted(torch_kernel.TENSOR_SUPPORTS)} on torch tensors "
                   "(hardmax, beta = +-inf, runs on numpy arrays)", sorted(missing))
    runs, n, d = math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1]
    if (backend == "auto" and runs >= MIN_RUNS_FUSED and runs * n * (n + 1) // 2 >= MIN_PAIRS_FUSED
            and max(e, d) <= MAX_HEAD_FUSED_TENSOR
            and fused_torch.covers(x, e, d, bias, check_normalization(normalization), beta)):
        return fused_torch.attend_tensor
    if backend == "auto" and triton_fused.covers(x, e, d, bias,
                                                 check_normalization(normalization), beta):
        return triton_fused.attend_or_sdpa
    return torch_kernel.attend_tensor


def harmonic_or_blocked(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float,
                        mask: MaskSpec, memory: Memory | None = None,
                        bias: np.ndarray | LinearBias | None = None,
                        normalization: Normalization = "softmax") -> np.ndarray:
    """The harmonic kernel (default tolerance) where `harmonic.check` accepts the call (its
    queries' and keys' norms are only known here), else the blocked kernel, or the dense one
    for the options blocked lacks (unnormalised, positional weights)."""
    try:
        harmonic.check(q, k, mask, bias, normalization, beta)
    except ValueError:
        fallback = (blocked.attend if needed(bias, check_normalization(normalization), beta)
                    <= blocked.SUPPORTS else dense.attend)
        return fallback(q, k, v, beta, mask, memory, bias=bias, normalization=normalization)
    return harmonic.attend(q, k, v, beta, mask, memory, bias, normalization)


harmonic_or_blocked.reads_directions = True  # type: ignore[attr-defined]  # as Harmonic


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
    """Masked attention by the kernel `choose(q, v, bias, normalization, mask, beta)` picks; same
    contract as `attnflow.kernels.dense.attend`."""
    kernel = choose(q, v, bias, normalization, mask, beta)
    return kernel(q, k, v, beta, mask, memory, bias=bias, normalization=normalization)
