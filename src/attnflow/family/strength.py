"""The interaction strength K: the attention sublayer's output times K (docs/science.md §11.2).

With strength K and attnflow's noise sigma (`attnflow.simulate`, ``noise=sigma``) a post-LN
block is the SDE

    dX = K F(X) dt + sigma P_X dW,        F the attention field of strength 1,

and K = 1 (the default) is the model without this part. K is a clock for the deterministic
part: in the time s = K t the same dynamics read dX = F ds + (sigma / sqrt(K)) P_X dW_s, so

    strength K, noise sigma, time t   ==   strength 1, noise sigma / sqrt(K), time K t

(in law; pathwise for a Brownian path rescaled in time, which attnflow's keyed paths are when
the step and `brownian_dt` are rescaled too: tests/test_strength.py). Stationary laws depend on
K / sigma^2 only. The noisy-transformer papers (Mun and Rosenzweig, arXiv 2604.16288,
2606.05140) write the coupling K of a free energy whose gradient flow is, in attnflow's units,
strength K sigma^2 at noise sigma (sigma = 1: strength K; docs/science.md §11.2 derives the
map and its time scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnflow._array import is_tensor, tensor_scalar
from attnflow._checks import fail, number
from attnflow.family.parts import Part, register

__all__ = ["Strength", "as_strength"]


@register
@dataclass(frozen=True)
class Strength(Part):
    """The interaction strength: a finite K > 0 multiplying the attention sublayer's output."""

    K: float = 1.0
    name: ClassVar[str] = "strength"
    slot: ClassVar[str] = "strength"
    help: ClassVar[str] = ("Interaction strength K > 0: the attention output times K "
                           "(dX = K F dt + sigma P dW; default 1).")
    text_help: ClassVar[str] = "K (a number > 0)"

    def __post_init__(self) -> None:
        if is_tensor(self.K):  # a 0-d tensor stays one: gradients reach it
            tensor_scalar("strength", self.K, 0.0, low_open=True,
                          expected="a finite number K > 0")
            return
        object.__setattr__(self, "K", number("strength", self.K, 0.0, low_open=True,
                                             expected="a finite number K > 0"))

    @classmethod
    def parse(cls, text: str | None, name: str | None = None) -> Strength | None:
        if text is None or text == "none":
            return None
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise fail(name or cls.name, "a finite number K > 0", repr(text)) from None
        if not (value > 0 and value < float("inf")):
            raise fail(name or cls.name, "a finite number K > 0", repr(text))
        return cls(value)

    def text(self) -> str:
        return repr(float(self.K))


def as_strength(strength: Any) -> float:
    """K from a `Strength`, a number or its text form ("2.5"); None is 1."""
    if strength is None:
        return 1.0
    if isinstance(strength, Strength):
        return strength.K
    if isinstance(strength, str):
        part = Strength.parse(strength, "strength")
        return 1.0 if part is None else part.K
    return Strength(strength).K
