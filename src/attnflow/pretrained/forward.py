"""The forward pass of a model read from GGUF (a decoder) or from a Hugging Face checkpoint (a
BERT-layout encoder): Euler with dt = 1 on its family Stack.

The real computation, layer L = 0 .. n_layers - 1 on the residual stream x (n, d), is one
Euler step of size 1 of the block `attnflow.pretrained.build.decoder_stack` builds (sequential
form: attention, then the MLP on the updated stream):

    x = x + sum_h W_O^h softmax_causal(<R_i q_i^h, R_j k_j^{kv(h)}> / sqrt(e)) v^{kv(h)}
    x = x + W_down (silu(W_gate u) * (W_up u)),  u = RMSNorm(x) * g_ffn

with q, k, v read from RMSNorm(x) * g_attn, and finally logits = W_out (RMSNorm(x) * g_out).
An encoder's layers are post-LN (`attnflow.pretrained.build.encoder_stack`); it has no logits.
There is no second attention implementation: `forward` takes the Euler steps of the Stack's
blocks (`attnflow.integrate.euler_step` on each sublayer's drift, as `attnflow.simulate` does
with method "euler", dt = 1), recording the stream between the sublayers for traces.
Weights are the file's, dequantised (`GGUFModel.note`); arithmetic is in `dtype`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow._repr import ShortRepr
from attnflow.family import RMSNorm, Stack
from attnflow.integrate import euler_step
from attnflow.pretrained.build import idealised_stack, model_stack
from attnflow.pretrained.checkpoint import Checkpoint
from attnflow.pretrained.gguf import GGUFModel, check_ids

__all__ = ["ForwardPass", "attention_stack", "forward", "log_likelihoods", "perplexity"]

LOGITS = ("all", "last", "none")
attention_stack = idealised_stack  # the name recipes and scripts know


@dataclass(frozen=True, repr=False)
class ForwardPass(ShortRepr):
    """What one forward pass computed.

    token_ids : (n,) the input. positions : (n,) the positions RoPE used.
    hidden : (n_layers + 1, n, d) the residual stream: entering layer 0 (the embeddings),
        then after each layer (before the final RMSNorm).
    mid : (n_layers, n, d) the residual stream after each layer's attention sublayer (before
        its MLP), or None (mlp=False: the same as hidden[1:]).
    attention : (n_layers, n_heads, n, n) attention weights (rows sum to 1, zero above the
        diagonal), or None when not requested.
    logits : (n, vocab) for logits="all", (1, vocab) (the last token's) for "last", else None.
    """

    token_ids: np.ndarray
    positions: np.ndarray
    hidden: np.ndarray
    attention: np.ndarray | None
    logits: np.ndarray | None
    mid: np.ndarray | None = None


def forward(model: GGUFModel | Checkpoint, token_ids: Sequence[int], attention: bool = False,
            logits: str = "all", mlp: bool = True, offset: int = 0,
            dtype: type = np.float64, stack: Any = None) -> ForwardPass:
    """Run the model on token ids (module docstring): a GGUF decoder or an encoder checkpoint.

    attention : also return every layer's attention weights (n_layers * n_heads * n^2 floats).
    logits : "all" (every position), "last" or "none" (an encoder: "none" only).
    mlp : False drops every MLP sub-layer (attention and norms only), for comparison with the
        attention-only dynamics.
    offset : the position of the first token (RoPE positions offset, offset + 1, ...); the
        trained model starts at 0. Scores depend only on differences of positions.
    dtype : float64 (default) or float32 arithmetic.
    stack : the Stack `model_stack(model, mlp, offset, dtype)` already built, to reuse
        (building one casts every weight to `dtype`: seconds for SmolLM2 or Gemma 3); None
        builds it.
    """
    encoder = isinstance(model, Checkpoint)
    if encoder:
        ids = np.asarray(token_ids)
        context = model.context_length
    else:
        ids = check_ids(token_ids, model.config.vocab_size)
        context = model.config.context_length
    if context is not None and ids.size > context:
        raise fail("token_ids", f"at most {context} token ids (the model's context)",
                   f"{ids.size} ids")
    if logits not in LOGITS or (encoder and logits != "none"):
        raise fail("logits", "'none' for an encoder (it has no output head)" if encoder
                   else f"one of {LOGITS}", repr(logits))
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise fail("offset", "an integer >= 0", repr(offset))
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise fail("dtype", "float32 or float64", repr(dtype))
    if stack is None:
        stack = model_stack(model, mlp=mlp, offset=offset, dtype=dtype)
    elif not isinstance(stack, Stack) or len(stack.layers) != (
            model.n_layers if encoder else model.config.n_layers):
        raise fail("stack", "a Stack of the model's layers (model_stack(model, ...))",
                   repr(stack)[:80])
    if encoder:  # LayerNorm(word + position + type-0 embeddings), checked ids
        x = model.embed(ids).astype(dtype)
        ids = np.asarray(ids, dtype=np.int64)
    else:
        x = model.embedding_rows(ids).astype(dtype)  # times sqrt(d) for Gemma 3
        if model.config.embedding_scale != 1.0:
            x = x * np.dtype(dtype).type(model.config.embedding_scale)
    L = len(stack.layers)
    hidden = np.empty((L + 1, *x.shape), dtype=x.dtype)
    hidden[0] = x
    mid = np.empty((L, *x.shape), dtype=x.dtype) if mlp else None
    weights = None
    for layer, block in enumerate(stack.layers):
        # Euler with dt = 1 on the block in sequential form: its sublayers in turn
        kernel = block.kernel_for(x)
        if attention:
            patterns = block.attention_patterns(x)
            weights = np.empty((L, *patterns.shape), patterns.dtype) if weights is None \
                else weights
            weights[layer] = patterns
        for i, (_, drift) in enumerate(block.sublayers(kernel)):
            x = euler_step(drift, x, 1.0, block.manifold)
            if i == 0 and mid is not None:
                mid[layer] = x
        hidden[layer + 1] = x
    out = None
    if logits != "none":
        last = x if logits == "all" else x[-1:]
        c = model.config
        final = RMSNorm(model.output_norm.astype(dtype, copy=False), c.rms_eps)  # as stored
        out = final(last) @ model.output_map.T.astype(dtype, copy=False)
    return ForwardPass(token_ids=ids, positions=np.arange(offset, offset + ids.size,
                                                          dtype=np.float64),
                       hidden=hidden, attention=weights, logits=out, mid=mid)


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
