"""Independent runs of an ensemble stepped as pieces, each on its own from start to end, on
the kernel threads (`step_pieces`, for the fixed-step methods of `attnflow.integrate`).

Stepping the whole batch one step at a time puts a barrier after every step (the threads
wait for the slowest share) and allocates each step's stage arrays at the batch's size,
which glibc's malloc hands back to the operating system between steps and faults in again
page by page. Pieces of at most PIECE_BYTES of state avoid both: a piece's arrays stay in
cache while it takes a chunk of steps, and the threads take chunks from a queue, so that they
end together. Valid when the field maps each run on its own; the result is then the same as
stepping the batch.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnflow.errors import NonFiniteStateError
from attnflow.parallel import n_threads, parallel_ranges

__all__ = ["PIECE_BYTES", "Progress", "step_pieces"]

Progress = Callable[[float], None]  # called with the time reached

# State bytes per piece of an ensemble (`step_pieces`). A step allocates about a dozen
# arrays the size of its piece; stepped whole, arrays of megabytes are handed back to the
# operating system between steps by glibc's malloc and faulted in again page by page: one
# thread, the paper's W1 ensemble (n = 200, d = 2, float64, 1000 runs, 3.2 MB a state):
# 580-1250 page faults per field evaluation (it varies with glibc's adaptive threshold) and
# up to +24% time over the kernel alone; in pieces 0-85 (2-core AVX-512 AMD
# EPYC, benchmarks/RESULTS.md).
PIECE_BYTES = 1 << 20


@dataclass
class _Piece:
    """Runs start:stop of an ensemble, stepped on their own: the state x after `done`
    steps, `interval` the index of the interval between save times it is in, and
    `in_interval` the steps it has taken there."""

    start: int
    stop: int
    x: np.ndarray
    done: int = 0
    interval: int = 0
    in_interval: int = 0


def step_pieces(step: Callable[[np.ndarray, float], np.ndarray], x0: np.ndarray,
                grid: list[tuple[float, float, int]], progress: Progress | None,
                grain: int) -> np.ndarray:
    """The fixed steps of `grid` ((start, h, steps) of each interval between save times)
    for the independent runs of x0 (..., n, d), as pieces of at most PIECE_BYTES of state
    (multiples of `grain` runs), each stepped on its own from start to end: no barrier
    between steps, and what a piece touches stays in cache while it takes a few steps. The
    kernel threads take pieces from a queue, a chunk of steps at a time (so that they end
    together); nested kernel calls run inline. The states equal those of stepping the whole
    batch (each run is computed alike), and so does the error for a non-finite state: the
    earliest time, with every run non-finite then. progress (from the calling thread) gets
    the time every run has reached. Returns the states at the save times,
    (len(grid) + 1, ..., n, d)."""
    lead, times = x0.shape[:-2], len(grid) + 1
    flat = x0.reshape(-1, *x0.shape[-2:])
    runs, n_steps = len(flat), sum(m for _, _, m in grid)
    if runs == 0:
        return np.broadcast_to(x0, (times, *x0.shape)).copy()
    ends = [t0 + (i + 1) * h for t0, h, m in grid for i in range(m)]  # after each step
    per_piece = max(grain, PIECE_BYTES // max(1, flat[:1].nbytes) // grain * grain)
    units, count = -(-runs // grain), -(-runs // per_piece)  # pieces of even size
    cuts = [min(runs, units * p // count * grain) for p in range(count + 1)]
    pieces = [_Piece(a, b, flat[a:b]) for a, b in zip(cuts, cuts[1:])]
    queue = collections.deque(pieces)
    chunk = max(1, -(-n_steps // 8))  # steps a thread takes of a piece before the next
    lock, stop = threading.Lock(), threading.Event()
    caller = threading.get_ident()
    saved: list[np.ndarray] = []  # the states, allocated at the first save
    failures: list[tuple[float, list[int]]] = []  # (time, flat runs) of pieces that failed
    reported = [0]

    def save(piece: _Piece, index: int) -> None:
        with lock:
            if not saved:
                saved.append(np.empty((times, *flat.shape),
                                      np.result_type(x0.dtype, piece.x.dtype)))
                saved[0][0] = flat
        saved[0][index, piece.start:piece.stop] = piece.x

    def advance(piece: _Piece) -> bool:
        """Up to `chunk` steps of the piece; True when it is done (or cannot matter)."""
        for _ in range(chunk):
            while piece.interval < len(grid) and piece.in_interval == grid[piece.interval][2]:
                save(piece, piece.interval + 1)
                piece.interval, piece.in_interval = piece.interval + 1, 0
            if piece.interval == len(grid) or stop.is_set():
                return True
            if failures and ends[piece.done] > min(t for t, _ in failures):
                return True  # it cannot fail earlier than a failure already found
            piece.x = step(piece.x, grid[piece.interval][1])
            piece.done, piece.in_interval = piece.done + 1, piece.in_interval + 1
            bad = ~np.isfinite(piece.x).all(axis=(-1, -2))
            if bad.any():
                with lock:
                    failures.append((ends[piece.done - 1],
                                     [piece.start + int(r) for r in np.flatnonzero(bad)]))
                return True
            if progress is not None and threading.get_ident() == caller:
                _report(progress, ends, reported, min(p.done for p in pieces))
        return False

    def work(_a: int, _b: int) -> None:
        while not stop.is_set():
            with lock:
                if not queue:
                    return  # what is left is being stepped by the other threads
                piece = queue.popleft()
            try:
                finished = advance(piece)
            except BaseException:
                stop.set()  # an error or an interrupt: the other threads stop too
                raise
            if not finished:
                with lock:
                    queue.append(piece)

    parallel_ranges(work, min(n_threads(), count), cost=flat.size * flat.shape[-2] * n_steps)
    if failures:
        t = min(t for t, _ in failures)
        bad = sorted(r for when, rows in failures if when == t for r in rows)
        raise NonFiniteStateError(float(t), [tuple(int(i) for i in np.unravel_index(r, lead))
                                             for r in bad])
    if progress is not None:
        _report(progress, ends, reported, n_steps)
    return saved[0].reshape(times, *x0.shape)


def _report(progress: Progress, ends: list[float], reported: list[int], done: int) -> None:
    """progress(the time after `done` steps) if that is past what was reported
    (reported[0] steps)."""
    if done > reported[0]:
        reported[0] = done
        progress(ends[done - 1])
