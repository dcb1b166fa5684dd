"""The labels of the causal mean field: where the labels s in [0, 1] sit and what each one
sees (docs/science.md §9, "Causal mask: labels"; guide: docs/guide/meanfield.md).

Under the causal mask the state is one density f(s, .) per label (token i of n has the label
s = i / n) and label s sees the measure

    sigma_s = int_0^s e^{-lambda (s - s')} f(s', .) ds'
            = s int_0^1 e^{-lambda s (1 - u)} f(s u, .) du,

lambda >= 0 ALiBi's slope per unit label (0 without ALiBi; the particles' bias -m (i - j) of
slope m per token is -m n (s - s'), so lambda = m n). Discretised, sigma = scale * (A f): the
"average" A (S, S) acting on the labels' densities, and a scale per label that the weighting
sets (`Labels.seen`): softmax 1 (the ratio N / Z cancels any factor of sigma, so s = 0 is a
label like any other), unnormalised s (the integral itself, mass P(s) = int_0^s e^{-lambda
(s - s')} ds'), positional 1 / (A 1) (the position weights normalised over the keys: mass 1).

Schemes (`SCHEMES`):

* ``"cells"``: S equal cells ((j - 1) / S, j / S], the state each cell's density (its average
  over the cell), label the cell's midpoint s_j = (j - 1/2) / S; f constant on each cell, so
  A_ji = (1 / s_j) int_{cell i, s' < s_j} e^{-lambda (s_j - s')} ds' (a label sees the cells
  before it and half of its own). Measured (docs/science.md §9): the first cell's error is
  first order in 1 / S (it reads its own value as the average of the labels before it, an
  error of (1 / (4 S)) d_s f), at fixed s the error falls about 3.2-fold per doubling
  (order ~1.7). Its use: states that are not smooth in s (tokens binned into cells,
  `from_tokens`; perturbations confined to whole cells), which a polynomial in s would not
  represent.
* ``"chebyshev"``: the S Chebyshev-Lobatto nodes s_j = (1 - cos(pi j / (S - 1))) / 2,
  j = 0..S-1 (the first token s = 0 and the last s = 1 among them), the state f at the nodes,
  f(s, .) their polynomial interpolant; A_ji = int_0^1 e^{-lambda s_j (1 - u)} L_i(s_j u) du
  by Gauss-Legendre quadrature in u (S + 32 points, exact for the polynomial part; L_i the
  Lagrange basis, evaluated by the barycentric formula). Spectral in S for states analytic
  in s (every label, the first included): measured 1e-10 or better with 32 labels
  (tests/test_meanfield_labels.py). Its resolution in s is checked like that in theta
  (`Labels.tail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.fft as sfft

from attnflow._checks import fail

__all__ = ["SCHEMES", "Labels", "label_nodes", "see", "token_cells"]

SCHEMES = ("cells", "chebyshev")
EXTRA_NODES = 32  # Gauss-Legendre points beyond S for the chebyshev scheme's average


def label_nodes(scheme: str, labels: int) -> np.ndarray:
    """The labels s (S,) of a scheme: the cells' midpoints (j - 1/2) / S, or the
    Chebyshev-Lobatto nodes (1 - cos(pi j / (S - 1))) / 2 (S >= 2), increasing."""
    if scheme not in SCHEMES:
        raise fail("scheme", f"one of {SCHEMES}", repr(scheme))
    if scheme == "cells":
        return (np.arange(labels) + 0.5) / labels
    if labels < 2:
        raise fail("labels", "S >= 2 Chebyshev-Lobatto labels (s = 0 and s = 1 among them)",
                   repr(labels))
    return (1 - np.cos(np.pi * np.arange(labels) / (labels - 1))) / 2


@dataclass(frozen=True, eq=False)
class Labels:
    """The labels of a causal run (module docstring).

    scheme : "cells" or "chebyshev".
    nodes : the labels s (S,).
    average : A (S, S), what label j sees, before the weighting's scale, is sum_i A_ji f_i.
    slope : lambda, ALiBi's slope per unit label (0: none).
    """

    scheme: str
    nodes: np.ndarray
    average: np.ndarray
    slope: float

    @classmethod
    def of(cls, scheme: str, labels: int, slope: float = 0.0) -> Labels:
        """The `scheme`'s S = `labels` labels with ALiBi's `slope` per unit label."""
        s = label_nodes(scheme, labels)
        if scheme == "cells":
            h = 1.0 / labels
            edges = np.arange(labels + 1) * h
            # int_{edges[i]}^{min(edges[i+1], s_j)} e^{-slope (s_j - s')} ds'
            upper = np.minimum(edges[None, 1:], s[:, None])
            lower = np.minimum(edges[None, :-1], s[:, None])
            weight = _decayed(s[:, None] - lower, slope) - _decayed(s[:, None] - upper, slope)
            return cls(scheme, s, weight / s[:, None], float(slope))
        x, w = np.polynomial.legendre.leggauss(labels + EXTRA_NODES)
        u, w = (x + 1) / 2, w / 2
        basis = _lagrange(s, s[:, None] * u[None, :])  # (S, Q, S): L_i(s_j u_q)
        decay = np.exp(-slope * s[:, None] * (1 - u[None, :]))  # (S, Q)
        return cls(scheme, s, np.einsum("jq,jqi->ji", w * decay, basis), float(slope))

    @property
    def size(self) -> int:
        return len(self.nodes)

    def seen(self, weighting: str) -> np.ndarray:
        """The matrix (S, S) from the labels' densities to what each label sees, for the
        weighting "softmax", "unnormalised" or "positional" (module docstring)."""
        if weighting == "softmax":
            return self.average
        if weighting == "unnormalised":
            return self.nodes[:, None] * self.average
        return self.average / self.average.sum(axis=1, keepdims=True)

    def interpolation(self, s: Any) -> np.ndarray:
        """The matrix (P, S) that takes the labels' values to labels s (P,) in [0, 1]: the
        cell holding s (cells; a cell edge belongs to the cell below, s = 0 to the first), the
        polynomial interpolant (chebyshev)."""
        s = np.atleast_1d(np.asarray(s, dtype=float))
        if s.ndim != 1 or np.any(~np.isfinite(s)) or np.any(s < 0) or np.any(s > 1):
            raise fail("s", "labels in [0, 1]", repr(s))
        if self.scheme == "cells":
            cell = np.clip(np.ceil(s * self.size).astype(int) - 1, 0, self.size - 1)
            return np.eye(self.size)[cell]
        return _lagrange(self.nodes, s)

    def excess(self, c: np.ndarray) -> np.ndarray:
        """The Chebyshev coefficients in s of degree above 2 (S - 1) / 3 (R, ...) of states c
        (S, ...) (up to the halved ends and signs; none, (0, ...), for cells): what
        `tail` measures, on the circle or S^2 (`attnflow.meanfield.sphere.label_tail`)."""
        if self.scheme == "cells":
            return c[:0]
        N = self.size - 1
        return (sfft.dct(c, type=1, axis=0) / N)[2 * N // 3 + 1:]

    def tail(self, c: np.ndarray) -> float:
        """The resolution measure in s of states c (S, K + 1) (chebyshev; 0 for cells): the l2
        norm, over the theta modes, of the Chebyshev coefficients in s of degree above
        2 (S - 1) / 3 (`excess`), relative to c_0 = 1 / (2 pi)."""
        return float(np.sqrt(np.sum(np.abs(self.excess(c)) ** 2)) * 2 * np.pi)


def see(seen: np.ndarray, c: np.ndarray) -> np.ndarray:
    """What each label sees, sum_i seen[j, i] c[i, ...] (S, ...), for complex coefficients c
    (S, ...) of any trailing shape (Fourier modes on the circle, (l, m) on S^2) and the real
    matrix `seen` (S, S) of `Labels.seen`: one real product on the interleaved real and
    imaginary parts (numpy's real @ complex goes through a complex product, ten times
    slower)."""
    c = np.ascontiguousarray(c, dtype=complex)
    flat = c.reshape(c.shape[0], -1).view(float)
    return np.ascontiguousarray(seen @ flat).view(complex).reshape(c.shape)


def token_cells(n: int, labels: int) -> np.ndarray:
    """The label cell (n,) of each of n tokens: token i (0-based) has the label (i + 1) / n,
    in cell j when it lies in (j / S, (j + 1) / S]; every cell must hold a token (S <= n)."""
    if labels > n:
        raise fail("labels", f"at most n = {n} label cells (each needs a token)", repr(labels))
    return np.ceil(np.arange(1, n + 1) * labels / n).astype(int) - 1


def _decayed(length: np.ndarray, slope: float) -> np.ndarray:
    """int_0^length e^{-slope x} dx = (1 - e^{-slope length}) / slope (length at slope 0)."""
    return -np.expm1(-slope * length) / slope if slope > 0 else length


def _lagrange(nodes: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The Chebyshev-Lobatto Lagrange basis L_i(x) (x.shape + (S,)) by the barycentric
    formula (weights (-1)^i, halved at the ends); exact at the nodes."""
    S = len(nodes)
    weights = (-1.0) ** np.arange(S)
    weights[[0, -1]] /= 2
    diff = x[..., None] - nodes
    hit = diff == 0
    diff[hit] = 1.0
    terms = weights / diff
    out = terms / terms.sum(axis=-1, keepdims=True)
    on_node = hit.any(axis=-1)
    out[on_node] = hit[on_node].astype(float)
    return out
