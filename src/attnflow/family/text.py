"""The model family's options written as text: command-line flags and sweep grids.

Every registered part (`attnflow.family.PARTS`) with a text form is an option: ``--NAME TEXT``
on the command line, the axis ``NAME`` in a sweep spec. The built-in ones:

* norm: ``post`` | ``pre`` | ``peri`` | ``ngpt`` (nGPT's step: alpha, a number of its own)
* attention: ``softmax`` | ``unnormalised`` | ``positional`` | ``sinkhorn`` | ``sinkhorn:IT``
* rope: ``none`` | ``BASE`` | ``BASE:PAIRING`` | ``BASE:PAIRING:OFFSET`` (pairing ``halves`` or
  ``adjacent``), e.g. ``10000:adjacent``
* alibi: ``none`` | ``default`` (slopes 2^(-8h/H)) | ``S`` (one slope) | ``S1,S2,...`` (per head)
* qk_norm: ``none`` | ``rms`` | ``rms:EPS``
* mlp: ``none`` | ``ACT:WIDTH[:SEED]`` (random weights; ACT swiglu, geglu, gelu, relu)
* strength: ``K`` (a number > 0, default 1: the attention output times K)

`family_options` turns them into keyword arguments of `attnflow.Attention`; errors name the
option as the caller spells it (``--rope`` on the command line, ``rope`` in a sweep spec).
`layers_from_npz` reads per-layer weights into a `Stack`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, number
from attnflow.family.block import Attention
from attnflow.family.feedforward import MLP
from attnflow.family.parts import PARTS, Part
from attnflow.family.positional import ALiBi, RoPE
from attnflow.family.schemes import Scheme
from attnflow.family.stack import Stack
from attnflow.family.weighting import Weighting

__all__ = ["BUILTIN", "DEFAULTS", "family_help", "family_options", "layers_from_npz",
           "option_names", "parse_alibi", "parse_attention", "parse_rope"]

# The options whose keyword in `attnflow.Attention` is their name (others go into `parts`).
BUILTIN = ("norm", "attention", "rope", "alibi", "qk_norm", "mlp", "strength")
DEFAULTS = {"norm": "post", "attention": "softmax", "strength": "1"}  # "none" for the others
EXTRA_HELP = {
    "alpha": "nGPT's step alpha (with --norm ngpt).",
    "noise": "sigma >= 0: dX = F dt + sigma P_X dW (methods euler, geodesic; seeded by --seed).",
    "layers": "Per-layer weights: an .npz with arrays Q, K (L, H, e, d) and V (L, H, d, d) "
              "(any may be absent: identity), or a saved run (.nc, .zarr) whose model (any "
              "Stack of blocks) to simulate; layer l acts on [l, l + 1).",
}


def option_names() -> list[str]:
    """The registered parts that have a text form: CLI flags and sweep axes, in order."""
    return [name for name, cls in PARTS.items() if cls.text_help]


def family_help() -> dict[str, str]:
    """One help line per option (the registered parts' and `EXTRA_HELP`)."""
    out = {name: f"{PARTS[name].help} Text: {PARTS[name].text_help}." for name in option_names()}
    return {**out, **EXTRA_HELP}


def parse_rope(text: str | None, name: str = "rope") -> RoPE | None:
    """A RoPE from ``BASE[:PAIRING[:OFFSET]]``, None from ``none`` or None."""
    return RoPE.parse(text, name)


def parse_alibi(text: str | None, name: str = "alibi") -> ALiBi | None:
    """An ALiBi from ``default``, ``S`` or ``S1,S2,...``; None from ``none`` or None."""
    return ALiBi.parse(text, name)


def parse_attention(text: str, name: str = "attention") -> str | tuple[str, int]:
    """"softmax", "unnormalised", "positional" or ("sinkhorn", IT) from ``sinkhorn[:IT]``."""
    w = Weighting.parse(text, name)
    return "sinkhorn" if text == "sinkhorn" else w.kernel_arg


def family_options(norm: str = "post", alpha: float = 0.2, attention: str = "softmax",
                   rope: str | None = None, alibi: str | None = None,
                   names: dict[str, str] | None = None, d: int | None = None,
                   **more: str | None) -> dict[str, Any]:
    """Keyword arguments of `attnflow.Attention` from the text forms (module docstring);
    `more` holds the texts of further registered options by name (qk_norm, mlp, and any
    registered part); `names` maps each option to the name errors should use (default: the
    option's own); `d` is the dimension random MLP weights are drawn for."""
    texts = {"norm": norm, "attention": attention, "rope": rope, "alibi": alibi, **more}
    unknown = sorted(set(texts) - set(option_names()))
    if unknown:
        raise fail(unknown[0], f"one of the model family's options {option_names()}",
                   repr(unknown[0]))
    names = {k: (names or {}).get(k, k) for k in (*texts, "alpha")}
    scheme = Scheme.parse(norm, names["norm"])  # "ngpt:ALPHA" carries its own alpha
    kwargs: dict[str, Any] = dict(norm=scheme if ":" in str(norm) else norm,
                                  alpha=number(names["alpha"], alpha, 0.0, low_open=True))
    parts: list[Part] = []
    for key, text in texts.items():
        if key == "norm" or text is None:
            continue
        if key == "attention":
            kwargs[key] = parse_attention(text, names[key])
        elif key == "mlp":
            kwargs[key] = MLP.parse(text, names[key], d=d)
        elif key in BUILTIN:
            kwargs[key] = PARTS[key].parse(text, names[key])
        else:
            part = PARTS[key].parse(text, names[key])
            if part is not None:
                parts.append(part)
    if parts:
        kwargs["parts"] = parts
    return kwargs


def layers_from_npz(path: str | os.PathLike, name: str = "layers", **options: Any):
    """A `Stack` from an .npz file of per-layer weights: arrays Q and K of shape (L, H, e, d)
    and V of shape (L, H, d, d), any of them absent for the identity (grouped-query heads:
    repeat K and V). `options` (beta, mask, norm, rope, ...) apply to every layer."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError, EOFError) as err:
        raise fail(name, "a readable .npz file with arrays Q, K, V", f"{str(path)!r} ({err})"
                   ) from None
    unknown = sorted(set(arrays) - {"Q", "K", "V"})
    if unknown or not arrays:
        raise fail(name, "an .npz file with arrays among Q, K, V",
                   f"arrays {sorted(arrays)} in {str(path)!r}")
    shapes = {k: a.shape[:2] for k, a in arrays.items()}
    if any(a.ndim != 4 for a in arrays.values()) or len(set(shapes.values())) != 1:
        raise fail(name, "arrays of shape (L, H, ., .) with the same L layers and H heads",
                   ", ".join(f"{k}: {describe(a)}" for k, a in arrays.items()))
    L, H = next(iter(shapes.values()))
    if L == 0 or H == 0:
        raise fail(name, "at least one layer and one head", f"L = {L}, H = {H}")
    layers = []
    for layer in range(L):
        heads = [tuple(arrays[m][layer, h] if m in arrays else None for m in "QKV")
                 for h in range(H)]
        try:
            layers.append(Attention(heads=heads, **options))
        except ValueError as err:
            raise fail(name, "weights that make a valid layer",
                       f"layer {layer} of {str(path)!r}: {err}") from None
    return Stack(layers)
