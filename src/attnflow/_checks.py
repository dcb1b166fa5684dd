"""Input validation shared by the package: clear errors that name the argument.

Every check raises ValueError (or TypeError for the wrong kind of object) with a message of
the form "<argument>: expected <what>, received <what>".
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fail(name: str, expected: str, received: Any) -> ValueError:
    """Build the package's standard error message for a bad argument (one line: line breaks
    in `received`, e.g. of an array's repr, become spaces)."""
    return ValueError(f"{name}: expected {expected}, received {' '.join(str(received).split())}")


def describe(a: Any) -> str:
    """A short description of an array-like for error messages."""
    if isinstance(a, np.ndarray):
        return f"an array of shape {a.shape} and dtype {a.dtype}"
    if type(a).__module__.startswith("torch") and hasattr(a, "shape"):
        return f"a tensor of shape {tuple(a.shape)} and dtype {a.dtype} on {a.device}"
    return repr(a)


def as_generator(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A numpy Generator from an int seed, a SeedSequence, a Generator or None."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and not isinstance(seed, (int, np.integer, np.random.SeedSequence)):
        raise fail("seed", "an int, a numpy Generator or None", repr(seed))
    return np.random.default_rng(seed)


def finite_array(name: str, a: Any, ndim: int | None = None, min_ndim: int | None = None,
                 dtype: Any = None) -> np.ndarray:
    """Convert to an array and check it is finite (and has the given rank)."""
    try:
        arr = np.asarray(a)
        if not np.issubdtype(arr.dtype, np.complexfloating):  # complex: refused, not cast
            arr = np.asarray(arr, dtype=dtype)
    except (TypeError, ValueError) as err:
        raise fail(name, "a numeric array", repr(a)) from err
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise fail(name, "a real numeric array", describe(arr))
    if ndim is not None and arr.ndim != ndim:
        raise fail(name, f"an array with {ndim} dimensions", describe(arr))
    if min_ndim is not None and arr.ndim < min_ndim:
        raise fail(name, f"an array with at least {min_ndim} dimensions", describe(arr))
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise fail(name, "finite entries", f"{bad} non-finite entries in {describe(arr)}")
    return arr


def square_matrix(name: str, a: Any, d: int | None = None) -> np.ndarray:
    """A finite float (d, d) matrix."""
    arr = finite_array(name, a, ndim=2, dtype=float)
    if arr.shape[0] != arr.shape[1] or (d is not None and arr.shape[0] != d):
        want = f"a ({d}, {d}) matrix" if d is not None else "a square matrix"
        raise fail(name, want, describe(arr))
    return arr


def number(name: str, value: Any, low: float = -np.inf, high: float = np.inf,
           low_open: bool = False, expected: str | None = None) -> float:
    """A finite float in [low, high] (or (low, high] when low_open); `expected` words the
    error (default "a finite number >= low" or "> low"). Booleans and strings are refused,
    though float() would take them (beta=True, beta="25")."""
    if expected is None:
        expected = f"a finite number {'>' if low_open else '>='} {low:g}"
    if isinstance(value, (bool, np.bool_, str, bytes)):  # float() takes them; not numbers
        raise fail(name, expected, repr(value))
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise fail(name, expected, repr(value)) from err
    if not np.isfinite(v) or v < low or (low_open and v == low) or v > high:
        raise fail(name, expected, repr(value))
    return v


def inverse_temperature(name: str, value: Any) -> float:
    """An inverse temperature beta: a float of either sign (beta < 0 is repulsive attention,
    docs/science.md §6), or +-inf: hardmax attention (each token attends to the keys of
    largest score, or of smallest at -inf; docs/science.md §11.6). The text "inf" is read
    by the CLI and sweeps, not here (strings are refused as for any number)."""
    expected = "a real number or +-inf (beta of either sign; inf: hardmax)"
    if not isinstance(value, (bool, np.bool_, str, bytes)):
        try:
            if np.isinf(float(value)):
                return float(value)
        except (TypeError, ValueError):
            pass
    return number(name, value, expected=expected)


def integer(name: str, value: Any, low: int | None = None, high: int | None = None,
            expected: str | None = None) -> int:
    """An int in [low, high] (either bound may be None: unbounded), returned as a Python
    int. Python and numpy integers only: booleans, floats (even 3.0), strings and anything
    else are refused, as is a value out of range. `expected` words the error (default "an
    integer >= low", "an integer in [low, high]", ...)."""
    if expected is None:
        expected = ("an integer" if low is None and high is None else
                    f"an integer >= {low}" if high is None else
                    f"an integer <= {high}" if low is None else
                    f"an integer in [{low}, {high}]")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise fail(name, expected, repr(value))
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise fail(name, expected, repr(v))
    return v


def nonnegative(name: str, value: Any) -> float:
    """A finite float >= 0."""
    return number(name, value, 0.0)


def positive(name: str, value: Any) -> float:
    """A finite float > 0."""
    return number(name, value, 0.0, low_open=True)
