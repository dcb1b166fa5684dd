"""attnflow.parallel: shares cover the range once, on the caller's thread and the pool's;
errors stop the call only once every started share has ended; nested calls run inline."""

import threading
import time

import numpy as np
import pytest

from attnflow.kernels import blocked
from attnflow.parallel import in_share, parallel_ranges


def test_parallel_ranges_covers_once(monkeypatch):
    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    for size, grain in ((1, 1), (2, 1), (7, 1), (1000, 1), (1000, 32), (40, 32), (5000, 32)):
        hits = np.zeros(size, int)
        starts = []

        def run(a, b, hits=hits, starts=starts):
            hits[a:b] += 1
            starts.append(a)

        parallel_ranges(run, size, cost=1e12, grain=grain)
        assert (hits == 1).all()
        assert all(a % grain == 0 for a in starts)


def test_shares_run_on_the_caller_and_the_pool(monkeypatch):
    """Shares long enough for the pool's thread to wake run on both threads, and every
    share runs inside `in_share`."""
    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    names, flags = set(), []

    def run(a, b):
        names.add(threading.current_thread().name)
        flags.append(in_share())
        time.sleep(0.01)  # releases the GIL, as the kernels' nogil code does

    parallel_ranges(run, 16, cost=1e12)
    assert threading.current_thread().name in names and len(names) == 2
    assert all(flags) and not in_share()


def test_an_error_in_a_share_waits_for_the_started_shares(monkeypatch):
    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    for failing in (0, 5):  # the first share (the caller's) or a later one
        running, started = [0], []
        lock = threading.Lock()

        def run(a, b, failing=failing, running=running, started=started, lock=lock):
            with lock:
                running[0] += 1
                started.append(a)
            try:
                time.sleep(0.005)
                if a == failing:
                    raise ValueError(f"share {a}")
            finally:
                with lock:
                    running[0] -= 1

        with pytest.raises(ValueError, match=f"share {failing}"):
            parallel_ranges(run, 16, cost=1e12)
        assert running[0] == 0  # nothing runs on after the call
        assert len(started) < 16  # no share starts after the failure is seen
        assert not in_share()


def test_nested_calls_run_inline_and_leave_blas_threads_alone(monkeypatch):
    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    inner_threads = []

    def blas_limit_entered():
        with blocked._blas_on_one_thread() as limit:
            return limit is not None

    def run(a, b):
        caller = threading.current_thread()
        parallel_ranges(lambda c, d: inner_threads.append(threading.current_thread() is caller),
                        100, cost=1e12)
        assert not blas_limit_entered()  # inside a share, even on the main thread
        time.sleep(0.005)

    parallel_ranges(run, 8, cost=1e12)
    assert inner_threads and all(inner_threads)
    assert blas_limit_entered()  # outside shares, from the main thread
