"""Types shared by the attention kernels."""

from __future__ import annotations

from typing import NamedTuple, Protocol, Union

import numpy as np

from attnflow.kernels.masks import MaskSpec


class Memory(NamedTuple):
    """Fixed tokens every query attends to (cross-attention).

    k : (m, e) keys K m_j; v : (m, f) values V m_j; log_weights : (m,) log multiplicities
    log a_j, added to the scores (a token of multiplicity a counts as a copies).
    """

    k: np.ndarray
    v: np.ndarray
    log_weights: np.ndarray


# "softmax" | "unnormalised" | "positional" | ("sinkhorn", iterations): see
# `attnflow.kernels.options`
Normalization = Union[str, tuple]


class Kernel(Protocol):
    """The one signature every attention kernel implements (see `dense.attend`; the options
    bias and normalization: `attnflow.kernels.options`)."""

    def __call__(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        beta: float,
        mask: MaskSpec,
        memory: Memory | None = None,
        bias: np.ndarray | None = None,
        normalization: Normalization = "softmax",
    ) -> np.ndarray: ...
