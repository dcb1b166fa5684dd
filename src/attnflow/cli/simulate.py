"""`attnflow simulate`: one batch of runs from the command line."""

from __future__ import annotations

import functools
import inspect
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import typer

from attnflow._checks import fail, inverse_temperature, number
from attnflow.cli._app import app
from attnflow.cli._options import given, output_path, renamed, unused
from attnflow.family.stack import segments
from attnflow.family.text import (
    DEFAULTS,
    family_help,
    family_options,
    layers_from_npz,
    option_names,
)
from attnflow.kernels.masks import mask_from_text
from attnflow.methods import METHODS, NOISY, check_solver_args
from attnflow.presets import SPEC_HELP, matrix_from_spec
from attnflow.savetimes import TEXT_HELP as SAVE_HELP
from attnflow.trajectory import FORMATS

Method = Enum("Method", {name: name for name in METHODS}, type=str)


class DType(str, Enum):
    float64 = "float64"
    float32 = "float32"


def flag(name: str) -> str:
    """The command-line flag of a family option: --qk-norm for qk_norm."""
    return "--" + name.replace("_", "-")


class FamilyCommand:
    """A command whose signature is its function's plus one ``--NAME TEXT`` option per
    registered part with a text form (`attnflow.family.text.option_names`), read from the
    registry each time typer builds the command: a part registered later (even in a test)
    is an option of the command, and its text arrives in the function's ``**family``."""

    def __init__(self, func: Callable[..., None]) -> None:
        functools.update_wrapper(self, func)
        self.func = func

    @property
    def __signature__(self) -> inspect.Signature:
        sig = inspect.signature(self.func, eval_str=True)
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        helps = family_help()
        for name in option_names():
            option = typer.Option(DEFAULTS.get(name, "none"), flag(name), help=helps[name])
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                            default=option, annotation=str))
        return sig.replace(parameters=params)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return self.func(*args, **kwargs)


def simulate(
    ctx: typer.Context,
    n: int = typer.Option(200, min=1, help="Number of tokens."),
    d: int = typer.Option(2, min=2, help="Dimension: tokens live on S^{d-1} in R^d."),
    beta: float = typer.Option(None, help="Inverse temperature beta, of either sign (beta < 0:"
                               " repulsive attention; inf: hardmax, with --method events; "
                               "default 64, 1 with --from-model)."),
    mask: str = typer.Option("causal", help="causal | full | window:W | FILE.npy (bool n x n)."),
    Q: str = typer.Option("identity", "--Q", help=f"Query matrix: {SPEC_HELP}."),
    K: str = typer.Option("identity", "--K", help=f"Key matrix: {SPEC_HELP}."),
    V: str = typer.Option("identity", "--V", help=f"Value matrix: {SPEC_HELP}."),
    batch: int = typer.Option(1, min=1, help="Number of independent runs."),
    method: Method = typer.Option("rk4", help="Integrator: fixed-step rk4, euler, geodesic; "
                                  "adaptive dopri5; implicit bdf, radau, lsoda (long "
                                  "horizons, a few thousand n*d per run at most); events "
                                  "(hardmax, --beta inf: leader changes located)."),
    dt: float = typer.Option(None, help="Step of fixed-step methods (default 0.05); "
                             "first step of the adaptive ones."),
    rtol: float = typer.Option(None, help="Relative tolerance of the adaptive methods "
                               "(default 1e-6)."),
    atol: float = typer.Option(None, help="Absolute tolerance of the adaptive methods "
                               "(default 1e-9)."),
    t_end: float = typer.Option(150.0, min=0.0, help="Final time (one unit = one layer)."),
    save_at: str = typer.Option(None, help=f"Save times: {SAVE_HELP} (default: 101 evenly "
                                "spaced from 0 to t_end, log-spaced inside the first interval "
                                "when it is longer than 0.1; log: 0 and 100 log-spaced times "
                                "from 0.01)."),
    seed: int = typer.Option(0, help="Seed of the initial tokens (uniform on the sphere) and of "
                             "random matrix presets without their own seed."),
    dtype: DType = typer.Option(DType.float64, help="Floating-point type of the tokens."),
    cluster_tol: float = typer.Option(
        None, help="Geodesic tolerance (rad) for the cluster count in the summary "
        "(default |beta|^{-1/2} / 4, or 1e-2 if beta = 0)."),
    out: Path = typer.Option(Path("run.nc"), "--out", "-o", help="Output file, .nc or .zarr."),
    progress: bool = typer.Option(True, help="Report progress on stderr: a bar on a terminal, "
                                  "else a line every 10 s (time reached, rate, time left)."),
    backend: str = typer.Option("auto", help="Attention kernel: auto (the fastest that "
                                "applies), dense, fused, blocked, harmonic, harmonic:TOL, "
                                "torch (the record names the kernel that ran)."),
    store: str = typer.Option("states", help="What to keep per save time: states, float32 "
                              "(states in float32: half the memory and file), summaries (mean "
                              "direction, cluster counts, energy; states at the first and "
                              "last times only)."),
    memory_budget: float = typer.Option(None, help="GB (1e9 bytes) the run may take at its "
                                        "peak, estimated before it starts (default: 80% of the "
                                        "memory available)."),
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
    alpha: float = typer.Option(0.2, help=family_help()["alpha"]),
    noise: float = typer.Option(None, help=family_help()["noise"]),
    layers: Path = typer.Option(None, help=family_help()["layers"] + " Replaces --Q, --K, --V "
                                "and --d; t_end <= L."),
    **family: str,
) -> None:
    """Simulate attention dynamics from uniform random tokens and write the Trajectory.

    Defaults are the paper's Fig. 2 setting: causal attention, Q = K = V = I, n = 200, d = 2,
    beta = 64, up to t = 150.
    """
    # Every option is checked (and the model built) before any work starts.
    flags = {name: flag(name) for name in option_names()}
    if from_model is not None:
        unused(given(ctx, n="--n", d="--d", mask="--mask", Q="--Q", K="--K", V="--V",
                     batch="--batch", seed="--seed", dtype="--dtype", alpha="--alpha",
                     noise="--noise", layers="--layers", backend="--backend", store="--store",
                     memory_budget="--memory-budget", **flags), "with --from-model")
        from attnflow.analysis._input import radius

        beta = 1.0 if beta is None else beta
        with renamed(**SOLVER_OPTIONS):
            output_path("--out", out, sorted(FORMATS))
            check_solver_args(method.value, t_end, save_at, dt, rtol, atol)
            inverse_temperature("beta", beta)
            if cluster_tol is not None:
                radius("cluster_tol", cluster_tol)
        from attnflow.cli.spectra import simulate_from_model

        return simulate_from_model(from_model, layer, head, text, token_ids, out, cluster_tol,
                                   beta=beta, t_end=t_end, method=method.value, dt=dt,
                                   rtol=rtol, atol=atol, save_at=save_at,
                                   progress=progress)
    unused(given(ctx, layer="--layer", head="--head", text="--text", token_ids="--token-ids"),
           "without --from-model")
    if layers is not None:
        unused(given(ctx, Q="--Q", K="--K", V="--V", d="--d"), "with --layers")
        if layers.suffix in MODEL_FILES:  # the saved model itself: every option is its own
            unused(given(ctx, beta="--beta", mask="--mask", alpha="--alpha",
                         backend="--backend", **flags),
                   f"with --layers {layers.suffix} (a saved model keeps its own options)")
    texts = {k: (None if v == "none" and k not in DEFAULTS else v) for k, v in family.items()}
    model_d = d if layers is None else None
    family = family_options(alpha=alpha, names={**flags, "alpha": "--alpha"}, d=model_d,
                            **texts)
    setup = _setup(n=n, d=d, beta=64.0 if beta is None else beta, mask=mask, Q=Q, K=K, V=V,
                   batch=batch, method=method.value, dt=dt, rtol=rtol, atol=atol, t_end=t_end,
                   save_at=save_at, seed=seed, dtype=dtype.value, cluster_tol=cluster_tol,
                   out=out, family=family, noise=noise, layers=layers, backend=backend,
                   store=store,
                   memory_budget=None if memory_budget is None else memory_budget * 1e9)
    _run(setup, progress)


app.command()(FamilyCommand(simulate))

SOLVER_OPTIONS = {"method": "--method", "t_end": "--t-end", "save_at": "--save-at",
                  "dt": "--dt", "rtol": "--rtol", "atol": "--atol", "rtol/atol": "--rtol/--atol",
                  "beta": "--beta", "cluster_tol": "--cluster-tol", "backend": "--backend",
                  "store": "--store", "memory_budget": "--memory-budget"}


@dataclass(frozen=True)
class Setup:
    """A checked `attnflow simulate`: what to integrate, from where, and where it goes."""

    model: Any  # attnflow.Attention
    x0: np.ndarray  # (n, d) or (batch, n, d)
    t_end: float
    save_at: str | None  # its text form (attnflow.savetimes), checked
    method: str
    dt: float | None
    rtol: float | None
    atol: float | None
    seed: int
    cluster_tol: float
    out: Path
    noise: float | None = None
    store: str = "states"
    memory_budget: float | None = None  # bytes


def _setup(*, n: int, d: int, beta: float, mask: str, Q: str, K: str, V: str, batch: int,
           method: str, dt: float | None, rtol: float | None, atol: float | None,
           t_end: float, save_at: str | None, seed: int, dtype: str,
           cluster_tol: float | None, out: Path, family: dict[str, Any] | None = None,
           noise: float | None = None, layers: Path | None = None, backend: str = "auto",
           store: str = "states", memory_budget: float | None = None) -> Setup:
    """Check every option and build the model and the initial tokens (cheap: no
    integration); a ValueError names the option."""
    from attnflow import Attention
    from attnflow.analysis._input import radius
    from attnflow.analysis.clusters import default_cluster_tol
    from attnflow.simulate import check_seed
    from attnflow.sphere import uniform
    from attnflow.store import check_store

    output_path("--out", out, sorted(FORMATS))
    with renamed(**SOLVER_OPTIONS, seed="--seed", mask="--mask", Q="--Q", K="--K", V="--V",
                 noise="--noise", alpha="--alpha", bias="--bias", d="--d",
                 **{"shape, d": "--n, --batch, --d"}, **{k: flag(k) for k in option_names()}):
        check_solver_args(method, t_end, save_at, dt, rtol, atol)
        seed = check_seed(seed)
        check_store(store)
        if memory_budget is not None and not memory_budget > 0:
            raise fail("memory_budget", "a number of GB > 0", repr(memory_budget / 1e9))
        tol = radius("cluster_tol", cluster_tol) if cluster_tol is not None else \
            default_cluster_tol(inverse_temperature("beta", beta))
        family = family or {}
        if layers is not None and layers.suffix in MODEL_FILES:
            model = _saved_model(layers)
            d = d if model.d is None else model.d
            if cluster_tol is None:  # the saved model's first beta, not the CLI default
                tol = default_cluster_tol(model.layers[0].beta)
            segments(model, t_end)  # t_end <= the number of layers
        elif layers is not None:
            model = layers_from_npz(layers, "--layers", beta=beta, mask=mask_from_text(mask),
                                    backend=backend, **family)
            d = d if model.d is None else model.d
            segments(model, t_end)  # t_end <= the number of layers
        else:
            matrices = {name: matrix_from_spec(spec, d, name, seed)
                        for name, spec in (("Q", Q), ("K", K), ("V", V))}
            model = Attention(**matrices, beta=beta, mask=mask_from_text(mask),
                              backend=backend, **family)
        if noise is not None:
            number("noise", noise, 0.0, expected="sigma >= 0")
            if method not in NOISY:
                raise fail("method", f"one of {', '.join(NOISY)} with --noise", repr(method))
        x0 = uniform((batch, n) if batch > 1 else n, d, seed).astype(dtype)
    return Setup(model=model, x0=x0, t_end=t_end, save_at=save_at, method=method, dt=dt,
                 rtol=rtol, atol=atol, seed=seed, cluster_tol=tol, out=out, noise=noise,
                 store=store, memory_budget=memory_budget)


MODEL_FILES = (".nc", ".zarr")  # --layers given a saved Trajectory: its model


def _saved_model(path: Path) -> Any:
    """The model of a saved Trajectory (any block or Stack: mixed blocks, MLPs, ...)."""
    from attnflow.trajectory import load

    try:
        return load(path).model
    except (OSError, ValueError, KeyError) as err:
        raise fail("--layers", "an .npz of per-layer weights or a saved Trajectory (.nc, "
                   ".zarr) whose model to simulate", f"{str(path)!r} ({err})") from None


def _run(setup: Setup, progress: bool) -> None:
    """Integrate, write the Trajectory and print a summary."""
    from attnflow import simulate as run
    from attnflow.analysis.clusters import cluster_count
    from attnflow.integrate import NonFiniteStateError
    from attnflow.simulate import estimate_run
    from attnflow.sphere import geodesic_distance

    with renamed(**SOLVER_OPTIONS, noise="--noise", brownian_dt="--dt"):
        cost = estimate_run(setup.model, setup.x0, setup.t_end, save_at=setup.save_at,
                            method=setup.method, dt=setup.dt, rtol=setup.rtol,
                            atol=setup.atol, seed=setup.seed, noise=setup.noise,
                            store=setup.store)
    if progress:  # before the run, with the progress report (stderr: stdout is the summary)
        print(f"estimated {cost.describe()}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        # A blow-up ends in NonFiniteStateError (with its time); numpy's overflow warnings
        # on the way there would only bury that one line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with renamed(**SOLVER_OPTIONS, noise="--noise", brownian_dt="--dt"):
                traj = run(setup.model, setup.x0, setup.t_end, save_at=setup.save_at,
                           method=setup.method, dt=setup.dt, rtol=setup.rtol,
                           atol=setup.atol, progress=progress, seed=setup.seed,
                           noise=setup.noise, store=setup.store,
                           memory_budget=setup.memory_budget,
                           cluster_tol=setup.cluster_tol)
    except NonFiniteStateError as err:
        raise fail("--Q/--K/--V/--beta/--dt", "settings under which the tokens stay finite",
                   str(err)) from None
    wall = time.perf_counter() - start
    path = traj.save(setup.out)
    final = traj.directions[-1]  # pre- and peri-LN: the clusters are of the directions
    counts = np.atleast_1d(cluster_count(final, setup.cluster_tol))
    drift = geodesic_distance(final, setup.x0[..., :1, :]).max()
    print(f"estimated         {cost.describe()}")
    print(f"final time        {traj.times[-1]:g}")
    print(f"clusters          {_spread(counts)}  (single linkage, tol {setup.cluster_tol:.3g} "
          "rad)")
    print(f"max dist to x_1(0) {drift:.3e} rad")
    print(f"field evaluations {traj.n_evals}")
    print(f"kernel            {traj.integrator['kernel']}")
    print(f"wall time         {wall:.2f} s")
    print(f"written           {path}")


def _spread(values: np.ndarray) -> str:
    if values.size == 1:
        return str(int(values[0]))
    return (f"median {np.median(values):g} (min {values.min()}, max {values.max()}) "
            f"over {values.size} runs")
