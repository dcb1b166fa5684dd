"""The reference attention kernel: dense scores, stable masked softmax, weighted sum.

Readable and general (every mask, memory tokens); every fast kernel is tested against it.
"""

from __future__ import annotations

import numpy as np

from attnflow.kernels.masks import MaskSpec, mask_matrix
from attnflow.kernels.types import Memory


def attention_weights(
    q: np.ndarray, k: np.ndarray, beta: float, mask: MaskSpec, memory: Memory | None = None
) -> np.ndarray:
    """Softmax attention weights, (..., n, n + m): row k is the law softmax_j(beta <q_k, k_j>)
    over the keys allowed by the mask, then the m memory keys (scores + log a_j).

    The softmax subtracts each row's maximum score (log-sum-exp), so huge beta stays finite.
    """
    n = q.shape[-2]
    scores = beta * (q @ np.swapaxes(k, -1, -2))
    scores = np.where(mask_matrix(mask, n), scores, -np.inf)
    if memory is not None:
        mem_scores = beta * (q @ memory.k.T) + memory.log_weights
        scores = np.concatenate([scores, mem_scores], axis=-1)
    weights = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    weights /= np.sum(weights, axis=-1, keepdims=True)
    return weights


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
) -> np.ndarray:
    """Masked softmax attention, softmax(beta q k^T + log-weights) v, row by row.

    Parameters
    ----------
    q, k : (..., n, e) queries and keys (already multiplied by Q and K).
    v : (..., n, f) values (already multiplied by V).
    beta : inverse temperature >= 0.
    mask : canonical mask spec (see `attnflow.kernels.masks`) over the n tokens.
    memory : optional fixed keys/values every token also attends to, with log multiplicities.

    Returns (..., n, f): for each query, the attention-weighted average of the values.
    """
    weights = attention_weights(q, k, beta, mask, memory)
    if memory is not None:
        v = np.concatenate(
            [v, np.broadcast_to(memory.v, (*v.shape[:-2], *memory.v.shape))], axis=-2
        )
    return weights @ v
