"""The reference attention kernel: dense scores, stable masked softmax, weighted sum.

Readable and general (every mask, memory tokens); every fast kernel is tested against it.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from attnflow.kernels import hardmax
from attnflow.kernels.masks import MaskSpec, mask_matrix
from attnflow.kernels.options import ALL, check_options, is_hardmax
from attnflow.kernels.types import Memory, Normalization

SUPPORTS = ALL  # every option (`attnflow.kernels.options`)


def attention_weights(
    q: np.ndarray,
    k: np.ndarray,
    beta: float,
    mask: MaskSpec,
    memory: Memory | None = None,
    bias: np.ndarray | None = None,
    normalization: Normalization = "softmax",
) -> np.ndarray:
    """Attention weights, (..., n, n + m): row i weighs the keys allowed by the mask, then
    the m memory keys, by their scores s_ij = beta <q_i, k_j> + bias_ij (memory: beta <q_i,
    k_j> + log a_j), normalised by `normalization` (`attnflow.kernels.options`):
    softmax_j(s_ij) (default), exp(s_ij) / N (unnormalised), exp(s_ij) / P_i (positional: P_i
    the row's sum of exp(bias_ij) over the keys it sees, plus the memory multiplicities), or
    Sinkhorn's doubly stochastic matrix (full mask, no memory).

    The softmax subtracts each row's maximum score (log-sum-exp), so huge beta stays finite;
    unnormalised weights overflow to inf only where exp(s_ij) / N does. beta = +-inf gives
    the hardmax weights (`attnflow.kernels.hardmax`: leaders share the row, ties within a
    stated tolerance).
    """
    n = q.shape[-2]
    bias, normalization = check_options("dense", SUPPORTS, n, mask, memory, bias, normalization,
                                        beta)
    if is_hardmax(beta):
        return hardmax.leader_weights(q, k, beta, mask)
    return _weights(_scores(q, k, beta, mask, memory, bias),
                    _count(n, memory, mask, bias, normalization), normalization)


def _weights(scores: np.ndarray, count: float | np.ndarray, normalization: Normalization
             ) -> np.ndarray:
    """The weights of masked scores (..., n, n + m); count: N of the unnormalised weights, or
    the positional weights' P_i as (n, 1)."""
    if normalization in ("unnormalised", "positional"):
        with np.errstate(over="ignore"):  # exp(s) / N beyond the float range: inf
            return np.exp(scores - np.log(count))
    if normalization != "softmax":
        return np.exp(_sinkhorn(scores, normalization[1]))
    with np.errstate(over="ignore"):  # finite scores a float range apart (|beta| ~ 1e308):
        weights = np.exp(scores - np.max(scores, axis=-1, keepdims=True))  # -inf, weight 0
    weights /= np.sum(weights, axis=-1, keepdims=True)
    return weights


def _scores(q: np.ndarray, k: np.ndarray, beta: float, mask: MaskSpec, memory: Memory | None,
            bias: np.ndarray | None) -> np.ndarray:
    """The scores (..., n, n + m): -inf where the mask forbids a key."""
    n = q.shape[-2]
    scores = beta * (q @ np.swapaxes(k, -1, -2))
    if bias is not None:
        scores = scores + bias.astype(scores.dtype, copy=False)
    scores = np.where(mask_matrix(mask, n), scores, -np.inf)
    if memory is not None:
        mem_scores = beta * (q @ memory.k.T) + memory.log_weights
        scores = np.concatenate([scores, np.broadcast_to(
            mem_scores, (*scores.shape[:-1], mem_scores.shape[-1]))], axis=-1)
    return scores


def _count(n: int, memory: Memory | None, mask: MaskSpec, bias: np.ndarray | None,
           normalization: Normalization) -> float | np.ndarray:
    """N = n + sum_j a_j (the tokens plus the memory multiplicities), or for positional weights
    P_i (n, 1): each row's sum of exp(bias_ij) over the keys it sees, plus sum_j a_j."""
    extra = 0.0 if memory is None else float(np.exp(memory.log_weights).sum())
    if normalization != "positional":
        return n + extra
    position = np.where(mask_matrix(mask, n), 0.0 if bias is None else bias, -np.inf)
    return np.exp(logsumexp(position, axis=-1, keepdims=True)) + extra


def _sinkhorn(scores: np.ndarray, iterations: int) -> np.ndarray:
    """log of Sinkhorn's scaling of exp(scores) (..., n, n): `iterations` times normalise the
    columns, then the rows, in log space (no overflow at any beta)."""
    log_w = scores
    for _ in range(iterations):
        log_w = log_w - logsumexp(log_w, axis=-2, keepdims=True)
        log_w = log_w - logsumexp(log_w, axis=-1, keepdims=True)
    return log_w


def _unnormalised_output(scores: np.ndarray, values: np.ndarray, count: float | np.ndarray
                         ) -> np.ndarray:
    """sum_j exp(s_ij) v_j / N (N a number, or (n, 1) per row) without spurious overflow or
    NaN: the row maximum M is taken out, (sum_j exp(s_ij - M) v_j) is multiplied by
    exp((M - log N) / 2) twice, and a zero sum stays 0 (never 0 * inf); a result beyond the
    float range is +-inf."""
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)  # a row without keys: every weight 0
    inner = np.exp(scores - top) @ values
    with np.errstate(over="ignore", invalid="ignore"):
        half = np.exp((top - np.log(count)) / 2).astype(inner.dtype)
        out = (inner * half) * half
    return np.where(inner == 0, 0, out)


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
    """Masked attention, row by row: the weights of `attention_weights` times the values
    (softmax(beta q k^T + bias + log-weights) v by default).

    Parameters
    ----------
    q, k : (..., n, e) queries and keys (already multiplied by Q and K).
    v : (..., n, f) values (already multiplied by V).
    beta : inverse temperature, a real number, or +-inf for hardmax attention
        (`attnflow.kernels.hardmax`; no bias, memory or other normalization then).
    mask : canonical mask spec (see `attnflow.kernels.masks`) over the n tokens.
    memory : optional fixed keys/values every token also attends to, with log multiplicities.
    bias : optional (n, n) score bias (finite or -inf), on the token block only.
    normalization : "softmax", "unnormalised", "positional" or ("sinkhorn", iterations)
        (`attnflow.kernels.options`).

    Returns (..., n, f): for each query, the attention-weighted sum of the values.
    """
    n = q.shape[-2]
    bias, normalization = check_options("dense", SUPPORTS, n, mask, memory, bias, normalization,
                                        beta)
    if is_hardmax(beta):
        return hardmax.attend(q, k, v, beta, mask)
    if memory is not None:
        v = np.concatenate(
            [v, np.broadcast_to(memory.v, (*v.shape[:-2], *memory.v.shape))], axis=-2
        )
    scores = _scores(q, k, beta, mask, memory, bias)
    count = _count(n, memory, mask, bias, normalization)
    if normalization in ("unnormalised", "positional"):
        return _unnormalised_output(scores, v, count)
    return _weights(scores, count, normalization) @ v
