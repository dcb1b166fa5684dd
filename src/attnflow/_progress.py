"""The one progress bar of attnflow (rich, on stderr, gone when done): simulate's times and
sweeps' runs use it; a caller may pass its own callable instead of True."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(progress: bool | Callable[..., None], total: float, label: str,
                 counter: str = "{task.completed:.4g} / {task.total:g}",
                 forward: Callable[[Callable[..., None], Any], None] | None = None
                 ) -> Iterator[Callable[[float], None] | None]:
    """Yield a function of the work done so far (None when `progress` is False).

    progress : True for a bar, False for none, or a callable that receives what the yielded
        function receives (`forward(progress, done)` decides how, when given).
    total : the work at completion (a bar of total 0 shows as complete).
    label, counter : the bar's text before it and after it (rich format strings).
    """
    if callable(progress):
        yield (progress if forward is None else (lambda done: forward(progress, done)))
        return
    if not progress:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn(label), BarColumn(), TextColumn(counter), TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(label, total=total or 1.0)
        yield lambda done: bar.update(task, completed=done)
