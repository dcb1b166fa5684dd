"""An independent reference forward pass of a BERT-layout encoder (MiniLM), in plain numpy,
for the tests.

It reads model.safetensors with `safetensors.numpy` and the tokenizer with `tokenizers` alone,
imports nothing of attnflow, and follows Hugging Face's BertModel (modeling_bert.py) in
float64, with no dropout and one segment (token type 0):

    x = LN_emb(E_word[ids] + E_pos[0..n-1] + E_type[0])
    per layer: q, k, v = x W^T + b (per head of size e = d / H),
               a = concat_h softmax(q k^T / sqrt(e)) v,  h = LN_attn(x + a W_O^T + b_O),
               x = LN_out(h + gelu(h W_i^T + b_i) W_o^T + b_o)   (gelu exact: erf)

and sentence-transformers' pooling for all-MiniLM-L6-v2: the mean of the last hidden states
over the tokens, divided by its norm.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf


def load(folder: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    folder = Path(folder)
    w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    return w, json.loads((folder / "config.json").read_text())


def token_ids(folder: str | Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok.encode(text).ids


def _ln(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def forward(w: dict[str, np.ndarray], config: dict, ids) -> tuple[list[np.ndarray], list]:
    """The hidden states entering layer 0 and after each layer, (n, d) each, and every
    layer's attention weights (H, n, n)."""
    eps = config["layer_norm_eps"]
    H = config["num_attention_heads"]
    ids = np.asarray(ids)
    n = ids.size
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][:n]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    states, patterns = [x], []
    for L in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{L}."

        def lin(name, z, p=p):
            return z @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        d = x.shape[1]
        e = d // H
        q, k, v = (lin(f"attention.self.{m}", x).reshape(n, H, e).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(e)
        s -= s.max(-1, keepdims=True)
        a = np.exp(s)
        a /= a.sum(-1, keepdims=True)
        patterns.append(a)
        ctx = (a @ v).transpose(1, 0, 2).reshape(n, d)
        h = _ln(x + lin("attention.output.dense", ctx),
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"], eps)
        z = lin("intermediate.dense", h)
        z = 0.5 * z * (1 + erf(z / np.sqrt(2)))
        x = _ln(h + lin("output.dense", z), w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"], eps)
        states.append(x)
    return states, patterns


def sentence_embedding(last: np.ndarray) -> np.ndarray:
    m = last.mean(axis=0)
    return m / np.linalg.norm(m)
