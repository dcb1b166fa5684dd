"""The explorer as a Jupyter widget: an anywidget on explorer.js (the module of the exported
page), its state synced with the notebook through traitlets. Needs the optional `anywidget`
(``pip install attnflow[explorer]``)."""

from __future__ import annotations

from typing import Any

import anywidget
import numpy as np
import traitlets

from attnflow._checks import fail
from attnflow.explorer.page import module_source, packed_for
from attnflow.trajectory import Trajectory

__all__ = ["Explorer", "explore"]

COLORS = ("index", "cluster")


class Explorer(anywidget.AnyWidget):
    """The explorer of one run, or of a trace of a real model (layers as time), in a notebook.
    Synced traits (front end <-> Python):

    frame : int, the index of the time shown (0 <= frame < T; the layer of a trace).
    color : "index" (arrival order) or "cluster" (single-linkage clusters of the frame).
    camera : [elevation, azimuth] in degrees, the sphere's orthographic view (dragging the
        sphere sets it).
    view : "circle" or "sphere"; setting it packs the run again for that view (an error if
        it does not fit the run's dimension).
    data : the packed run (`attnflow.explorer.pack`), sent to the front end once.
    """

    _esm = traitlets.Unicode(module_source()).tag(sync=True)
    data = traitlets.Dict().tag(sync=True)
    frame = traitlets.Int(0).tag(sync=True)
    color = traitlets.Unicode("index").tag(sync=True)
    camera = traitlets.List(traitlets.Float(), [20.0, -60.0], minlen=2, maxlen=2).tag(sync=True)
    view = traitlets.Unicode().tag(sync=True)

    def __init__(self, traj: Trajectory | Any, *, run: int = 0, view: str | None = None,
                 basis: Any = None, attention: bool | None = None, onto: str = "pca",
                 **kwargs: Any) -> None:
        self._options = {"run": run, "basis": basis, "attention": attention, "onto": onto}
        packed = packed_for(traj, view=view, **self._options)
        self._traj = traj
        super().__init__(data=packed, view=packed["view"], **kwargs)

    @property
    def time(self) -> float:
        """The time shown (time units: layers)."""
        return float(self.data["times"][self.frame])

    @property
    def cluster_count(self) -> int:
        """The cluster count of the frame shown (at the package's default tolerance); a trace
        has none (an error)."""
        if self.data.get("clusters") is None:
            raise fail("cluster_count", "a simulated run (a trace has sink rate and mean "
                       "cosine per layer instead)", "a trace")
        return int(self.data["clusters"][self.frame])

    def show(self, t: float) -> None:
        """Show the saved time nearest to t."""
        self.frame = int(np.argmin(np.abs(np.asarray(self.data["times"]) - float(t))))

    @traitlets.validate("frame")
    def _check_frame(self, proposal: dict[str, Any]) -> int:
        T = len(self.data["times"])
        value = proposal["value"]
        if not 0 <= value < T:
            raise fail("frame", f"a frame index in [0, {T})", repr(value))
        return value

    @traitlets.validate("color")
    def _check_color(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in COLORS:
            raise fail("color", f"one of {', '.join(COLORS)}", repr(proposal["value"]))
        return proposal["value"]

    @traitlets.validate("view")
    def _check_view(self, proposal: dict[str, Any]) -> str:
        if self.data and proposal["value"] != self.data["view"]:
            self.data = packed_for(self._traj, view=proposal["value"], **self._options)
        return proposal["value"]


def explore(traj: Trajectory | Any, *, run: int = 0, view: str | None = None,
            basis: Any = None, attention: bool | None = None, onto: str = "pca") -> Explorer:
    """The explorer of one run, or of a trace of a real model, as a Jupyter widget (display
    it, or leave it last in a cell).

    traj, run, view, basis, attention, onto : as for `attnflow.explorer.explore_html` (a
    trace: `attnflow.explorer.tracepack.pack_trace`). The widget shows what the exported page
    shows; its `frame`, `color` and `camera` follow the controls and move them when set from
    Python.
    """
    return Explorer(traj, run=run, view=view, basis=basis, attention=attention, onto=onto)
