"""The interactive explorer of a run: tokens on the circle or the sphere through time, the
attention matrix, cluster counts and the order parameter, Rényi centers of causal runs.

* pack: a run as compact JSON (uint16 frames in base64 and what the page shows beside them;
  binned densities instead of points above 20 000 tokens).
* tracepack: `pack_trace`, a trace of a real model (`attnflow.pretrained.trace`) the same way,
  layers as time: sink rate and mean cosine per layer, every layer's and head's pattern.
* page: `explore_html`, one self-contained HTML page (no network).
* widget: `explore`, a Jupyter widget (anywidget) on the same ES module, explorer.js.
* live: `explore_live`, the widget simulating in the kernel as beta, mask, n, seed change.
"""

from typing import Any

from attnflow.explorer.pack import ANGLE_ERROR, COORD_ERROR, pack, unpack, unpack_density
from attnflow.explorer.page import explore_html
from attnflow.explorer.tracepack import PATTERN_ERROR, pack_trace, unpack_patterns

__all__ = ["ANGLE_ERROR", "COORD_ERROR", "PATTERN_ERROR", "Explorer", "LiveExplorer", "explore",
           "explore_html", "explore_live", "pack", "pack_trace", "unpack", "unpack_density",
           "unpack_patterns"]


def __getattr__(name: str) -> Any:
    """The widgets (`explore`, `explore_live`) on first use: they need the optional anywidget."""
    if name in ("Explorer", "explore"):
        from attnflow.explorer import widget

        return getattr(widget, name)
    if name in ("LiveExplorer", "explore_live"):
        from attnflow.explorer import live

        return getattr(live, name)
    raise AttributeError(f"module 'attnflow.explorer' has no attribute {name!r}")
