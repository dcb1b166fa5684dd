"""Weight normalisations: how the exponentiated scores become attention weights
(docs/science.md §6; the kernels' option `normalization`, `attnflow.kernels.options`).

* ``softmax``: each row divided by its sum (the paper's);
* ``unnormalised``: exp(score) / N, N = n plus the memory multiplicities (the gradient flow of
  the interaction energy);
* ``positional``: exp(score) / P_i, P_i row i's sum of exp(bias) over the keys it sees (plus
  the memory multiplicities): the position factor (mask, ALiBi) sums to 1 over the row, the
  similarity factor stays unnormalised (arXiv 2605.09213's model; docs/science.md §11.1);
* ``sinkhorn``: `iterations` Sinkhorn iterations, doubly stochastic in the limit (Sinkformers;
  full mask, no memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnflow._checks import fail
from attnflow.family.parts import Part, register
from attnflow.kernels import options

__all__ = ["SINKHORN_ITERATIONS", "Weighting", "as_weighting"]

SINKHORN_ITERATIONS = 20  # default number of Sinkhorn iterations
METHODS = ("softmax", "unnormalised", "positional", "sinkhorn")


@register
@dataclass(frozen=True)
class Weighting(Part):
    """A weight normalisation: `method` in METHODS; `iterations` for Sinkhorn."""

    method: str = "softmax"
    iterations: int = SINKHORN_ITERATIONS
    name: ClassVar[str] = "attention"
    slot: ClassVar[str] = "weighting"
    help: ClassVar[str] = "Weight normalisation (sinkhorn: full mask, no memory)."
    text_help: ClassVar[str] = "softmax | unnormalised | positional | sinkhorn[:IT]"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise fail("attention", f"one of {METHODS}", repr(self.method))
        it = self.iterations
        if isinstance(it, bool) or not isinstance(it, int) or it < 1:
            raise fail("attention", "Sinkhorn iterations: an integer >= 1", repr(it))

    @property
    def kernel_arg(self) -> str | tuple[str, int]:
        """The kernels' `normalization` argument."""
        return ("sinkhorn", self.iterations) if self.method == "sinkhorn" else self.method

    @property
    def needs(self) -> frozenset[str]:
        """The kernel options this weighting needs."""
        return options.needed(None, self.kernel_arg)

    @classmethod
    def parse(cls, text: str, name: str | None = None) -> Weighting:
        if text in METHODS:
            return cls(text)
        head, _, it = str(text).partition(":")
        if head == "sinkhorn" and it.isdigit() and int(it) >= 1:
            return cls("sinkhorn", int(it))
        raise fail(name or cls.name, "softmax, unnormalised, positional, sinkhorn or "
                   "sinkhorn:IT (an integer IT >= 1)", repr(text))

    def text(self) -> str:
        return f"sinkhorn:{self.iterations}" if self.method == "sinkhorn" else self.method


def as_weighting(attention: Any) -> Weighting:
    """A Weighting from itself, its text form ("softmax", "unnormalised", "positional", "sinkhorn",
    "sinkhorn:IT", as on the command line) or ("sinkhorn", it)."""
    if isinstance(attention, Weighting):
        return attention
    if isinstance(attention, str):
        return Weighting.parse(attention, "attention")
    try:
        canonical = options.check_normalization(attention)
    except ValueError:
        raise fail("attention", "'softmax', 'unnormalised', 'positional', 'sinkhorn' or "
                   "('sinkhorn', iterations) with an integer >= 1", repr(attention)) from None
    if isinstance(canonical, tuple):
        return Weighting("sinkhorn", canonical[1])
    return Weighting(canonical)
