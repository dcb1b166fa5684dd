"""Read a decoder's GGUF file (llama.cpp's format) offline, through the `gguf` package.

A GGUF file is untrusted data: it is parsed by `gguf.GGUFReader` (the reference reader of the
format) and its tensors are dequantised by `gguf.quants.dequantize`; a truncated or corrupted
file, a missing or misshapen tensor, or non-finite weights give a ValueError naming the file.
Two architectures (``general.architecture``) are read, LLaMA ("llama", e.g. SmolLM2) and
Gemma 3 ("gemma3"); any other gives "not supported: ARCH" with the supported ones.

Quantised weights (e.g. Q4_1: 4 bits per weight with a scale and offset per block of 32) are
an approximation of the released model's float weights: `GGUFModel.note` says which types
the file holds; outputs built on it should repeat it.

Conventions (as in `attnflow.pretrained.checkpoint`): matrices act on column vectors of the
residual stream R^d. Per layer (``blk.L.``), with H query heads of size e = d_head sharing
H_kv key/value heads (grouped-query attention: query head h reads key/value head
h // (H / H_kv), llama.cpp's rule):

* ``attn_norm``, ``ffn_norm`` : RMSNorm gains g (d,): RMSNorm(x) = g * x / sqrt(mean(x^2) + eps);
* ``attn_q`` W_Q (H e, d), ``attn_k`` W_K, ``attn_v`` W_V (H_kv e, d), ``attn_output`` W_O
  (d, H e);
* ``ffn_gate`` W_gate, ``ffn_up`` W_up (d_ff, d), ``ffn_down`` W_down (d, d_ff): the SwiGLU
  MLP W_down (silu(W_gate u) * (W_up u)).

``token_embd`` holds the embeddings (vocab, d); the output map is ``output`` when present, else
the embeddings themselves (tied). GGUF's converter permutes the rows of W_Q and W_K within each
head (row 2p <- p, row 2p+1 <- p + e/2 of the Hugging Face layout) so that rotary position
embeddings rotate adjacent pairs (x_{2p}, x_{2p+1}): `rope` is ``RoPE(base, "adjacent")``.
The permutation is the same for W_Q and W_K, so W_Q^T W_K (and every score without positions)
is unchanged by it.

Gemma 3 (``gemma3``; `DecoderConfig` fields in brackets) differs from LLaMA in:

* sandwich ("peri") norm [norm = "peri"]: RMSNorm before and after each sublayer,
  x += RMSNorm(W_O attn(RMSNorm(x) g_attn)) g_post_attn, and likewise for the MLP with
  ``ffn_norm``, ``post_ffw_norm``; the gains are stored as used: Hugging Face's Gemma
  computes RMSNorm(x) (1 + w), and llama.cpp's converter writes 1 + w into the file (checked
  in tests/test_gemma.py: read as stored + 1 instead, the perplexity exceeds 10^7);
* QK-norm [qk_norm]: q and k RMS-normalised per head with gains ``attn_q_norm``,
  ``attn_k_norm`` (d_head,), shared by all heads, before RoPE;
* RoPE on halves [rope_pairing = "halves"]: the converter leaves Gemma's W_Q, W_K rows in
  Hugging Face's order (llama.cpp's NEOX rope), pairs (x_p, x_{p + e/2});
* local and global layers [layer_window, layer_rope_base]: layer L is local (keys j with
  i - j < sliding_window, RoPE base ``rope.freq_base_swa``, 1e4 when absent) unless it is
  global (every sliding_window_pattern-th layer, 6 when the file does not say: layers 5, 11,
  17; RoPE base ``rope.freq_base``, 1e6);
* GeGLU MLP [activation = "gelu_tanh"]: W_down (gelu_tanh(W_gate u) * (W_up u));
* embeddings scaled by sqrt(d) [embedding_scale] entering layer 0 (`GGUFModel.embed`);
  the output map is the unscaled embeddings (tied);
* nothing in the scores: q.k / sqrt(d_head) as in LLaMA (`DecoderConfig.scale`).

Its tokenizer is SentencePiece (``tokenizer.ggml.model = "llama"``, `attnflow.pretrained.spm`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import describe, fail
from attnflow._repr import ShortRepr
from attnflow.family.positional import RoPE
from attnflow.pretrained.checkpoint import HF_INITIALIZER_RANGE, AttentionLayer
from attnflow.pretrained.ggufheader import (
    INDEX,
    READ_ERRORS,
    ReaderFields,
    from_index,
    tensor_info,
    to_index,
)
from attnflow.pretrained.weightcache import WeightCache, cache_root

__all__ = ["ARCHITECTURES", "DecoderBlock", "DecoderConfig", "GGUFModel", "LlamaBlock",
           "LlamaConfig", "check_ids"]

ARCHITECTURES = ("llama", "gemma3")
_BLOCK_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                  "ffn_gate", "ffn_up", "ffn_down")
_GEMMA3_TENSORS = ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm")
_TENSORS = {"llama": _BLOCK_TENSORS, "gemma3": _BLOCK_TENSORS + _GEMMA3_TENSORS}
GEMMA3_PATTERN = 6  # llama.cpp's default for gemma3: every sixth layer global
GEMMA3_LOCAL_BASE = 10000.0  # llama.cpp's default RoPE base of gemma3's local layers
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


@dataclass(frozen=True, repr=False)
class DecoderConfig(ShortRepr):
    """The architecture of a decoder's GGUF file, from its metadata (module docstring).

    d : width of the residual stream; n_layers; n_heads, n_kv_heads : query and key/value
    heads; d_head : head size e; d_ff : width of the MLP; vocab_size; rope_base : RoPE's base
    (pairs rotate at base^(-2p/e); Gemma 3: of its global layers); rms_eps : RMSNorm's eps;
    tied_embeddings : output map = embeddings; context_length : the trained context;
    tensor_types : GGML type name -> number of tensors of that type; add_bos, bos_id : whether
    the tokenizer prepends a BOS token, and which.

    The rest is LLaMA's by default. architecture : "llama" or "gemma3"; norm : "pre" (RMSNorm
    before each sublayer) or "peri" (before and after); activation : the MLP's gate, "silu"
    (SwiGLU) or "gelu_tanh" (GeGLU); embedding_scale : factor on the embeddings entering
    layer 0; qk_norm : RMSNorm of q and k per head; rope_pairing : "adjacent" or "halves";
    layer_window, layer_rope_base :
    per layer, the sliding window (keys j with i - j < window; None: all the past) and RoPE's
    base (empty: no window, rope_base everywhere).
    """

    name: str
    d: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    vocab_size: int
    rope_base: float
    rms_eps: float
    tied_embeddings: bool
    context_length: int | None
    tensor_types: dict[str, int] = field(default_factory=dict)
    add_bos: bool = False
    bos_id: int | None = None
    architecture: str = "llama"
    norm: str = "pre"
    activation: str = "silu"
    embedding_scale: float = 1.0
    qk_norm: bool = False
    rope_pairing: str = "adjacent"
    layer_window: tuple[int | None, ...] = ()
    layer_rope_base: tuple[float, ...] = ()

    @property
    def kv_head(self) -> np.ndarray:
        """(n_heads,) the key/value head each query head reads: h // (n_heads / n_kv_heads)."""
        return np.arange(self.n_heads) // (self.n_heads // self.n_kv_heads)

    @property
    def rope(self) -> RoPE:
        """The rotary embedding of the file's W_Q, W_K rows at base `rope_base` (LLaMA:
        adjacent pairs, module docstring; Gemma 3: halves, its global layers')."""
        return RoPE(self.rope_base, pairing=self.rope_pairing)

    @property
    def scale(self) -> float:
        """The factor on the scores q.k: 1 / sqrt(d_head) (both architectures; Gemma 3's
        query_pre_attn_scalar is d_head)."""
        return 1.0 / np.sqrt(self.d_head)

    def _check_layer(self, layer: int) -> int:
        if (isinstance(layer, bool) or not isinstance(layer, (int, np.integer))
                or not 0 <= layer < self.n_layers):
            raise fail("layer", f"an integer in [0, {self.n_layers})", repr(layer))
        return int(layer)

    def rope_at(self, layer: int) -> RoPE:
        """The rotary embedding of layer `layer` (Gemma 3: base 1e4 local, 1e6 global)."""
        layer = self._check_layer(layer)
        base = self.layer_rope_base[layer] if self.layer_rope_base else self.rope_base
        return RoPE(base, pairing=self.rope_pairing)

    def window(self, layer: int) -> int | None:
        """The sliding window of layer `layer`: query i sees keys j with i - j < window;
        None: every key j <= i."""
        layer = self._check_layer(layer)
        return self.layer_window[layer] if self.layer_window else None


LlamaConfig = DecoderConfig  # the name of the LLaMA-only reader, kept


@dataclass(frozen=True, repr=False)
class DecoderBlock(ShortRepr):
    """The float32 weights of one layer, dequantised (shapes in the module docstring).

    Gemma 3 only (None for LLaMA): post_attn_norm, post_ffn_norm (d,) the gains of the RMSNorm
    after each sublayer (``post_attention_norm``, ``post_ffw_norm``); q_norm, k_norm (d_head,)
    the QK-norm gains (``attn_q_norm``, ``attn_k_norm``), one per coordinate of a head.
    """

    index: int
    attn_norm: np.ndarray
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    ffn_norm: np.ndarray
    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None


LlamaBlock = DecoderBlock  # the name of the LLaMA-only reader, kept


class GGUFModel:
    """A decoder's GGUF file (LLaMA or Gemma 3), read offline; weights dequantised lazily and
    kept (float32).

    Parameters
    ----------
    path : the .gguf file.
    cache : keep dequantised tensors on disk, keyed by the file's checksum
        (`attnflow.pretrained.weightcache`): True (default: under $ATTNFLOW_CACHE,
        $XDG_CACHE_HOME/attnflow or ~/.cache/attnflow; ATTNFLOW_CACHE=off turns it off),
        False, or the cache's root folder.

    Attributes
    ----------
    path, config (`DecoderConfig`); for `attnflow.pretrained.spectra` the `Checkpoint`
    attributes name, model_dir (= path), layout ("llama"), d, n_layers, n_heads, n_kv_heads,
    d_head, initializer_range (0.02: LLaMA's, GGUF does not record it).
    """

    layout = "llama"
    initializer_range = HF_INITIALIZER_RANGE

    def __init__(self, path: str | Path, cache: bool | str | Path = True) -> None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise fail("path", "an existing GGUF file", repr(str(path)))
        self.path = p
        self.model_dir = p
        if isinstance(cache, (bool, np.bool_)):
            self._cache_root = cache_root() if cache else None
        elif isinstance(cache, (str, os.PathLike)):
            self._cache_root = Path(cache)
        else:
            raise fail("cache", "True, False or a folder", repr(cache))
        index = None if self._cache is None else from_index(self._cache.read_json(INDEX))
        if index is None:  # parse the file's header (Gemma 3's: ~20 s, its 262k-token vocab)
            self._fields: Mapping[str, Any] = ReaderFields(self._reader, self._corrupt)
            self._tensors = {t.name: tensor_info(t) for t in self._reader.tensors}
        else:
            self._fields, self._tensors = index
        arch = self._meta("general.architecture", str)
        if arch not in ARCHITECTURES:
            raise fail("path", f"a GGUF file of a supported architecture {list(ARCHITECTURES)}",
                       f"not supported: {arch} ({p.name})")
        self._arch = arch
        self.config = self._config()
        self._check_tensors()
        self._blocks: dict[int, DecoderBlock] = {}
        if index is None and self._cache is not None:
            self._cache.write_json(INDEX, to_index(self._fields, self._tensors))

    @cached_property
    def _cache(self) -> WeightCache | None:
        """The on-disk cache of this file's parsed header and dequantised tensors, None when
        off (its key, the file's SHA-256, is computed when the model opens: ~0.3 s for
        Gemma 3 270M)."""
        return None if self._cache_root is None else WeightCache(self.path, self._cache_root)

    def __repr__(self) -> str:
        c = self.config
        return (f"GGUFModel({str(self.path)!r}, {c.name!r}, d={c.d}, layers={c.n_layers}, "
                f"heads={c.n_heads}, kv_heads={c.n_kv_heads}, d_head={c.d_head})")

    # ------------------------------------------------------------------ reading
    @cached_property
    def _reader(self) -> Any:
        """The `gguf.GGUFReader` of the file, which parses its header: only when the weight
        cache has no parsed header of the file."""
        return self._read()

    def _data(self, name: str) -> np.ndarray:
        """The stored (quantised) data of a tensor, memory-mapped from the file at the offset
        its header gives (`TensorInfo`), so that no header needs parsing."""
        t = self._tensors[name]
        try:
            return np.memmap(self.path, dtype=np.dtype(t.raw_dtype), mode="r",
                             offset=t.offset, shape=t.raw_shape)
        except (OSError, ValueError, TypeError) as err:
            raise self._corrupt(err) from err

    def _read(self) -> Any:
        try:
            import gguf
        except ImportError as err:
            raise fail("path", "the `gguf` package installed to read "
                       f"{self.path.name} (pip install 'attnflow[pretrained]')", "none") from err
        try:
            return gguf.GGUFReader(self.path)
        except READ_ERRORS as err:
            raise self._corrupt(err) from err

    def _corrupt(self, err: BaseException) -> ValueError:
        return fail("path", "a complete, well-formed GGUF file",
                    f"{str(self.path)!r}, unreadable ({type(err).__name__}: {err})")

    def _meta(self, key: str, kind: type, default: Any = None) -> Any:
        """The metadata value `key` (a str, int, float or bool, or a list of them), checked to
        be of `kind`; `default` when absent (an error when absent and default is None)."""
        if key not in self._fields:
            if default is None:
                raise fail("path", f"a GGUF file with metadata {key!r}",
                           f"none in {str(self.path)!r}")
            return default
        value = self._fields[key]
        items = value if isinstance(value, list) else [value]
        if kind is float:  # an integer-valued float may be stored as an integer
            items = [float(v) if type(v) is int else v for v in items]
        if not all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
                   for v in items):
            raise fail("path", f"metadata {key!r} of type {kind.__name__} in {str(self.path)!r}",
                       repr(value)[:80])
        return items if isinstance(value, list) else items[0]

    def _config(self) -> DecoderConfig:
        a = self._arch + "."
        d = self._positive(a + "embedding_length")
        heads = self._positive(a + "attention.head_count")
        kv_heads = self._positive(a + "attention.head_count_kv", heads)
        if heads % kv_heads:
            raise fail("path", f"head_count a multiple of head_count_kv in {str(self.path)!r}",
                       f"{heads} and {kv_heads}")
        d_head = self._positive(a + "attention.key_length", d // heads)
        d_value = self._positive(a + "attention.value_length", d_head)
        if d_value != d_head:
            raise fail("path", "keys and values of the same head size",
                       f"not supported: key_length {d_head}, value_length {d_value} "
                       f"({self.path.name})")
        rope_dim = self._positive(a + "rope.dimension_count", d_head)
        scaling = self._meta(a + "rope.scaling.type", str, "none")
        if rope_dim != d_head or scaling != "none" or d_head % 2:
            raise fail("path", "RoPE on whole heads of even size without scaling",
                       f"not supported: rope dimension {rope_dim}, head size {d_head}, "
                       f"scaling {scaling!r} ({self.path.name})")
        if "token_embd.weight" not in self._tensors:
            raise fail("path", "a GGUF file with tensor 'token_embd.weight'",
                       f"none in {str(self.path)!r}")
        embd_shape = self._tensors["token_embd.weight"].shape
        if len(embd_shape) != 2:
            raise fail("path", "a 2-d tensor 'token_embd.weight'",
                       f"shape {tuple(int(s) for s in embd_shape)} in {str(self.path)!r}")
        vocab = int(embd_shape[1])
        eps = self._meta(a + "attention.layer_norm_rms_epsilon", float)
        base = self._meta(a + "rope.freq_base", float, 10000.0)
        if not (np.isfinite(base) and base > 0 and np.isfinite(eps) and eps >= 0):
            raise fail("path", f"rope.freq_base > 0 and rms eps >= 0 in {str(self.path)!r}",
                       f"{base!r} and {eps!r}")
        types: dict[str, int] = {}
        for t in self._tensors.values():
            types[t.type] = types.get(t.type, 0) + 1
        bos = self._meta("tokenizer.ggml.bos_token_id", int, -1)
        context = self._meta(a + "context_length", int, -1)
        layers = self._positive(a + "block_count")
        extra = self._gemma3(a, layers, d, float(base)) if self._arch == "gemma3" else {}
        return DecoderConfig(
            name=self._meta("general.name", str, self.path.stem),
            d=d, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
            d_head=d_head, d_ff=self._positive(a + "feed_forward_length"), vocab_size=vocab,
            rope_base=float(base), rms_eps=float(eps),
            tied_embeddings="output.weight" not in self._tensors,
            context_length=context if context > 0 else None,
            tensor_types=types,
            add_bos=bool(self._meta("tokenizer.ggml.add_bos_token", bool, False)),
            bos_id=bos if bos >= 0 else None, architecture=self._arch, **extra)

    def _gemma3(self, a: str, n_layers: int, d: int, base: float) -> dict[str, Any]:
        """The DecoderConfig fields in which Gemma 3 differs from LLaMA (module docstring)."""
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if key in self._fields or a + key in self._fields:
                raise fail("path", "a Gemma 3 file without logit soft-capping",
                           f"not supported: {a + key} ({self.path.name})")
        window = self._positive(a + "attention.sliding_window")
        local = self._meta(a + "rope.freq_base_swa", float, GEMMA3_LOCAL_BASE)
        if not (np.isfinite(local) and local > 0):
            raise fail("path", f"rope.freq_base_swa > 0 in {str(self.path)!r}", repr(local))
        key = a + "attention.sliding_window_pattern"
        if key in self._fields and isinstance(self._fields[key], list):
            sliding = self._meta(a + "attention.sliding_window_pattern", bool)
            if len(sliding) != n_layers:
                raise fail("path", f"sliding_window_pattern of {n_layers} layers in "
                           f"{str(self.path)!r}", f"{len(sliding)} entries")
        else:
            period = self._positive(a + "attention.sliding_window_pattern", GEMMA3_PATTERN)
            sliding = [(layer + 1) % period != 0 for layer in range(n_layers)]
        return {"norm": "peri", "activation": "gelu_tanh", "embedding_scale": float(np.sqrt(d)),
                "qk_norm": True, "rope_pairing": "halves",
                "layer_window": tuple(window if s else None for s in sliding),
                "layer_rope_base": tuple(float(local) if s else base for s in sliding)}

    def _positive(self, key: str, default: int | None = None) -> int:
        value = self._meta(key, int, default)
        if value < 1:
            raise fail("path", f"a positive {key!r} in {str(self.path)!r}", repr(value))
        return int(value)

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the model needs, with its numpy shape (rows, columns)."""
        c = self.config
        q, kv = c.n_heads * c.d_head, c.n_kv_heads * c.d_head
        per_block = {"attn_norm": (c.d,), "attn_q": (q, c.d), "attn_k": (kv, c.d),
                     "attn_v": (kv, c.d), "attn_output": (c.d, q), "ffn_norm": (c.d,),
                     "ffn_gate": (c.d_ff, c.d), "ffn_up": (c.d_ff, c.d),
                     "ffn_down": (c.d, c.d_ff), "attn_q_norm": (c.d_head,),
                     "attn_k_norm": (c.d_head,), "post_attention_norm": (c.d,),
                     "post_ffw_norm": (c.d,)}
        shapes = {"token_embd.weight": (c.vocab_size, c.d), "output_norm.weight": (c.d,)}
        if not c.tied_embeddings:
            shapes["output.weight"] = (c.vocab_size, c.d)
        for layer in range(c.n_layers):
            for name in _TENSORS[self._arch]:
                shapes[f"blk.{layer}.{name}.weight"] = per_block[name]
        return shapes

    def _check_tensors(self) -> None:
        expected = self._expected_shapes()
        missing = sorted(set(expected) - set(self._tensors))
        if missing:
            raise fail("path", f"a {self._arch} GGUF file with tensors {missing[:5]}",
                       f"{len(missing)} missing in {str(self.path)!r}")
        extra = sorted(set(self._tensors) - set(expected))
        if extra:
            raise fail("path", f"only the tensors of the plain {self._arch} layout",
                       f"not supported: {extra[:5]} ({self.path.name})")
        for name, shape in expected.items():
            found = tuple(int(s) for s in reversed(self._tensors[name].shape))
            if found != shape:
                raise fail("path", f"tensor {name!r} of shape {shape} (the file's metadata)",
                           f"shape {found} in {str(self.path)!r}")

    def tensor(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """One tensor, dequantised to float32, numpy shape (rows, columns), read-only; with
        `rows` (integer indices) only those rows, in that order (GGUF quantises row by row, so
        they are the same numbers as the whole tensor's rows, at a fraction of the cost).
        Whole tensors come from the on-disk cache when it has them (verified, so a refused
        entry is dequantised again and rewritten), and go into it; rows come from the cache
        once the whole tensor has been verified, else from the file (verifying a whole
        table to read a few rows would cost more than dequantising them)."""
        t = self._tensors.get(name)
        if t is None:
            raise fail("name", f"a tensor of {self.path.name}", repr(name))
        shape = tuple(int(s) for s in reversed(t.shape))
        cached = None  # rows alone come from the cache only once it is verified (whole)
        if self._cache is not None:
            cached = self._cache.get(name, shape) if rows is None else self._cache.loaded(name)
        if cached is not None:
            return cached if rows is None else _read_only(cached[rows])
        data = self._data(name)
        if rows is None:
            a = self._dequantise(name, data, shape)
            if self._cache is not None:
                self._cache.put(name, a)
            return a
        return self._dequantise(name, data[rows], (len(rows), *shape[1:]))

    def _dequantise(self, name: str, data: Any, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor data of the file dequantised to a read-only float32 array of that shape,
        checked finite."""
        kind = self._tensors[name].type
        try:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            a = np.array(dequantize(data, GGMLQuantizationType[kind]),
                         dtype=np.float32).reshape(shape)
        except NotImplementedError as err:
            raise fail("path", "tensors of a type the gguf package dequantises",
                       f"{kind} for {name!r} in {str(self.path)!r}") from err
        except READ_ERRORS as err:
            raise self._corrupt(err) from err
        bad = a.size - int(np.count_nonzero(np.isfinite(a)))
        if bad:
            raise fail("path", f"finite weights in tensor {name!r}",
                       f"{bad} non-finite values in {str(self.path)!r} (corrupted?)")
        return _read_only(a)

    # ------------------------------------------------------------------ model
    @property
    def name(self) -> str:
        return self.config.name

    @property
    def d(self) -> int:
        return self.config.d

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.config.n_kv_heads

    @property
    def d_head(self) -> int:
        return self.config.d_head

    @property
    def quantised(self) -> bool:
        """True when some tensor is stored in a quantised (not float) type."""
        return any(t not in _FLOAT_TYPES for t in self.config.tensor_types)

    @property
    def note(self) -> str:
        """What the weights are: their storage types, and that quantised ones approximate the
        released model."""
        types = ", ".join(f"{k} ({v})" for k, v in sorted(self.config.tensor_types.items()))
        if not self.quantised:
            return f"{self.name}: float weights read from GGUF (tensor types: {types})."
        return (f"{self.name}: weights dequantised from the GGUF file's quantised tensors "
                f"(tensor types: {types}); they approximate the released model's float "
                "weights, so numbers differ slightly from the original model's.")

    def block(self, layer: int) -> DecoderBlock:
        """The float32 weights of layer `layer` (0-based), dequantised once and kept."""
        layer = self.config._check_layer(layer)
        if layer not in self._blocks:
            w = {name: self.tensor(f"blk.{layer}.{name}.weight")
                 for name in _TENSORS[self._arch]}
            self._blocks[layer] = DecoderBlock(
                index=layer, attn_norm=w["attn_norm"], W_Q=w["attn_q"], W_K=w["attn_k"],
                W_V=w["attn_v"], W_O=w["attn_output"], ffn_norm=w["ffn_norm"],
                W_gate=w["ffn_gate"], W_up=w["ffn_up"], W_down=w["ffn_down"],
                post_attn_norm=w.get("post_attention_norm"),
                post_ffn_norm=w.get("post_ffw_norm"),
                q_norm=w.get("attn_q_norm"), k_norm=w.get("attn_k_norm"))
        return self._blocks[layer]

    def layer(self, layer: int) -> AttentionLayer:
        """The per-head attention weights of layer `layer` as an `AttentionLayer` (float64;
        W_Q, W_K rows in the file's adjacent-pair order; W_K, W_V of each query head are its
        key/value head's; norm gains "attn_norm", "ffn_norm", and for Gemma 3 also
        "post_attention_norm", "post_ffw_norm" (d,), "attn_q_norm", "attn_k_norm" (d_head,))."""
        b = self.block(layer)
        c = self.config
        H, Hkv, e, d = c.n_heads, c.n_kv_heads, c.d_head, c.d
        kv = c.kv_head
        as64 = np.float64
        return AttentionLayer(
            index=b.index,
            W_Q=b.W_Q.astype(as64).reshape(H, e, d),
            W_K=b.W_K.astype(as64).reshape(Hkv, e, d)[kv],
            W_V=b.W_V.astype(as64).reshape(Hkv, e, d)[kv],
            W_O=b.W_O.astype(as64).reshape(d, H, e).transpose(1, 0, 2),
            kv_head=kv,
            norm_gains={name: g.astype(as64) for name, g in (
                ("attn_norm", b.attn_norm), ("ffn_norm", b.ffn_norm),
                ("post_attention_norm", b.post_attn_norm), ("post_ffw_norm", b.post_ffn_norm),
                ("attn_q_norm", b.q_norm), ("attn_k_norm", b.k_norm)) if g is not None})

    @cached_property
    def embeddings(self) -> np.ndarray:
        """(vocab, d) float32 token embeddings."""
        return self.tensor("token_embd.weight")

    @cached_property
    def output_map(self) -> np.ndarray:
        """(vocab, d) float32: logits = output_map @ RMSNorm(x) (the embeddings when tied)."""
        return self.embeddings if self.config.tied_embeddings else self.tensor("output.weight")

    @cached_property
    def output_norm(self) -> np.ndarray:
        """(d,) float32 gain of the final RMSNorm."""
        return self.tensor("output_norm.weight")

    def embed(self, token_ids: Sequence[int]) -> np.ndarray:
        """The residual stream entering layer 0, (n, d) float64: the word embeddings times
        `DecoderConfig.embedding_scale` (Gemma 3: sqrt(d); positions are rotary, inside
        attention)."""
        x = self.embedding_rows(token_ids).astype(np.float64)
        scale = self.config.embedding_scale
        return x if scale == 1.0 else x * scale

    def embedding_rows(self, token_ids: Sequence[int]) -> np.ndarray:
        """(n, d) float32: the rows of `embeddings` for these token ids, dequantised alone
        unless the whole table is already (Gemma 3's 262 144 rows take 15 s)."""
        ids = check_ids(token_ids, self.config.vocab_size)
        if "embeddings" in self.__dict__:
            return self.embeddings[ids]
        return self.tensor("token_embd.weight", rows=ids)

    # ------------------------------------------------------------------ tokenizer
    @cached_property
    def tokenizer(self) -> Any:
        """The file's own tokenizer: byte-level BPE (`attnflow.pretrained.tokenizer`) or
        SentencePiece (`attnflow.pretrained.spm`, ``tokenizer.ggml.model = "llama"``)."""
        from attnflow.pretrained.tokenizer import bpe_tokenizer

        tokens = self._meta("tokenizer.ggml.tokens", str)
        types = self._meta("tokenizer.ggml.token_type", int, [1] * len(tokens))
        if self._meta("tokenizer.ggml.model", str) == "llama":
            from attnflow.pretrained.spm import SentencePiece

            return SentencePiece(tokens, self._meta("tokenizer.ggml.scores", float), types,
                                 self._meta("tokenizer.ggml.add_space_prefix", bool, True),
                                 str(self.path))
        return bpe_tokenizer(tokens, self._meta("tokenizer.ggml.merges", str, []), types,
                             self._meta("tokenizer.ggml.model", str),
                             self._meta("tokenizer.ggml.pre", str, "default"),
                             str(self.path))

    def token_ids(self, text: str) -> list[int]:
        """The model's tokenisation of `text` (a BOS token first when the file asks for it)."""
        if not isinstance(text, str) or not text:
            raise fail("text", "a non-empty string", repr(text))
        ids = list(self.tokenizer.encode(text).ids)
        if self.config.add_bos and self.config.bos_id is not None:
            ids.insert(0, self.config.bos_id)
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids, control tokens included (decode(token_ids(t)) == t)."""
        ids = check_ids(token_ids, self.config.vocab_size)
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def check_ids(token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """Token ids as a 1-d int array in [0, vocab_size), non-empty."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise fail("token_ids", "a non-empty 1-d sequence of integers", describe(ids))
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise fail("token_ids", f"ids in [0, {vocab_size})", f"ids in [{ids.min()}, {ids.max()}]")
    return ids
