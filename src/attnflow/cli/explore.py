"""`attnflow explore`: a saved run, or a saved trace of a real model, as one interactive HTML
page (see `attnflow.explorer`)."""

from __future__ import annotations

import os
import stat
from enum import Enum
from pathlib import Path

import typer

from attnflow.cli._app import app
from attnflow.cli._options import output_path, renamed, unused


class View(str, Enum):
    auto = "auto"
    circle = "circle"
    sphere = "sphere"


class Onto(str, Enum):
    pca = "pca"
    sphere = "sphere"


MAX_METADATA_BYTES = 1 << 24  # a store's root metadata larger than this is not read here


def is_trace_file(path: Path) -> bool:
    """Whether path is a trace written by `attnflow.pretrained.save_trace` (a .zarr store
    whose root attributes hold ``attnflow_trace``), read without opening the arrays."""
    if path.suffix != ".zarr" or not path.is_dir():
        return False
    for meta in ("zarr.json", ".zattrs"):
        file = path / meta
        try:
            st = os.lstat(file)
        except OSError:
            continue
        # a regular file of metadata size only (a link, a FIFO or 1 GB are left to load's
        # checks, which refuse them in one line)
        if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_METADATA_BYTES:
            if '"attnflow_trace"' in file.read_text("utf-8", errors="replace"):
                return True
    return False


@app.command()
def explore(
    run_file: Path = typer.Argument(..., help="A run written by `attnflow simulate` (.nc or "
                                    ".zarr), or a trace of a real model written by "
                                    "`attnflow.pretrained.save_trace` (.zarr).", exists=True),
    out: Path = typer.Option(..., "--out", "-o", help="The page to write (.html)."),
    view: View = typer.Option(View.auto, help="circle (d = 2) or sphere (d >= 3; projected "
                              "onto the top principal directions for d > 3); auto: by d (a "
                              "trace: sphere)."),
    run: int = typer.Option(0, help="Run of a batch (not for a trace)."),
    attention: bool | None = typer.Option(None, "--attention/--no-attention",
                                          help="Show the attention matrix (a trace: every "
                                          "layer's and head's pattern), or an error naming "
                                          "what is missing; default: when available."),
    onto: Onto = typer.Option(Onto.pca, help="A trace's token directions: pca (projected onto "
                              "the top principal directions, inside the ball) or sphere "
                              "(scaled to unit length)."),
    density: bool | None = typer.Option(None, "--density/--points",
                                        help="Draw binned densities per frame (small pages "
                                        "at any n) or every token; default: densities above "
                                        "20 000 tokens (not for a trace)."),
) -> None:
    """Write one self-contained HTML page to explore a saved run: tokens through time (play,
    slider, turn the sphere by dragging), the attention matrix (n <= 400), cluster counts and
    the order parameter, Rényi centers of causal runs. A trace of a real model shows layers as
    time, the sink rate and mean cosine per layer and each head's attention pattern. The page
    opens from disk, offline."""
    from attnflow.explorer import explore_html

    output_path("--out", out, [".html"])
    options = {"path": "RUN_FILE", "view": "--view", "run": "--run", "attention": "--attention",
               "onto": "--onto", "density": "--density"}
    picked = None if view is View.auto else view.value
    with renamed(**options):
        if is_trace_file(run_file):
            from attnflow.pretrained.trace import load_trace

            if run != 0:
                unused({"--run": run}, "for a trace (one forward pass)")
            if density is not None:
                unused({"--density" if density else "--points": True},
                       "for a trace (it draws every token)")
            obj = load_trace(run_file)
        else:
            from attnflow.trajectory import load

            if onto is not Onto.pca:
                unused({"--onto": onto.value}, "for a simulated run (it is for traces)")
            obj = load(run_file)
        explore_html(obj, out, run=run, view=picked, attention=attention, onto=onto.value,
                     density=density)
    print(f"written {out} ({out.stat().st_size / 1e6:.2f} MB)")
