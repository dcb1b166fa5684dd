"""`python -m attnflow` runs the command line."""

from attnflow.cli import app

app()
