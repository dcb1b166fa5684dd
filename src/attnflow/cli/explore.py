"""`attnflow explore`: a saved run as one interactive HTML page (see `attnflow.explorer`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from attnflow.cli._app import app
from attnflow.cli._options import output_path, renamed


class View(str, Enum):
    auto = "auto"
    circle = "circle"
    sphere = "sphere"


@app.command()
def explore(
    run_file: Path = typer.Argument(..., help="A run written by `attnflow simulate` (.nc or "
                                    ".zarr).", exists=True),
    out: Path = typer.Option(..., "--out", "-o", help="The page to write (.html)."),
    view: View = typer.Option(View.auto, help="circle (d = 2) or sphere (d >= 3; projected "
                              "onto the top principal directions for d > 3); auto: by d."),
    run: int = typer.Option(0, help="Run of a batch."),
) -> None:
    """Write one self-contained HTML page to explore a saved run: tokens through time (play,
    slider, turn the sphere by dragging), the attention matrix (n <= 400), cluster counts and
    the order parameter, Rényi centers of causal runs. It opens from disk, offline."""
    from attnflow.explorer import explore_html
    from attnflow.trajectory import load

    output_path("--out", out, [".html"])
    with renamed(path="RUN_FILE", view="--view", run="--run"):
        traj = load(run_file)
        explore_html(traj, out, run=run, view=None if view is View.auto else view.value)
    print(f"written {out} ({out.stat().st_size / 1e6:.2f} MB)")
