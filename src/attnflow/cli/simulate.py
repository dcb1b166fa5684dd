"""`attnflow simulate`: one batch of runs from the command line."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path

import numpy as np
import typer
from rich.console import Console

from attnflow.cli import app
from attnflow.integrate import METHODS
from attnflow.kernels.masks import mask_from_text
from attnflow.presets import SPEC_HELP, matrix_from_spec

Method = Enum("Method", {name: name for name in METHODS}, type=str)


class DType(str, Enum):
    float64 = "float64"
    float32 = "float32"


def parse_times(text: str | None) -> np.ndarray | None:
    """'0,10,75,150' or 'linspace:START:STOP:NUM'."""
    if text is None:
        return None
    try:
        if text.startswith("linspace:"):
            start, stop, num = text.split(":")[1:]
            return np.linspace(float(start), float(stop), int(num))
        return np.array([float(v) for v in text.split(",")])
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated times or linspace:START:STOP:NUM, got {text!r}"
        ) from None


@app.command()
def simulate(
    n: int = typer.Option(200, min=1, help="Number of tokens."),
    d: int = typer.Option(2, min=1, help="Dimension: tokens live on S^{d-1} in R^d."),
    beta: float = typer.Option(None, min=0.0, help="Inverse temperature beta >= 0 (default 64;"
                               " 1 with --from-model)."),
    mask: str = typer.Option("causal", help="causal | full | window:W | FILE.npy (bool n x n)."),
    Q: str = typer.Option("identity", "--Q", help=f"Query matrix: {SPEC_HELP}."),
    K: str = typer.Option("identity", "--K", help=f"Key matrix: {SPEC_HELP}."),
    V: str = typer.Option("identity", "--V", help=f"Value matrix: {SPEC_HELP}."),
    batch: int = typer.Option(1, min=1, help="Number of independent runs."),
    method: Method = typer.Option("rk4", help="Integrator: fixed-step rk4, euler, geodesic; "
                                  "adaptive dopri5; implicit bdf, radau, lsoda (long "
                                  "horizons, a few thousand n*d per run at most)."),
    dt: float = typer.Option(None, help="Step of fixed-step methods (default 0.05); "
                             "first step of the adaptive ones."),
    rtol: float = typer.Option(None, help="Relative tolerance of the adaptive methods "
                               "(default 1e-6)."),
    atol: float = typer.Option(None, help="Absolute tolerance of the adaptive methods "
                               "(default 1e-9)."),
    t_end: float = typer.Option(150.0, min=0.0, help="Final time (one unit = one layer)."),
    save_at: str = typer.Option(None, help="Save times: 't1,t2,...' or linspace:START:STOP:NUM "
                                "(default 101 times from 0 to t_end)."),
    seed: int = typer.Option(0, help="Seed of the initial tokens (uniform on the sphere) and of "
                             "random matrix presets without their own seed."),
    dtype: DType = typer.Option(DType.float64, help="Floating-point type of the tokens."),
    cluster_tol: float = typer.Option(
        None, help="Geodesic tolerance (rad) for the cluster count in the summary "
        "(default beta^{-1/2} / 4, or 1e-2 if beta = 0)."),
    out: Path = typer.Option(Path("run.nc"), "--out", "-o", help="Output file, .nc or .zarr."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    from_model: Path = typer.Option(None, help="A Hugging Face checkpoint directory: simulate "
                                    "one layer of it, causal and full, from the model's "
                                    "embedding of --text or --token-ids (replaces --n, --d, "
                                    "--Q, --K, --V, --mask, --batch, --seed, --dtype)."),
    layer: int = typer.Option(0, min=0, help="With --from-model: the layer (0-based)."),
    head: int = typer.Option(None, min=0, help="With --from-model: one head (default: all "
                             "heads, summed)."),
    text: str = typer.Option(None, help="With --from-model: the text to embed."),
    token_ids: str = typer.Option(None, help="With --from-model: comma-separated token ids "
                                  "instead of --text."),
) -> None:
    """Simulate attention dynamics from uniform random tokens and write the Trajectory.

    Defaults are the paper's Fig. 2 setting: causal attention, Q = K = V = I, n = 200, d = 2,
    beta = 64, up to t = 150.
    """
    from attnflow import Attention
    from attnflow import simulate as run
    from attnflow.analysis import cluster_count, default_cluster_tol
    from attnflow.sphere import geodesic_distance, uniform

    if from_model is not None:
        from attnflow.cli.spectra import simulate_from_model

        return simulate_from_model(from_model, layer, head, text, token_ids, out, cluster_tol,
                                   beta=1.0 if beta is None else beta, t_end=t_end,
                                   method=method.value, dt=dt, rtol=rtol, atol=atol,
                                   save_at=parse_times(save_at), progress=progress)
    beta = 64.0 if beta is None else beta
    console = Console(stderr=True)
    try:
        matrices = {name: matrix_from_spec(spec, d, name, seed)
                    for name, spec in (("Q", Q), ("K", K), ("V", V))}
        model = Attention(**matrices, beta=beta, mask=mask_from_text(mask))
        x0 = uniform((batch, n) if batch > 1 else n, d, seed).astype(dtype.value)
        start = time.perf_counter()
        traj = run(model, x0, t_end, save_at=parse_times(save_at), method=method.value,
                   dt=dt, rtol=rtol, atol=atol, progress=progress, seed=seed)
        wall = time.perf_counter() - start
    except ValueError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    path = traj.save(out)
    tol = cluster_tol if cluster_tol is not None else default_cluster_tol(beta)
    counts = np.atleast_1d(cluster_count(traj.final, tol))
    drift = geodesic_distance(traj.final, x0[..., :1, :]).max()
    print(f"final time        {traj.times[-1]:g}")
    print(f"clusters          {_spread(counts)}  (single linkage, tol {tol:.3g} rad)")
    print(f"max dist to x_1(0) {drift:.3e} rad")
    print(f"field evaluations {traj.n_evals}")
    print(f"wall time         {wall:.2f} s")
    print(f"written           {path}")


def _spread(values: np.ndarray) -> str:
    if values.size == 1:
        return str(int(values[0]))
    return (f"median {np.median(values):g} (min {values.min()}, max {values.max()}) "
            f"over {values.size} runs")
