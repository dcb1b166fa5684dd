"""The `attnflow` command line: thin wrappers that parse, call the library, print and write.

Each subcommand lives in its own module and registers itself on `app` here.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="attnflow",
    help="Simulate and analyse self-attention dynamics of tokens on the sphere.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

@app.callback()
def main() -> None:
    """Simulate and analyse self-attention dynamics of tokens on the sphere."""

from attnflow.cli import plot as _plot  # noqa: E402,F401  (registers `plot`, `animate`)
from attnflow.cli import reproduce as _reproduce  # noqa: E402,F401
from attnflow.cli import simulate as _simulate  # noqa: E402,F401  (registers `simulate`)
from attnflow.cli import spectra as _spectra  # noqa: E402,F401  (registers `spectra`)
from attnflow.cli import sweep as _sweep  # noqa: E402,F401  (registers `sweep`)

__all__ = ["app"]
