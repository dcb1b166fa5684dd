"""torch's intra-op threads for a run on CPU tensors (`attnflow.simulate`): threads that never
make a run slower.

torch's default (one OpenMP thread per core) costs more than it gains on small problems: each
parallel region ends at a barrier that waits for every thread, and on a shared machine a
descheduled thread holds the barrier for its whole time slice. The rule (`threads_for`): a
run uses one thread while a field evaluation does fewer than `MIN_WORK_PER_THREAD` multiply-
adds per thread it would add (`field_work`), else as many as the work pays for, never more
than torch's setting nor the CPUs this process may run on (`os.sched_getaffinity`). The
threshold is the measurement of benchmarks/torch_threads.py (benchmarks/RESULTS.md: on the
shared 2-vCPU development machine, two threads were slower than one at every size up to 1e9
multiply-adds per evaluation, and 100x slower on small ones under load).

torch's setting is global: `run_threads` restores it after the run (the backward pass, run by
the caller later, uses the caller's setting). When torch's threads exceed the CPUs this
process may run on, it warns once per process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["MIN_WORK_PER_THREAD", "field_work", "run_threads", "threads_for", "usable_cpus"]

# Multiply-adds per field evaluation per torch thread below which another thread does not pay
# (benchmarks/torch_threads.py; module docstring).
MIN_WORK_PER_THREAD = 10**9

_warned = False


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count() without one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def field_work(model: Any, x: Any) -> int:
    """Multiply-adds of one field evaluation of `model`'s first layer at tokens x (..., n, d),
    counted as runs x n^2 x d per head for the scores and the weighted sum (the n x n part
    that dominates; projections and masks not counted)."""
    runs = 1
    for size in x.shape[:-2]:
        runs *= int(size)
    n, d = int(x.shape[-2]), int(x.shape[-1])
    heads = len(model.layers[0].heads)
    return 2 * runs * n * n * d * heads


def threads_for(work: int, requested: int, usable: int) -> int:
    """The torch threads for a run whose field evaluations do `work` multiply-adds, given the
    user's torch setting `requested` and the `usable` CPUs: work // MIN_WORK_PER_THREAD of
    them (one below the threshold), at most min(requested, usable), at least 1."""
    return max(1, min(requested, usable, work // MIN_WORK_PER_THREAD))


@contextmanager
def run_threads(work: int) -> Iterator[int]:
    """torch's intra-op threads set to `threads_for(work, torch's setting, usable_cpus())`
    for the block and restored after it; warns once per process when torch's setting
    exceeds the usable CPUs. Yields the thread count used."""
    import torch

    global _warned
    requested, usable = torch.get_num_threads(), usable_cpus()
    if requested > usable and not _warned:
        _warned = True
        warnings.warn(f"torch uses {requested} threads but this process may run on {usable} "
                      f"CPU(s) (os.sched_getaffinity): threads beyond the CPUs wait at every "
                      f"parallel region; attnflow runs use at most {usable} "
                      "(torch.set_num_threads sets torch's own)", RuntimeWarning, stacklevel=4)
    threads = threads_for(work, requested, usable)
    if threads == requested:
        yield threads
        return
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(requested)
