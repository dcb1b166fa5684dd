"""Read per-head attention weights from a Hugging Face checkpoint directory, offline.

A checkpoint directory holds ``config.json`` and the weights as ``model.safetensors`` (or
sharded, with ``model.safetensors.index.json``) or ``pytorch_model.bin`` (or sharded, with
``pytorch_model.bin.index.json``). Nothing is ever downloaded.

A checkpoint is untrusted input: safetensors files are plain data and read with
`safetensors` (bfloat16 tensors, which numpy lacks, by reading the raw little-endian words
at the offsets the safetensors header gives); ``pytorch_model.bin`` only through
``torch.load(..., weights_only=True)``, which refuses any pickle that would run code.

Conventions (docs/science.md §5; docs/design.md): matrices act on column vectors of the residual
stream R^d. For head h of a layer with head size d_head:

* W_Q^h, W_K^h, W_V^h : (d_head, d), so q = W_Q^h x;
* W_O^h : (d, d_head), the output projection's columns for head h;
* V_h = W_O^h W_V^h : (d, d), the head's value map on the residual stream;
* B_h = (W_Q^h)^T W_K^h / sqrt(d_head) : (d, d), so the head's score is x_k^T B_h x_j.

`Checkpoint.layer` reads no biases (the dynamics of docs/science.md §1 are linear in the
tokens); `Checkpoint.encoder_block` reads the whole layer of a BERT-layout encoder, biases and
LayerNorms included, for its real forward pass (`attnflow.pretrained.build.encoder_stack`).

Layouts, recognised from the tensor names (any prefix such as ``bert.`` is allowed):

* ``bert``: BERT, MiniLM, RoBERTa, ... (``encoder.layer.L.attention.self.query.weight``).
* ``albert``: one set of weights (per layer group) shared by all layers
  (``encoder.albert_layer_groups.G.albert_layers.0.attention.query.weight``).
* ``gpt2``: fused ``h.L.attn.c_attn.weight`` of shape (d, 3 d), Conv1D weights stored
  transposed (in, out).
* ``llama``: ``layers.L.self_attn.{q,k,v,o}_proj.weight`` with grouped-query attention:
  query head h reads key/value head h // (n_heads / n_kv_heads). Rotary position embeddings
  act inside the score and are not part of B_h.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import describe, fail
from attnflow._repr import ShortRepr

__all__ = ["LAYOUTS", "AttentionLayer", "Checkpoint", "EncoderBlock", "distinct_layers",
           "load_layers"]

LAYOUTS = ("bert", "albert", "gpt2", "llama")

# The query weight of layer 0 in each layout; group 1 is the prefix (e.g. "bert.").
_DETECT = {
    "bert": r"(.*?)encoder\.layer\.0\.attention\.self\.query\.weight",
    "albert": r"(.*?)encoder\.albert_layer_groups\.0\.albert_layers\.0\.attention\.query\.weight",
    "gpt2": r"(.*?)h\.0\.attn\.c_attn\.weight",
    "llama": r"(.*?)layers\.0\.self_attn\.q_proj\.weight",
}
# Config keys per layout: hidden size, heads, layers.
_CONFIG_KEYS = {
    "bert": ("hidden_size", "num_attention_heads", "num_hidden_layers"),
    "albert": ("hidden_size", "num_attention_heads", "num_hidden_layers"),
    "gpt2": ("n_embd", "n_head", "n_layer"),
    "llama": ("hidden_size", "num_attention_heads", "num_hidden_layers"),
}
# A LayerNorm / RMSNorm gain inside a layer: the name relative to the layer's stem.
_NORM_GAIN = re.compile(r"(^|\.)(\w*norm\w*|ln_\w+)\.weight$", re.IGNORECASE)
_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")
HF_INITIALIZER_RANGE = 0.02  # Hugging Face's default `initializer_range` for these models


@dataclass(frozen=True, repr=False)
class AttentionLayer(ShortRepr):
    """The per-head attention weights of one layer (float64, see the module docstring).

    Attributes
    ----------
    index : the layer index (0-based, in depth).
    W_Q, W_K, W_V : (n_heads, d_head, d). With grouped-query attention W_K, W_V hold, for
        each query head, the key/value head it reads (`kv_head`).
    W_O : (n_heads, d, d_head).
    kv_head : (n_heads,) index of the key/value head each query head reads.
    norm_gains : LayerNorm / RMSNorm gains (d,) of this layer, keyed by the checkpoint's name
        relative to the layer (e.g. ``"attention.output.LayerNorm"``). Loaded for reference,
        not folded into the matrices.
    """

    index: int
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    kv_head: np.ndarray
    norm_gains: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d(self) -> int:
        return self.W_Q.shape[2]

    def value_map(self, head: int) -> np.ndarray:
        """V_h = W_O^h W_V^h, (d, d): the head's value map on the residual stream."""
        return self.W_O[head] @ self.W_V[head]

    def value_core(self, head: int) -> np.ndarray:
        """W_V^h W_O^h, (d_head, d_head): same nonzero spectrum (with Jordan structure) as V_h."""
        return self.W_V[head] @ self.W_O[head]

    def qk_form(self, head: int) -> np.ndarray:
        """B_h = (W_Q^h)^T W_K^h / sqrt(d_head), (d, d): the score of (k, j) is x_k^T B_h x_j."""
        return self.W_Q[head].T @ self.W_K[head] / np.sqrt(self.d_head)


@dataclass(frozen=True, repr=False)
class EncoderBlock(ShortRepr):
    """Every weight of one BERT-layout encoder layer (float64), whose computation on the
    hidden states x (n, d) is

        h = LN_attn(x + b_O + sum_h W_O^h softmax((W_Q^h x + b_Q^h)^T (W_K^h x + b_K^h)
                                                  / sqrt(e)) (W_V^h x + b_V^h))
        x' = LN_ffn(h + W_down gelu(W_up h + b_up) + b_down)

    (full attention, exact erf GELU; LN(x) = g (x - mean) / sqrt(var + eps) + b).

    W_Q, W_K, W_V : (H, e, d); b_Q, b_K, b_V : (H, e); W_O : (H, d, e); b_O : (d,);
    W_up : (h, d); b_up : (h,); W_down : (d, h); b_down : (d,);
    ln_attn, ln_ffn : (gain, bias), each (d,); eps : the LayerNorms' eps; activation : the
    config's hidden_act.
    """

    index: int
    W_Q: np.ndarray
    b_Q: np.ndarray
    W_K: np.ndarray
    b_K: np.ndarray
    W_V: np.ndarray
    b_V: np.ndarray
    W_O: np.ndarray
    b_O: np.ndarray
    W_up: np.ndarray
    b_up: np.ndarray
    W_down: np.ndarray
    b_down: np.ndarray
    ln_attn: tuple[np.ndarray, np.ndarray]
    ln_ffn: tuple[np.ndarray, np.ndarray]
    eps: float
    activation: str


class _Tensors:
    """Named tensors of a checkpoint directory, read lazily, returned as float64 arrays."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.files: dict[str, Path] = {}  # tensor name -> file holding it
        self._open: dict[Path, Any] = {}
        st, st_index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
        pt, pt_index = model_dir / "pytorch_model.bin", model_dir / "pytorch_model.bin.index.json"
        if st.is_file():
            self.kind = "safetensors"
            self._index_single(st)
        elif st_index.is_file():
            self.kind = "safetensors"
            self._index_sharded(st_index)
        elif pt.is_file():
            self.kind = "torch"
            self._index_single(pt)
        elif pt_index.is_file():
            self.kind = "torch"
            self._index_sharded(pt_index)
        else:
            raise fail("model_dir", "a checkpoint directory with model.safetensors, "
                       "model.safetensors.index.json, pytorch_model.bin or "
                       "pytorch_model.bin.index.json",
                       f"{str(model_dir)!r} holding {_files(model_dir)}")

    @property
    def names(self) -> list[str]:
        return sorted(self.files)

    def _index_single(self, path: Path) -> None:
        for name in self._file(path).keys():
            self.files[name] = path

    def _index_sharded(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise fail("model_dir", f"{index.name} with a 'weight_map'", repr(err)) from err
        for name, shard in weight_map.items():
            path = (self.model_dir / shard).resolve()
            if path.parent != self.model_dir.resolve():
                raise fail("model_dir", f"shards inside the checkpoint directory ({index.name})",
                           repr(shard))
            self.files[name] = path

    def _file(self, path: Path) -> Any:
        """The opened file: a safetensors handle, or the dict of tensors of a torch file."""
        if path not in self._open:
            self._open[path] = (_open_safetensors(path) if self.kind == "safetensors"
                                else _load_torch(path))
        return self._open[path]

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str, what: str) -> np.ndarray:
        """The tensor `name` as float64; `what` names the checkpoint layout for the error."""
        if name not in self.files:
            raise fail("model_dir", f"a {what} checkpoint with tensor {name!r}",
                       f"tensors {_listing(self.names)} in {str(self.model_dir)!r}")
        path = self.files[name]
        handle = self._file(path)
        if self.kind == "torch":
            return handle[name].float().numpy().astype(np.float64)
        if handle.get_slice(name).get_dtype() == "BF16":
            return _read_bf16(path, name)
        return np.asarray(handle.get_tensor(name), dtype=np.float64)


def _listing(names: Sequence[str], limit: int = 80) -> str:
    shown = ", ".join(names[:limit])
    more = f", ... and {len(names) - limit} more" if len(names) > limit else ""
    return f"[{shown}{more}]"


def _files(directory: Path) -> str:
    return _listing(sorted(p.name for p in directory.iterdir()), limit=20)


def _open_safetensors(path: Path) -> Any:
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as err:
        raise fail("model_dir", "the `safetensors` package installed to read "
                   f"{path.name} (pip install 'attnflow[pretrained]')", "none") from err

    try:
        return safe_open(str(path), framework="np")
    except (SafetensorError, OSError) as err:
        raise fail("model_dir", "a readable safetensors file", f"{path.name}: {err}") from err


def _read_bf16(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor of a safetensors file as float64 (bf16 is the top half of float32).

    Layout of the format: 8-byte little-endian header length, JSON header with each tensor's
    dtype, shape and byte offsets relative to the end of the header, then the data."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        info = json.loads(fh.read(n))[name]
    start, end = info["data_offsets"]
    words = np.fromfile(path, dtype="<u2", count=(end - start) // 2, offset=8 + n + start)
    return (words.astype("<u4") << 16).view("<f4").astype(np.float64).reshape(info["shape"])


def _load_torch(path: Path) -> dict[str, Any]:
    """The tensors of a pytorch_model.bin, through torch's restricted (weights-only) unpickler."""
    try:
        import torch
    except ImportError as err:
        raise fail("model_dir", "model.safetensors, or torch installed to read "
                   "pytorch_model.bin (pip install 'attnflow[torch]')",
                   f"{path.name} without torch") from err
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # legacy (non-zip) files cannot be memory-mapped
        state = _load_torch_unmapped(torch, path)
    except Exception as err:  # noqa: BLE001 - any refusal of the unpickler
        raise _refused(path, err) from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise fail("model_dir", f"{path.name} holding a dict of tensors", type(state).__name__)
    return state


def _load_torch_unmapped(torch: Any, path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001
        raise _refused(path, err) from err


def _refused(path: Path, err: Exception) -> ValueError:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    first = text.splitlines()[0].split(". ")[0] if text else ""
    return fail("model_dir", f"{path.name} holding plain tensors only (read with "
                "torch.load(weights_only=True); pickled code is refused)",
                f"{type(err).__name__}: {first}")


class Checkpoint:
    """A Hugging Face checkpoint directory, read offline and lazily.

    Parameters
    ----------
    model_dir : directory with config.json and the weights (see the module docstring).

    Attributes
    ----------
    layout : one of `LAYOUTS`, recognised from the tensor names.
    d, n_heads, n_kv_heads, d_head, n_layers : the attention shapes (from config.json).
    initializer_range : the std of the Gaussian initialiser (config ``initializer_range``,
        else Hugging Face's default 0.02).
    tensor_names : every tensor name in the checkpoint.
    """

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise fail("model_dir", "an existing checkpoint directory", repr(str(model_dir)))
        self.model_dir = path
        config_path = path / "config.json"
        try:
            self.config: dict[str, Any] = json.loads(config_path.read_text())
        except FileNotFoundError as err:
            raise fail("model_dir", "a directory with config.json",
                       f"{str(path)!r} holding {_files(path)}") from err
        except json.JSONDecodeError as err:
            raise fail("model_dir", "a valid JSON config.json", str(err)) from err
        self._tensors = _Tensors(path)
        self.layout, self._prefix = self._detect()
        hidden, heads, layers = (self._config_int(k) for k in _CONFIG_KEYS[self.layout])
        self.d, self.n_heads, self.n_layers = hidden, heads, layers
        if self.layout == "llama":
            self.n_kv_heads = int(self.config.get("num_key_value_heads") or heads)
            self.d_head = int(self.config.get("head_dim") or hidden // heads)
        else:
            self.n_kv_heads = heads
            self.d_head = hidden // heads
        if heads % self.n_kv_heads or self.n_kv_heads < 1:
            raise fail("config.json", "num_attention_heads a multiple of num_key_value_heads",
                       f"{heads} and {self.n_kv_heads}")
        self.initializer_range = float(self.config.get("initializer_range",
                                                       HF_INITIALIZER_RANGE))
        if self.layout == "albert" and int(self.config.get("inner_group_num", 1)) != 1:
            raise fail("config.json", "inner_group_num = 1 (one ALBERT layer per group)",
                       self.config["inner_group_num"])

    def __repr__(self) -> str:
        return (f"Checkpoint({str(self.model_dir)!r}, layout={self.layout!r}, d={self.d}, "
                f"layers={self.n_layers}, heads={self.n_heads}, kv_heads={self.n_kv_heads}, "
                f"d_head={self.d_head})")

    @property
    def tensor_names(self) -> list[str]:
        return self._tensors.names

    @property
    def name(self) -> str:
        """A readable model name: config ``_name_or_path`` when set, else the directory name."""
        return str(self.config.get("_name_or_path") or self.model_dir.name)

    def _detect(self) -> tuple[str, str]:
        for layout, pattern in _DETECT.items():
            for name in self._tensors.names:
                match = re.fullmatch(pattern, name)
                if match:
                    return layout, match.group(1)
        raise fail("model_dir", f"a checkpoint in one of the layouts {list(LAYOUTS)} (e.g. "
                   "'encoder.layer.0.attention.self.query.weight')",
                   f"unknown layout with tensors {_listing(self._tensors.names)}")

    def _config_int(self, key: str) -> int:
        value = self.config.get(key)
        if not isinstance(value, int) or value < 1:
            raise fail("config.json", f"a positive integer {key!r} ({self.layout} layout)",
                       repr(value))
        return value

    def _get(self, name: str) -> np.ndarray:
        return self._tensors.get(self._prefix + name, self.layout)

    def _shaped(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        a = self._get(name)
        if a.shape != shape:
            raise fail("model_dir", f"tensor {self._prefix + name!r} of shape {shape} "
                       f"(config.json of a {self.layout} model)", describe(a))
        return a

    # ------------------------------------------------------------------ layers
    def layer_stem(self, layer: int) -> str:
        """The tensor-name stem of layer `layer` (relative to the checkpoint's prefix)."""
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.n_layers:
            raise fail("layer", f"an integer in [0, {self.n_layers})", repr(layer))
        if self.layout == "bert":
            return f"encoder.layer.{layer}."
        if self.layout == "albert":
            groups = int(self.config.get("num_hidden_groups", 1))
            return f"encoder.albert_layer_groups.{layer * groups // self.n_layers}.albert_layers.0."
        if self.layout == "gpt2":
            return f"h.{layer}."
        return f"layers.{layer}."

    def layer(self, layer: int) -> AttentionLayer:
        """The per-head weights of layer `layer` (0-based)."""
        stem = self.layer_stem(layer)
        d, H, Hkv, dh = self.d, self.n_heads, self.n_kv_heads, self.d_head
        if self.layout == "gpt2":
            fused = self._shaped(stem + "attn.c_attn.weight", (d, 3 * d)).T  # Conv1D: (in, out)
            q, k, v = fused[:d], fused[d:2 * d], fused[2 * d:]
            o = self._shaped(stem + "attn.c_proj.weight", (d, d)).T
        else:
            names = {
                "bert": ("attention.self.query", "attention.self.key", "attention.self.value",
                         "attention.output.dense"),
                "albert": ("attention.query", "attention.key", "attention.value",
                           "attention.dense"),
                "llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj"),
            }[self.layout]
            q = self._shaped(stem + names[0] + ".weight", (H * dh, d))
            k = self._shaped(stem + names[1] + ".weight", (Hkv * dh, d))
            v = self._shaped(stem + names[2] + ".weight", (Hkv * dh, d))
            o = self._shaped(stem + names[3] + ".weight", (d, H * dh))
        kv_head = np.arange(H) // (H // Hkv)
        gains = {}
        for full in self._tensors.names:
            rest = full.removeprefix(self._prefix + stem)
            if rest != full and _NORM_GAIN.search(rest):
                gains[rest.removesuffix(".weight")] = self._tensors.get(full, self.layout)
        return AttentionLayer(
            index=layer,
            W_Q=q.reshape(H, dh, d),
            W_K=k.reshape(Hkv, dh, d)[kv_head],
            W_V=v.reshape(Hkv, dh, d)[kv_head],
            W_O=o.reshape(d, H, dh).transpose(1, 0, 2),
            kv_head=kv_head,
            norm_gains=gains,
        )

    def encoder_block(self, layer: int) -> EncoderBlock:
        """Every weight of layer `layer` (0-based) of a BERT-layout encoder (`EncoderBlock`)."""
        if self.layout != "bert":
            raise fail("model_dir", "a BERT-layout encoder (BERT, MiniLM) for the real "
                       "forward pass", f"a checkpoint of layout {self.layout!r}")
        stem = self.layer_stem(layer)
        w = self.layer(layer)
        d, H, e = self.d, self.n_heads, self.d_head
        width = self._config_int("intermediate_size")

        def vec(name: str, size: int) -> np.ndarray:
            return self._shaped(stem + name, (size,))

        def ln(name: str) -> tuple[np.ndarray, np.ndarray]:
            return vec(name + ".weight", d), vec(name + ".bias", d)

        return EncoderBlock(
            index=layer, W_Q=w.W_Q, W_K=w.W_K, W_V=w.W_V, W_O=w.W_O,
            b_Q=vec("attention.self.query.bias", H * e).reshape(H, e),
            b_K=vec("attention.self.key.bias", H * e).reshape(H, e),
            b_V=vec("attention.self.value.bias", H * e).reshape(H, e),
            b_O=vec("attention.output.dense.bias", d),
            W_up=self._shaped(stem + "intermediate.dense.weight", (width, d)),
            b_up=vec("intermediate.dense.bias", width),
            W_down=self._shaped(stem + "output.dense.weight", (d, width)),
            b_down=vec("output.dense.bias", d),
            ln_attn=ln("attention.output.LayerNorm"), ln_ffn=ln("output.LayerNorm"),
            eps=float(self.config.get("layer_norm_eps", 1e-12)),
            activation=str(self.config.get("hidden_act", "gelu")))

    @property
    def context_length(self) -> int | None:
        """The most tokens the position embeddings hold (config max_position_embeddings)."""
        value = self.config.get("max_position_embeddings", self.config.get("n_positions"))
        return int(value) if isinstance(value, int) else None

    # ------------------------------------------------------------------ embeddings
    @cached_property
    def _tokenizer(self) -> Any:
        path = self.model_dir / "tokenizer.json"
        if not path.is_file():
            raise fail("model_dir", "a tokenizer.json to tokenise text (or give token ids)",
                       f"none in {str(self.model_dir)!r}")
        try:
            from tokenizers import Tokenizer
        except ImportError as err:
            raise fail("text", "the `tokenizers` package installed (pip install "
                       "'attnflow[pretrained]'), or token ids", "text without it") from err
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_padding()  # pad/truncate settings are for batches; the text stays whole
        tokenizer.no_truncation()
        return tokenizer

    def token_ids(self, text: str) -> list[int]:
        """The model's own tokenisation of `text`, with its special tokens (e.g. [CLS] ...
        [SEP] for BERT), through `tokenizers` and the checkpoint's tokenizer.json."""
        if not isinstance(text, str) or not text.strip():
            raise fail("text", "a non-empty string", repr(text))
        return list(self._tokenizer.encode(text).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of token ids, special tokens included."""
        return self._tokenizer.decode([int(i) for i in token_ids], skip_special_tokens=False)

    @property
    def path(self) -> Path:
        """The checkpoint folder."""
        return self.model_dir

    @property
    def note(self) -> str:
        """How the weights were read (for provenance records)."""
        return f"Hugging Face checkpoint ({self.layout} layout), weights as stored, in float64"

    def embed(self, token_ids: Sequence[int]) -> np.ndarray:
        """The residual stream entering layer 0 for these token ids, (n, d), not normalised.

        bert: LayerNorm(word + position + token-type-0 embeddings) with its gain and bias;
        albert: the same followed by the embedding-to-hidden map (with its bias);
        gpt2: word + position embeddings; llama: word embeddings (positions are rotary).
        """
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise fail("token_ids", "a non-empty 1-d sequence of integers", describe(ids))
        names = {"bert": "embeddings.word_embeddings.weight",
                 "albert": "embeddings.word_embeddings.weight",
                 "gpt2": "wte.weight", "llama": "embed_tokens.weight"}
        word = self._get(names[self.layout])
        if ids.min() < 0 or ids.max() >= word.shape[0]:
            raise fail("token_ids", f"ids in [0, {word.shape[0]})",
                       f"ids in [{ids.min()}, {ids.max()}]")
        x = word[ids]
        positions = np.arange(len(ids))
        if self.layout in ("bert", "albert"):
            if self.config.get("model_type") in _ROBERTA_LIKE:
                positions = positions + int(self.config.get("pad_token_id", 1)) + 1
            x = x + self._positions("embeddings.position_embeddings.weight", positions)
            if self._prefix + "embeddings.token_type_embeddings.weight" in self._tensors:
                x = x + self._get("embeddings.token_type_embeddings.weight")[0]
            eps = float(self.config.get("layer_norm_eps", 1e-12))
            x = _layer_norm(x, self._get("embeddings.LayerNorm.weight"),
                            self._get("embeddings.LayerNorm.bias"), eps)
            if self.layout == "albert":
                x = (x @ self._get("encoder.embedding_hidden_mapping_in.weight").T
                     + self._get("encoder.embedding_hidden_mapping_in.bias"))
        elif self.layout == "gpt2":
            x = x + self._positions("wpe.weight", positions)
        return x

    def _positions(self, name: str, positions: np.ndarray) -> np.ndarray:
        table = self._get(name)
        if positions[-1] >= table.shape[0]:
            raise fail("token_ids", f"at most {table.shape[0] - positions[0]} tokens "
                       "(the model's position embeddings)", f"{len(positions)} tokens")
        return table[positions]


def _layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis: gain * (x - mean) / sqrt(var + eps) + bias."""
    centred = x - x.mean(axis=-1, keepdims=True)
    return gain * centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps) + bias


def load_layers(model_dir: str | Path | Checkpoint,
                layers: Sequence[int] | None = None) -> tuple[Checkpoint, list[AttentionLayer]]:
    """The checkpoint and the listed layers (default: every distinct weight set: all layers,
    or for ALBERT one layer per group, since the others share its weights)."""
    ckpt = model_dir if isinstance(model_dir, Checkpoint) else Checkpoint(model_dir)
    if layers is None:
        layers = distinct_layers(ckpt)
    return ckpt, [ckpt.layer(int(layer)) for layer in layers]


def distinct_layers(ckpt: Checkpoint) -> list[int]:
    """One layer index per distinct set of attention weights (ALBERT shares them)."""
    seen: dict[str, int] = {}
    for layer in range(ckpt.n_layers):
        seen.setdefault(ckpt.layer_stem(layer), layer)
    return list(seen.values())

