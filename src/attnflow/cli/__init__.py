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


def _print_version(value: bool) -> None:
    if value:
        from attnflow._version import provenance

        info = provenance()
        typer.echo(f"attnflow {info['version']}"
                   + (f" (git {info['commit']})" if info["commit"] else ""))
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_print_version,
                                      is_eager=True, help="Print the version and exit.")) -> None:
    """Simulate and analyse self-attention dynamics of tokens on the sphere."""

from attnflow.cli import plot as _plot  # noqa: E402,F401  (registers `plot`, `animate`)
from attnflow.cli import reproduce as _reproduce  # noqa: E402,F401
from attnflow.cli import simulate as _simulate  # noqa: E402,F401  (registers `simulate`)
from attnflow.cli import spectra as _spectra  # noqa: E402,F401  (registers `spectra`)
from attnflow.cli import sweep as _sweep  # noqa: E402,F401  (registers `sweep`)

__all__ = ["app"]
