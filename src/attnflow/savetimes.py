"""Save times of a run: the default, log-spaced times, and their text forms.

Evenly spaced times draw a long run's first steps as chords: at t_end = 150 the first saved
time after 0 is 1.5, when the tokens have long left their starting points. So

* the default (`default_times`) is 101 evenly spaced times from 0 to t_end, and, when their
  first interval is longer than `EARLY`, log-spaced times inside it from `EARLY` / 10 at 10
  per decade (t_end = 150: 123 times, the first ones 0, 0.01, 0.0126, ...);
* `log_times(t_end, num)` is 0 and num - 1 log-spaced times up to t_end, for pictures on a
  log time axis (`plot_timeseries`, `plot_angles`);
* the text forms, the same in Python (``save_at="log"``) and on the command line
  (``--save-at log``): ``default``, ``log``, ``log:NUM``, ``linspace:START:STOP:NUM`` and
  ``t1,t2,...`` (`times_from_text`).

Times are in the dynamics' units (one unit = one layer).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnflow._checks import fail, integer, number

__all__ = ["EARLY", "MAX_SAVE_TIMES", "TEXT_HELP", "as_times", "default_times",
           "is_generated", "log_times", "on_step_grid", "times_from_text"]

EARLY = 0.1  # an evenly spaced first interval longer than this is resolved on a log scale
_PER_DECADE = 10
_EVEN = 101  # evenly spaced times of the default
MAX_SAVE_TIMES = 10**8  # generated save times at most: no more than a run's steps (methods)
TEXT_HELP = "default | log | log:NUM | linspace:START:STOP:NUM | t1,t2,..."


def log_times(t_end: float, num: int = 101, first: float | None = None) -> np.ndarray:
    """0 and num - 1 log-spaced times from `first` to t_end, (num,) increasing.

    t_end : the last time, > 0.
    num : how many times, an integer >= 2 (0 included).
    first : the first time after 0, in (0, t_end) (default min(0.01, t_end / 100)).
    """
    t_end = number("t_end", t_end, 0.0, low_open=True)
    num = integer("num", num, 2, MAX_SAVE_TIMES, expected=f"an integer in [2, "
                  f"{MAX_SAVE_TIMES:.0e}] (the number of times, 0 included)")
    if num == 2:
        return np.array([0.0, t_end])
    if first is None:
        first = min(0.01, t_end / 100)
    expected = f"a time in (0, t_end = {t_end:g})"
    if number("first", first, 0.0, t_end, low_open=True, expected=expected) == t_end:
        raise fail("first", expected, repr(first))
    return np.concatenate([[0.0], np.geomspace(float(first), t_end, num - 1)])


def default_times(t_end: float) -> np.ndarray:
    """The default save times (module docstring): 101 evenly spaced from 0 to t_end, plus
    log-spaced times inside the first interval when it is longer than `EARLY`."""
    if t_end <= 0:
        return np.zeros(1)
    even = np.linspace(0.0, t_end, _EVEN)
    if even[1] <= EARLY:
        return even
    lo = EARLY / 10
    count = int(np.ceil(_PER_DECADE * np.log10(even[1] / lo)))
    early = lo * 10.0 ** (np.arange(count) / _PER_DECADE)
    return np.concatenate([[0.0], early[early < even[1]], even[1:]])


def on_step_grid(times: np.ndarray, dt: float) -> np.ndarray:
    """Save times (T,) moved to the nearest times k dt of a fixed-step method's grid (repeats
    dropped), the last one (t_end) kept as it is: so that saving never shortens a step but
    the last one, where t_end is not a multiple of dt. A time within 1e-9 steps of t_end is
    t_end."""
    t_end = float(times[-1])
    grid = np.unique(np.round(times[:-1] / dt)) * dt
    grid = grid[grid < t_end - 1e-9 * dt]
    return np.append(grid, t_end)


def times_from_text(text: str, t_end: float, name: str = "save_at") -> np.ndarray:
    """Save times from their text form (module docstring); `name` is the argument errors
    name (``--save-at`` on the command line)."""
    expected = TEXT_HELP.replace(" | ", ", ").replace(", t1", " or t1")
    try:
        if text == "default":
            return default_times(t_end)
        if text == "log" or text.startswith("log:"):
            num = int(text[4:]) if text.startswith("log:") else _EVEN
            return log_times(t_end, num)
        if text.startswith("linspace:"):
            start, stop, num = text.split(":")[1:]
            count = integer("num", int(num), 1, MAX_SAVE_TIMES, expected=f"an integer in "
                            f"[1, {MAX_SAVE_TIMES:.0e}] (the number of times)")
            return np.linspace(float(start), float(stop), count)
        return np.array([float(v) for v in text.split(",")])
    except ValueError as err:
        raise fail(name, expected, f"{text!r} ({err})" if "expected" in str(err) else
                   repr(text)) from None


def as_times(save_at: Any, t_end: float) -> Any:
    """save_at as given, None as the default times, text read by `times_from_text`."""
    if save_at is None:
        return default_times(t_end)
    if isinstance(save_at, str):
        return times_from_text(save_at, t_end)
    return save_at


def is_generated(save_at: Any) -> bool:
    """Whether save_at asks for generated times (None, or a text form other than a list of
    times), which a run with noise may snap to its step grid; listed times must lie on it."""
    return save_at is None or (isinstance(save_at, str)
                               and save_at.split(":")[0] in ("default", "log", "linspace"))
