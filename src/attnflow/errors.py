"""The errors attnflow raises beside ValueError (bad input): a state that became non-finite
(the integrators), a file that `load` refuses."""

from __future__ import annotations

__all__ = ["CorruptFileError", "NonFiniteStateError"]


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


class CorruptFileError(ValueError):
    """Raised by the loaders for a file that is not a complete, consistent attnflow file, or
    that asks to read something other than itself; one line naming the file and the field:
    ``FILE: FIELD: expected ..., received ...``, or for the file as a whole (unreadable, a
    special file, over the size budget) ``path: expected ..., received FILE, ...``."""

    def __init__(self, path: object, field: str, expected: str, received: object):
        self.path = str(path)
        self.field = field
        received = " ".join(str(received).split())
        if field == "path":  # the file as a whole: the form of every bad argument
            super().__init__(f"path: expected {expected}, received {path}, {received}")
        else:
            super().__init__(f"{path}: {field}: expected {expected}, received {received}")
