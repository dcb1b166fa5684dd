"""One self-contained HTML page of the explorer: explorer.js and the packed run inlined, with
a small shim in the role of anywidget's `model` (get, set, on, off, save_changes). The page
loads nothing from the network and opens from disk."""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from attnflow._checks import fail
from attnflow._files import write_text
from attnflow.explorer.pack import pack
from attnflow.explorer.tracepack import is_trace, pack_trace
from attnflow.trajectory import Trajectory

__all__ = ["explore_html", "module_source", "packed_for", "page_html", "script_json"]

# Characters a JSON text inside <script> must not carry literally: "<" could end the script
# ("</script") or open a comment that swallows the next one ("<!--<script"), ">" and "&" are
# escaped with it as is usual, and U+2028/2029 end lines in older JavaScript. Each becomes
# its JSON escape \uXXXX, which JSON.parse reads back as the same character.
_SCRIPT_UNSAFE = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}

# The page's `model`: a plain object with anywidget's methods, whose `set` calls the
# listeners of "change:<key>" at once (a page has no kernel to sync with).
_SHIM = """
const state = JSON.parse(document.getElementById("af-data").textContent);
const listeners = {};
const model = {
  get: (key) => state[key],
  set: (key, value) => {
    state[key] = value;
    (listeners["change:" + key] || []).forEach((f) => f());
  },
  on: (event, f) => { (listeners[event] = listeners[event] || []).push(f); },
  off: (event, f) => { listeners[event] = (listeners[event] || []).filter((g) => g !== f); },
  save_changes: () => {},
};
render({ model, el: document.getElementById("af-explorer") });
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body{{margin:12px;background:#fff}}
h1{{font:600 16px system-ui,sans-serif;margin:0 0 4px}}
</style>
</head>
<body>
<h1>{title}</h1>
<div id="af-explorer"></div>
<script type="application/json" id="af-data">{state}</script>
<script type="module">
{module}
{shim}
</script>
</body>
</html>
"""


def packed_for(obj: Trajectory | Any, *, run: int = 0, view: str | None = None,
               basis: Any = None, attention: bool | None = None,
               onto: str = "pca", density: bool | None = None) -> dict[str, Any]:
    """`pack` of a Trajectory or `pack_trace` of a trace (dispatch on the type). For a
    Trajectory, attention=True asks for the attention matrix (an error when the page cannot
    compute it), onto must be "pca", and density is pack's (binned densities instead of
    points: None by n)."""
    if is_trace(obj):
        if density is not None:
            raise fail("density", "None for a trace (it draws every token)", repr(density))
        return pack_trace(obj, view=view, basis=basis, onto=onto, attention=attention)
    if onto != "pca":
        raise fail("onto", "'pca' for a simulated run ('sphere' is for traces)", repr(onto))
    packed = pack(obj, run=run, view=view, basis=basis, density=density)
    if attention and packed["attention"] is None:
        raise fail("attention", "a run whose attention matrix the page computes (n <= 400 "
                   "tokens of one layer with one head, no memory, d <= 3)",
                   f"n = {obj.n}, d = {obj.d}, {len(obj.model.layers)} layer(s)")
    if attention is False:
        packed["attention"] = None
    return packed


def module_source() -> str:
    """The text of explorer.js, the ES module shared by the page and the widget."""
    return resources.files("attnflow.explorer").joinpath("explorer.js").read_text("utf-8")


def page_html(packed: dict[str, Any], title: str = "attnflow explorer") -> str:
    """The page's HTML for the output of `attnflow.explorer.pack` (the first frame shown,
    tokens coloured by index)."""
    state = {"data": packed, "frame": 0, "color": "index", "camera": [20.0, -60.0]}
    module = module_source()
    if "</script" in module.lower() or "<!--" in module:
        raise fail("explorer.js", "a module without '</script' or '<!--'", "one with it")
    return _PAGE.format(title=html.escape(title), state=script_json(state), module=module,
                        shim=_SHIM)


def script_json(value: Any) -> str:
    """value as JSON text safe inside an HTML <script> element: no string in it can end the
    script or open one (every "<", ">", "&", U+2028 and U+2029 written as \\uXXXX, which
    JSON.parse decodes to the same text)."""
    return json.dumps(value, separators=(",", ":")).translate(_SCRIPT_UNSAFE)


def explore_html(traj: Trajectory | Any, path: str | os.PathLike, *, run: int = 0,
                 view: str | None = None, basis: Any = None, title: str | None = None,
                 attention: bool | None = None, onto: str = "pca",
                 density: bool | None = None) -> Path:
    """Write the explorer of one run, or of a trace of a real model, as one self-contained
    HTML page (opens from disk, no network), atomically; return its path.

    traj, run, view, basis : as for `attnflow.explorer.pack` (view "circle" for d = 2,
        "sphere" for d >= 3). traj may be a trace (`attnflow.pretrained.trace_dataset`,
        `load_trace`): then layers are the time, and view, basis, onto and attention are as
        for `attnflow.explorer.tracepack.pack_trace` (run is ignored).
    attention : None (shown when available), True (an error when the run's attention matrix
        or the trace's patterns cannot be shown, naming what is missing), False (not shown).
    path : the page to write (a name ending in .html).
    title : the page's heading; default the model's short repr and n.
    density : None (points up to `attnflow.explorer.pack.DENSITY_N` tokens, binned densities
        above), True (densities), False (points, whatever n); simulated runs only.

    The page holds 2 bytes per token and coordinate per frame in base64 (8/3 characters)
    plus 20-35 kB of module and series: a 1000-token run on the sphere with 200 frames is
    1.6 MB. A page of binned densities holds 5.5 kB a frame on the circle and 44 kB a frame
    on the sphere, whatever n.
    """
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise fail("path", "a file name ending in .html", str(path))
    packed = packed_for(traj, run=run, view=view, basis=basis, attention=attention, onto=onto,
                        density=density)
    if title is None:
        title = (f"attnflow explorer: {packed['model']}, {packed['n']} tokens, "
                 f"{len(packed['times']) - 1} layers" if is_trace(traj) else
                 f"attnflow explorer: n = {traj.n}, d = {traj.d}, {packed['mask']} attention")
    return write_text(path, page_html(packed, title))
