"""The typer app of the command line and its command group, which turns bad input into one
line on stderr and exit status 2 (see the package's docstring). The subcommand modules
register themselves on `app`; this module imports none of them, so nothing imports in a circle.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

BAD_INPUT = 2  # exit status of a failure caused by the input
INTERRUPTED = 130  # exit status after SIGINT (128 + 2, as a shell reports it)

# What bad input raises: the library's ValueError (attnflow._checks.fail), FloatingPointError
# (attnflow.integrate.NonFiniteStateError) and OSError (missing, unreadable or unwritable
# files).
INPUT_ERRORS = (ValueError, FloatingPointError, OSError)
# click's exceptions, from the click that typer uses (recent typers vendor their own copy).
_click = importlib.import_module(typer.BadParameter.__module__)
_NO_ARGS = getattr(_click, "NoArgsIsHelpError", ())  # click >= 8.2


class Commands(TyperGroup):
    """The command group of `app`, whose `main` turns bad input into one line (see above)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            status = super().main(args, prog_name, complete_var, False, **extra)
        except _NO_ARGS as err:  # `attnflow` alone: the help
            typer.echo(err.ctx.get_help())
            sys.exit(0)
        except _click.ClickException as err:
            message = err.format_message()
            value = _received(err, sys.argv[1:] if args is None else list(args))
            if value is not None and repr(value) not in message:
                message += f", received {value!r}"
            where = getattr(getattr(err, "ctx", None), "command_path", None)
            if isinstance(err, _click.UsageError) and where:
                message += f" (see '{where} --help')"
            fail_line(message, err.exit_code)
        except typer.Abort as err:
            if isinstance(err.__cause__, KeyboardInterrupt):  # Ctrl-C: the shell's status
                fail_line("interrupted", INTERRUPTED)
            fail_line("aborted", 1)
        except INPUT_ERRORS as err:
            fail_line(str(err), BAD_INPUT)
        if status == INTERRUPTED:  # Ctrl-C, as typer's click reports it (no Abort)
            fail_line("interrupted", INTERRUPTED)
        sys.exit(status if isinstance(status, int) else 0)


def _received(err: Exception, args: list[str]) -> str | None:
    """The value given on the command line to the option a usage error is about (click's
    messages do not always say it), or None."""
    names = getattr(getattr(err, "param", None), "opts", None) or []
    for i, arg in enumerate(args):
        for name in names:
            if name.startswith("-") and arg == name and i + 1 < len(args):
                return args[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def fail_line(message: str, status: int = BAD_INPUT) -> NoReturn:
    """End the command: print ``error: message`` as one line on stderr, exit with status."""
    typer.echo("error: " + " ".join(message.split()), err=True)
    sys.exit(status)


app = typer.Typer(
    cls=Commands,
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
