"""The one progress report of attnflow, on stderr: simulate's times and sweeps' runs use it; a
caller may pass its own callable instead of True.

On a terminal it is a bar (rich, gone when done). Where stderr is not a terminal (a batch
job, a log file, a pipe) a bar would draw nothing, so it is plain lines instead, one every
`INTERVAL` seconds: the work done, its rate, and the time left at that rate, e.g.

    simulating: t = 0.85 / 2 (42%), 0.0112 per s, about 1.7 min left

and a last line with the total time once any line was written.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, TextIO

__all__ = ["INTERVAL", "progress_bar"]

INTERVAL = 10.0  # seconds between two plain lines


@contextlib.contextmanager
def progress_bar(progress: bool | Callable[..., None], total: float, label: str,
                 counter: str = "{task.completed:.4g} / {task.total:g}",
                 forward: Callable[[Callable[..., None], Any], None] | None = None,
                 stream: TextIO | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ) -> Iterator[Callable[[float], None] | None]:
    """Yield a function of the work done so far (None when `progress` is False).

    progress : True for a report, False for none, or a callable that receives what the
        yielded function receives (`forward(progress, done)` decides how, when given).
    total : the work at completion (a bar of total 0 shows as complete).
    label, counter : the text before the work done and the work done itself (rich format
        strings of `task.completed` and `task.total`).
    stream : where to report (default sys.stderr): a bar if it is a terminal, else plain
        lines every `interval` seconds (default `INTERVAL`) of `clock` (module docstring).
    """
    if callable(progress):
        yield (progress if forward is None else (lambda done: forward(progress, done)))
        return
    if not progress:
        yield None
        return
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        lines = _Lines(stream, total, label, counter,
                       INTERVAL if interval is None else interval, clock)
        yield lines.update
        lines.finish()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn(label), BarColumn(), TextColumn(counter), TimeRemainingColumn())
    with Progress(*columns, transient=True, console=Console(file=stream)) as bar:
        task = bar.add_task(label, total=total or 1.0)
        yield lambda done: bar.update(task, completed=done)


class _Lines:
    """Plain progress lines on a stream that is not a terminal (module docstring)."""

    def __init__(self, stream: TextIO, total: float, label: str, counter: str,
                 interval: float, clock: Callable[[], float]) -> None:
        self.stream, self.total, self.label, self.counter = stream, total, label, counter
        self.interval, self.clock = interval, clock
        self.start = self.last = clock()
        self.done = 0.0
        self.written = False

    def update(self, done: float) -> None:
        self.done = done
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            self._write(now)

    def _write(self, now: float, final: bool = False) -> None:
        elapsed = now - self.start
        work = self.counter.format(task=SimpleNamespace(completed=self.done, total=self.total))
        text = f"{self.label}: {work}"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        if final:
            text += f", done in {_duration(elapsed)}"
        elif elapsed > 0 and self.done > 0:
            rate = self.done / elapsed
            text += f", {rate:.3g} per s"
            if self.total:
                text += f", about {_duration(max(0.0, self.total - self.done) / rate)} left"
        print(text, file=self.stream, flush=True)
        self.written = True

    def finish(self) -> None:
        if self.written:
            self._write(self.clock(), final=True)


def _duration(seconds: float) -> str:
    """A duration for people: 42 s, 3.5 min, 2.1 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
