"""Packing a trace of a real model (`attnflow.pretrained.trace`) for the explorer: layers as
time, the token directions at every depth projected onto their leading principal directions,
the sink rate and mean cosine per layer, and every layer's and head's attention pattern.

The frames are `accumulated_resid(ds)`: L + 1 entries (the residual stream entering layers
0..L-1, then leaving the last), each token drawn as its direction x / |x| projected onto the
top 3 (view "sphere") or 2 (view "circle") principal directions of the uncentred second
moment of all the directions of all layers (`attnflow.plot.frame`, the helper `pack` uses for
d > 3). They are quantised as in `attnflow.explorer.pack` (`COORD_ERROR`, `ANGLE_ERROR`), and
`unpack` decodes them. With onto="sphere" the projections are scaled to unit length (the
direction within the principal subspace) instead of lying inside the ball.

The patterns (L, H, n, n), weights in [0, 1], are uint8: q = round(255 A), decoded as
q / 255, off by at most 1 / 510 (`PATTERN_ERROR`); base64 in JSON under "patterns". They take
L H n^2 bytes (4/3 as many characters), at most `PATTERN_BUDGET` bytes: a 30-layer, 9-head
model on 128 tokens is 4.4 MB. A larger trace is packed without them (attention=None) or
refused (attention=True), naming the size.
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.analysis.depth import mean_pairwise_cosine, sink_rate
from attnflow.explorer.pack import _LEVELS, ANGLE_STEP, FORMAT, VIEWS
from attnflow.plot import frame
from attnflow.pretrained.trace import accumulated_resid, stacked

__all__ = ["ONTO", "PATTERN_BUDGET", "PATTERN_ERROR", "is_trace", "pack_trace",
           "unpack_patterns"]

PATTERN_LEVELS = 255
PATTERN_ERROR = 1 / (2 * PATTERN_LEVELS)  # the largest error of a decoded attention weight
PATTERN_BUDGET = 16_000_000  # bytes of uint8 patterns a page holds at most (L H n^2)
ONTO = ("pca", "sphere")
_PATTERN_HOOK = "attn.hook_pattern"


def is_trace(obj: Any) -> bool:
    """Whether obj is a trace (an xarray Dataset made by `trace_dataset` or `load_trace`)."""
    return hasattr(obj, "data_vars") and "attnflow_trace" in getattr(obj, "attrs", {})


def _patterns(ds: Any) -> np.ndarray | None:
    """The (L, H, n, n) attention patterns of a trace, or None when it has none."""
    return stacked(ds, _PATTERN_HOOK) if f"blocks.0.{_PATTERN_HOOK}" in ds else None


def pack_trace(ds: Any, *, view: str | None = None, basis: Any = None, onto: str = "pca",
               attention: bool | None = None) -> dict[str, Any]:
    """Everything the explorer page shows of a trace, as JSON-friendly data (the keys of
    `attnflow.explorer.pack`, times being the layers 0..L).

    ds : a trace (`attnflow.pretrained.trace_dataset`, `load_trace`).
    view : "sphere" (3 principal directions, default) or "circle" (2, drawn as angles).
    basis : the directions to project onto (see `attnflow.plot.frame`; default the top
        principal directions of the directions of all layers).
    onto : "pca" (the projections, inside the ball) or "sphere" (scaled to unit length).
    attention : None (the patterns when the trace has them and they fit `PATTERN_BUDGET`),
        True (them, or an error naming what is missing), False (none).

    Besides pack's keys (clusters and order are None: a trace has no layer parameters), it
    has kind "trace", time_label "layer", cosine (L + 1,) (`mean_pairwise_cosine` of each
    layer's stream), sink (L + 1,) (`sink_rate` of layer l's heads, None at layer L and when
    there are no patterns), labels (the tokens' text, or None), patterns (None or {"L", "H",
    "levels", "data": base64 of uint8 (L, H, n, n)}, see the module docstring), and
    no_patterns (why there are none: "" when there are).
    """
    if not is_trace(ds):
        raise TypeError(f"ds: expected a trace (attnflow.pretrained.trace_dataset or "
                        f"load_trace), received {type(ds).__name__}")
    if view is None:
        view = "sphere"
    if view not in VIEWS:
        raise fail("view", f"one of {', '.join(VIEWS)} (or None: sphere)", repr(view))
    if onto not in ONTO:
        raise fail("onto", f"one of {', '.join(ONTO)}", repr(onto))
    if attention not in (None, True, False):
        raise fail("attention", "None, True or False", repr(attention))
    R = np.asarray(accumulated_resid(ds).values, dtype=float)  # (L + 1, n, d)
    T, n, d = R.shape
    norms = np.linalg.norm(R, axis=-1, keepdims=True)
    if np.any(norms == 0):
        raise fail("ds", "a residual stream with nonzero tokens (their directions are drawn)",
                   f"{int(np.count_nonzero(norms == 0))} zero tokens")
    X = R / norms
    k = 2 if view == "circle" else 3
    fr = frame(SimpleNamespace(d=d), X, k, basis)  # only d is read for "pca" and arrays
    P = fr(X)
    if onto == "sphere" or view == "circle":
        length = np.linalg.norm(P, axis=-1, keepdims=True)
        P = np.divide(P, length, out=np.zeros_like(P), where=length > 0)
    if view == "circle":
        q = (np.round((np.arctan2(P[..., 1], P[..., 0]) + np.pi) / ANGLE_STEP) % _LEVELS)[..., None]
    else:
        q = np.round((np.clip(P, -1.0, 1.0) + 1.0) / 2.0 * (_LEVELS - 1))
    frames = np.ascontiguousarray(q.astype("<u2"))

    A = _patterns(ds) if attention is not False else None
    why = "" if A is not None else (
        "not asked for (attention=False)" if attention is False else
        f"the trace has no attention patterns (no blocks.l.{_PATTERN_HOOK}: trace the model "
        "with attention=True)")
    if attention and A is None:
        raise fail("attention", "a trace holding attention patterns "
                   f"(blocks.l.{_PATTERN_HOOK}) for the attention view", "a trace without them")
    packed_patterns = None
    sink: list[float | None] = [None] * T
    if A is not None:
        sink = [float(s) for s in sink_rate(A)] + [None]
        size = A.size
        if size > PATTERN_BUDGET:
            if attention:
                raise fail("attention", f"patterns of at most {PATTERN_BUDGET} bytes "
                           "(layers x heads x n^2)", f"{size} bytes ({A.shape})")
            why = (f"the patterns take {size / 1e6:.1f} MB, over the page's "
                   f"{PATTERN_BUDGET / 1e6:.0f} MB budget")
        else:
            u8 = np.round(np.clip(A, 0.0, 1.0) * PATTERN_LEVELS).astype(np.uint8)
            packed_patterns = {"L": int(A.shape[0]), "H": int(A.shape[1]),
                               "levels": PATTERN_LEVELS,
                               "data": base64.b64encode(np.ascontiguousarray(u8).tobytes())
                               .decode("ascii")}
    labels = json.loads(ds.attrs["str_tokens"]) if "str_tokens" in ds.attrs else None
    meta = json.loads(ds.attrs["attnflow_trace"])
    model = str(meta.get("model", "a traced model"))
    return {
        "format": FORMAT, "kind": "trace", "time_label": "layer", "view": view, "n": n, "d": d,
        "k": frames.shape[-1],
        "frames": base64.b64encode(frames.tobytes()).decode("ascii"), "density": None,
        "times": [float(t) for t in range(T)], "beta": None, "tol": None,
        "clusters": None, "order": None,
        "cosine": [float(c) for c in mean_pairwise_cosine(R)] if n >= 2 else [1.0] * T,
        "sink": sink, "labels": labels,
        "causal": False, "mask": "", "model": model,
        "projection": fr.note + (", scaled to unit length" if onto == "sphere" and fr.note
                                 else ""),
        "delta": None, "renyi": None, "strong": None, "attention": None,
        "patterns": packed_patterns, "no_patterns": why,
    }


def unpack_patterns(packed: dict[str, Any]) -> np.ndarray:
    """The (L, H, n, n) attention patterns of `pack_trace`'s output, each weight within
    `PATTERN_ERROR` of the trace's; an error naming what is missing when it has none."""
    pat = packed.get("patterns") if isinstance(packed, dict) else None
    if pat is None:
        why = packed.get("no_patterns", "") if isinstance(packed, dict) else ""
        raise fail("packed", "a packed trace holding attention patterns",
                   f"one without them ({why or 'not a packed trace'})")
    u8 = np.frombuffer(base64.b64decode(pat["data"]), dtype=np.uint8)
    n = packed["n"]
    return u8.reshape(pat["L"], pat["H"], n, n).astype(float) / pat["levels"]
