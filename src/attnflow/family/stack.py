"""Per-layer weights: a stack of blocks, layer L acting on [L, L + 1) (docs/science.md §6).

A real model has different weights in every layer; in continuous time that is a field that is
piecewise constant in t. The paper's tied-weight model is the one-block case (a `Block`, e.g.
an `Attention`, acts at every time). Each layer keeps all its own parts (heads, beta, mask,
positions, weighting, schemes, feed-forward term); the layers must share the state space
(sphere or R^d) and the dimension d. `Model` is what every function that takes a model
accepts: a block or a stack.

    >>> import attnflow as af
    >>> layers = [af.Attention(beta=4.0, norm="pre", rope=af.RoPE(100.0)) for _ in range(4)]
    >>> model = af.Stack(layers)           # simulate(model, x0, t_end <= 4)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.family.block import Attention, Block
from attnflow.manifolds import Manifold

__all__ = ["Model", "Stack", "model_from_record", "segments"]


class Stack:
    """Blocks, layer L (0-based) acting on the times [L, L + 1).

    layers : a non-empty sequence of blocks (`attnflow.Attention` or `attnflow.Block`) with
        one dimension d (or None, any d) and one state space (`Block.manifold`).
    """

    def __init__(self, layers: Sequence[Block]) -> None:
        if isinstance(layers, Block) or not isinstance(layers, Sequence) or not layers:
            raise fail("layers", "a non-empty sequence of attnflow blocks (Attention layers)",
                       repr(layers)[:80])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Block):
                raise fail(f"layers[{i}]", "an attnflow block (Attention)",
                           type(layer).__name__)
        dims = {layer.d for layer in layers if layer.d is not None}
        if len(dims) > 1:
            raise fail("layers", "layers of one dimension d",
                       f"dimensions {[layer.d for layer in layers]}")
        manifolds = {layer.manifold for layer in layers}
        if len(manifolds) > 1:
            raise fail("layers", "layers on one state space (norm 'post'/'ngpt': the sphere; "
                       "'pre'/'peri'/'flat': R^d)", f"norms {[layer.norm for layer in layers]}")
        ns = {layer.fixed_n for layer in layers if layer.fixed_n is not None}
        if len(ns) > 1:
            raise fail("layers", "masks and biases for one number of tokens n",
                       f"n = {sorted(ns)}")
        self.layers: tuple[Block, ...] = tuple(layers)
        self.d: int | None = dims.pop() if dims else None
        self.manifold: Manifold = manifolds.pop()

    def __len__(self) -> int:
        return len(self.layers)

    def __repr__(self) -> str:
        return f"Stack({len(self.layers)} layers, d={self.d}, manifold={self.manifold.name!r})"

    @property
    def is_causal(self) -> bool:
        """True when every layer is causal (token k depends on tokens 1..k only)."""
        return all(layer.is_causal for layer in self.layers)

    @property
    def beta(self) -> float:
        """The first layer's beta (for summaries; each layer has its own)."""
        return self.layers[0].beta

    def check_tokens(self, X: Any, name: str = "X") -> np.ndarray:
        """Validate a token array (..., n, d) for every layer."""
        for layer in self.layers:
            X = layer.check_tokens(X, name)
        return X

    def layer_at(self, t: float) -> Block:
        """The layer acting at time t (layer floor(t); the last one at t = len(self))."""
        return self.layers[min(int(math.floor(t)), len(self.layers) - 1)]

    def to_record(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """{"stack": [layer records]} and the layers' arrays, prefixed "layer<L>_"."""
        metas, arrays = [], {}
        for i, layer in enumerate(self.layers):
            meta, arr = layer.to_record()
            metas.append(meta)
            arrays.update({f"layer{i}_{name}": a for name, a in arr.items()})
        return {"stack": metas}, arrays


Model = Block | Stack


def model_from_record(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Model:
    """Inverse of `Block.to_record` and `Stack.to_record`."""
    if "stack" not in meta:
        return Attention.from_record(meta, arrays)
    layers = []
    for i, layer_meta in enumerate(meta["stack"]):
        prefix = f"layer{i}_"
        layers.append(Attention.from_record(
            layer_meta, {k[len(prefix):]: a for k, a in arrays.items() if k.startswith(prefix)}))
    return Stack(layers)


def segments(model: Model, t_end: float) -> list[tuple[float, float, Block]]:
    """The pieces (t0, t1, layer) of [0, t_end] on which the field is one layer's."""
    if isinstance(model, Block):
        return [(0.0, t_end, model)]
    if t_end > len(model):
        raise fail("t_end", f"a time <= {len(model)} (the stack's number of layers; layer L "
                   "acts on [L, L + 1))", repr(t_end))
    n = max(1, math.ceil(t_end))
    return [(float(L), float(min(L + 1, t_end)), model.layers[L]) for L in range(n)]
