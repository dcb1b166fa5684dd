"""Checks the commands run on their options before any work starts (see `attnflow.cli`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import typer

from attnflow._checks import fail

__all__ = ["given", "output_path", "renamed", "unused"]


def output_path(option: str, path: Path, suffixes: Sequence[str]) -> Path:
    """Check that `path` (the value of `option`) ends in one of `suffixes` and can be written:
    an existing target is of the same kind (a directory for ``.zarr``, else a file) and its
    nearest existing folder is a writable directory. Returns the path."""
    if path.suffix not in suffixes:
        raise fail(option, f"a file name ending in {' or '.join(suffixes)}", str(path))
    directory = path.suffix == ".zarr"
    if path.exists() and path.is_dir() != directory:
        raise fail(option, f"a path for a {'directory store' if directory else 'file'}",
                   f"{path}, an existing {'directory' if path.is_dir() else 'file'}")
    parent = path.parent.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise fail(option, "a path in a writable folder",
                   f"{path} ({parent} is {'not writable' if parent.is_dir() else 'a file'})")
    return path


@contextlib.contextmanager
def renamed(**options: str) -> Iterator[None]:
    """Within the block, a ValueError about a library argument (its message starts with
    "<argument>: ", see `attnflow._checks.fail`) names the command-line option instead:
    ``renamed(t_end="--t-end")`` turns "t_end: expected ..." into "--t-end: expected ..."."""
    try:
        yield
    except ValueError as err:
        name, sep, rest = str(err).partition(": ")
        if sep and name in options:
            raise ValueError(f"{options[name]}: {rest}") from None
        raise


def given(ctx: typer.Context, **options: str) -> dict[str, Any]:
    """{option: value} of the parameters (name=option) set on the command line (not by
    their defaults)."""
    return {option: ctx.params[name] for name, option in options.items()
            if (source := ctx.get_parameter_source(name)) is not None
            and source.name not in ("DEFAULT", "DEFAULT_MAP")}


def unused(options: dict[str, Any], why: str) -> None:
    """Refuse options that were given ({option: value}) where they have no effect; `why`
    completes "expected no value ...", e.g. "with --from-model"."""
    for option, value in options.items():
        raise fail(option, f"no value {why}", repr(value))
