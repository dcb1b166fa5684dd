"""Traces of a forward pass in TransformerLens's hook names, as an xarray Dataset in Zarr.

A trace holds, for layers l = 0 .. L-1 of a model run on n tokens (TransformerLens's names
and dimension names; no batch axis):

    blocks.{l}.hook_resid_pre    (pos, d_model)  the residual stream entering layer l
    blocks.{l}.hook_resid_mid    (pos, d_model)  after the attention sublayer (optional)
    blocks.{l}.hook_resid_post   (pos, d_model)  after the whole layer
    blocks.{l}.attn.hook_pattern (head_index, query_pos, key_pos)  attention weights
                                                 (optional; rows are queries)
    tokens                       (pos,)          the token ids

with coordinates pos, d_model, head_index, query_pos, key_pos (0-based integers), the token
strings in the attribute ``str_tokens`` (a JSON list; Zarr 3 has no stable string type), and
the caller's description (model, text, notes) in ``attnflow_trace`` (JSON). Values keep their
dtype, so `load_trace(save_trace(ds, path))` is bit-identical to ds.

A layer axis in one call, beside the per-layer names (TransformerLens's `ActivationCache`
methods of the same names):

    accumulated_resid(ds)          (layer, pos, d_model)  the residual stream entering each
                                   layer 0..L-1, then leaving the last (layer L): L + 1 entries
    stack_activation(ds, hook)     (layer, ...)  one hook over the layers, labelled
    stacked(ds, hook)              the same as a numpy array (what `attnflow.analysis.depth.battery`
                                   reads)

A trace made by `trace_dataset` or read by `load_trace` also has them as methods of its
``attnflow`` accessor: ``ds.attnflow.accumulated_resid()``, ``ds.attnflow.stack_activation(
"attn.hook_pattern")``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array
from attnflow._datafiles import (
    MAX_BYTES,
    check_exists,
    load_values,
    open_dataset,
    parse_record,
    reading,
    save_dataset,
    strip_attrs,
)
from attnflow._files import recover
from attnflow.errors import CorruptFileError

__all__ = ["HOOKS", "ROW_SUM_TOL", "accumulated_resid", "hook_name", "load_trace", "save_trace",
           "stack_activation", "stacked", "trace", "trace_dataset"]

HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_pattern")
_DIMS = {"hook_resid_pre": ("pos", "d_model"), "hook_resid_mid": ("pos", "d_model"),
         "hook_resid_post": ("pos", "d_model"),
         "attn.hook_pattern": ("head_index", "query_pos", "key_pos")}
_FORMAT = 1
ROW_SUM_TOL = 1e-3  # |sum of a pattern row - 1| allowed (float32 sums over 10^4 keys: 1e-4)


def hook_name(layer: int, hook: str) -> str:
    """TransformerLens's name of `hook` (one of HOOKS) at layer `layer`, e.g.
    ``blocks.3.attn.hook_pattern``."""
    if hook not in HOOKS:
        raise fail("hook", f"one of {HOOKS}", repr(hook))
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise fail("layer", "an integer >= 0", repr(layer))
    return f"blocks.{int(layer)}.{hook}"


def _floats(name: str, a: Any, shape: tuple[int | None, ...]) -> np.ndarray:
    """A finite float32 or float64 array of the given shape (None: any length)."""
    arr = finite_array(name, a)
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    if arr.ndim != len(shape) or any(s is not None and s != t for s, t in zip(shape, arr.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise fail(name, f"a float array of shape {want}", describe(arr))
    return arr


def trace_dataset(resid_pre: Any, resid_post: Any, token_ids: Sequence[int], *,
                  resid_mid: Any = None, pattern: Any = None,
                  str_tokens: Sequence[str] | None = None,
                  attrs: dict[str, Any] | None = None) -> Any:
    """The trace (module docstring) of one forward pass as an `xarray.Dataset`.

    resid_pre, resid_post : (L, n, d); resid_mid : (L, n, d) or None; pattern : (L, H, n, n)
    or None; token_ids : (n,) ints; str_tokens : n strings or None; attrs : JSON-serialisable
    description (model name, text, notes), stored in ``attnflow_trace``.
    """
    import xarray as xr

    pre = _floats("resid_pre", resid_pre, (None, None, None))
    if pre.shape[0] < 1 or pre.shape[1] < 1:
        raise fail("resid_pre", "at least one layer and one token", describe(pre))
    L, n, d = pre.shape
    arrays = {"hook_resid_pre": pre,
              "hook_resid_post": _floats("resid_post", resid_post, (L, n, d))}
    if resid_mid is not None:
        arrays["hook_resid_mid"] = _floats("resid_mid", resid_mid, (L, n, d))
    if pattern is not None:
        arrays["attn.hook_pattern"] = _floats("pattern", pattern, (L, None, n, n))
        bad = _pattern_fault(arrays["attn.hook_pattern"])
        if bad:
            raise fail("pattern", "attention weights (in [0, 1], rows summing to 1 within "
                       f"{ROW_SUM_TOL:g})", bad)
    ids = np.asarray(token_ids)
    if ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer):
        raise fail("token_ids", f"{n} integer token ids (one per position)", describe(ids))
    meta = {"format": _FORMAT, **(attrs or {})}
    try:
        described = json.dumps(meta)
    except TypeError as err:
        raise fail("attrs", "a JSON-serialisable dict", f"{err}") from None
    out_attrs = {"attnflow_trace": described}
    if str_tokens is not None:
        words = list(str_tokens)
        if len(words) != n or not all(isinstance(w, str) for w in words):
            raise fail("str_tokens", f"{n} strings (one per position)", repr(words)[:80])
        out_attrs["str_tokens"] = json.dumps(words)
    data = {"tokens": (("pos",), ids.astype(np.int64))}
    for hook in HOOKS:
        if hook in arrays:
            for layer in range(L):
                data[hook_name(layer, hook)] = (_DIMS[hook], arrays[hook][layer])
    coords = {"pos": np.arange(n), "d_model": np.arange(d)}
    if pattern is not None:
        H = arrays["attn.hook_pattern"].shape[1]
        coords.update(head_index=np.arange(H), query_pos=np.arange(n), key_pos=np.arange(n))
    _register_accessor()
    return xr.Dataset(data, coords=coords, attrs=out_attrs)


def save_trace(ds: Any, path: str | os.PathLike) -> Path:
    """Write a trace to a ``.zarr`` directory atomically, a completeness marker last
    (`attnflow._datafiles.save_dataset`)."""
    path = Path(path)
    if path.suffix != ".zarr":
        raise fail("path", "a name ending in .zarr", str(path))
    if "attnflow_trace" not in getattr(ds, "attrs", {}):
        raise fail("ds", "a trace made by trace_dataset", type(ds).__name__)
    return save_dataset(ds, path, "zarr", "attnflow_trace")


def load_trace(path: str | os.PathLike, max_bytes: int | None = MAX_BYTES) -> Any:
    """Read a trace written by `save_trace`, into memory, with the checks of `attnflow.load`
    (nothing but the store read, declared sizes within `max_bytes`, complete, every chunk
    passing its checksum), every layer of every hook present, 0..L-1, the labels
    ``str_tokens`` one string per token and the attention patterns attention weights (finite,
    in [0, 1], every row summing to 1 within `ROW_SUM_TOL`). A missing path raises
    FileNotFoundError; anything that is not a trace, a ValueError naming the file (and the
    field)."""
    path = Path(path)
    recover(path)
    check_exists(path, "trace")
    with reading(path, "zarr"):
        return _load_trace(path, max_bytes)


def _load_trace(path: Path, max_bytes: int | None) -> Any:
    ds = open_dataset(path, "zarr", "attnflow_trace",
                      "a trace written by save_trace (a Zarr store)", max_bytes)
    if "attnflow_trace" not in ds.attrs or "tokens" not in ds:
        raise fail("path", "a trace written by save_trace", f"{path}, another dataset")
    parse_record(path, ds, "attnflow_trace")
    _check_layers(path, ds)
    load_values(path, ds)  # into memory, each chunk checked (checksum, decoding)
    _check_values(path, ds)
    strip_attrs(ds)
    _register_accessor()
    return ds


def _pattern_fault(A: np.ndarray) -> str:
    """What is wrong with attention weights A (..., n, n), rows being queries: '' if
    nothing (finite, in [0, 1], every row summing to 1 within ROW_SUM_TOL; masked keys
    hold 0)."""
    if not np.all(np.isfinite(A)):
        return f"{int(np.sum(~np.isfinite(A)))} non-finite weights"
    if A.size and (A.min() < 0 or A.max() > 1):
        return f"weights from {A.min():.3g} to {A.max():.3g}"
    off = np.abs(A.sum(axis=-1, dtype=np.float64) - 1.0)
    if off.size and off.max() > ROW_SUM_TOL:
        row = np.unravel_index(int(np.argmax(off)), off.shape)
        return f"a row summing to {1 + off[row] if A[row].sum() > 1 else 1 - off[row]:.6g} " \
               f"(query {row[-1]})"
    return ""


def _check_values(path: Path, ds: Any) -> None:
    """The token ids integers, the labels n strings, the patterns attention weights."""
    n = ds.sizes["pos"] if "pos" in ds.sizes else 0
    tokens = ds["tokens"]
    if tokens.dims != ("pos",) or tokens.dtype.kind not in "iu":
        raise CorruptFileError(path, "tokens", f"{n} integer token ids on pos",
                               f"{tokens.dtype} on {tokens.dims}")
    if "str_tokens" in ds.attrs:
        try:
            words = json.loads(ds.attrs["str_tokens"])
        except (TypeError, ValueError, RecursionError):
            words = ds.attrs["str_tokens"]
        if (not isinstance(words, list) or len(words) != n
                or not all(isinstance(w, str) for w in words)):
            got = (f"a JSON {type(words).__name__}" if not isinstance(words, list) else
                   f"{len(words)} labels" if len(words) != n else "labels that are not strings")
            raise CorruptFileError(path, "str_tokens", f"a JSON list of {n} strings (one label "
                                   "per token)", got)
    for name in map(str, ds.data_vars):
        if name.endswith(".attn.hook_pattern"):
            bad = _pattern_fault(ds[name].values)
            if bad:
                raise CorruptFileError(path, name, "attention weights (finite, in [0, 1], "
                                       f"rows summing to 1 within {ROW_SUM_TOL:g})", bad)


def _check_layers(path: Path, ds: Any) -> None:
    """Every hook of the trace at layers 0..L-1, L the number of hook_resid_pre layers."""
    import re

    layers: dict[str, set[int]] = {}
    for name in map(str, ds.data_vars):
        m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
        if m and m.group(2) in HOOKS:
            layers.setdefault(m.group(2), set()).add(int(m.group(1)))
    L = len(layers.get("hook_resid_pre", ()))
    for hook in ("hook_resid_pre", "hook_resid_post", *layers):
        if layers.get(hook, set()) != set(range(L)) or L == 0:
            missing = sorted(set(range(max(L, 1))) - layers.get(hook, set()))
            raise CorruptFileError(path, hook_name(missing[0] if missing else L, hook),
                                   f"every layer 0..{L - 1} of {hook} (a trace's layers "
                                   "complete)", f"layers {sorted(layers.get(hook, set()))}")


def stack_activation(ds: Any, hook: str) -> Any:
    """`hook` (one of HOOKS) over the layers of a trace as one `xarray.DataArray` with a
    leading ``layer`` axis (coordinates 0..L-1), e.g. ``stack_activation(ds,
    "attn.hook_pattern")`` (layer, head_index, query_pos, key_pos)."""
    import xarray as xr

    if hook not in HOOKS:
        raise fail("hook", f"one of {HOOKS}", repr(hook))
    layers = []
    while hook_name(len(layers), hook) in ds:
        layers.append(ds[hook_name(len(layers), hook)])
    if not layers:
        raise fail("hook", f"a hook recorded in this trace ({hook!r} is not)", repr(hook))
    out = xr.concat(layers, dim="layer", coords="minimal", compat="override")
    return out.assign_coords(layer=np.arange(len(layers))).rename(hook)


def stacked(ds: Any, hook: str) -> np.ndarray:
    """The (L, ...) numpy array of `stack_activation`, e.g. ``stacked(ds,
    "hook_resid_post")`` (L, n, d) for `attnflow.analysis.depth.battery`."""
    return stack_activation(ds, hook).values


def accumulated_resid(ds: Any) -> Any:
    """The residual stream at every depth as one `xarray.DataArray` (layer, pos, d_model) of
    L + 1 entries: entering layers 0..L-1 (``blocks.{l}.hook_resid_pre``), then leaving the
    last layer (``blocks.{L-1}.hook_resid_post``) as layer L."""
    import xarray as xr

    pre = stack_activation(ds, "hook_resid_pre")
    last = stack_activation(ds, "hook_resid_post").isel(layer=[-1])
    out = xr.concat([pre, last.assign_coords(layer=[pre.sizes["layer"]])], dim="layer")
    return out.rename("resid")


class TraceAccessor:
    """``ds.attnflow``: the layer-axis views of a trace (module docstring)."""

    def __init__(self, ds: Any) -> None:
        self._ds = ds

    def accumulated_resid(self) -> Any:
        """`accumulated_resid` of this trace: (layer, pos, d_model), L + 1 layers."""
        return accumulated_resid(self._ds)

    def stack_activation(self, hook: str) -> Any:
        """`stack_activation` of this trace: (layer, ...)."""
        return stack_activation(self._ds, hook)


def _register_accessor() -> None:
    """Make ``ds.attnflow`` available on xarray Datasets (once)."""
    import xarray as xr

    if not hasattr(xr.Dataset, "attnflow"):
        xr.register_dataset_accessor("attnflow")(TraceAccessor)


def trace(model: Any, text: str | None = None, token_ids: Sequence[int] | None = None,
          attention: bool = True, dtype: Any = np.float64, mlp: bool = True) -> Any:
    """The trace of one forward pass of a decoder or encoder (Euler dt = 1 on its Stack,
    `attnflow.pretrained.forward`): residual streams before, between and after each layer's
    sublayers, and (with `attention`) every head's attention pattern.

    model : a `GGUFModel` or `Checkpoint`, a .gguf path, a Hugging Face checkpoint folder
        (BERT layout), or an installed weight package's name
        (`attnflow.pretrained.models.MODELS`: "smollm2", "gemma3-270m", "minilm").
    text, token_ids : exactly one of them: the text (tokenised by the model's own tokenizer,
        BOS first where the model asks for it) or the token ids.
    mlp : False for the ablation: the same model with every MLP sublayer dropped (attention
        and norms only; no hook_resid_mid, which would equal hook_resid_post). The trace's
        attribute ``mlp`` says which.
    """
    from attnflow.pretrained.forward import forward
    from attnflow.pretrained.models import read

    if (text is None) == (token_ids is None):
        raise fail("text, token_ids", "exactly one of them", "both" if text else "neither")
    m = read(model)
    ids = m.token_ids(text) if text is not None else list(token_ids)
    if not isinstance(mlp, (bool, np.bool_)):
        raise fail("mlp", "True or False (False: every MLP sublayer dropped)", repr(mlp))
    run = forward(m, ids, attention=attention, logits="none", dtype=dtype, mlp=bool(mlp))
    words = [m.decode([int(i)]) for i in run.token_ids]
    return trace_dataset(run.hidden[:-1], run.hidden[1:], run.token_ids, resid_mid=run.mid,
                         pattern=run.attention, str_tokens=words,
                         attrs={"model": m.name, "path": str(m.path), "text": text,
                                "note": m.note, "forward": "Euler dt = 1 on the family Stack",
                                "mlp": int(bool(mlp))})

