"""The errors the integrators raise beside ValueError (bad input)."""

from __future__ import annotations

__all__ = ["NonFiniteStateError"]


class NonFiniteStateError(FloatingPointError):
    """Raised when a state becomes non-finite (or diverges); says when and in which run(s)."""

    def __init__(self, t: float, runs: list[tuple[int, ...]]):
        self.t = t
        self.runs = runs
        shown = ", ".join(str(r) for r in runs[:10]) + (" ..." if len(runs) > 10 else "")
        super().__init__(
            f"the state became non-finite at t = {t:.6g} in {len(runs)} run(s) "
            f"(batch index): {shown}"
        )
