"""Attention dynamics with the weights of a pretrained Transformer (docs/science.md §1, §5).

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow._repr import ShortRepr
from attnflow.analysis.atlas import (
    AtlasPrediction,
    ObservedConfiguration,
    classify_configuration,
    predict_configuration,
)
from attnflow.family import Attention
from attnflow.kernels.masks import MaskSpec
from attnflow.pretrained.checkpoint import Checkpoint
from attnflow.simulate import simulate
from attnflow.sphere import normalize
from attnflow.trajectory import Trajectory

__all__ = ["PretrainedDynamics", "attention_from_pretrained", "run_pretrained",
           "tokens_from_ids", "tokens_from_text"]


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


@dataclass(frozen=True, repr=False)
class PretrainedDynamics(ShortRepr):
    """Dynamics of one layer of a pretrained model from the embedding of a text.

    Attributes
    ----------
    model_name, layer, head : what was simulated (head None: all heads summed).
    token_ids : (n,) the token ids; x0 : (n, d) the initial tokens on the sphere.
    prediction : the atlas row predicted from the head's value map V_h = W_O^h W_V^h (d x d;
        its spectrum is that of W_V^h W_O^h plus d - d_head zeros, so a head whose nonzero
        spectrum lies in the left half-plane has lambda_max = 0, which the atlas does not
        cover); None for all heads, which the atlas (one value matrix) does not cover.
    runs : mask name -> (Trajectory, ObservedConfiguration of the final tokens, classified
        with V_h and x_1(0) at geodesic tolerance `tol`).
    """

    model_name: str
    layer: int
    head: int | None
    token_ids: list[int]
    x0: np.ndarray
    prediction: AtlasPrediction | None
    runs: dict[str, tuple[Trajectory, ObservedConfiguration]]


def run_pretrained(model_dir: str | Path | Checkpoint, layer: int, text: str | None = None,
                   token_ids: Sequence[int] | None = None, head: int | None = None,
                   beta: float = 1.0, t_end: float = 150.0,
                   masks: Sequence[str] = ("causal", "full"), tol: float = 1e-2,
                   progress: bool | Callable[[float], None] = False,
                   **solver: Any) -> PretrainedDynamics:
    """Simulate one layer's attention (one head, or all heads) from the model's own embedding
    of `text` (or of `token_ids`: give exactly one), once per mask, and set each final
    configuration beside the atlas prediction.

    beta : inverse temperature of `attention_from_pretrained` (1: unit tokens).
    t_end : final time (one unit = one layer). solver : method, dt, rtol, atol, save_at of
        `attnflow.simulate`. tol : geodesic tolerance (rad) of `classify_configuration`.
    """
    if (text is None) == (token_ids is None):
        raise fail("text, token_ids", "exactly one of them", "both" if text is not None
                   else "neither")
    ckpt = _checkpoint(model_dir)
    ids = ckpt.token_ids(text) if text is not None else [int(i) for i in token_ids]
    x0 = tokens_from_ids(ckpt, ids)
    V = None
    prediction = None
    if head is not None:
        V = attention_from_pretrained(ckpt, layer, head).heads[0][2]
        prediction = predict_configuration(V, x1_0=x0[0])
    runs = {}
    for mask in masks:
        model = attention_from_pretrained(ckpt, layer, head, beta=beta, mask=mask)
        traj = simulate(model, x0, t_end, progress=progress, **solver)
        runs[mask] = (traj, classify_configuration(traj.final, V=V, x1_0=x0[0], tol=tol))
    return PretrainedDynamics(model_name=ckpt.name, layer=layer, head=head, token_ids=ids,
                              x0=x0, prediction=prediction, runs=runs)
