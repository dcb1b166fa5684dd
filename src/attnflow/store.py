"""What a run keeps at each save time (`simulate(..., store=)`): its states, in float64 or
float32, or only summaries of them, for runs too big to keep.

* ``"states"`` (default): every saved state in the tokens' dtype.
* ``"float32"``: every saved state rounded to float32 (half the memory and file of float64;
  the integration itself stays in the tokens' dtype).
* ``"summaries"``: per save time and run, instead of the states, the entries of the
  analysis registry (`attnflow.analysis.metrics.METRICS`) named in `SUMMARIES` under their
  stored keys:

  - ``mean``: the first moment (1/n) sum_i u_i of the token directions, (T, ..., d) (on the
    circle, its complex form is the first Fourier moment of the tokens' angles);
  - ``clusters``: the single-linkage cluster count at the geodesic tolerance `cluster_tol`
    (`attnflow.analysis.clusters.cluster_count`), (T, ...): on the circle at any n (O(n log n)), on
    S^{d-1},
    d > 2, up to `SMALL` tokens (Prim's tree is O(n^2));
  - ``log_energy``: log E_beta (`attnflow.analysis.energy.log_energy`), (T, ...), where it is
  defined (one
    layer of one (Q, K, V) head, 0 < beta < inf): by harmonic moments in O(n K) where they
    apply (circle and S^2, Q and K multiples of orthogonal matrices), else directly up to
    `SMALL` tokens.

  The states are kept at the first and last save times only. Summaries beyond these limits
  are left out, and the record lists those kept (``integrator["summaries"]``).

Times and shapes: T save times, (...) the runs, n tokens, d coordinates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._array import is_tensor, namespace
from attnflow._checks import fail

__all__ = ["SMALL", "STORES", "SUMMARIES", "Keep", "check_store"]

STORES = ("states", "float32", "summaries")
SMALL = 4096  # tokens up to which the O(n^2) summaries are computed


def check_store(store: Any) -> str:
    """store, one of `STORES`."""
    if store not in STORES:
        raise fail("store", f"one of {STORES}", repr(store))
    return store


class Keep:
    """The saved states (or summaries) of a run, filled save time by save time into arrays
    allocated once (no list of states stacked at the end: the peak memory is the saved
    states themselves, once).

    store : one of `STORES`. count : the number of save times T. x0 : the initial state
    (..., n, d). summarize : for "summaries", a function of a state giving a dict of arrays
    (...) or (..., k) (`summaries`).
    """

    def __init__(self, store: str, count: int, x0: np.ndarray,
                 summarize: Any = None) -> None:
        self.store, self.count, self.summarize = store, count, summarize
        self.index = 0
        self.summaries: dict[str, np.ndarray] = {}
        self._tensors: list | None = None
        if is_tensor(x0):  # kept as they come (in the autograd graph), stacked when asked
            self._tensors = []
            return
        dtype = np.float32 if store == "float32" else x0.dtype
        kept = 2 if store == "summaries" else count
        self._states = np.empty((min(kept, count), *x0.shape), dtype)

    @property
    def states(self) -> Any:
        """The kept states (K, ..., n, d): a numpy array, or a tensor of torch states."""
        if self._tensors is not None:
            return namespace(self._tensors[0]).stack(self._tensors)
        return self._states

    def add(self, x: np.ndarray) -> None:
        """The state at the next save time."""
        i = self.index
        if self._tensors is not None:  # store "states" only (simulate refuses the others)
            self._tensors.append(x)
        elif self.store != "summaries":
            self._states[i] = x
        else:
            if i == 0:
                self._states[0] = x
            if i == self.count - 1:
                self._states[-1] = x
            for name, value in self.summarize(x).items():
                if name not in self.summaries:
                    self.summaries[name] = np.full((self.count, *np.shape(value)), np.nan)
                self.summaries[name][i] = value
        self.index += 1

    def kept_times(self, times: np.ndarray) -> np.ndarray:
        """The save times whose states are kept: all, or the first and last."""
        return times if self.store != "summaries" else times[[0, -1]][: len(self.states)]


# The stored summaries: their key in a saved run -> the registry entry they hold
# (`attnflow.analysis.metrics.METRICS`; the keys are those of runs saved before the registry).
SUMMARIES = {"mean": "mean_direction", "clusters": "cluster_count", "log_energy": "log_energy"}


def summaries(model: Any, cluster_tol: float, x: np.ndarray) -> dict[str, np.ndarray]:
    """The summaries of the state x (..., n, d) of a run of `model` (module docstring): the
    registry's entries of `SUMMARIES` where they are defined and affordable."""
    from attnflow.analysis.metrics import evaluate_metric
    from attnflow.manifolds import directions

    u = directions(x)
    n, d = u.shape[-2:]
    out: dict[str, np.ndarray] = {}
    for key, name in SUMMARIES.items():
        if name == "log_energy":
            value = _log_energy(model, u)
        elif name == "cluster_count" and not (d == 2 or n <= SMALL):
            value = None
        else:
            value = evaluate_metric(name, u[None], tol=cluster_tol)[0]
        if value is not None:
            out[key] = value
    return out


def _log_energy(model: Any, u: np.ndarray) -> np.ndarray | None:
    """log E_beta of the directions u (...), where defined and affordable, else None: by
    harmonic moments where they apply, else the registry's entry up to `SMALL` tokens."""
    from attnflow.analysis.metrics import evaluate_metric
    from attnflow.kernels import harmonic

    layers = model.layers
    if len(layers) != 1 or len(layers[0].heads) != 1 or len(layers[0].heads[0]) != 3:
        return None
    beta = layers[0].beta
    if not (0 < beta < np.inf):
        return None
    Q, K, _ = layers[0].heads[0]
    q = u if Q is None else u @ np.asarray(Q).T
    k = u if K is None else u @ np.asarray(K).T
    try:
        return harmonic.log_energy(q, k, beta)
    except ValueError:  # no harmonic expansion: directly, where n^2 is affordable
        return evaluate_metric("log_energy", u[None], beta=beta, Q=Q, K=K)[0] \
            if u.shape[-2] <= SMALL else None
