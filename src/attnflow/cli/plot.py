"""`attnflow plot` and `attnflow animate`: pictures of a saved run (see `attnflow.plot`)."""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path

import numpy as np
import typer

from attnflow._checks import fail
from attnflow.cli._app import app
from attnflow.cli._options import output_path, renamed


class Kind(str, Enum):
    auto = "auto"
    circle = "circle"
    sphere = "sphere"
    angles = "angles"
    timeseries = "timeseries"
    attention = "attention"


# The library's names for what these commands' options and argument give it.
NAMES = {"traj": "RUN_FILE", "run": "--run", "t": "--t",
         "frames": "--frames", "fps": "--fps", "size": "--size"}

RUN_FILE = typer.Argument(..., help="A run written by `attnflow simulate` (.nc or .zarr).",
                          exists=True)


@app.command()
def plot(
    run_file: Path = RUN_FILE,
    kind: Kind = typer.Option(Kind.auto, help="What to draw; auto: circle for d = 2, sphere "
                              "for d >= 3 (projected onto principal directions for d > 3)."),
    t: list[float] = typer.Option(None, "--t", help="Time shown (nearest saved time; default "
                                  "the last). circle: repeat for a row of snapshots."),
    run: int = typer.Option(None, help="Run of a batch (default 0; timeseries: all runs, "
                            "mean and 10-90% band)."),
    out: Path = typer.Option(..., "--out", "-o", help="Image file (.png, .pdf, .svg)."),
    dpi: int = typer.Option(200, min=10, help="Resolution of raster images (at most 2^26 "
                            "pixels in all: about 2300 dpi for a 3.4 x 3.4 in figure)."),
) -> None:
    """Draw one picture of a saved run and write it to an image file."""
    from matplotlib.backend_bases import FigureCanvasBase

    from attnflow import plot as pictures
    from attnflow._files import atomic_path
    from attnflow.plot._style import MAX_IMAGE_PIXELS
    from attnflow.trajectory import load

    output_path("--out", out, sorted(f".{k}" for k in FigureCanvasBase.get_supported_filetypes()))
    times = list(t or [])
    if not all(np.isfinite(times)):
        raise fail("--t", "finite times", times)
    with renamed(**NAMES, path="RUN_FILE"):
        traj = load(run_file)
        chosen = kind.value if kind is not Kind.auto else \
            ("circle" if traj.d == 2 else "sphere")
        if len(times) > 1 and chosen != "circle":
            raise fail("--t", f"one time for --kind {chosen}", times)
        one = times[0] if times else None
        if chosen == "circle":
            fig = pictures.plot_circle(traj, times or None, run=run or 0)
        elif chosen == "sphere":
            fig = pictures.plot_sphere(traj, one, run=run or 0)
        elif chosen == "angles":
            fig = pictures.plot_angles(traj, run=run or 0)
        elif chosen == "timeseries":
            fig = pictures.plot_timeseries(traj, run=run)
        else:
            fig = pictures.plot_attention(traj, one, run=run or 0)
    width, height = fig.get_size_inches()
    if width * height * dpi * dpi > MAX_IMAGE_PIXELS:
        raise fail("--dpi", f"at most {int(math.sqrt(MAX_IMAGE_PIXELS / (width * height)))} "
                   f"for this {width:.3g} x {height:.3g} in figure (a budget of "
                   f"{MAX_IMAGE_PIXELS} pixels)", dpi)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=dpi, format=out.suffix[1:])
    print(f"written {out}")


@app.command()
def animate(
    run_file: Path = RUN_FILE,
    out: Path = typer.Option(..., "--out", "-o", help="Movie file, .gif or .mp4."),
    frames: int = typer.Option(None, min=1, help="Number of frames (default every saved "
                               "time, at most 120)."),
    fps: float = typer.Option(12.0, help="Frames per second: at most 50 for a GIF (its frame "
                              "delays are 2 to 65535 centiseconds), 240 for an MP4."),
    run: int = typer.Option(0, help="Run of a batch."),
    size: int = typer.Option(400, min=64, help="Frame width and height in pixels (at most "
                             "8192; frames x size^2 at most 2^28)."),
) -> None:
    """Write a movie of the tokens moving (circle for d = 2, sphere for d >= 3)."""
    from attnflow import plot as pictures
    from attnflow.trajectory import load

    output_path("--out", out, [".gif", ".mp4"])
    with renamed(path="RUN_FILE"):
        traj = load(run_file)
    with renamed(**NAMES, path="--out"):
        path = pictures.animate(traj, out, run=run, frames=frames, fps=fps, size=size)
    print(f"written {path}")
