"""One builder: a decoder's weights, as a reader returns them, into a family `Stack`
(docs/science.md §7-8).

Layer L of a LLaMA-architecture decoder (SmolLM2; `attnflow.pretrained.gguf`) is the block

    attention: heads (W_Q^h, W_K^{kv(h)}, W_V^{kv(h)}, W_O^h), beta = 1 / sqrt(e), causal,
               RoPE on adjacent pairs, in the pre-LN scheme with RMSNorm(g_attn, eps);
    MLP:       SwiGLU (W_gate, W_up, W_down), pre-LN with RMSNorm(g_ffn, eps);

and of Gemma 3 the block with, in addition, the sandwich (peri) scheme around each sublayer
(RMSNorm(g_post_attn) / RMSNorm(g_post_ffn) on its output), QK-norm with the file's gains,
RoPE on halves with the layer's base (1e4 local, 1e6 global), a causal sliding window of 512
tokens on the local layers, and a GeGLU (tanh-GELU) MLP; its embeddings enter scaled by
sqrt(d) (`GGUFModel.embed`).

in sequential form, so that Euler with dt = 1 is exactly the network's forward pass
(`attnflow.pretrained.forward`) and finer steps of the continuous form give its ODE. Query
heads that share a key/value head (grouped-query attention) share the K and V arrays, which
the attention sublayer then computes once.

A BERT-layout encoder (MiniLM; `attnflow.pretrained.checkpoint.Checkpoint.encoder_block`) is
the block with biased projections (`ProjectionBias`), full attention, beta = 1 / sqrt(e), in
the post-LN scheme with its trained LayerNorm (gain and bias), and an exact-GELU MLP with
biases, also post-LN: x <- LN_attn(x + attention(x)), then x <- LN_ffn(x + MLP(x))
(`encoder_stack`).

`idealised_stack` is the theory's twin of the same weights: attention only, directions
instead of RMSNorm (the gains and sqrt(d) folded into the weights, eps = 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.family import (
    MLP,
    Attention,
    LayerNorm,
    Peri,
    Post,
    Pre,
    ProjectionBias,
    QKNorm,
    RMSNorm,
    RoPE,
    Stack,
)
from attnflow.pretrained.checkpoint import Checkpoint
from attnflow.pretrained.gguf import GGUFModel

__all__ = ["decoder_stack", "encoder_stack", "idealised_stack", "model_stack"]

ENCODER_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # config hidden_act -> MLP activation


def _dtype(dtype: Any) -> np.dtype:
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise fail("dtype", "float32 or float64", repr(dtype))
    return np.dtype(dtype)


def decoder_stack(model: GGUFModel, mlp: bool = True, offset: float = 0.0,
                  dtype: Any = np.float64, backend: str = "auto",
                  form: str = "sequential") -> Stack:
    """The decoder as a Stack of blocks (module docstring); weights in `dtype`.

    mlp : False drops every feed-forward sublayer (attention and norms only).
    offset : the position of the first token (RoPE positions offset, offset + 1, ...).
    form : "sequential" (default: Euler dt = 1 is the network) or "continuous".
    """
    c = model.config
    dt = _dtype(dtype)
    H, Hkv, e, d = c.n_heads, c.n_kv_heads, c.d_head, c.d
    activation = {"silu": "swiglu", "gelu_tanh": "geglu"}[c.activation]
    layers = []
    for index in range(c.n_layers):
        b = model.block(index)

        def rms(gain: np.ndarray) -> RMSNorm:
            return RMSNorm(gain.astype(dt), c.rms_eps)

        def scheme(before: np.ndarray, after: np.ndarray | None) -> Pre:
            return Peri(rms(before), rms(after)) if c.norm == "peri" else Pre(rms(before))

        Ks = [k.copy() for k in b.W_K.astype(dt).reshape(Hkv, e, d)]
        Vs = [v.copy() for v in b.W_V.astype(dt).reshape(Hkv, e, d)]
        Qs = b.W_Q.astype(dt).reshape(H, e, d)
        Os = b.W_O.astype(dt).reshape(d, H, e)
        heads = [(Qs[h].copy(), Ks[kv], Vs[kv], Os[:, h].copy())
                 for h, kv in enumerate(c.kv_head)]
        ffn = MLP(b.W_up.astype(dt), b.W_down.astype(dt), b.W_gate.astype(dt), activation) \
            if mlp else None
        rope = c.rope_at(index)
        window = c.window(index)
        qk = QKNorm(b.q_norm.astype(dt), b.k_norm.astype(dt), c.rms_eps) if c.qk_norm else None
        layers.append(Attention(
            heads=heads, beta=c.scale, backend=backend,
            mask="causal" if window is None else ("window", window),
            norm=scheme(b.attn_norm, b.post_attn_norm), qk_norm=qk,
            rope=RoPE(rope.base, rope.pairing, float(offset)), mlp=ffn,
            mlp_norm=scheme(b.ffn_norm, b.post_ffn_norm) if mlp else None, form=form))
    return Stack(layers)


def encoder_stack(model: Checkpoint, mlp: bool = True, dtype: Any = np.float64,
                  backend: str = "auto", form: str = "sequential") -> Stack:
    """A BERT-layout encoder as a Stack of post-LN blocks (module docstring); weights in
    `dtype`. mlp : False drops every feed-forward sublayer (attention and its LayerNorm)."""
    dt = _dtype(dtype)
    layers = []
    for index in range(model.n_layers):
        b = model.encoder_block(index)
        if b.activation not in ENCODER_ACTIVATIONS:
            raise fail("model_dir", f"hidden_act among {sorted(ENCODER_ACTIVATIONS)} in "
                       "config.json", repr(b.activation))

        def post(ln: tuple[np.ndarray, np.ndarray], eps: float = b.eps) -> Post:
            return Post(LayerNorm(ln[0].astype(dt), ln[1].astype(dt), eps))

        heads = [(b.W_Q[h].astype(dt), b.W_K[h].astype(dt), b.W_V[h].astype(dt),
                  b.W_O[h].astype(dt)) for h in range(model.n_heads)]
        biases = ProjectionBias(b.b_Q.astype(dt), b.b_K.astype(dt), b.b_V.astype(dt),
                                b.b_O.astype(dt))
        ffn = MLP(b.W_up.astype(dt), b.W_down.astype(dt), None,
                  ENCODER_ACTIVATIONS[b.activation], b.b_up.astype(dt),
                  b.b_down.astype(dt)) if mlp else None
        layers.append(Attention(heads=heads, beta=1.0 / np.sqrt(model.d_head), mask="full",
                                backend=backend, norm=post(b.ln_attn), biases=biases,
                                mlp=ffn, mlp_norm=post(b.ln_ffn) if mlp else None,
                                form=form))
    return Stack(layers)


def model_stack(model: GGUFModel | Checkpoint, mlp: bool = True, offset: float = 0.0,
                dtype: Any = np.float64, backend: str = "auto",
                form: str = "sequential") -> Stack:
    """The real network of a read model: `decoder_stack` for a GGUF decoder, `encoder_stack`
    for a Hugging Face encoder checkpoint (whose positions are absolute: offset 0 only)."""
    if isinstance(model, Checkpoint):
        if offset != 0:
            raise fail("offset", "0 for an encoder (absolute position embeddings)",
                       repr(offset))
        return encoder_stack(model, mlp, dtype, backend, form)
    return decoder_stack(model, mlp, offset, dtype, backend, form)


def idealised_stack(model: GGUFModel, backend: str = "auto") -> Stack:
    """The model's attention sublayers as the theory's dynamics: a Stack of pre-LN blocks on
    the token directions, no MLP.

    RMSNorm(x) * g = sqrt(d) g * theta (eps aside), so with that factor folded into the
    weights the heads of layer L are, for query head h and its key/value head kv(h),

        Q_h = sqrt(d) W_Q^h diag(g),  K_h = sqrt(d) W_K^{kv(h)} diag(g)  (e, d),
        V_h = sqrt(d) W_O^h W_V^{kv(h)} diag(g)  (d, d),  beta = 1 / sqrt(e),

    with RoPE on adjacent pairs; heads sharing a key/value head share one K array. One Euler
    step of size 1 per layer is then `decoder_stack(model, mlp=False)`'s when eps = 0
    (relative difference about eps / mean(x^2) otherwise). LLaMA-architecture models only
    (Gemma 3's sandwich norms and QK-norm have no such folding).
    """
    c = model.config
    if c.architecture != "llama":
        raise fail("model", "a LLaMA-architecture decoder for the idealised stack (its "
                   "pre-LN gains fold into the weights)", repr(c.architecture))
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
