"""`simulate`: integrate a model of the family from initial tokens into a Trajectory."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from attnflow._array import (
    device_of,
    dtype_name,
    is_tensor,
    namespace,
    on_device,
    tensors_of,
    to_numpy,
)
from attnflow._checks import describe, fail, number, positive
from attnflow._progress import progress_bar
from attnflow.brownian import BrownianPath
from attnflow.events import Switching, integrate_events
from attnflow.family import Block, Model, Stack, segments
from attnflow.implicit import IMPLICIT
from attnflow.integrate import (
    DEFAULT_DT,
    EVENTS,
    NOISY,
    Drift,
    Noise,
    check_solver_args,
    check_tensor_method,
    integrate,
)
from attnflow.kernels import hardmax
from attnflow.kernels.fused import tile_runs
from attnflow.manifolds import SPHERE
from attnflow.savetimes import is_generated
from attnflow.sphere import inner
from attnflow.trajectory import Trajectory

__all__ = ["check_seed", "simulate"]


def simulate(
    model: Model,
    x0: Any,
    t_end: float,
    save_at: Any = None,
    method: str = "rk4",
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    progress: bool | Callable[[float], None] = False,
    normalize: bool = False,
    seed: int | None = None,
    noise: float | None = None,
    brownian_dt: float | None = None,
    device: Any = None,
    checkpoint: int | None = None,
) -> Trajectory:
    """Integrate the dynamics of `model` from tokens x0 up to time t_end.

    Parameters
    ----------
    model : a block (an `Attention` or a `Block`, acting at every time: tied weights) or a
        `Stack` of blocks (layer L on [L, L + 1), so t_end <= the number of layers).
    x0 : (..., n, d) initial tokens; leading axes are independent runs. On the sphere for the
        post-LN and nGPT schemes; any non-zero vectors for pre- and peri-LN (state in R^d);
        any vectors for the flat scheme (which reads x itself; never normalised unless
        `normalize`).
    t_end : final time >= 0 (one unit of time = one layer).
    save_at : increasing save times in [0, t_end], or "log" (0 and 100 log-spaced times from
        0.01, `attnflow.log_times`), "log:NUM", "linspace:START:STOP:NUM". Default: 101
        evenly spaced times from 0 to t_end, with log-spaced ones inside the first interval
        when it is longer than 0.1, so a long run's early dynamics are resolved
        (`attnflow.savetimes.default_times`; t_end = 150: 123 times). With noise, generated
        times move to the nearest times on the step grid. t_end is always saved.
    method : "rk4" (default), "euler", "geodesic", "dopri5", or the implicit "bdf", "radau",
        "lsoda" for long horizons (see `attnflow.integrate`; these solve run by run with
        the model's exact Jacobian where it has one, finite differences otherwise), or
        "events" for hardmax models (beta = +-inf, one head): RK4 steps of dt with every
        leader change located and recorded (`attnflow.events`; the events are in
        `Trajectory.integrator["events"]` as [t, run, token, old leaders, new leaders]).
        "euler" steps x <- normalize(x + dt attn(x)): with dt = 1, one post-LN layer; blocks
        in sequential form (an MLP after attention) only step with "euler" (their
        sublayers in turn: with dt = 1, the real network's layers).
    dt : step of the fixed-step methods (default 0.05); initial step for the others.
    rtol, atol : tolerances of the adaptive methods (defaults 1e-6 and 1e-9).
    progress : True for a progress bar on stderr, or a callable receiving the current time.
    normalize : project x0 onto the sphere first (for any scheme); otherwise x0 off the
        sphere by more than `attnflow.manifolds.sphere_tolerance` of its dtype is an error on
        the sphere schemes, and x0 is taken as given in R^d.
    seed : the seed x0 was drawn with, recorded in the Trajectory; with noise also the key of
        the Brownian path (then required). A non-negative int.
    noise : sigma >= 0 for the SDE dX = F dt + sigma P_X dW on the sphere (dX = F dt +
        sigma dW in R^d), by "euler" (Euler-Maruyama, then retraction) or "geodesic" (its
        exponential-map variant), in steps of exactly dt. None (default): deterministic.
    brownian_dt : the coarse step of the Brownian path (default dt); dt must be
        brownian_dt / 2^L, and runs with L = 0, 1, 2, ... then refine one path.
    device : None, or a torch device ("cpu", "cuda", "cuda:1", ...): x0 is moved there as a
        tensor. A tensor x0 (or a model with tensor parameters) runs on its device without
        this: "euler", "rk4", "geodesic", "dopri5" and noise step there, recorded by
        autograd (gradients reach x0 and every tensor parameter); the states are tensors.
    checkpoint : with tensors and fixed steps: recompute chunks of this many steps in the
        backward pass (`attnflow.checkpointing`): memory for long runs.

    Returns a Trajectory with states of shape (len(save times), ..., n, d) (numpy arrays, or
    tensors on the run's device; `Trajectory.save` writes them as numpy).
    Raises ValueError for bad input and `NonFiniteStateError` if a state becomes non-finite.
    """
    if not isinstance(model, (Block, Stack)):
        raise fail("model", "an attnflow.Attention, Block or Stack", type(model).__name__)
    seed = check_seed(seed)
    t_end, times, dt, rtol, atol = check_solver_args(method, t_end, save_at, dt, rtol, atol)
    if method != "euler" and any(layer.form == "sequential" and layer.mlp is not None
                                 for layer in model.layers):
        raise fail("method", "'euler' for blocks in sequential form (their sublayers step in "
                   "turn; form='continuous' integrates the summed field with any method)",
                   repr(method))
    if method in IMPLICIT and any(layer.mlp is not None and not layer.has_exact_jacobian
                                  for layer in model.layers):
        raise fail("method", "an explicit method for blocks with a feed-forward term outside "
                   "post-LN and flat (the implicit methods need the block's exact Jacobian, "
                   "which attnflow has for post-LN and flat blocks only)", repr(method))
    _check_hardmax(model, method, noise)
    if not model.manifold.geodesic and method == "geodesic":
        raise fail("method", "a method for states in R^d (not 'geodesic', which needs the "
                   "sphere: norm 'post' or 'ngpt')", repr(method))
    pieces = segments(model, t_end)
    x0 = on_device(x0, device, tensors_of(model))
    check_tensor_method(x0, method, noise, checkpoint)
    x0 = _initial_tokens(model, x0, normalize)
    sigma = None if noise is None else number("noise", noise, 0.0, expected="sigma >= 0")
    path = level = None
    if sigma is not None:
        if method not in NOISY:
            raise fail("method", f"one of {NOISY} with noise", repr(method))
        if seed is None:
            raise fail("seed", "an int with noise (the key of the Brownian path)", "None")
        dt = 0.05 if dt is None else dt
        level = _refinement_level(dt, brownian_dt)
        times = _on_grid(times, dt, is_generated(save_at), [b for _, b, _ in pieces])
        runs = int(np.prod(x0.shape[:-2], dtype=int))
        path = BrownianPath(seed, runs, x0.shape[-2:], dt * 2**level)
    with progress_bar(progress, t_end, "simulating",
                      "t = {task.completed:.4g}" + f" / {t_end:g}") as report:
        start = time.perf_counter()
        states, work = _integrate_pieces(pieces, x0, times, method, dt, rtol, atol, report,
                                         model.manifold, sigma, path, level, checkpoint)
        wall = time.perf_counter() - start
    integrator = {"method": method, "dt": dt, "rtol": rtol, "atol": atol,
                  "n_steps": work["n_steps"], "n_rejected": work["n_rejected"]}
    if is_tensor(x0):
        integrator.update(device=device_of(x0), dtype=dtype_name(x0))
        if checkpoint is not None:
            integrator["checkpoint"] = int(checkpoint)
    if method in IMPLICIT:
        integrator["n_jacobians"] = work["n_jacobians"]
    if method == EVENTS:
        integrator["events"] = work["events"]
    if sigma is not None:
        integrator["noise"] = sigma
        integrator["brownian_dt"] = dt * 2**level
    return Trajectory(times=times, states=states, model=model, integrator=integrator,
                      seed=seed, n_evals=work["n_evals"], wall_time=wall)


COUNTS = ("n_evals", "n_steps", "n_rejected", "n_jacobians")  # an integrator's work


def _integrate_pieces(pieces, x0, times, method, dt, rtol, atol, report, manifold, sigma,
                      path, level, checkpoint=None) -> tuple[np.ndarray, dict[str, int]]:
    """Integrate layer by layer, each piece with its own field, saving at `times`."""
    x = x0
    saved = [x0] if times[0] == 0 else []
    work: dict[str, Any] = {**dict.fromkeys(COUNTS, 0), "events": []}
    for a, b, layer in pieces:
        inside = times[(times > a) & (times <= b)]
        stops = inside if inside.size and inside[-1] == b else np.append(inside, b)
        if b == a:
            continue
        if method == EVENTS:
            sol, events = integrate_events(_switching(layer), x, np.concatenate([[a], stops]),
                                           DEFAULT_DT if dt is None else dt, report, manifold)
            sol.states = sol.states[1:]
            work["events"].extend([list(e) for e in events])
            saved.extend(sol.states[: len(inside)])
            x = sol.states[-1]
            for key in COUNTS:
                work[key] += getattr(sol, key)
            continue
        # One kernel for the whole piece (chosen for the batch, or for one run where the
        # implicit methods solve run by run).
        kernel = layer.kernel_for(x if method not in IMPLICIT else x[(0,) * (x.ndim - 2)])
        noise = None if sigma is None else Noise(sigma, path, level, round(a / dt))
        drift = Drift(partial(layer.tangent_field, kernel=kernel),
                      euler=partial(layer.drift, kernel=kernel),
                      jacobian=layer.jacobian if layer.has_exact_jacobian else None,
                      splitting=layer.splitting(kernel), runs_independent=True)
        runs = int(np.prod(x.shape[:-2], dtype=int))
        sol = integrate(drift, x, stops, method, dt, rtol, atol, report, manifold=manifold,
                        noise=noise, t0=a, checkpoint=checkpoint,
                        grain=1 if is_tensor(x) else tile_runs(x.dtype, runs))
        saved.extend(sol.states[: len(inside)])
        x = sol.states[-1]
        for key in COUNTS:
            work[key] += getattr(sol, key)
    return namespace(x0).stack(saved), work


def _check_hardmax(model: Model, method: str, noise: Any) -> None:
    """The methods that apply to hardmax layers (beta = +-inf) and the models "events"
    integrates (every layer hardmax with one head, continuous form, no noise)."""
    explicit = "'events' (leader changes located) or an explicit method ('euler', 'rk4', " \
               "'geodesic', 'dopri5')"
    hard = [layer.attention.is_hardmax for layer in model.layers]
    if any(hard) and method in IMPLICIT:
        raise fail("method", f"{explicit} for hardmax attention (beta = +-inf: the field "
                   "jumps where a token's leaders change, and has no Jacobian)", repr(method))
    if method != EVENTS:
        return
    if not all(hard):
        raise fail("method", "another method than 'events' for attention at a finite beta "
                   "('events' locates the leader changes of hardmax, beta = +-inf)",
                   f"beta = {[layer.beta for layer in model.layers][hard.index(False)]}")
    for layer in model.layers:
        if len(layer.heads) != 1 or (layer.form == "sequential" and layer.mlp is not None):
            raise fail("model", "one head per layer in continuous form for method 'events' "
                       "(each head would have leaders of its own)",
                       f"{len(layer.heads)} heads, form {layer.form!r}")
    if noise is not None:
        raise fail("noise", "None with method 'events' (leader changes of a deterministic "
                   "flow)", repr(noise))


def _switching(layer: Block) -> Switching:
    """The hardmax layer as the events method sees it: scores, tie rule, frozen field."""

    def field(X: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return layer.tangent_field(X, kernel=hardmax.Frozen(weights))

    return Switching(scores=layer.hardmax_scores, leaders=hardmax.leaders, field=field)


def _initial_tokens(model: Model, x0: Any, normalize: bool) -> np.ndarray:
    """x0 checked for the model: unit vectors on the sphere (or normalised), non-zero in R^d
    where a sublayer reads directions (any vectors for the flat scheme)."""
    x0 = model.check_tokens(x0, "x0")
    norms = namespace(x0).sqrt(inner(x0, x0))
    host = to_numpy(norms)[..., 0]  # (a tensor's norms are read once, for the checks)
    if model.manifold != SPHERE or normalize:
        directions = normalize or any(
            s is not None and s.unit_inputs
            for layer in model.layers for s in (layer.scheme, layer.mlp_scheme))
        if directions and np.any(host == 0):
            where = np.argwhere(host == 0)[0]
            raise fail("x0", "non-zero token vectors (their directions are what attention "
                       "reads)", f"a zero vector at index {tuple(int(i) for i in where)}")
        return x0 / norms if normalize else x0
    tol = model.manifold.tolerance(x0.dtype)
    off = float(np.max(np.abs(host - 1.0)))
    if off > tol:
        raise fail("x0", f"unit vectors (|norm - 1| <= {tol:.2g} in {x0.dtype}; or pass "
                   "normalize=True)", f"norms off 1 by up to {off:.3g}")
    return x0


def check_seed(seed: Any) -> int | None:
    """A seed: None or a non-negative int (numpy integers accepted, returned as int)."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise fail("seed", "a non-negative int or None", repr(seed))
    return int(seed)


def _refinement_level(dt: float, brownian_dt: Any) -> int:
    """L with dt = brownian_dt / 2^L (0 without brownian_dt)."""
    if brownian_dt is None:
        return 0
    coarse = positive("brownian_dt", brownian_dt)
    ratio = coarse / dt
    level = round(np.log2(ratio)) if ratio >= 1 else -1
    if level < 0 or abs(ratio - 2.0**level) > 1e-9 * ratio:
        raise fail("brownian_dt", f"dt times a power of 2 (dt = {dt:g})", repr(brownian_dt))
    return level


def _on_grid(times: np.ndarray, dt: float, default: bool, bounds: list[float]) -> np.ndarray:
    """Save times on the noise grid k dt: the default times snapped to it; given times (and
    t_end, and layer boundaries) must lie on it."""
    steps = times / dt
    if default:
        return np.unique(np.round(steps)) * dt if times[-1] > 0 else times
    for t in np.concatenate([times, bounds]):
        if abs(t / dt - round(t / dt)) > 1e-9 * max(1.0, t / dt):
            raise fail("save_at", f"times on the step grid k dt (dt = {dt:g}) with noise",
                       describe(t))
    return np.round(steps) * dt
