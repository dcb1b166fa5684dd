"""The per-run summaries a sweep keeps over time, and their radii.

The metrics a sweep accepts are the scalar entries of the analysis registry
(`attnflow.analysis.metrics.METRICS`: one number per run and save time); `METRICS` here is
that selection, `DEFAULT_METRICS` what a spec without ``keep.metrics`` keeps. Each maps the
saved token directions of a batch of runs, (T, B, n, d), and their initial tokens (B, n, d)
to values (T, B). Its radii (cluster tolerance, Rényi radius delta, consumption radius r,
all in rad) are scales of |beta|^{-1/2} (beta of either sign:
`attnflow.analysis.clusters.length_scale`); at each save time t they, beta and the Q, K of the
energy
are those of the layer acting at t (``model.layer_at(t)``: the only layer of a tied model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.analysis.clusters import default_cluster_tol, length_scale
from attnflow.analysis.metrics import METRICS as REGISTRY
from attnflow.analysis.metrics import Metric, evaluate_metric

Radii = dict[str, float]  # {"tol": cluster tolerance, "delta": Rényi radius, "r": consumption}

# The metrics a sweep accepts: the registry's scalar entries for every dimension.
METRICS: dict[str, Metric] = {name: m for name, m in REGISTRY.items()
                              if m.scalar and m.d is None}
# What a spec without keep.metrics keeps (the sweep's metrics before the registry).
DEFAULT_METRICS = ("max_distance_to_first", "cluster_count", "renyi_count",
                   "strong_renyi_count", "consumed_renyi", "consumed_strong")


@dataclass(frozen=True)
class Keep:
    """What a sweep keeps per run, and the radii of its metrics (see `attnflow.sweeps`)."""

    metrics: tuple[str, ...]
    states: bool = False
    cluster_tol: float | None = None
    delta_scale: float = 4.0
    r_scale: float = 1.0

    def radii(self, beta: float) -> Radii:
        """Cluster tolerance, Rényi radius delta and consumption radius r at beta (rad)."""
        scale = length_scale(beta)  # |beta|^{-1/2}, either sign; inf at beta = 0, +-inf
        tol = self.cluster_tol if self.cluster_tol is not None else default_cluster_tol(beta)
        return {"tol": min(math.pi, tol), "delta": min(math.pi, self.delta_scale * scale),
                "r": min(math.pi, self.r_scale * scale)}

    def describe_radii(self) -> str:
        """The radii in words (the store's ``radii`` attribute)."""
        tol = f"{self.cluster_tol:g} rad" if self.cluster_tol is not None \
            else "|beta|^-1/2 / 4 (1e-2 rad if beta = 0 or +-inf)"
        return (f"cluster_tol = {tol}; delta = {self.delta_scale:g} |beta|^-1/2; "
                f"r = {self.r_scale:g} |beta|^-1/2 (radii capped at pi; pi at beta = 0, +-inf)")


def measure(keep: Keep, theta: np.ndarray, x0: np.ndarray, layers: Sequence[Any]
            ) -> dict[str, np.ndarray]:
    """The kept metrics {name: (B, T)} of directions theta (T, B, n, d) from x0 (B, n, d),
    layers[i] the layer acting at save time i (one radius set per distinct layer)."""
    T, B = theta.shape[:2]
    out = {m: np.empty((T, B)) for m in keep.metrics}
    for layer in dict.fromkeys(layers):
        at = np.array([other is layer for other in layers])
        context: dict[str, Any] = {**keep.radii(layer.beta), "beta": layer.beta, "x0": x0}
        for m in keep.metrics:
            if "Q" in METRICS[m].needs:
                context["Q"], context["K"] = _query_key(layer)
            out[m][at] = evaluate_metric(m, theta if at.all() else theta[at], **{
                k: context[k] for k in METRICS[m].needs})
    return {m: v.T for m, v in out.items()}


def _query_key(layer: Any) -> tuple[Any, Any]:
    """Q, K of a layer's single (Q, K, V) head (what the energy takes)."""
    if len(layer.heads) != 1 or len(layer.heads[0]) != 3:
        raise fail("keep.metrics", "the energy of layers with one (Q, K, V) head",
                   repr(layer))
    return layer.heads[0][0], layer.heads[0][1]
