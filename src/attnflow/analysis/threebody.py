"""Three tokens on the circle (docs/science.md §11.3): the equilateral triangle's linear
stability and the classification of a final configuration.

Full attention with Q = K = V = I on the circle, tokens at angles theta_i, moves them by
theta_i' = sum_j w_ij sin(theta_j - theta_i), with w_ij = e^{beta cos(theta_i - theta_j)} / Z_i
(softmax, Z_i the sum over j including i) or e^{beta cos(theta_i - theta_j)} / n (unnormalised,
n = 3). The equilateral triangle (0, 2 pi / 3, 4 pi / 3) is an equilibrium for every beta; its
linearisation has the eigenvalue 0 on the rotation mode (all angles shifted alike) and one
double eigenvalue on the two modes of zero sum, the rate `triangle_rates`:

    softmax:      lambda(beta) = (3 / 4) (2 + 3 beta) / (e^{3 beta / 2} + 2)
    unnormalised: lambda(beta) = (1 / 4) (2 + 3 beta) e^{-beta / 2}

both positive (the triangle unstable) for beta > -2/3 and negative (stable) for beta < -2/3
(`triangle_threshold`), 1/2 at beta = 0 where the two weightings coincide.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import fail

__all__ = ["three_token_state", "triangle_rates", "triangle_threshold"]

#: The codes of `three_token_state`.
SYNCHRONISED, TRIANGLE, OTHER = 0, 1, 2
_WEIGHTINGS = ("softmax", "unnormalised")


def _weighting(attention: str) -> str:
    if attention not in _WEIGHTINGS:
        raise fail("attention", "'softmax' or 'unnormalised'", repr(attention))
    return attention


def triangle_rates(beta: Any, attention: str = "softmax") -> np.ndarray:
    """The double eigenvalue lambda(beta) (1 / time unit) of the linearised dynamics of three
    tokens at the equilateral triangle, on the two modes orthogonal to the rotation (whose
    eigenvalue is 0): a perturbation's norm grows like e^{lambda t}. `attention`: "softmax"
    or "unnormalised" (weights e^{score} / 3). Vectorised over finite beta of either sign;
    returns beta's shape."""
    b = np.asarray(beta, dtype=float)
    if not np.all(np.isfinite(b)):
        raise fail("beta", "finite numbers", repr(beta))
    if _weighting(attention) == "softmax":
        # (3/4)(2 + 3b) / (e^{3b/2} + 2), written with e^{-3b/2} for b > 0 (no overflow)
        s = np.exp(-1.5 * np.abs(b))
        return np.where(b > 0, 0.75 * (2 + 3 * b) * s / (1 + 2 * s),
                        0.75 * (2 + 3 * b) / (s + 2))
    return 0.25 * (2 + 3 * b) * np.exp(-0.5 * b)


def triangle_threshold(attention: str = "softmax") -> float:
    """The beta at which `triangle_rates` changes sign: -2/3 for both weightings (the factor
    2 + 3 beta; the other factor is positive). The triangle is stable below it."""
    _weighting(attention)
    return -2.0 / 3.0


def three_token_state(theta: Any, tol: float) -> np.ndarray:
    """Classify configurations of three tokens on the circle: `SYNCHRONISED` when the three
    lie within an arc of length tol (rad), `TRIANGLE` when each of the three gaps between
    neighbours is within tol of 2 pi / 3, else `OTHER`. theta: (..., 3) angles (rad); returns
    int codes of shape theta.shape[:-1]."""
    th = np.asarray(theta, dtype=float)
    if th.ndim < 1 or th.shape[-1] != 3 or not np.all(np.isfinite(th)):
        raise fail("theta", "finite angles of shape (..., 3)", repr(np.shape(theta)))
    if not (np.isfinite(tol) and tol > 0):
        raise fail("tol", "a positive angle (rad)", repr(tol))
    s = np.sort(np.mod(th, 2 * np.pi), axis=-1)
    gaps = np.diff(np.concatenate([s, s[..., :1] + 2 * np.pi], axis=-1), axis=-1)
    synced = 2 * np.pi - gaps.max(axis=-1) <= tol
    triangle = np.all(np.abs(gaps - 2 * np.pi / 3) <= tol, axis=-1)
    return np.where(synced, SYNCHRONISED, np.where(triangle, TRIANGLE, OTHER))
