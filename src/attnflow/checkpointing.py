"""Fixed steps on torch tensors, optionally checkpointed for reverse mode in bounded memory.

Reverse-mode gradients through `attnflow.simulate` are ordinary torch autograd: every step
is recorded, so a run of S steps keeps S steps' intermediate tensors (each field evaluation's
queries, keys, scores and stages) until `backward`. With ``checkpoint=c`` the steps run in
chunks of c under `torch.utils.checkpoint` (non-reentrant): only each chunk's starting state
is kept, and the chunk is recomputed during the backward pass, so memory falls from S steps'
intermediates to about S / c states plus one chunk's intermediates, for one more forward
pass of compute. The counts and the states are those of the plain loop (the recomputation
runs the same arithmetic on the same inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["run_steps"]


def run_steps(step: Callable[[Any, float], Any], x: Any, t0: float, h: float, m: int,
              every: int | None, progress: Callable[[float], None] | None) -> Any:
    """m steps x <- step(x, h) from time t0; with `every`, in chunks of `every` steps under
    torch's non-reentrant checkpoint. progress gets the time after each chunk (each step
    without checkpointing). Returns the state after the m steps."""
    if every is None:
        for i in range(m):
            x = step(x, h)
            if progress is not None:
                progress(t0 + (i + 1) * h)
        return x
    from torch.utils.checkpoint import checkpoint

    done = 0
    while done < m:
        count = min(every, m - done)
        x = checkpoint(_chunk, step, x, h, count, use_reentrant=False)
        done += count
        if progress is not None:
            progress(t0 + done * h)
    return x


def _chunk(step: Callable[[Any, float], Any], x: Any, h: float, count: int) -> Any:
    for _ in range(count):
        x = step(x, h)
    return x
