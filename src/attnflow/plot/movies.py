"""Movies: the tokens moving on the circle or the sphere, as a GIF or an MP4."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from attnflow._checks import fail, integer, number
from attnflow._files import atomic_path
from attnflow.plot._input import _finite, _states, _time_range
from attnflow.plot._style import (
    DEFAULT_VIEW,
    MAX_IMAGE_PIXELS,
    MAX_MOVIE_PIXELS,
    STYLE,
    _token_colors,
)
from attnflow.plot.circle import _draw_disk
from attnflow.plot.projection import frame
from attnflow.plot.sphere import _camera, _shaded_sphere, _sphere_grid
from attnflow.trajectory import Trajectory

MIN_FPS = 100 / 65535  # a GIF's longest frame delay: 65535 centiseconds
MAX_MP4_FPS = 240.0


def animate(
    traj: Trajectory,
    path: str | os.PathLike,
    *,
    run: int = 0,
    frames: int | None = None,
    fps: float = 12.0,
    t_range: tuple[float, float] | None = None,
    view: tuple[float, float] = DEFAULT_VIEW,
    basis: Any = None,
    size: int = 400,
    max_bytes: int = 20_000_000,
) -> Path:
    """A movie of the tokens moving, with the time written on each frame.

    d = 2: the circle; d >= 3: the sphere seen from `view` (d > 3: projected onto three
    directions, see `frame`). Token directions x / |x| are drawn (the states themselves on
    the sphere). Frames show saved times evenly spaced in their index (save at
    log-spaced times for a movie in log time). Written atomically.

    path : ``.gif`` (Pillow) or ``.mp4`` (H.264 through the ffmpeg binary of imageio-ffmpeg).
    frames : number of frames, at most the number of selected saved times (default all of
        them, up to 120).
    fps : frames per second: [100 / 65535, 50] for a GIF (its frame delays are 2 to 65535
        centiseconds), up to 240 for an MP4.
    size : width and height of a frame in pixels (GIF frames share one 255-colour palette),
        at most 8192; frames * size^2 at most 2^28 pixels (the frames are held in memory).
    max_bytes : the file may not exceed this; a larger result is an error (use fewer frames
        or a smaller size) and nothing is written.

    Returns the path written.
    """
    path = Path(path)
    if path.suffix not in (".gif", ".mp4"):
        raise fail("path", "a file name ending in .gif or .mp4", str(path))
    X = _states(traj, run)
    times = traj.times
    idx = _time_range(times, t_range)
    if frames is None:
        frames = min(len(idx), 120)
    frames = integer("frames", frames, 1, len(idx), expected=f"a number of frames in [1, "
                     f"{len(idx)}] (the selected saved times)")
    fps = _fps(fps, path.suffix)
    side = math.isqrt(MAX_IMAGE_PIXELS)
    size = integer("size", size, 64, side, expected=f"a frame width in pixels in [64, {side}] "
                   f"(a budget of {MAX_IMAGE_PIXELS} pixels per frame)")
    if frames * size * size > MAX_MOVIE_PIXELS:
        raise fail("frames", f"at most {MAX_MOVIE_PIXELS // (size * size)} frames of {size} x "
                   f"{size} pixels (a budget of {MAX_MOVIE_PIXELS} pixels per movie, held in "
                   "memory)", repr(frames))
    idx = idx[np.floor(np.linspace(0, len(idx) - 1, frames) + 0.5).astype(int)]
    X = _finite("traj", X[idx], times[idx])
    images = _render(traj, X, times[idx], view, basis, int(size))
    with atomic_path(path) as tmp:
        (_write_gif if path.suffix == ".gif" else _write_mp4)(tmp, images, fps)
        written = os.path.getsize(tmp)
        if written > max_bytes:
            raise fail("max_bytes", f"room for the movie (it takes {written} bytes; use fewer "
                       "frames or a smaller size)", max_bytes)
    return path


def _render(traj: Trajectory, X: np.ndarray, times: np.ndarray, view: Any, basis: Any,
            size: int) -> list[np.ndarray]:
    """RGB frames (size, size, 3) uint8 of the tokens X (F, n, d) at the given times."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    dpi = 100
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(size / dpi, size / dpi), dpi=dpi)
        canvas = FigureCanvasAgg(fig)
        a = fig.add_axes((0.0, 0.0, 1.0, 0.92))
        colors = _token_colors(traj.n)
        if traj.d == 2:
            fr = frame(traj, X, 2, basis)
            _draw_disk(a, fr)
            a.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1))  # no center ring in the movie
            dots = a.scatter(*fr(X[0, ::-1]).T, s=20, c=colors[::-1], alpha=0.7, linewidths=0,
                             zorder=3)

            def place(Xt: np.ndarray) -> None:
                dots.set_offsets(fr(Xt[::-1]))
        else:
            fr = frame(traj, X, 3, basis)
            C = _camera(view)
            _shaded_sphere(a)
            _sphere_grid(a, C, fr)
            a.set_aspect("equal")
            a.set(xlim=(-1.2, 1.2), ylim=(-1.2, 1.2))
            a.set_axis_off()
            back = a.scatter([], [], s=14, alpha=0.3, linewidths=0, zorder=2)
            front = a.scatter([], [], s=22, linewidths=0, zorder=5)

            def place(Xt: np.ndarray) -> None:
                S = fr(Xt[::-1]) @ C.T  # early tokens drawn last, on top
                ahead = S[:, 2] >= 0
                for dots, sel in ((front, ahead), (back, ~ahead)):
                    dots.set_offsets(S[sel, :2])
                    dots.set_facecolors(colors[::-1][sel])
        label = fig.text(0.5, 0.96, "", ha="center", va="center", fontsize=11)
        if fr.note:
            fig.text(0.01, 0.01, fr.note, fontsize=7, color="0.3")
        fmt = _time_format(times)
        images = []
        for Xt, t in zip(X, times):
            place(Xt)
            label.set_text(f"t = {t:{fmt}}")
            canvas.draw()
            images.append(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    return images


def _time_format(times: np.ndarray) -> str:
    """A format spec that writes every time distinctly: as many decimals as the spacing needs."""
    steps = np.diff(times)
    step = steps[steps > 0].min() if np.any(steps > 0) else 1.0
    return f".{int(np.clip(np.ceil(-np.log10(step) - 1e-9), 0, 6))}f"


def _fps(fps: Any, suffix: str) -> float:
    """Frames per second a movie can hold: a GIF's frame delay is a 16-bit count of
    centiseconds, of which browsers honour 2 and more (they show 0 and 1 as 10), so fps in
    [100 / 65535, 50]; an MP4 up to `MAX_MP4_FPS`."""
    top, why = (50.0, "GIF frame delays of 2 to 65535 centiseconds") if suffix == ".gif" \
        else (MAX_MP4_FPS, f"an MP4 of at most {MAX_MP4_FPS:g} frames per second")
    return number("fps", fps, MIN_FPS, top, expected=f"frames per second in "
                  f"[{MIN_FPS:.4g}, {top:g}] ({why})")


def _write_gif(path: Path, images: list[np.ndarray], fps: float) -> None:
    """An animated GIF with one palette taken from the first frame and no dithering, so the
    still background is identical in every frame and compresses away."""
    from PIL import Image

    first = Image.fromarray(images[0]).quantize(255, method=Image.Quantize.MAXCOVERAGE)
    frames = [Image.fromarray(im).quantize(palette=first, dither=Image.Dither.NONE)
              for im in images]
    frames[0].save(path, save_all=True, append_images=frames[1:], loop=0,
                   duration=round(1000 / fps), optimize=False)


def _write_mp4(path: Path, images: list[np.ndarray], fps: float) -> None:
    """H.264 (yuv420p, which needs even sides: odd sides get one white pixel) via ffmpeg."""
    try:
        import imageio_ffmpeg
    except ImportError as err:
        raise fail("path", "a .gif, or imageio-ffmpeg installed for .mp4 (pip install "
                   "'attnflow[plot]')", str(path)) from err
    h, w = images[0].shape[:2]
    pad = ((0, h % 2), (0, w % 2), (0, 0))
    writer = imageio_ffmpeg.write_frames(str(path), (w + w % 2, h + h % 2), fps=fps,
                                         codec="libx264", pix_fmt_out="yuv420p",
                                         macro_block_size=1)
    writer.send(None)
    for im in images:
        writer.send(np.ascontiguousarray(np.pad(im, pad, constant_values=255)))
    writer.close()
