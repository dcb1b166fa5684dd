"""An independent reference forward pass of GGUF decoders, in plain numpy, for the tests.

It reads the file with the `gguf` package alone (`gguf.GGUFReader`, `gguf.quants.dequantize`)
and imports nothing of attnflow, so it checks attnflow's reader and forward pass rather than
repeating them. Written from llama.cpp's graphs (``llm_build_llama``, ``llm_build_gemma3_iswa``)
and the Hugging Face modelling code, in float64 on the dequantised weights.

llama (SmolLM2): x = E[ids]; per layer x += W_O attn(RMSNorm(x) g_attn), then
x += W_down(silu(W_gate u) * W_up u) with u = RMSNorm(x) g_ffn; logits = W_out RMSNorm(x) g_out.
RoPE on adjacent pairs (x_2p, x_2p+1): the GGUF converter permutes LLaMA's W_Q, W_K rows.

gemma3: x = sqrt(d) E[ids]; per layer (sandwich norm)
    x += RMSNorm(W_O attn(RMSNorm(x) g_attn)) g_post_attn
    x += RMSNorm(W_down(gelu_tanh(W_gate u) * W_up u)) g_post_ffw,  u = RMSNorm(x) g_ffn
with q, k RMS-normalised per head (gains attn_q_norm, attn_k_norm) before RoPE, RoPE on halves
(x_p, x_p+e/2) (the converter does not permute Gemma's rows; llama.cpp's NEOX rope type),
scores q.k / sqrt(e); layer L is local (keys j with i - j < window, RoPE base
rope.freq_base_swa, else 1e4) unless the file's sliding_window_pattern makes it global (a
period p: (L + 1) % p == 0, p = 6 when absent; or one flag per layer), with RoPE base
rope.freq_base. The gains are used as stored: the
converter stores 1 + w for Gemma's RMSNorm(x) (1 + w) (tests/test_gemma.py proves it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

GEMMA_PATTERN = 6  # every sixth layer global (Gemma 3)
GEMMA_LOCAL_BASE = 10000.0


@dataclass
class Reference:
    """A GGUF decoder's weights (float32, numpy shapes) and hyper-parameters."""

    arch: str
    hp: dict
    t: dict

    def w(self, name: str) -> np.ndarray:
        return self.t[name].astype(np.float64)


def load(source: str | Path | gguf.GGUFReader) -> Reference:
    """Every tensor of the file, dequantised, and the few metadata values the pass needs.

    source : a GGUF path, or a `gguf.GGUFReader` of it (parsing a 262 144-token vocabulary
    takes seconds; a parse shared with attnflow's reader is still the `gguf` package's own).
    """
    r = source if isinstance(source, gguf.GGUFReader) else gguf.GGUFReader(str(source))

    def meta(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()

    arch = meta("general.architecture")
    a = arch + "."
    hp = {"d": meta(a + "embedding_length"), "layers": meta(a + "block_count"),
          "heads": meta(a + "attention.head_count"),
          "kv_heads": meta(a + "attention.head_count_kv"),
          "eps": meta(a + "attention.layer_norm_rms_epsilon"),
          "base": meta(a + "rope.freq_base", 10000.0),
          "window": meta(a + "attention.sliding_window")}
    hp["e"] = meta(a + "attention.key_length", hp["d"] // hp["heads"])
    hp["local_base"] = meta(a + "rope.freq_base_swa", GEMMA_LOCAL_BASE)
    pattern = r.fields.get(a + "attention.sliding_window_pattern")
    if pattern is not None and pattern.types[0] == gguf.GGUFValueType.ARRAY:  # True = local
        hp["local"] = [bool(pattern.parts[i][0]) for i in pattern.data]
    else:
        period = meta(a + "attention.sliding_window_pattern", GEMMA_PATTERN)
        hp["local"] = [(L + 1) % period != 0 for L in range(hp["layers"])]
    t = {}
    for tensor in r.tensors:
        shape = tuple(int(s) for s in reversed(tensor.shape))
        t[tensor.name] = np.asarray(dequantize(tensor.data, tensor.tensor_type),
                                    dtype=np.float32).reshape(shape)
    return Reference(arch=arch, hp=hp, t=t)


def _rms(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    return g * (x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps))


def _rotate(x: np.ndarray, base: float, pairs: str) -> np.ndarray:
    """RoPE on (heads, n, e) at positions 0 .. n-1, as complex multiplication."""
    n, e = x.shape[1], x.shape[2]
    theta = np.arange(n)[:, None] * base ** (-np.arange(0, e, 2) / e)[None, :]
    if pairs == "adjacent":
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * theta)
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out
    z = (x[..., : e // 2] + 1j * x[..., e // 2:]) * np.exp(1j * theta)
    return np.concatenate([z.real, z.imag], axis=-1)


def _gelu_tanh(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


def forward(ref: Reference, ids, logits: str = "all", gain_shift: float = 0.0,
            pairs: str | None = None, record: dict | None = None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """The residual stream (layers + 1, n, d) (embeddings, then after each layer) and the
    logits ((n, vocab) for "all", (1, vocab) for "last", None for "none"), float64.

    record : a dict to fill with "resid_mid" (layers, n, d), the stream after each attention
    sublayer, and "pattern" (layers, H, n, n), the attention weights (rows: queries).

    gain_shift and pairs exist only to test the conventions: every RMSNorm gain g is used as
    g + gain_shift; pairs overrides the RoPE pairing ("adjacent" or "halves").
    """
    hp, arch = ref.hp, ref.arch
    gemma = arch == "gemma3"
    d, H, Hkv, e, eps = hp["d"], hp["heads"], hp["kv_heads"], hp["e"], hp["eps"]
    pairs = pairs or ("halves" if gemma else "adjacent")
    ids = np.asarray(ids)
    n = ids.size

    def gain(name):
        return ref.w(name) + gain_shift

    x = ref.t["token_embd.weight"][ids].astype(np.float64)
    if gemma:
        x = x * np.sqrt(d)
    stream = [x]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    mids, patterns = [], []
    for L in range(hp["layers"]):
        p = f"blk.{L}."
        u = _rms(x, gain(p + "attn_norm.weight"), eps)
        q = (u @ ref.w(p + "attn_q.weight").T).reshape(n, H, e).transpose(1, 0, 2)
        k = (u @ ref.w(p + "attn_k.weight").T).reshape(n, Hkv, e).transpose(1, 0, 2)
        v = (u @ ref.w(p + "attn_v.weight").T).reshape(n, Hkv, e).transpose(1, 0, 2)
        visible = j <= i
        base = hp["base"]
        if gemma:
            q = _rms(q, gain(p + "attn_q_norm.weight"), eps)
            k = _rms(k, gain(p + "attn_k_norm.weight"), eps)
            if hp["local"][L]:
                base = hp["local_base"]
                visible = visible & (i - j < hp["window"])
        q, k = _rotate(q, base, pairs), _rotate(k, base, pairs)
        group = H // Hkv
        out = np.empty((n, H * e))
        pattern = np.empty((H, n, n))
        for h in range(H):
            s = q[h] @ k[h // group].T / np.sqrt(e)
            s = np.where(visible, s, -np.inf)
            a = np.exp(s - s.max(1, keepdims=True))
            a /= a.sum(1, keepdims=True)
            pattern[h] = a
            out[:, h * e:(h + 1) * e] = a @ v[h // group]
        attn = out @ ref.w(p + "attn_output.weight").T
        if gemma:
            attn = _rms(attn, gain(p + "post_attention_norm.weight"), eps)
        x = x + attn
        mids.append(x)
        patterns.append(pattern)
        u = _rms(x, gain(p + "ffn_norm.weight"), eps)
        gate = u @ ref.w(p + "ffn_gate.weight").T
        act = _gelu_tanh(gate) if gemma else gate / (1 + np.exp(-gate))
        mlp = (act * (u @ ref.w(p + "ffn_up.weight").T)) @ ref.w(p + "ffn_down.weight").T
        if gemma:
            mlp = _rms(mlp, gain(p + "post_ffw_norm.weight"), eps)
        x = x + mlp
        stream.append(x)
    if record is not None:
        record.update(resid_mid=np.array(mids), pattern=np.array(patterns))
    if logits == "none":
        return np.array(stream), None
    last = x if logits == "all" else x[-1:]
    z = _rms(last, gain("output_norm.weight"), eps)
    out_map = ref.t.get("output.weight", ref.t["token_embd.weight"])
    chunk = 32768  # float64 copies of the (vocab, d) map a slice at a time
    logit = np.concatenate([z @ out_map[s:s + chunk].astype(np.float64).T
                            for s in range(0, out_map.shape[0], chunk)], axis=1)
    return np.array(stream), logit


def log_likelihoods(logits: np.ndarray, ids) -> np.ndarray:
    """(n - 1,) natural-log probabilities of each next token."""
    ids = np.asarray(ids)
    z = logits[:-1] - logits[:-1].max(1, keepdims=True)
    return z[np.arange(ids.size - 1), ids[1:]] - np.log(np.exp(z).sum(1))


def perplexity(logits: np.ndarray, ids) -> float:
    return float(np.exp(-log_likelihoods(logits, ids).mean()))


def rank(logits_row: np.ndarray, token: int) -> int:
    """1-based rank of `token` among the logits of one position (1 = the top prediction)."""
    return int(np.sum(logits_row > logits_row[token])) + 1
