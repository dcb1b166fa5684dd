"""Attention dynamics with the weights of a pretrained Transformer (SCIENCE.md §1, §5).

The paper's idealisation: one layer's attention weights are used at every depth (as in
ALBERT), there is no MLP, and tokens live on the unit sphere. For head h of layer L:

    dx_k/dt = P_{x_k}( sum_j softmax_j(beta x_k^T B_h x_j) V_h x_j ),
    B_h = (W_Q^h)^T W_K^h / sqrt(d_head),   V_h = W_O^h W_V^h,

and with all heads the velocities of the heads add (``combine="sum"``), as head outputs add
into the residual stream. With beta = 1 the scores are those of unit tokens, and the
effective beta of the head is ||B_h||_2 (`attnflow.pretrained.spectra`); tokens of a
LayerNorm'd residual stream have norm about sqrt(d), which is beta = d.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnflow._checks import fail
from attnflow.kernels.masks import MaskSpec
from attnflow.model import Attention
from attnflow.pretrained.checkpoint import Checkpoint
from attnflow.sphere import normalize

__all__ = ["attention_from_pretrained", "tokens_from_ids", "tokens_from_text"]


def _checkpoint(model_dir: str | Path | Checkpoint) -> Checkpoint:
    return model_dir if isinstance(model_dir, Checkpoint) else Checkpoint(model_dir)


def attention_from_pretrained(model_dir: str | Path | Checkpoint, layer: int,
                              head: int | None = None, beta: float = 1.0,
                              mask: MaskSpec = "causal", backend: str = "dense") -> Attention:
    """The `Attention` model of one head (or, with head=None, all heads summed) of a layer.

    Each head is (Q, K, V) = (I, B_h, V_h) on R^d, so its score is beta x_k^T B_h x_j.
    `beta`, `mask` and `backend` are passed to `Attention`.
    """
    ckpt = _checkpoint(model_dir)
    weights = ckpt.layer(layer)
    if head is not None and (not isinstance(head, (int, np.integer))
                             or not 0 <= head < weights.n_heads):
        raise fail("head", f"None or an integer in [0, {weights.n_heads})", repr(head))
    heads = range(weights.n_heads) if head is None else [int(head)]
    triples = [(None, weights.qk_form(h), weights.value_map(h)) for h in heads]
    if len(triples) == 1:
        return Attention(*triples[0], beta=beta, mask=mask, backend=backend)
    return Attention(heads=triples, beta=beta, mask=mask, backend=backend)


def tokens_from_ids(model_dir: str | Path | Checkpoint, token_ids: Sequence[int]) -> np.ndarray:
    """Initial tokens (n, d) on the sphere: the model's own embedding of the token ids (the
    residual stream entering layer 0, `Checkpoint.embed`), each normalised to unit length."""
    return normalize(_checkpoint(model_dir).embed(token_ids))


def tokens_from_text(model_dir: str | Path | Checkpoint, text: str) -> np.ndarray:
    """Initial tokens (n, d) on the sphere for a text: tokenised by the model's own
    tokenizer.json (with `tokenizers`, special tokens included), then `tokens_from_ids`."""
    ckpt = _checkpoint(model_dir)
    return tokens_from_ids(ckpt, ckpt.token_ids(text))
