"""The per-run summaries a sweep keeps over time, and their radii.

A metric maps the saved token directions of a batch of runs, (T, B, n, d), and their initial
tokens (B, n, d) to values (T, B). Its radii (cluster tolerance, Rényi radius delta,
consumption radius r, all in rad) are scales of |beta|^{-1/2} (beta of either sign:
`attnflow.analysis.clusters.length_scale`); at each save time t they use the
beta of the layer acting at t (``model.layer_at(t).beta``: the only beta of a tied model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from attnflow.analysis.clusters import cluster_count, default_cluster_tol, length_scale
from attnflow.analysis.renyi import consumed_fraction, renyi_centers, strong_renyi_centers
from attnflow.sphere import geodesic_distance

Radii = dict[str, float]  # {"tol": cluster tolerance, "delta": Rényi radius, "r": consumption}


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


def _max_distance_to_first(states: np.ndarray, x0: np.ndarray, radii: Radii) -> np.ndarray:
    return geodesic_distance(states, x0[None, :, :1, :]).max(axis=-1)


def _cluster_count(states: np.ndarray, x0: np.ndarray, radii: Radii) -> np.ndarray:
    return cluster_count(states, radii["tol"]).astype(float)


def _center_count(finder: Callable) -> Callable:
    def count(states: np.ndarray, x0: np.ndarray, radii: Radii) -> np.ndarray:
        return np.array([[finder(X, radii["delta"]).size for X in at_t] for at_t in states],
                        dtype=float)

    return count


def _consumed(finder: Callable) -> Callable:
    def consumed(states: np.ndarray, x0: np.ndarray, radii: Radii) -> np.ndarray:
        return np.stack([consumed_fraction(states[:, b], finder(x0[b], radii["delta"]),
                                           radii["r"]) for b in range(x0.shape[0])], axis=1)

    return consumed


@dataclass(frozen=True)
class Metric:
    """A per-run summary over time: fn(states (T, B, n, d), x0 (B, n, d), radii) -> (T, B)."""

    fn: Callable[[np.ndarray, np.ndarray, Radii], np.ndarray]
    units: str
    definition: str


METRICS: dict[str, Metric] = {
    "max_distance_to_first": Metric(
        _max_distance_to_first, "rad",
        "max over tokens k of the geodesic distance from x_k(t) to x_1(0) (Theorem 4.1: -> 0 "
        "for V = I)"),
    "cluster_count": Metric(
        _cluster_count, "1",
        "number of single-linkage clusters at geodesic tolerance cluster_tol "
        "(attnflow.analysis.clusters.cluster_count)"),
    "renyi_count": Metric(
        _center_count(renyi_centers), "1",
        "number of Rényi centers(delta) of the configuration at time t (docs/science.md §4)"),
    "strong_renyi_count": Metric(
        _center_count(strong_renyi_centers), "1",
        "number of strong Rényi centers(delta) of the configuration at time t "
        "(docs/science.md §4)"),
    "consumed_renyi": Metric(
        _consumed(renyi_centers), "1",
        "fraction of tokens within geodesic radius r of the current position of a Rényi "
        "center(delta) of the initial tokens (docs/science.md §4, Fig. 3)"),
    "consumed_strong": Metric(
        _consumed(strong_renyi_centers), "1",
        "fraction of tokens within geodesic radius r of the current position of a strong "
        "Rényi center(delta) of the initial tokens (docs/science.md §4, Fig. 3)"),
}


def measure(keep: Keep, theta: np.ndarray, x0: np.ndarray, betas: Sequence[float]
            ) -> dict[str, np.ndarray]:
    """The kept metrics {name: (B, T)} of directions theta (T, B, n, d) from x0 (B, n, d),
    betas[i] the beta acting at save time i (one radius set per distinct beta)."""
    T, B = theta.shape[:2]
    out = {m: np.empty((T, B)) for m in keep.metrics}
    for beta in dict.fromkeys(betas):
        at = np.array([b == beta for b in betas])
        radii = keep.radii(beta)
        for m in keep.metrics:
            out[m][at] = METRICS[m].fn(theta if at.all() else theta[at], x0, radii)
    return {m: v.T for m, v in out.items()}
