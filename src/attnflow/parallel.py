"""Both cores for the kernels and the integrators: split an index range over a thread pool.

The kernels are compiled with ``nogil=True`` and run one contiguous share of their rows per
call, so plain Python threads run them in parallel. Shares are handed out dynamically (more
shares than threads), which keeps both cores busy when the machine is shared and one core
is slower than the other; numba's own prange (static shares, spinning barriers) lost a
factor of 10 here under such load. The calling thread takes shares too, from the first one,
while the pool's threads wake up (30-60 us each on the 2-core development machine): a call
too small to be worth the wake-up is done by the caller alone, little slower than inline.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from functools import cache

__all__ = ["in_share", "n_threads", "parallel_ranges"]

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


def in_share() -> bool:
    """Whether this thread is running a share of a `parallel_ranges` call."""
    return getattr(_worker, "busy", False)


def parallel_ranges(run: Callable[[int, int], object], size: int, cost: float,
                    grain: int = 1) -> None:
    """Call run(start, stop) over shares of range(size) covering it exactly once, on
    `n_threads()` threads (the caller's and the pool's) when the total `cost` is worth it,
    else inline. Shares are taken in order (put the heaviest first), as each thread becomes
    free. Share bounds are multiples of `grain` (but the last). Calls made from inside a share
    (nested parallelism, e.g. a kernel inside an integrator's share of the runs) run inline:
    the outer level already uses every thread. If a share raises, no further share starts,
    and the error (the caller's own, if its share raised too) propagates only once every
    started share has ended."""
    if in_share():  # first: the cheapest test, and the common one inside an ensemble step
        run(0, size)
        return
    threads = n_threads()
    units = -(-size // grain)
    if threads == 1 or cost < MIN_COST or units < 2:
        run(0, size)
        return
    shares = min(units, threads * SHARES_PER_THREAD)
    bounds = [min(size, units * s // shares * grain) for s in range(shares + 1)]
    taken = itertools.count()  # next() on it is atomic: each share is taken once
    failed = threading.Event()

    def work() -> None:
        _worker.busy = True
        try:
            for s in taken:
                if s >= shares or failed.is_set():
                    return
                run(bounds[s], bounds[s + 1])
        except BaseException:
            failed.set()
            raise
        finally:
            _worker.busy = False

    helpers = [_pool(threads - 1).submit(work) for _ in range(min(threads, shares) - 1)]
    try:
        work()
    finally:
        # Helpers still queued (not woken yet) are cancelled: there is nothing left for them.
        # The others end before any error propagates: no share runs on after the call.
        helpers = [helper for helper in helpers if not helper.cancel()]
        wait(helpers)
    for helper in helpers:
        helper.result()  # a helper's error
