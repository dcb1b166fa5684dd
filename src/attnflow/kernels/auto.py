"""Backend "auto": the fastest applicable numpy kernel for each call's shapes.

Measured on the 2-core development machine (benchmarks/RESULTS.md): the fused kernel wins
from a few runs on (its SIMD lanes are runs), as long as heads are small; the blocked kernel
wins for single runs from about a hundred tokens (BLAS products, no n x n temporaries); the
dense reference is fastest only for tiny single runs. torch is never chosen automatically
(it is optional; ask for backend="torch").
"""

from __future__ import annotations

import numpy as np

from attnflow.kernels import blocked, dense, fused
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.types import Kernel, Memory

__all__ = ["attend", "choose"]

MIN_RUNS_FUSED = 4  # runs from which the fused kernel beats the others (d = 2, n = 200)
MAX_HEAD_FUSED = 16  # head sizes e, f up to which its unrolled loops pay
# Pair evaluations per call from which the fused kernel beats blocked/dense per call (measured
# 2026-11-30: 0.33 vs 0.57 ms at 8 x 100 tokens, 1.2 vs 4.1 ms at 20 x 200). Its one-off
# compilation (seconds, per head sizes and dtype, then cached on disk) is repaid within a
# simulation, which calls the kernel thousands of times.
MIN_PAIRS_FUSED = 40_000
MIN_TOKENS_BLOCKED = 128  # tokens from which the blocked kernel beats the dense one


def choose(q: np.ndarray, v: np.ndarray) -> Kernel:
    """The kernel `attend` uses for queries q (..., n, e) and values v (..., n, f)."""
    runs = int(np.prod(np.broadcast_shapes(q.shape[:-2], v.shape[:-2])))
    n = q.shape[-2]
    if (runs >= MIN_RUNS_FUSED and max(q.shape[-1], v.shape[-1]) <= MAX_HEAD_FUSED
            and runs * n * (n + 1) // 2 >= MIN_PAIRS_FUSED):
        return fused.attend
    if n >= MIN_TOKENS_BLOCKED:
        return blocked.attend
    return dense.attend


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
) -> np.ndarray:
    """Masked softmax attention by the kernel `choose(q, v)` picks; same contract as
    `attnflow.kernels.dense.attend`."""
    return choose(q, v)(q, k, v, beta, mask, memory)
