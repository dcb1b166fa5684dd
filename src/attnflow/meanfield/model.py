"""The model of a mean-field run, read from attnflow's own parts (docs/science.md §9).

`MeanFieldModel.of(model)` takes an `attnflow.Attention` block (or the keyword arguments of
one) and keeps what the density equation needs: the weighting ("softmax", "unnormalised" or
"positional"), the mask ("full" or "causal"), beta, ALiBi's slope per unit label (given
apart: the block's own ALiBi is per token, and the mean field has no n), and the head's
(Q, K, V) reduced to

* the score of angles (theta, phi): beta <Q x, K y> = b cos(theta - alpha - phi) when Q^T K is
  c times a rotation by alpha (b = beta c), or b cos(theta - alpha + phi) when it is c times a
  reflection (``reflect``), with x = (cos theta, sin theta), y = (cos phi, sin phi);
* V, any real (2, 2) matrix, times the block's interaction strength K
  (`attnflow.family.Strength`: the velocity is K times that of strength 1, softmax or not).

On S^2 (d = 3, `attnflow.meanfield.sphere`) Q^T K must be c I (the kernel e^{b <x, y>} is then
zonal, b = beta c of either sign) and V is any real (3, 3) matrix (times K); masks, weightings
and ALiBi as on the circle. For d >= 4 (zonal densities, `attnflow.meanfield.zonal`) V must
be v I.

Everything else of the family (d other than 2 and 3, several heads, memory, positional
encodings, QK-norm, projection biases, an MLP, schemes other than post-LN, window or array
masks, Sinkhorn weights, a Stack) is refused with a ValueError naming what is supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import fail, number
from attnflow.family import Attention, Block

__all__ = ["MeanFieldModel"]

SUPPORTED = ("an attnflow.Attention block (or its keyword arguments) with d = 2 (circle), "
             "d = 3 (S^2) or d >= 4 (zonal densities, V a multiple of the identity), a finite "
             "beta, one (Q, K, V) head whose Q^T K is a multiple of an orthogonal matrix "
             "(d = 2) or of the identity (d >= 3), any V, mask 'full' or "
             "'causal', attention 'softmax', 'unnormalised' or 'positional', norm 'post', "
             "no memory, positional encodings, QK-norm, "
             "projection biases or MLP (ALiBi: the slope per unit label as solve(..., "
             "alibi=m * n) for the particles' slope m per token at n tokens, causal mask)")


MAX_B = 700.0  # the largest |beta c| of weights not normalised by Z, whose kernel is e^(b cos)


@dataclass(frozen=True)
class MeanFieldModel:
    """The mean-field equation's parameters (module docstring).

    block : the attnflow block they were read from (kept for the result's record).
    weighting : "softmax", "unnormalised" or "positional" (exp(score) / P_i, the position
        weights normalised over the keys: for the full mask without ALiBi the same as
        unnormalised).
    causal : True for the causal mask (labels s attend to s' <= s), False for "full".
    slope : ALiBi's slope lambda >= 0 per unit label (0: none; causal mask only): label s
        weighs label s' < s by e^{-lambda (s - s')} (the particles' slope m per token at n
        tokens gives lambda = m n).
    b : beta c, the effective inverse temperature of the kernel e^{b cos(.)}, of either sign
        (b < 0: repulsive; the Bessel coefficients I_k(b) = (-1)^k I_k(|b|) carry the sign).
    alpha : the rotation angle of Q^T K (radians); with `reflect`, the reflection's angle.
    reflect : Q^T K is c times a reflection (det < 0): the score depends on theta + phi.
    V : (d, d) value matrix times the interaction strength K of the block.
    d : 2 (the circle), 3 (S^2) or more (zonal densities on S^{d-1}).
    """

    block: Block
    weighting: str
    causal: bool
    b: float
    alpha: float
    reflect: bool
    V: np.ndarray
    slope: float = 0.0
    d: int = 2

    @classmethod
    def of(cls, model: Block | Mapping[str, Any], alibi: float | None = None, d: int = 2
           ) -> MeanFieldModel:
        """Read a block (or build `attnflow.Attention(**options)` from a mapping) for the
        sphere S^{d-1} of the density (d = 2, 3, or more for zonal densities; the block's own
        d, if set, must agree);
        `alibi`: ALiBi's slope per unit label (None or 0: none; causal mask only)."""
        if isinstance(model, Mapping):
            model = Attention(**model)
        if not isinstance(model, Block):
            raise fail("model", SUPPORTED, type(model).__name__)
        att = model.attention
        _require(model.d in (None, d), "d", f"a model of d = {model.d} for a density on "
                 f"S^{d - 1}" if model.d in (2, 3) else model.d)
        _require(model.mlp is None, "mlp", model.mlp)
        _require(model.norm == "post", "norm", model.norm)
        _require(len(att.heads) == 1 and len(att.heads[0]) == 3, "heads",
                 f"{len(att.heads)} head(s) of {len(att.heads[0])} matrices")
        _require(att.memory is None, "memory", "memory tokens")
        _require(not att.encodings, "encodings", [e.kind for e in att.encodings])
        _require(att.qk_norm is None, "qk_norm", att.qk_norm)
        _require(att.biases is None, "biases", att.biases)
        _require(isinstance(att.mask, str) and att.mask in ("full", "causal"), "mask",
                 att.mask if isinstance(att.mask, (str, tuple)) else "a boolean array")
        _require(att.weighting.method in ("softmax", "unnormalised", "positional"),
                 "attention", att.weighting.method)
        slope = 0.0 if alibi is None else number("alibi", alibi, 0.0,
                                                 expected="a slope per unit label >= 0")
        if slope > 0 and att.mask != "causal":
            raise fail("alibi", "ALiBi with mask 'causal' (the full mask's two-sided bias "
                       "is not modelled)", f"mask {att.mask!r}")
        _require(bool(np.isfinite(att.beta)), "beta", att.beta)
        if d >= 3:
            return cls._of_sphere(model, slope, d)
        Q, K, V = att.heads[0]
        B = (np.eye(2) if Q is None else Q).T @ (np.eye(2) if K is None else K)
        c = float(np.sqrt(abs(np.linalg.det(B))))
        if not np.allclose(B.T @ B, c * c * np.eye(2), rtol=0, atol=1e-12 * max(1.0, c * c)):
            raise fail("Q, K", "Q^T K a multiple of an orthogonal (2, 2) matrix (" + SUPPORTED
                       + ")", f"Q^T K = {B.tolist()}")
        if att.weighting.method != "softmax" and abs(float(att.beta)) * c > MAX_B:
            raise fail("beta", f"|beta| c <= {MAX_B:g} for {att.weighting.method} weights "
                       f"(c = {c:.6g}, the scale of Q^T K: the kernel e^(|beta| c) overflows "
                       "float64 beyond)",
                       f"beta c = {float(att.beta) * c:.6g}")
        reflect = bool(np.linalg.det(B) < 0)
        # Rotation by alpha: B = c [[cos a, -sin a], [sin a, cos a]]; reflection at angle
        # alpha: B = c [[cos a, sin a], [sin a, -cos a]]. Both have first column c (cos, sin).
        alpha = float(np.arctan2(B[1, 0], B[0, 0])) if c > 0 else 0.0
        V = np.eye(2) if V is None else np.asarray(V, dtype=float)
        return cls(model, att.weighting.method, att.mask == "causal", float(att.beta) * c,
                   alpha, reflect, att.strength * V, slope)


    @classmethod
    def _of_sphere(cls, model: Block, slope: float, d: int) -> MeanFieldModel:
        """The S^{d-1} case of `of`, d >= 3 (Q^T K = c I; d > 3: V = v I, zonal densities),
        after the checks common to all."""
        att = model.attention
        Q, K, V = att.heads[0]
        B = (np.eye(d) if Q is None else Q).T @ (np.eye(d) if K is None else K)
        c = float(np.trace(B) / d)
        if not np.allclose(B, c * np.eye(d), rtol=0, atol=1e-12 * max(1.0, abs(c))):
            raise fail("Q, K", f"Q^T K a multiple of the identity on S^{d - 1} (" + SUPPORTED
                       + ")", f"Q^T K = {B.tolist()}")
        b = float(att.beta) * c
        if att.weighting.method != "softmax" and abs(b) > MAX_B:
            raise fail("beta", f"|beta| c <= {MAX_B:g} for {att.weighting.method} weights "
                       f"(c = {c:.6g}, "
                       "the scale of Q^T K: the kernel e^(|beta| c) overflows float64 beyond)",
                       f"beta c = {b:.6g}")
        V = np.eye(d) if V is None else np.asarray(V, dtype=float)
        if d > 3 and not np.allclose(V, V[0, 0] * np.eye(d), rtol=0,
                                     atol=1e-12 * max(1.0, abs(V[0, 0]))):
            raise fail("V", f"a multiple of the identity on S^{d - 1} (zonal densities, d > 3)",
                       f"V = {V.tolist()}")
        return cls(model, att.weighting.method, att.mask == "causal", b, 0.0, False,
                   att.strength * V, slope, d=d)


def _require(ok: bool, name: str, received: Any) -> None:
    if not ok:
        raise fail(name, SUPPORTED, received)
