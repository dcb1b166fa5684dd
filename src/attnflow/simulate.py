"""`simulate`: integrate a model of the family from initial tokens into a Trajectory."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from attnflow._array import (
    device_of,
    dtype_name,
    is_tensor,
    namespace,
    on_device,
    scalar,
    tensors_of,
    to_numpy,
)
from attnflow._checks import describe, fail, integer, number, positive
from attnflow._progress import progress_bar
from attnflow.adjoint import adjoint_runner
from attnflow.brownian import BrownianPath
from attnflow.budget import (
    CHUNK_BYTES,
    EVALS,
    Cost,
    check_budget,
    check_graph_budget,
    graph_cost,
    run_cost,
)
from attnflow.events import Switching, integrate_events
from attnflow.family import Block, Model, Stack, segments
from attnflow.implicit import IMPLICIT
from attnflow.integrate import Drift, Noise, integrate
from attnflow.kernels import hardmax, harmonic, kernel_name
from attnflow.kernels.auto import harmonic_or_blocked
from attnflow.kernels.fused import tile_runs
from attnflow.manifolds import SPHERE
from attnflow.methods import (
    DEFAULT_DT,
    EVENTS,
    FIXED_STEP,
    NOISY,
    check_gradients,
    check_solver_args,
    check_tensor_method,
)
from attnflow.savetimes import is_generated, on_step_grid
from attnflow.sphere import inner
from attnflow.store import Keep, check_store, summaries
from attnflow.torchthreads import field_work, run_threads
from attnflow.trajectory import Trajectory

__all__ = ["check_seed", "estimate_run", "simulate"]


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
    store: str = "states",
    memory_budget: float | None = None,
    cluster_tol: float | None = None,
    device: Any = None,
    checkpoint: int | None = None,
    gradients: str = "backprop",
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
        (`attnflow.savetimes.default_times`; t_end = 150: 123 times). With a fixed-step
        method the default times move to the nearest times k dt of the step grid
        (`attnflow.savetimes.on_step_grid`), so that saving never shortens a step (t_end = 2,
        dt = 0.05: 41 times); given times are kept, and the steps shortened to meet them
        are recorded (`integrator["dt_min"]`). With noise, generated times move to the
        nearest times on the step grid. t_end is always saved.
    method : "rk4" (default), "euler", "geodesic", "dopri5", or the implicit "bdf", "radau",
        "lsoda" for long horizons (see `attnflow.integrate`; these solve run by run with
        the model's exact Jacobian where it has one, finite differences otherwise), or
        "events" for hardmax models (beta = +-inf, one head; with Q = K = I every token is
        its own leader and stays still, which is warned of): RK4 steps of dt with every
        leader change located and recorded (`attnflow.events`; the events are in
        `Trajectory.integrator["events"]` as [t, run, token, old leaders, new leaders]).
        "euler" steps x <- normalize(x + dt attn(x)): with dt = 1, one post-LN layer; blocks
        in sequential form (an MLP after attention) only step with "euler" (their
        sublayers in turn: with dt = 1, the real network's layers).
    dt : step of the fixed-step methods (default 0.05); initial step for the others.
    rtol, atol : tolerances of the adaptive methods (defaults 1e-6 and 1e-9).
    progress : True for a progress report on stderr (a bar on a terminal, else a plain line
        every 10 s with the time reached, the rate and the time left; `attnflow._progress`),
        or a callable receiving the current time.
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
    store : what is kept at each save time (`attnflow.store`): "states" (default), "float32"
        (the states rounded to float32: half the memory and file of float64), or
        "summaries" (the mean direction, cluster counts at `cluster_tol` and log E_beta per
        save time, `Trajectory.summaries`; states at the first and last save times only).
    memory_budget : bytes the run may take at its peak, estimated before it starts
        (`attnflow.budget`: kept states plus a step's working memory, the field's measured on
        a few tokens); over it the run is refused in one line naming the cheaper choices.
        Default None: 80% of the memory available when the run starts. The estimate is in
        `integrator["estimate"]` (use `estimate_run` to see it without running).
    cluster_tol : geodesic tolerance of the summaries' cluster counts (default
        `attnflow.analysis.clusters.default_cluster_tol` of the first layer's beta).
    device : None, or a torch device ("cpu", "cuda", "cuda:1", ...): x0 is moved there as a
        tensor. A tensor x0 (or a model with tensor parameters) runs on its device without
        this: "euler", "rk4", "geodesic", "dopri5" and noise step there, recorded by
        autograd (gradients reach x0 and every tensor parameter); the states are tensors
        (store "states" only; the budget is the device's, `attnflow.budget`, and covers
        the autograd graph of backpropagation through fixed steps without checkpoint,
        `attnflow.budget.graph_cost`). Devices without storage ("meta") and devices this
        torch cannot reach are refused. On CPU tensors the run chooses torch's thread count
        from the problem size (`attnflow.torchthreads`: one thread below 1e9 multiply-adds
        per field evaluation), restoring the caller's setting after it.
    checkpoint : with tensors and fixed steps: recompute chunks of this many steps in the
        backward pass (`attnflow.checkpointing`): memory for long runs.
    gradients : how reverse mode differentiates a tensor run: "backprop" (default; torch's
        graph of every step, forward mode too) or "adjoint" (the discrete adjoint of the
        fixed steps taken, `attnflow.adjoint`: "euler", "rk4", "geodesic" without noise; the
        same gradients as "backprop" to round-off, with one state per step held instead of
        every step's graph, for one more evaluation of each step; with checkpoint=c one
        state per c steps, the others recomputed in the backward pass).

    Returns a Trajectory with states of shape (len(save times), ..., n, d) (numpy arrays, or
    tensors on the run's device; `Trajectory.save` writes them as numpy; with
    store="summaries", the first and last save times).
    Raises ValueError for bad input and `NonFiniteStateError` if a state becomes non-finite.
    """
    plan = _plan(model, x0, t_end, save_at, method, dt, rtol, atol, normalize, seed, noise,
                 brownian_dt, store, device, checkpoint, gradients, budget=(memory_budget,))
    x0, times, dt, pieces, cost = plan.x0, plan.times, plan.dt, plan.pieces, plan.cost
    tensor = is_tensor(x0)
    if tensor and plan.runner is None and checkpoint is None and method in EVALS:
        _check_graph(model, plan, memory_budget)
    keep = Keep(plan.store, len(times), x0, summarize=partial(
        summaries, model, _cluster_tol(model, cluster_tol)) if plan.store == "summaries"
        else None)
    threads = run_threads(field_work(model, x0)) if tensor and x0.device.type == "cpu" \
        else nullcontext()
    with threads, progress_bar(progress, plan.t_end, "simulating",
                               "t = {task.completed:.4g}" + f" / {plan.t_end:g}") as report:
        start = time.perf_counter()
        work = _integrate_pieces(pieces, x0, times, method, dt, plan.rtol, plan.atol, report,
                                 model.manifold, plan.sigma, plan.path, plan.level, keep,
                                 checkpoint, plan.runner)
        wall = time.perf_counter() - start
    if not tensor:  # hardmax (the only case it warns of) never runs on tensors
        _warn_if_still(model, x0, work["final"], plan.t_end)
    integrator = {"method": method, "dt": dt, "rtol": plan.rtol, "atol": plan.atol,
                  "n_steps": work["n_steps"], "n_rejected": work["n_rejected"],
                  "kernel": ", ".join(dict.fromkeys(work["kernels"])), "store": plan.store,
                  "estimate": {"memory": cost.memory, "file": cost.file}}
    if tensor:
        integrator.update(device=device_of(x0), dtype=dtype_name(x0))
        if checkpoint is not None:
            integrator["checkpoint"] = int(checkpoint)
        if plan.runner is not None:
            integrator["gradients"] = "adjoint"
    if method in FIXED_STEP:
        integrator["dt_min"] = work["dt_min"]
    if method in IMPLICIT:
        integrator["n_jacobians"] = work["n_jacobians"]
    if method == EVENTS:
        integrator["events"] = work["events"]
    if plan.sigma is not None:
        integrator["noise"] = plan.sigma
        integrator["brownian_dt"] = dt * 2**plan.level
    kept = None
    if plan.store == "summaries":
        integrator["summaries"] = sorted(keep.summaries)
        kept = {"time": times, **keep.summaries}
    return Trajectory(times=keep.kept_times(times), states=keep.states, model=model,
                      integrator=integrator, seed=plan.seed, n_evals=work["n_evals"],
                      wall_time=wall, summaries=kept)


def _check_graph(model: Model, plan: _Plan, memory_budget: Any) -> None:
    """Refuse backpropagation whose graph would exceed the memory budget (`budget.
    check_graph_budget`: the first layer's field evaluation measured on x0, times the
    evaluations of every step), where anything is differentiated: grad mode on, and x0 or a
    tensor of the model requiring grad. Not under torch.func's transforms, whose wrapped
    tensors have no storage to measure."""
    import torch

    params = tensors_of(model)
    x0 = plan.x0
    if torch._C._functorch.is_functorch_wrapped_tensor(x0) or any(
            torch._C._functorch.is_functorch_wrapped_tensor(p) for p in params):
        return
    if not torch.is_grad_enabled() or not (x0.requires_grad or any(
            p.requires_grad for p in params)) or not plan.pieces:
        return
    layer = plan.pieces[0][2]
    splitting = layer.splitting(plan.kernel)
    evals = EVALS[plan.method] if splitting is None else len(splitting)
    spans = np.diff(np.concatenate([[0.0], plan.times]))
    steps = int(sum(np.ceil(spans[spans > 0] / plan.dt * (1 - 1e-12))))
    per_eval = graph_cost(partial(layer.tangent_field, kernel=plan.kernel), x0, params)
    check_graph_budget(per_eval, evals, steps, len(plan.times) * x0.nbytes,
                       x0.nbytes, memory_budget, x0.device)


def estimate_run(model: Model, x0: Any, t_end: float, save_at: Any = None,
                 method: str = "rk4", dt: float | None = None, rtol: float | None = None,
                 atol: float | None = None, normalize: bool = False, seed: int | None = None,
                 noise: float | None = None, brownian_dt: float | None = None,
                 store: str = "states") -> Cost:
    """The estimated peak memory and file size of `simulate` with these arguments
    (`attnflow.budget.Cost`, in bytes), without running it (one field evaluation on a few
    tokens, measured)."""
    return _plan(model, x0, t_end, save_at, method, dt, rtol, atol, normalize, seed, noise,
                 brownian_dt, store).cost


@dataclass
class _Plan:
    """A checked run: what `simulate` integrates, and how."""

    x0: np.ndarray
    t_end: float
    times: np.ndarray
    dt: float | None
    rtol: float | None
    atol: float | None
    seed: int | None
    pieces: list
    store: str
    kernel: Any  # the first layer's kernel, for the estimate
    cost: Cost  # the estimate (attnflow.budget)
    sigma: float | None = None
    path: BrownianPath | None = None
    level: int | None = None
    runner: Any = None  # the tensor loop of gradients="adjoint" (`attnflow.adjoint`)
    method: str = "rk4"


def _cluster_tol(model: Model, cluster_tol: Any) -> float:
    from attnflow.analysis._input import radius
    from attnflow.analysis.clusters import default_cluster_tol

    if cluster_tol is not None:
        return radius("cluster_tol", cluster_tol)
    beta = model.layers[0].beta
    return default_cluster_tol(beta) if np.isfinite(beta) else 1e-2


def _plan(model, x0, t_end, save_at, method, dt, rtol, atol, normalize, seed, noise,
          brownian_dt, store, device=None, checkpoint=None, gradients="backprop",
          budget=None) -> _Plan:
    """Check simulate's arguments and work out its save times, step and cost; `budget`, a
    1-tuple (memory_budget,), checks the cost against it (tensors before their values are
    checked: their estimate is a formula of the shape, and an expanded tensor's checks are
    as long as the run's first step)."""
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
    runner = None
    if check_gradients(gradients, x0, method, noise) == "adjoint":
        runner = adjoint_runner(tensors_of(model), checkpoint)
    store = check_store(store)
    if is_tensor(x0) and store != "states":
        raise fail("store", "'states' for torch tensors (the states stay tensors in the "
                   "autograd graph; 'float32' and 'summaries' keep numpy arrays)", repr(store))
    early = is_tensor(x0) and x0.ndim >= 2  # its budget checked before its values
    if not early:
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
    elif method in FIXED_STEP:
        dt = DEFAULT_DT if dt is None else dt
        if save_at is None or (isinstance(save_at, str) and save_at == "default"):
            times = on_step_grid(times, dt)
    if early:
        if budget is not None:
            _check_cost(run_cost(model, x0, times, method, store, None), budget[0], x0)
        x0 = _initial_tokens(model, x0, normalize)
    layer = pieces[0][2] if pieces else model.layers[0]
    kernel = layer.kernel_for(x0 if method not in IMPLICIT else x0[(0,) * (x0.ndim - 2)])
    cost = run_cost(model, x0, times, method, store, kernel)
    if budget is not None and not early:
        _check_cost(cost, budget[0], x0)
    return _Plan(x0, t_end, times, dt, rtol, atol, seed, pieces, store, kernel, cost, sigma,
                 path, level, runner, method)


def _check_cost(cost: Cost, memory_budget: Any, x0: Any) -> None:
    """`budget.check_budget` for a run from x0 (on its device's memory for a tensor)."""
    check_budget(cost, memory_budget, int(np.prod(x0.shape[:-2], dtype=int)), *x0.shape[-2:],
                 x0.dtype, device_of(x0) if is_tensor(x0) else None)


COUNTS = ("n_evals", "n_steps", "n_rejected", "n_jacobians")  # an integrator's work


def _integrate_pieces(pieces, x0, times, method, dt, rtol, atol, report, manifold, sigma,
                      path, level, keep: Keep, checkpoint=None, runner=None
                      ) -> dict[str, Any]:
    """Integrate layer by layer, each piece with its own field, handing the state at each
    of `times` to `keep`. Fixed-step methods step through a few save times per call
    (`chunk_times`; the same steps as in one call), so that no more than the kept states
    and one chunk are ever held."""
    x = x0
    if times[0] == 0:
        keep.add(x0)
    work: dict[str, Any] = {**dict.fromkeys(COUNTS, 0), "events": [], "kernels": [],
                            "dt_min": None}
    for a, b, layer in pieces:
        inside = times[(times > a) & (times <= b)]
        stops = inside if inside.size and inside[-1] == b else np.append(inside, b)
        if b == a:
            continue
        if method == EVENTS:
            sol, events = integrate_events(_switching(layer), x, np.concatenate([[a], stops]),
                                           DEFAULT_DT if dt is None else dt, report, manifold)
            work["events"].extend([list(e) for e in events])
            work["kernels"].append("hardmax (leader changes located)")
            _add_work(work, sol, keep, sol.states[1:], len(inside))
            x = sol.states[-1]
            continue
        # One kernel for the whole piece (chosen for the batch, or for one run where the
        # implicit methods solve run by run).
        kernel = layer.kernel_for(x if method not in IMPLICIT else x[(0,) * (x.ndim - 2)])
        work["kernels"].append(kernel_label(layer, kernel, x.shape[-1]))
        drift = Drift(partial(layer.tangent_field, kernel=kernel),
                      euler=partial(layer.drift, kernel=kernel),
                      jacobian=layer.jacobian if layer.has_exact_jacobian else None,
                      splitting=layer.splitting(kernel), runs_independent=True)
        runs = int(np.prod(x.shape[:-2], dtype=int))
        solve = partial(integrate, drift, method=method, dt=dt, rtol=rtol, atol=atol,
                        progress=report, manifold=manifold, checkpoint=checkpoint,
                        runner=runner,
                        grain=1 if is_tensor(x) else tile_runs(x.dtype, runs))
        if method not in FIXED_STEP:
            sol = solve(x, stops, t0=a)
            _add_work(work, sol, keep, sol.states, len(inside))
            x = sol.states[-1]
            continue
        start, chunk = a, chunk_times(x)
        for i in range(0, len(stops), chunk):
            noise = None if sigma is None else Noise(sigma, path, level, round(start / dt))
            sol = solve(x, stops[i:i + chunk], t0=start, noise=noise)
            x, start = sol.states[-1], stops[i:i + chunk][-1]
            _add_work(work, sol, keep, sol.states, max(0, min(chunk, len(inside) - i)))
    work["final"] = x
    return work


def chunk_times(x: np.ndarray) -> int:
    """Save times a fixed-step method steps through per call: as many states as fit in
    `budget.CHUNK_BYTES` (at least one). Fewer calls keep an ensemble's pieces stepping
    without a barrier at every save time (`attnflow.ensembles`)."""
    return max(1, CHUNK_BYTES // max(1, x.nbytes))


def _add_work(work: dict[str, Any], sol: Any, keep: Keep, states: np.ndarray,
              saved: int) -> None:
    """Count a solution's work and keep its first `saved` states."""
    for state in states[:saved]:
        keep.add(state)
    for key in COUNTS:
        work[key] += getattr(sol, key)
    _note_step(work, sol)


def _note_step(work: dict[str, Any], sol: Any) -> None:
    """Keep the smallest step a fixed-step solution took (`Solution.h_min`)."""
    h = getattr(sol, "h_min", None)
    if h is not None:
        work["dt_min"] = h if work["dt_min"] is None else min(work["dt_min"], h)


def kernel_label(layer: Block, kernel: Any, d: int) -> str:
    """The kernel a layer's attention ran with, as the record names it: the backend's name
    ("dense", "blocked", "fused", "torch"), "harmonic (tol T, order K)" with the order at the
    layer's score scale beta |Q| |K| (auto's harmonic choice adds that calls whose queries or
    keys have no common norm fall back to blocked), "hardmax" at beta = +-inf."""
    name = kernel_name(kernel)
    if not name.startswith("harmonic"):
        return "hardmax" if layer.attention.is_hardmax and name == "dense" else name
    tol = getattr(kernel, "tol", harmonic.DEFAULT_TOL)
    orders = []
    for Q, K, *_ in layer.heads:
        scale = 1.0
        for M in (Q, K):
            scale *= 1.0 if M is None else float(np.linalg.norm(M, 2))
        e = layer.attention.head_size(Q, K, d)
        if e in (2, 3):
            orders.append(harmonic.order(float(layer.beta) * scale, e, tol))
    text = f"harmonic (tol {tol:g}" + (f", order {max(orders)})" if orders else ")")
    return text + (", blocked where refused" if kernel is harmonic_or_blocked else "")


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


def _warn_if_still(model: Model, x0: np.ndarray, final: np.ndarray, t_end: float) -> None:
    """A one-line warning when hardmax attention left every token exactly where it was, with
    the reason when Q^T K is a positive multiple of the identity for every head (Q = K = I
    among them): then each token is its own leader, since <x_i, x_i> = |x_i|^2 >= <x_i, x_j>
    for tokens of one norm (Cauchy-Schwarz), so the attention output is V x_i itself and the
    field (its tangent part, for V = I) vanishes."""
    if t_end <= 0 or not any(layer.attention.is_hardmax for layer in model.layers):
        return
    eps = np.finfo(np.result_type(final.dtype, np.float32)).eps
    if np.max(np.abs(final - x0), initial=0.0) > 1e3 * eps:  # it moved (beyond round-off)
        return
    own = all(Q is not None and K is not None and _positive_identity(Q.T @ K)
              or Q is None and K is None
              for layer in model.layers if layer.attention.is_hardmax
              for Q, K, *_ in layer.heads)
    reason = (" (each token is its own leader: with Q^T K a positive multiple of the "
              "identity, <x_i, x_i> >= <x_i, x_j> on the sphere, so hardmax attention returns "
              "each token's own value; take Q != K or a finite beta)") if own else ""
    warnings.warn(f"hardmax attention left every token still up to t = {t_end:g}{reason}",
                  stacklevel=3)


def _positive_identity(M: np.ndarray) -> bool:
    """Whether M is c I with c > 0 (to round-off)."""
    c = float(np.trace(M)) / M.shape[0]
    return M.shape[0] == M.shape[1] and c > 0 and np.allclose(M, c * np.eye(M.shape[0]),
                                                               atol=1e-12 * c)


def _switching(layer: Block) -> Switching:
    """The hardmax layer as the events method sees it: scores, tie rule, frozen field."""

    def field(X: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return layer.tangent_field(X, kernel=hardmax.Frozen(weights))

    return Switching(scores=layer.hardmax_scores, leaders=hardmax.leaders, field=field)


def _initial_tokens(model: Model, x0: Any, normalize: bool) -> np.ndarray:
    """x0 checked for the model: unit vectors on the sphere (or normalised), non-zero in R^d
    where a sublayer reads directions (any vectors for the flat scheme)."""
    x0 = model.check_tokens(x0, "x0")
    xp = namespace(x0)
    norms = xp.sqrt(inner(x0, x0))
    # the checks reduce on x0's own device to Python scalars: no host copy of the tokens, and
    # torch.func transforms (jvp, grad), whose wrapped tensors have no storage, pass through
    if model.manifold != SPHERE or normalize:
        directions = normalize or any(
            s is not None and s.unit_inputs
            for layer in model.layers for s in (layer.scheme, layer.mlp_scheme))
        if directions and bool(scalar(xp.any(norms == 0))):
            where = np.argwhere(to_numpy(norms)[..., 0] == 0)[0]
            raise fail("x0", "non-zero token vectors (their directions are what attention "
                       "reads)", f"a zero vector at index {tuple(int(i) for i in where)}")
        return x0 / norms if normalize else x0
    tol = model.manifold.tolerance(x0.dtype)
    off = scalar(xp.max(xp.abs(norms - 1.0)))
    if off > tol:
        raise fail("x0", f"unit vectors (|norm - 1| <= {tol:.2g} in {x0.dtype}; or pass "
                   "normalize=True)", f"norms off 1 by up to {off:.3g}")
    return x0


def check_seed(seed: Any) -> int | None:
    """A seed: None or a non-negative int (numpy integers accepted, returned as int)."""
    if seed is None:
        return None
    return integer("seed", seed, 0, expected="a non-negative int or None")


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
