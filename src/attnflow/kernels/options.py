"""The kernels' options beside plain softmax attention, and their validation.

* bias: None, a float (n, n) array b (entries finite or -inf: a forbidden key) added to the
  scores beta <q_i, k_j> of the n x n token block, or a `LinearBias` (b_ij = -slope |i - j|,
  ALiBi's), kept structured so that a kernel that sums over prefixes (the harmonic kernels)
  never needs the n x n array; the others receive its matrix from `check_bias`. Memory keys
  keep their log-weights only. The mask applies on top (a key it forbids stays forbidden
  whatever its bias).
* normalization: how the weights exp(score) become attention weights w_ij
  - "softmax" (default): each row divided by its sum;
  - "unnormalised": w_ij = exp(score_ij) / N, N = n + sum_j a_j (the tokens plus the memory
    multiplicities), rows not normalised (docs/science.md §6);
  - "positional": w_ij = exp(score_ij) / P_i, P_i = sum_{j in M(i)} exp(bias_ij) + sum_j a_j:
    the position factor exp(bias_ij) / P_i of the keys row i sees sums to 1, the factor
    exp(beta <q_i, k_j>) stays unnormalised (without a bias: exp(beta <q_i, k_j>) over the
    number of keys the row sees; docs/science.md §11.1);
  - ("sinkhorn", iterations): `iterations` >= 1 times (normalise columns, then rows), in log
    space, on the full n x n block: rows sum to 1 exactly, columns to 1 in the limit (doubly
    stochastic, Sinkformers); only with the "full" mask and no memory.
* hardmax: beta = +-inf (`attnflow.kernels.hardmax`: each row's leaders, ties sharing), the
  limit of softmax attention; not an argument but the value of beta. It has no limit with
  a score bias, memory tokens or another normalization (a finite bias or log-multiplicity
  is negligible against an infinite beta), so these are refused with it.

Each kernel module names the options it has in `SUPPORTS` (collected in
`attnflow.kernels.SUPPORTS`); `check_options` raises a ValueError naming the backend and the
option when one is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import describe, fail
from attnflow.kernels.masks import MaskSpec
from attnflow.kernels.types import Normalization

__all__ = ["ALL", "LinearBias", "Normalization", "check_bias", "check_normalization",
           "check_options", "is_hardmax", "needed"]

ALL = frozenset({"bias", "unnormalised", "positional", "sinkhorn",
                 "hardmax"})  # beside plain softmax
UNNORMALISED = ("unnormalised", "positional")  # rows not normalised by their scores' sum
_EXPECTED = ("'softmax', 'unnormalised', 'positional' or ('sinkhorn', iterations) with an "
             "integer iterations >= 1")


def check_normalization(normalization: Any) -> Normalization:
    """The canonical form of a normalization spec (see the module docstring)."""
    if isinstance(normalization, str) and normalization in ("softmax", *UNNORMALISED):
        return normalization
    if (isinstance(normalization, (tuple, list)) and len(normalization) == 2
            and isinstance(normalization[0], str) and normalization[0] == "sinkhorn"):
        it = normalization[1]
        if not isinstance(it, (bool, np.bool_)) and isinstance(it, (int, np.integer)) and it >= 1:
            return ("sinkhorn", int(it))
    raise fail("normalization", _EXPECTED, repr(normalization))


@dataclass(frozen=True)
class LinearBias:
    """The score bias b_ij = -slope |i - j| (ALiBi's; under a causal mask -slope (i - j),
    linear in i - j), kept structured: O(1) to hold for any n.

    slope : a finite number >= 0 (0: no bias), or a 0-d torch tensor (kept: gradients reach
        it through the tensor kernels).
    """

    slope: Any

    def __post_init__(self) -> None:
        s = self.slope
        if is_tensor(s):
            return
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, float, np.number)) or \
                not 0 <= float(s) < np.inf:
            raise fail("bias", "a LinearBias slope: a finite number >= 0", repr(s))
        object.__setattr__(self, "slope", float(s))

    def matrix(self, n: int) -> np.ndarray:
        """The float64 (n, n) array b_ij = -slope |i - j|."""
        i = np.arange(n, dtype=float)
        return -float(self.slope) * np.abs(i[:, None] - i[None, :])


def check_bias(bias: Any, n: int) -> np.ndarray | None:
    """None, or the bias as a float (n, n) array with entries finite or -inf (a `LinearBias`
    becomes its matrix)."""
    if bias is None:
        return None
    if isinstance(bias, LinearBias):
        return bias.matrix(n)
    arr = np.asarray(bias)
    if (arr.shape != (n, n) or not np.issubdtype(arr.dtype, np.number)
            or np.issubdtype(arr.dtype, np.complexfloating)):
        raise fail("bias", f"None or a real ({n}, {n}) array for n = {n} tokens", describe(arr))
    arr = arr.astype(np.result_type(arr.dtype, np.float32), copy=False)
    if arr.size and not arr.max() < np.inf:  # one pass: max is NaN or +inf if any entry is
        raise fail("bias", "entries finite or -inf (a forbidden key)",
                   f"{int(np.count_nonzero(np.isnan(arr) | (arr == np.inf)))} NaN or +inf "
                   "entries")
    return arr


def is_hardmax(beta: Any) -> bool:
    """True for beta = +inf or -inf (hardmax attention, `attnflow.kernels.hardmax`)."""
    return isinstance(beta, (int, float, np.number)) and math.isinf(beta)


def needed(bias: np.ndarray | None, normalization: Normalization, beta: Any = None
           ) -> frozenset[str]:
    """The options (names in `ALL`) a call with this bias (None or an array), this
    canonical normalization and this beta (None: any finite beta) needs."""
    opts = set() if bias is None else {"bias"}
    if is_hardmax(beta):
        opts.add("hardmax")
    if normalization != "softmax":
        opts.add(normalization if isinstance(normalization, str) else normalization[0])
    return frozenset(opts)


def check_options(backend: str, supports: frozenset[str], n: int, mask: MaskSpec,
                  memory: Any, bias: Any, normalization: Any, beta: Any = None
                  ) -> tuple[np.ndarray | None, Normalization]:
    """Validate a kernel call's bias and normalization for n tokens (and beta, when given:
    +-inf is hardmax); returns them canonical.

    Raises ValueError when the kernel `backend` lacks an option the call needs (naming both),
    for sinkhorn with a mask other than "full" or with memory tokens, and for hardmax with
    a bias, memory or another normalization.
    """
    normalization = check_normalization(normalization)
    bias = check_bias(bias, n)
    need = needed(bias, normalization, beta)
    if "hardmax" in need and (len(need) > 1 or memory is not None):
        others = sorted(need - {"hardmax"}) + (["memory"] if memory is not None else [])
        raise fail("beta", "a finite beta with " + " and ".join(others) + " (at beta = +-inf, "
                   "hardmax, a finite score bias or memory log-weight is negligible and "
                   "unnormalised or Sinkhorn weights have no limit)", repr(beta))
    missing = need - supports
    if missing:
        raise fail("backend", f"a kernel with the option(s) {sorted(missing)} (backend "
                   f"{backend!r} has {sorted(supports)}; 'dense' has them all)", repr(backend))
    if isinstance(normalization, tuple) and (
            not (isinstance(mask, str) and mask == "full") or memory is not None):
        received = f"mask {mask if isinstance(mask, (str, tuple)) else 'array'!r}" + (
            " with memory tokens" if memory is not None else "")
        raise fail("normalization", "('sinkhorn', iterations) only with mask 'full' and no "
                   "memory (a doubly stochastic matrix needs every token to see every token)",
                   received)
    return bias, normalization
