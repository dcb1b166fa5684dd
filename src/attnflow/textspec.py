"""The model family's options written as text: command-line flags and sweep grids.

* norm: ``post`` | ``pre`` | ``peri`` | ``ngpt`` (nGPT's step: alpha, a number of its own)
* attention: ``softmax`` | ``unnormalised`` | ``sinkhorn`` | ``sinkhorn:IT``
* rope: ``none`` | ``BASE`` | ``BASE:PAIRING`` | ``BASE:PAIRING:OFFSET`` (pairing ``halves`` or
  ``adjacent``), e.g. ``10000:adjacent``
* alibi: ``none`` | ``default`` (slopes 2^(-8h/H)) | ``S`` (one slope) | ``S1,S2,...`` (per head)

`family_options` turns them into keyword arguments of `attnflow.Attention`; errors name the
option as the caller spells it (``--rope`` on the command line, ``rope`` in a sweep spec).
`layers_from_npz` reads per-layer weights into a `Stack`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, number
from attnflow.positional import ALiBi, RoPE
from attnflow.schemes import SCHEMES

__all__ = ["FAMILY_HELP", "family_options", "layers_from_npz", "parse_alibi",
           "parse_attention", "parse_rope"]

FAMILY_HELP = {
    "norm": "Normalisation scheme: post (the paper's, on the sphere) | pre | peri (tokens in "
            "R^d) | ngpt.",
    "alpha": "nGPT's step alpha (with --norm ngpt).",
    "attention": "Weight normalisation: softmax | unnormalised | sinkhorn[:IT] (full mask).",
    "rope": "Rotary positions: none | BASE[:halves|adjacent[:OFFSET]], e.g. 10000:adjacent.",
    "alibi": "Linear score biases: none | default (slopes 2^(-8h/H)) | S | S1,S2,... per head.",
    "noise": "sigma >= 0: dX = F dt + sigma P_X dW (methods euler, geodesic; seeded by --seed).",
    "layers": "Per-layer weights: an .npz with arrays Q, K (L, H, e, d) and V (L, H, d, d) "
              "(any may be absent: identity); layer l acts on [l, l + 1).",
}


def parse_rope(text: str | None, name: str = "rope") -> RoPE | None:
    """A RoPE from ``BASE[:PAIRING[:OFFSET]]``, None from ``none`` or None."""
    if text is None or text == "none":
        return None
    parts = str(text).split(":")
    expected = "none or BASE[:halves|adjacent[:OFFSET]] with numbers BASE > 0 and OFFSET"
    if len(parts) > 3:
        raise fail(name, expected, repr(text))
    try:
        base = float(parts[0])
        offset = float(parts[2]) if len(parts) == 3 else 0.0
    except ValueError:
        raise fail(name, expected, repr(text)) from None
    try:
        return RoPE(base, parts[1] if len(parts) > 1 else "halves", offset)
    except ValueError as err:
        raise fail(name, expected, f"{text!r} ({err})") from None


def parse_alibi(text: str | None, name: str = "alibi") -> ALiBi | None:
    """An ALiBi from ``default``, ``S`` or ``S1,S2,...``; None from ``none`` or None."""
    if text is None or text == "none":
        return None
    if text == "default":
        return ALiBi()
    expected = "none, default, a slope S >= 0 or slopes S1,S2,... >= 0"
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise fail(name, expected, repr(text)) from None
    try:
        return ALiBi(values[0] if len(values) == 1 else tuple(values))
    except ValueError:
        raise fail(name, expected, repr(text)) from None


def parse_attention(text: str, name: str = "attention") -> str | tuple[str, int]:
    """"softmax", "unnormalised" or ("sinkhorn", IT) from ``sinkhorn[:IT]``."""
    if text in ("softmax", "unnormalised", "sinkhorn"):
        return text
    head, _, it = str(text).partition(":")
    if head == "sinkhorn" and it.isdigit() and int(it) >= 1:
        return ("sinkhorn", int(it))
    raise fail(name, "softmax, unnormalised, sinkhorn or sinkhorn:IT (an integer IT >= 1)",
               repr(text))


def family_options(norm: str = "post", alpha: float = 0.2, attention: str = "softmax",
                   rope: str | None = None, alibi: str | None = None,
                   names: dict[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments of `attnflow.Attention` from the text forms (module docstring);
    `names` maps each option to the name errors should use (default: the option's own)."""
    names = {k: (names or {}).get(k, k) for k in ("norm", "alpha", "attention", "rope",
                                                  "alibi")}
    if norm not in SCHEMES:
        raise fail(names["norm"], f"one of {', '.join(SCHEMES)}", repr(norm))
    alpha = number(names["alpha"], alpha, 0.0, low_open=True)
    return dict(norm=norm, alpha=alpha, attention=parse_attention(attention, names["attention"]),
                rope=parse_rope(rope, names["rope"]), alibi=parse_alibi(alibi, names["alibi"]))


def layers_from_npz(path: str | os.PathLike, name: str = "layers", **options: Any):
    """A `Stack` from an .npz file of per-layer weights: arrays Q and K of shape (L, H, e, d)
    and V of shape (L, H, d, d), any of them absent for the identity (grouped-query heads:
    repeat K and V). `options` (beta, mask, norm, rope, ...) apply to every layer."""
    from attnflow.model import Attention
    from attnflow.stack import Stack

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
