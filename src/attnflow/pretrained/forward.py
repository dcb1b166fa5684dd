"""The forward pass of a LLaMA model read from GGUF, in numpy: the model as trained.

Unlike the idealised dynamics (tokens on the sphere, attention only, one weight set), this
is the real computation, layer L = 0 .. n_layers - 1 on the residual stream x (n, d):

    u = RMSNorm(x) * g_attn                         RMSNorm(x) = x / sqrt(mean(x^2) + eps)
    x = x + sum_h W_O^h softmax_causal(<R_i q_i^h, R_j k_j^{kv(h)}> / sqrt(e)) v^{kv(h)}
    u = RMSNorm(x) * g_ffn
    x = x + W_down (silu(W_gate u) * (W_up u))      silu(z) = z / (1 + exp(-z))

with q^h = W_Q^h u, k = W_K^{kv(h)} u, v = W_V^{kv(h)} u, R_i the rotation of position i
(`LlamaConfig.rope`, adjacent pairs), and finally logits = W_out (RMSNorm(x) * g_out).
Weights are the file's, dequantised (`GGUFModel.note`); arithmetic is in `dtype`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit

from attnflow._checks import fail
from attnflow.pretrained.gguf import GGUFModel, LlamaBlock, check_ids

__all__ = ["ForwardPass", "attention_stack", "forward", "log_likelihoods", "perplexity",
           "rms_norm"]

LOGITS = ("all", "last", "none")


@dataclass(frozen=True)
class ForwardPass:
    """What one forward pass computed.

    token_ids : (n,) the input. positions : (n,) the positions RoPE used.
    hidden : (n_layers + 1, n, d) the residual stream: entering layer 0 (the embeddings),
        then after each layer (before the final RMSNorm).
    attention : (n_layers, n_heads, n, n) attention weights (rows sum to 1, zero above the
        diagonal), or None when not requested.
    logits : (n, vocab) for logits="all", (1, vocab) (the last token's) for "last", else None.
    """

    token_ids: np.ndarray
    positions: np.ndarray
    hidden: np.ndarray
    attention: np.ndarray | None
    logits: np.ndarray | None


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    """gain * x / sqrt(mean(x^2) + eps) over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def forward(model: GGUFModel, token_ids: Sequence[int], attention: bool = False,
            logits: str = "all", mlp: bool = True, offset: int = 0,
            dtype: type = np.float64) -> ForwardPass:
    """Run the model on token ids (module docstring).

    attention : also return every layer's attention weights (n_layers * n_heads * n^2 floats).
    logits : "all" (every position), "last" or "none".
    mlp : False drops every MLP sub-layer (attention and norms only), for comparison with the
        attention-only dynamics.
    offset : the position of the first token (RoPE positions offset, offset + 1, ...); the
        trained model starts at 0. Scores depend only on differences of positions.
    dtype : float64 (default) or float32 arithmetic.
    """
    c = model.config
    ids = check_ids(token_ids, c.vocab_size)
    if logits not in LOGITS:
        raise fail("logits", f"one of {LOGITS}", repr(logits))
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise fail("offset", "an integer >= 0", repr(offset))
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise fail("dtype", "float32 or float64", repr(dtype))
    n = ids.size
    positions = np.arange(offset, offset + n, dtype=np.float64)
    x = model.embeddings[ids].astype(dtype, copy=False)
    hidden = np.empty((c.n_layers + 1, n, c.d), dtype=dtype)
    hidden[0] = x
    weights = np.empty((c.n_layers, c.n_heads, n, n), dtype=dtype) if attention else None
    for layer in range(c.n_layers):
        b = model.block(layer)
        u = rms_norm(x, b.attn_norm.astype(dtype, copy=False), c.rms_eps)
        a, w = _attention(model, b, u, positions)
        x = x + a
        if mlp:
            x = x + _mlp(b, rms_norm(x, b.ffn_norm.astype(dtype, copy=False), c.rms_eps))
        hidden[layer + 1] = x
        if weights is not None:
            weights[layer] = w
    out = None
    if logits != "none":
        last = x if logits == "all" else x[-1:]
        out = rms_norm(last, model.output_norm.astype(dtype, copy=False), c.rms_eps) @ \
            model.output_map.T.astype(dtype, copy=False)
    return ForwardPass(token_ids=ids, positions=positions, hidden=hidden, attention=weights,
                       logits=out)


def _attention(model: GGUFModel, b: LlamaBlock, u: np.ndarray,
               positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The attention sub-layer's output (n, d) and its weights (H, n, n)."""
    c = model.config
    n, e = u.shape[0], c.d_head
    dt = u.dtype

    def heads(W: np.ndarray) -> np.ndarray:  # (n, d) -> (heads, n, e)
        return (u @ W.T.astype(dt, copy=False)).reshape(n, -1, e).transpose(1, 0, 2)

    rope = c.rope
    q = rope.rotate(heads(b.W_Q), positions)
    k = rope.rotate(heads(b.W_K), positions)[c.kv_head]
    v = heads(b.W_V)[c.kv_head]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(e)
    scores = np.where(np.tri(n, dtype=bool), scores, -np.inf)
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    y = (w @ v).transpose(1, 0, 2).reshape(n, c.n_heads * e)
    return y @ b.W_O.T.astype(dt, copy=False), w


def _mlp(b: LlamaBlock, u: np.ndarray) -> np.ndarray:
    """The SwiGLU MLP: W_down (silu(W_gate u) * (W_up u)), (n, d)."""
    dt = u.dtype
    gate = u @ b.W_gate.T.astype(dt, copy=False)
    up = u @ b.W_up.T.astype(dt, copy=False)
    return (gate * expit(gate) * up) @ b.W_down.T.astype(dt, copy=False)


def log_likelihoods(logits: np.ndarray, token_ids: Sequence[int]) -> np.ndarray:
    """(n - 1,) log p(token_{i+1} | tokens_0..i), natural log, from the (n, vocab) logits of
    a forward pass over the n token ids (logits="all")."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size < 2 or logits.shape[:1] != ids.shape:
        raise fail("logits, token_ids", "(n, vocab) logits of n >= 2 token ids",
                   f"logits of shape {np.shape(logits)} for {ids.size} ids")
    z = logits[:-1] - logits[:-1].max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return log_p[np.arange(ids.size - 1), ids[1:]]


def perplexity(model: GGUFModel, token_ids: Sequence[int]) -> float:
    """exp(-mean log p(token_{i+1} | tokens_0..i)) over the sequence, by one forward pass
    (uniform guessing gives the vocabulary size)."""
    ids = check_ids(token_ids, model.config.vocab_size)
    return float(np.exp(-np.mean(log_likelihoods(forward(model, ids).logits, ids))))


def attention_stack(model: GGUFModel, backend: str = "auto") -> Any:
    """The model's attention sub-layers as idealised dynamics: an `attnflow.Stack` of one
    pre-LN `Attention` per layer (layer L acting on [L, L + 1)), no MLP.

    The pre-LN scheme reads the directions theta = x / |x| of the residual stream, and
    RMSNorm(x) * g = sqrt(d) g * theta (eps aside), so with that factor folded into the weights
    the heads of layer L are, for query head h and its key/value head kv(h),

        Q_h = sqrt(d) W_Q^h diag(g),  K_h = sqrt(d) W_K^{kv(h)} diag(g)  (e, d),
        V_h = sqrt(d) W_O^h W_V^{kv(h)} diag(g)  (d, d),  beta = 1 / sqrt(e),

    with RoPE on adjacent pairs (`LlamaConfig.rope`); heads sharing a key/value head share
    one K array. One explicit Euler step of size 1 per layer is then exactly
    `forward(model, ids, mlp=False)` when eps = 0 (relative difference about
    eps / mean(x^2) otherwise); smaller steps follow the continuous-time dynamics.
    """
    from attnflow.model import Attention
    from attnflow.stack import Stack

    c = model.config
    scale = np.sqrt(c.d)
    layers = []
    for index in range(c.n_layers):
        w = model.layer(index)
        g = scale * w.norm_gains["attn_norm"]
        shared = {int(kv): w.W_K[h] * g for h, kv in enumerate(w.kv_head)}
        heads = [(w.W_Q[h] * g, shared[int(w.kv_head[h])], w.W_O[h] @ (w.W_V[h] * g))
                 for h in range(c.n_heads)]
        layers.append(Attention(heads=heads, beta=1.0 / np.sqrt(c.d_head), norm="pre",
                                rope=c.rope, backend=backend))
    return Stack(layers)
