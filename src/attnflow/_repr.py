"""Short representations of results: one line of text (`__repr__`) and a small HTML table
(`_repr_html_`, which notebooks show, as xarray's objects do), never a thousand numbers.

A class mixes in `ShortRepr` and lists what to show in `_summary()` (name -> value); arrays
are summarised by shape and dtype (with their values when they have at most `SMALL`
entries), long sequences by their length, nested objects by their own short repr.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["SMALL", "Plain", "ShortRepr", "summarize"]

SMALL = 8  # arrays and sequences with at most this many entries are shown whole
_WIDTH = 200  # longer texts (a nested repr, a string) are cut with an ellipsis


class Plain(str):
    """A summary's own words, shown without quotes (e.g. "101 from 0 to 150")."""


def summarize(value: Any) -> str:
    """A short text for one value: arrays by shape and dtype (values when small), long
    sequences and mappings by their length, others by their repr cut to a few words."""
    if isinstance(value, np.ndarray):
        if value.size <= SMALL and value.ndim <= 1:
            return np.array2string(value, precision=4, separator=", ")
        return f"array{value.shape} {value.dtype}"
    if isinstance(value, (list, tuple)) and len(value) > SMALL:
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, Mapping) and len(value) > SMALL:
        return f"dict of {len(value)} keys"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    text = str(value) if isinstance(value, Plain) else repr(value)
    return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + "..."


class ShortRepr:
    """Mixin: `__repr__` and `_repr_html_` from `_summary()` (module docstring). The default
    summary lists a dataclass's fields; classes override it to say more in fewer words.
    Dataclasses that mix it in pass ``repr=False``, or their generated repr would win."""

    def _summary(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if f.repr}

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={summarize(v)}" for k, v in self._summary().items())
        return f"{type(self).__name__}({items})"

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(summarize(v))}</td></tr>"
                       for k, v in self._summary().items())
        return (f"<div><strong>{html.escape(type(self).__name__)}</strong>"
                f"<table>{rows}</table></div>")
