"""The `attnflow` command line: thin wrappers that parse, call the library, print and write.

Each subcommand lives in its own module and registers itself on `app`, defined in _app.py,
which imports no subcommand (so no module imports in a circle); this package imports them
all. Every failure ends in one line on stderr, ``error: ...``, and a non-zero exit status,
never in a traceback: bad input (click's usage errors, a ValueError from the library, a state that
became non-finite, a missing or unwritable file) exits with 2. Commands therefore just let
those exceptions propagate; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from attnflow.cli import explore as _explore  # noqa: F401  (registers `explore`)
from attnflow.cli import plot as _plot  # noqa: F401  (registers `plot`, `animate`)
from attnflow.cli import reproduce as _reproduce  # noqa: F401  (registers `reproduce`)
from attnflow.cli import simulate as _simulate  # noqa: F401  (registers `simulate`)
from attnflow.cli import spectra as _spectra  # noqa: F401  (registers `spectra`)
from attnflow.cli import sweep as _sweep  # noqa: F401  (registers `sweep`)
from attnflow.cli import trace as _trace  # noqa: F401  (registers `trace`)
from attnflow.cli._app import app

__all__ = ["app"]
