"""The registry of quantities over time: each measure of a configuration of tokens that the
package tracks through a run is registered here once, with its name, shape, units, whether
it is differentiable, and a one-line description.

An entry's function maps tokens X (T, ..., n, d) (T save times or layers, then the runs)
and a `MetricContext` (the radii, beta, Q, K, the initial tokens) to its values (T, ...), or
(T, ..., k) for a vector-valued entry (`Metric.shape`). It computes with the array it is
given (`attnflow._array.namespace`): a numpy array gives numpy, a torch tensor a tensor on
its device, in its autograd graph for a differentiable entry; a combinatorial entry (a
count, a fraction of tokens) refuses a tensor that requires grad in one line naming a
differentiable neighbour and computes a tensor without grad on a host copy.

Everything that lists metrics reads `METRICS`: a sweep's ``keep.metrics`` (its scalar
entries), the stored summaries of ``simulate(..., store="summaries")``, the depth
`battery`, the explorer's series panels and `attnflow.plot.plot_metric`. A new metric is one
function and one line of `METRICS`; tests/test_metrics.py is generated from it.

Measures of direction (everything but norm_spread and massive_activation, which read the
raw tokens of a residual stream) use the directions x / |x|; the counts, the energy, the
mean direction and the order parameter use tokens already on the unit sphere (within
`attnflow.manifolds.sphere_tolerance`) as they are (`_input.unit_directions`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from attnflow._array import is_tensor, namespace, to_numpy
from attnflow._checks import describe, fail
from attnflow.analysis._input import host, tokens, unit_directions
from attnflow.analysis.clusters import cluster_count
from attnflow.analysis.depth import (
    SINK_EPS,
    angular_distance,
    attention_to_first,
    check_attention,
    cosine_to_first,
    effective_rank,
    massive_activation,
    mean_direction,
    mean_pairwise_cosine,
    norm_spread,
    order_parameter,
    sink_rate,
)
from attnflow.analysis.energy import energy, log_energy
from attnflow.analysis.moments import fourier_moments
from attnflow.analysis.renyi import consumed_fraction, renyi_centers, strong_renyi_centers
from attnflow.sphere import geodesic_distance

__all__ = ["METRICS", "Metric", "MetricContext", "battery", "evaluate_metric"]


@dataclass(frozen=True)
class MetricContext:
    """What an entry may need beside the tokens (`Metric.needs` names the fields).

    tol : the single-linkage cluster tolerance (rad). delta : the Rényi radius (rad).
    r : the consumption radius (rad). beta, Q, K : the inverse temperature and the (e, d)
    query and key matrices of the energy (None: the identity). x0 : the initial tokens
    (..., n, d) of the runs. modes : the number K of Fourier modes 1..K.
    """

    tol: float | None = None
    delta: float | None = None
    r: float | None = None
    beta: Any = None
    Q: Any = None
    K: Any = None
    x0: Any = None
    modes: int | None = None


# Fields of MetricContext that may stay None when needed (Q, K: the identity).
_OPTIONAL = ("Q", "K")


@dataclass(frozen=True)
class Metric:
    """One registered quantity of a configuration over time.

    name : its key everywhere (sweep variables, summaries, battery keys, plot labels).
    fn : fn(X (T, ..., n, d), context) -> (T, ...) or (T, ..., k).
    shape : the result's shape in words, "(T, ...)" or "(T, ..., k)" with k said.
    units : "1" (dimensionless) or "rad".
    differentiable : True when a tensor input gives a result in its autograd graph (almost
        everywhere for maxima, minima and medians: piecewise smooth); False for counts and
        fractions (refused with grad).
    description : one line.
    needs : the `MetricContext` fields it reads.
    d : the only dimension d it applies to (2: the circle), None for every d >= 2.
    """

    name: str
    fn: Callable[[Any, MetricContext], Any] = field(repr=False)
    shape: str
    units: str
    differentiable: bool
    description: str
    needs: tuple[str, ...] = ()
    d: int | None = None

    @property
    def scalar(self) -> bool:
        """True for one number per configuration (shape (T, ...))."""
        return self.shape == "(T, ...)"


def _energy(X: Any, c: MetricContext) -> Any:
    return energy(unit_directions("X", X), c.beta, c.Q, c.K)


def _log_energy(X: Any, c: MetricContext) -> Any:
    return log_energy(unit_directions("X", X), c.beta, c.Q, c.K)


def _max_distance_to_first(X: Any, c: MetricContext) -> Any:
    """max_k of the geodesic distance 2 atan2(|x - y|, |x + y|) from x_k(t) to x_1(0)."""
    X, x1 = unit_directions("X", X), unit_directions("x0", c.x0)[..., :1, :]
    if X.shape[1:-2] != x1.shape[:-2] or X.shape[-1] != x1.shape[-1]:
        raise fail("x0", f"initial tokens of shape {tuple(X.shape[1:])}", describe(c.x0))
    if not is_tensor(X) and not is_tensor(x1):
        return geodesic_distance(X, x1[None]).max(axis=-1)
    xp = namespace(X, x1)
    norm = xp.linalg.vector_norm
    dist = 2.0 * xp.atan2(norm(X - x1[None], axis=-1), norm(X + x1[None], axis=-1))
    return xp.max(dist, axis=-1)


def _cluster_count(X: Any, c: MetricContext) -> Any:
    theta = unit_directions("X", host("X", X, "cluster_count (a count)"))
    return cluster_count(theta, c.tol)


def _center_count(finder: Callable) -> Callable:
    def count(X: Any, c: MetricContext) -> np.ndarray:
        theta = unit_directions("X", host("X", X, f"the number of {finder.__name__} (a count)"))
        flat = theta.reshape(-1, *theta.shape[-2:])
        return np.array([finder(x, c.delta).size for x in flat],
                        dtype=np.intp).reshape(theta.shape[:-2])

    return count


def _consumed(finder: Callable) -> Callable:
    def consumed(X: Any, c: MetricContext) -> np.ndarray:
        what = "the fraction consumed (a fraction of tokens)"
        theta = unit_directions("X", host("X", X, what))
        x0 = unit_directions("x0", host("x0", c.x0, what))
        runs = theta.shape[1:-2]
        theta = theta.reshape(theta.shape[0], -1, *theta.shape[-2:])
        x0 = x0.reshape(-1, *x0.shape[-2:])
        if len(x0) != theta.shape[1]:
            raise fail("x0", f"initial tokens of {theta.shape[1]} runs", describe(x0))
        out = np.stack([consumed_fraction(theta[:, b], finder(x0[b], c.delta), c.r)
                        for b in range(len(x0))], axis=1)
        return out.reshape(theta.shape[0], *runs)

    return consumed


def _fourier_moduli(X: Any, c: MetricContext) -> Any:
    m = fourier_moments(unit_directions("X", X), c.modes).mean
    return namespace(m).abs(m)


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("energy", _energy, "(T, ...)", "1", True,
           "the interaction energy E_beta = (1 / (2 beta n^2)) sum_ij exp(beta (Q x_i)^T K x_j) "
           "of the directions (attnflow.analysis.energy.energy)", ("beta", "Q", "K")),
    Metric("log_energy", _log_energy, "(T, ...)", "1", True,
           "log E_beta by a shifted log-sum-exp, finite at any beta "
           "(attnflow.analysis.energy.log_energy)", ("beta", "Q", "K")),
    Metric("mean_pairwise_cosine", lambda X, c: mean_pairwise_cosine(X), "(T, ...)", "1", True,
           "the mean of cos(x_k, x_l) over the pairs k < l (anisotropy)"),
    Metric("mean_cosine_to_first", lambda X, c: namespace(X).mean(cosine_to_first(X), axis=-1),
           "(T, ...)", "1", True, "the mean over k >= 2 of cos(x_k, x_1) (Theorem 4.1: -> 1)"),
    Metric("min_cosine_to_first", lambda X, c: namespace(X).min(cosine_to_first(X), axis=-1),
           "(T, ...)", "1", True,
           "the least over k >= 2 of cos(x_k, x_1) (differentiable almost everywhere)"),
    Metric("order_parameter", lambda X, c: order_parameter(X), "(T, ...)", "1", True,
           "the length of the mean direction (1/n) sum_k x_k / norm(x_k), in [0, 1]"),
    Metric("mean_direction", lambda X, c: mean_direction(X), "(T, ..., d)", "1", True,
           "(1/n) sum_k x_k / norm(x_k), the first moment of the directions (k = d coordinates)"),
    Metric("fourier_moduli", _fourier_moduli, "(T, ..., modes)", "1", True,
           "the moduli of the Fourier moments M_k = (1/n) sum_j exp(i k theta_j), k = 1..modes, "
           "on the circle (attnflow.analysis.moments.fourier_moments)", ("modes",), 2),
    Metric("effective_rank", lambda X, c: effective_rank(X), "(T, ...)", "1", True,
           "exp of the entropy of the normalised singular values of the directions, "
           "in [1, min(n, d)]"),
    Metric("massive_activation", lambda X, c: massive_activation(X), "(T, ...)", "1", True,
           "max abs(x_kc) / median abs(x_kc) over tokens and coordinates of the raw tokens "
           "(differentiable almost everywhere)"),
    Metric("norm_spread", lambda X, c: norm_spread(X), "(T, ...)", "1", True,
           "std(norm x_k) / mean(norm x_k) of the raw tokens (0 on the sphere)"),
    Metric("max_distance_to_first", _max_distance_to_first, "(T, ...)", "rad", True,
           "max over tokens k of the geodesic distance from x_k(t) to x_1(0) (Theorem 4.1: "
           "-> 0 for V = I; differentiable almost everywhere)", ("x0",)),
    Metric("cluster_count", _cluster_count, "(T, ...)", "1", False,
           "number of single-linkage clusters at geodesic tolerance cluster_tol "
           "(attnflow.analysis.clusters.cluster_count)", ("tol",)),
    Metric("renyi_count", _center_count(renyi_centers), "(T, ...)", "1", False,
           "number of Rényi centers(delta) of the configuration at time t (docs/science.md "
           "§4)", ("delta",)),
    Metric("strong_renyi_count", _center_count(strong_renyi_centers), "(T, ...)", "1", False,
           "number of strong Rényi centers(delta) of the configuration at time t "
           "(docs/science.md §4)", ("delta",)),
    Metric("consumed_renyi", _consumed(renyi_centers), "(T, ...)", "1", False,
           "fraction of tokens within geodesic radius r of the current position of a Rényi "
           "center(delta) of the initial tokens (docs/science.md §4, Fig. 3)",
           ("x0", "delta", "r")),
    Metric("consumed_strong", _consumed(strong_renyi_centers), "(T, ...)", "1", False,
           "fraction of tokens within geodesic radius r of the current position of a strong "
           "Rényi center(delta) of the initial tokens (docs/science.md §4, Fig. 3)",
           ("x0", "delta", "r")),
)}


def evaluate_metric(name: str, X: Any, **context: Any) -> Any:
    """The registered quantity `name` of tokens X (T, ..., n, d) (a Trajectory: its states),
    with the `MetricContext` fields it needs as keywords (e.g. tol= for "cluster_count", beta=
    for "energy"); fields it does not need are ignored. Returns (T, ...) or (T, ..., k)
    in X's library (`METRICS` for each entry's shape, units and differentiability)."""
    if name not in METRICS:
        raise fail("name", f"a registered metric, one of {sorted(METRICS)}", repr(name))
    unknown = sorted(set(context) - {f.name for f in fields(MetricContext)})
    if unknown:
        raise fail(unknown[0], f"a context field of a metric, one of "
                   f"{[f.name for f in fields(MetricContext)]}", repr(context[unknown[0]]))
    m = METRICS[name]
    missing = [k for k in m.needs if k not in _OPTIONAL and context.get(k) is None]
    if missing:
        raise fail(missing[0], f"a value: the metric {name!r} needs {', '.join(m.needs)}", None)
    X = tokens("X", X)
    if X.ndim < 3:
        raise fail("X", "tokens of shape (T, ..., n, d) (one configuration per save time)",
                   describe(X))
    if m.d is not None and X.shape[-1] != m.d:
        raise fail("X", f"tokens with d = {m.d} (the metric {name!r} is defined there)",
                   describe(X))
    return m.fn(X, replace(MetricContext(), **context))


# The battery's keys of two registry entries, as they were before the registry.
_BATTERY_KEYS = {"renyi_count": "renyi_centers", "strong_renyi_count": "strong_renyi_centers"}


def battery(states: Any, attention: Any = None, *, tol: float, delta: float,
            eps: float = SINK_EPS) -> dict[str, Any]:
    """The diagnostics battery through depth (`attnflow.analysis.depth`): every registered
    quantity of one configuration that needs at most a cluster tolerance and a Rényi radius
    (`METRICS`), along the first axis of states (T, n, d) (e.g. the residual stream
    entering layer 0, then after each layer), with tol (cluster tolerance, radians), delta
    (Rényi radius, radians) and eps (sink threshold) stated by the caller; plus what
    compares consecutive configurations and what reads the attention weights.

    Returns arrays of length T: "mean_pairwise_cosine", "mean_cosine_to_first",
    "min_cosine_to_first", "order_parameter", "effective_rank", "cluster_count",
    "renyi_centers", "strong_renyi_centers" (the registry's renyi_count and
    strong_renyi_count), "massive_activation", "norm_spread"; (T, d) "mean_direction". Of
    length T - 1 (when T >= 2): "angular_distance"; with attention (L, H, n, n):
    "attention_to_first" (L, H) and "sink_rate" (L,). Tensor states give the differentiable
    entries as tensors in their graph and the counts from a host copy of the detached
    states (numbers).
    """
    X = tokens("states", states, min_n=2)
    if X.ndim != 3:
        raise fail("states", "configurations of shape (T, n, d)", describe(X))
    detached = to_numpy(X)
    out = {}
    for name, m in METRICS.items():
        if set(m.needs) <= {"tol", "delta"} and m.d in (None, X.shape[-1]):
            out[_BATTERY_KEYS.get(name, name)] = evaluate_metric(
                name, X if m.differentiable else detached, tol=tol, delta=delta)
    if X.shape[0] >= 2:
        out["angular_distance"] = angular_distance(X)
    if attention is not None:
        A = check_attention(attention)
        if A.ndim != 4 or A.shape[-1] != X.shape[1]:
            raise fail("attention", f"weights of shape (L, H, {X.shape[1]}, {X.shape[1]})",
                       describe(A))
        out["attention_to_first"] = attention_to_first(A)
        out["sink_rate"] = sink_rate(A.detach() if is_tensor(A) else A, eps)
    return out
