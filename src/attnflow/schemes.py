"""Normalisation schemes: where the layer norm sits, and so what the state is
(docs/science.md §6).

Tokens are x_i = r_i theta_i (direction theta_i on the sphere, radius r_i > 0). Attention
always reads the directions: A_i = sum_j w_ij V theta_j (summed over heads). A scheme turns
A into the velocity of the state:

=======  =========  ==========================  ============================================
scheme   state      velocity dx_i/dt            Transformer layer it idealises
=======  =========  ==========================  ============================================
post     sphere     P_theta(A)                  x <- LN(x + attn(x))  (the paper's)
pre      R^d        A                           x <- x + attn(LN(x))  (GPT-2, LLaMA/RMSNorm)
peri     R^d        A / |A|                     x <- x + LN(attn(LN(x)))
ngpt     sphere     alpha P_theta(A) / |A|      x <- norm(x + alpha (norm(attn(x)) - x))
=======  =========  ==========================  ============================================

In polar form pre-LN is dr/dt = <theta, A>, dtheta/dt = P_theta(A) / r (the radius grows and
slows the angular motion) and peri-LN the same divided by |A|. Where A = 0 the directions
A / |A| are taken as 0 (no motion).

Each scheme also gives the ambient drift D of an explicit Euler step, x <- retract(x + h D),
with retract the normalisation on the sphere and the identity in R^d: with h = 1 that is one
layer of the Transformer in the last column (post: D = A; ngpt: D = alpha A / |A|).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnflow._checks import fail, number
from attnflow.sphere import inner, project

__all__ = ["MANIFOLDS", "SCHEMES", "Scheme", "directions", "make_scheme", "retract"]

MANIFOLDS = ("sphere", "euclidean")


def directions(X: np.ndarray) -> np.ndarray:
    """theta = x / |x| row by row, (..., n, d)."""
    return X / np.sqrt(inner(X, X))


def retract(X: np.ndarray, manifold: str) -> np.ndarray:
    """The state after an ambient step: normalised on the sphere, unchanged in R^d."""
    return directions(X) if manifold == "sphere" else X


def _unit(A: np.ndarray) -> np.ndarray:
    """A / |A| row by row, 0 where A = 0."""
    norm = np.sqrt(inner(A, A))
    return np.divide(A, norm, out=np.zeros_like(A), where=norm > 0)


@dataclass(frozen=True)
class Scheme:
    """A normalisation scheme: its state space and how A moves the state."""

    name: ClassVar[str] = ""
    manifold: ClassVar[str] = "sphere"

    def field(self, X: np.ndarray, A: np.ndarray) -> np.ndarray:
        """The velocity dX/dt (..., n, d) of the state X given the attention output A at its
        directions."""
        raise NotImplementedError

    def drift(self, X: np.ndarray, A: np.ndarray) -> np.ndarray:
        """The ambient drift D of an Euler step x <- retract(x + h D)."""
        return self.field(X, A)

    def params(self) -> dict[str, float]:
        """The scheme's parameters for the record."""
        return {}


class Post(Scheme):
    name = "post"

    def field(self, X, A):
        return project(X, A)

    def drift(self, X, A):
        return A


class Pre(Scheme):
    name = "pre"
    manifold = "euclidean"

    def field(self, X, A):
        return A


class Peri(Scheme):
    name = "peri"
    manifold = "euclidean"

    def field(self, X, A):
        return _unit(A)


@dataclass(frozen=True)
class NGPT(Scheme):
    """nGPT (Loshchilov et al.): the step toward the normalised attention output, alpha."""

    alpha: float = 0.2
    name: ClassVar[str] = "ngpt"

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", number("alpha", self.alpha, 0.0, low_open=True))

    def field(self, X, A):
        return self.alpha * project(X, _unit(A))

    def drift(self, X, A):
        return self.alpha * _unit(A)

    def params(self) -> dict[str, float]:
        return {"alpha": self.alpha}


SCHEMES: dict[str, type[Scheme]] = {cls.name: cls for cls in (Post, Pre, Peri, NGPT)}


def make_scheme(norm: str, alpha: float = 0.2) -> Scheme:
    """The scheme named `norm` ("post", "pre", "peri", "ngpt"); alpha is nGPT's step."""
    if norm not in SCHEMES:
        raise fail("norm", f"one of {tuple(SCHEMES)}", repr(norm))
    return NGPT(alpha) if norm == "ngpt" else SCHEMES[norm]()
