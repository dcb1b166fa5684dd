"""Both cores for the kernels and the integrators: split an index range over a thread pool.

The kernels are compiled with ``nogil=True`` and run one contiguous share of their rows per
call, so plain Python threads run them in parallel. Shares are handed out dynamically (more
shares than threads), which keeps both cores busy when the machine is shared and one core
is slower than the other; numba's own prange (static shares, spinning barriers) lost a
factor of 10 here under such load.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache

__all__ = ["n_threads", "parallel_ranges"]

SHARES_PER_THREAD = 8
_worker = threading.local()  # .busy: this thread is running a share
MIN_COST = 2_000_000  # below this many flop-like units one thread is faster than handing off


def n_threads() -> int:
    """Threads used by the kernels: the CPUs this process may run on, or $ATTNFLOW_THREADS."""
    env = os.environ.get("ATTNFLOW_THREADS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="attnflow")


def parallel_ranges(run: Callable[[int, int], object], size: int, cost: float,
                    grain: int = 1) -> None:
    """Call run(start, stop) over shares of range(size) covering it exactly once, on
    `n_threads()` threads when the total `cost` is worth it, else inline. Share bounds are
    multiples of `grain` (but the last). Calls made from inside a share (nested parallelism,
    e.g. a kernel inside an integrator's share of the runs) run inline: the outer level
    already uses every thread."""
    threads = n_threads()
    units = -(-size // grain)
    if threads == 1 or cost < MIN_COST or units < 2 or getattr(_worker, "busy", False):
        run(0, size)
        return
    shares = min(units, threads * SHARES_PER_THREAD)
    bounds = [min(size, units * s // shares * grain) for s in range(shares + 1)]
    futures = [_pool(threads).submit(_as_worker, run, a, b)
               for a, b in zip(bounds[:-1], bounds[1:])]
    for fut in futures:
        fut.result()


def _as_worker(run: Callable[[int, int], object], start: int, stop: int) -> None:
    _worker.busy = True
    try:
        run(start, stop)
    finally:
        _worker.busy = False
