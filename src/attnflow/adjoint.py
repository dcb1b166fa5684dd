"""Reverse mode through fixed steps on torch tensors by the discrete adjoint of the steps taken:
memory flat in the number of steps (`simulate(..., gradients="adjoint")`).

Backpropagation through a run (`gradients="backprop"`, the default) records every step: a run
of S steps holds S steps' intermediate tensors (each field evaluation's queries, keys, scores,
the stages, the retraction) until `backward`. The adjoint here records none of them. The
forward pass runs the steps with no graph and keeps only the state at the start of each step;
the backward pass walks the steps in reverse, re-running one step at a time under
`torch.enable_grad` from its kept starting state and pulling the incoming cotangent back
through it with `torch.autograd.grad`:

    lambda_{s} = (d x_{s+1} / d x_s)^T lambda_{s+1},
    dL/dtheta += (d x_{s+1} / d theta)^T lambda_{s+1}.

These are the exact gradients of the discrete map actually run (the Runge-Kutta stages and the
retraction onto the sphere included), not those of the continuous ODE that a continuous
adjoint (torchdiffeq's ``odeint_adjoint``) integrates backwards: the re-run step repeats the
forward arithmetic on the same inputs, so the gradients equal backpropagation through the same
steps up to the order in which the per-step parameter gradients are summed (float64: 1e-13
relative in tests/test_adjoint.py). Memory: one state per step plus one step's graph at a
time; time: one more evaluation of each step than backpropagation (the forward pass without
a graph, then each step again with one). With ``checkpoint=c`` only every c-th step's
starting state is kept, the others recomputed stretch by stretch in the backward pass (one
more pass without a graph).

The parameters are the tensors the step reads that require grad (`attnflow._array.tensors_of`
of the model: heads, beta, strength, slopes, norms, MLP weights, memory tokens): they enter
the `torch.autograd.Function` as inputs, so their gradients (and those of tensors they were
computed from) accumulate as with backpropagation. Reverse mode only: forward-mode AD
(`torch.func.jvp`, dual numbers) goes through `gradients="backprop"`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

__all__ = ["Runner", "adjoint_runner", "run_steps"]

# m steps x <- step(x, h) from time t0, with progress(t) after each: the tensor loop of
# `attnflow.integrate` (its `runner=`), given (step, x, t0, h, m, progress).
Runner = Callable[..., Any]


def adjoint_runner(params: Sequence[Any], every: int | None = None) -> Runner:
    """The tensor loop that differentiates by the discrete adjoint, with gradients for the
    tensors `params` (those not requiring grad are skipped); with `every`, keeping only
    every `every`-th step's starting state (`run_steps`)."""
    return partial(run_steps, params=tuple(params), every=every)


def run_steps(step: Callable[[Any, float], Any], x: Any, t0: float, h: float, m: int,
              progress: Callable[[float], None] | None, params: tuple[Any, ...] = (),
              every: int | None = None) -> Any:
    """m steps x <- step(x, h) from time t0 (progress gets the time after each), recorded for
    reverse mode as one node whose backward pass is the discrete adjoint of the m steps
    (module docstring). With `every` = c, only the starting states of steps 0, c, 2c, ...
    are kept and the backward pass recomputes the others of each stretch of c steps (no
    graph) before walking it in reverse: m / c + c states held for one more pass of compute.
    Without anything to differentiate (no grad mode, or neither x nor a parameter requiring
    grad) the steps run as they are."""
    import torch

    wanted = tuple(p for p in params if p.requires_grad)
    if m == 0 or not torch.is_grad_enabled() or not (x.requires_grad or wanted):
        for i in range(m):
            x = step(x, h)
            if progress is not None:
                progress(t0 + (i + 1) * h)
        return x
    return _adjoint_function().apply(step, h, m, every or 1, t0, progress, x, *wanted)


_FUNCTION: Any = None


def _adjoint_function() -> Any:
    """The `torch.autograd.Function` of m steps (defined on first use: torch is optional)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    class Steps(torch.autograd.Function):
        """m fixed steps: forward without a graph keeping each step's starting state;
        backward one step's graph at a time, in reverse."""

        @staticmethod
        def forward(ctx: Any, step: Callable, h: float, m: int, every: int, t0: float,
                    progress: Callable | None, x: Any, *params: Any) -> Any:
            starts = []  # the starting states of steps 0, every, 2 every, ...
            for i in range(m):
                if i % every == 0:
                    starts.append(x)
                x = step(x, h)
                if progress is not None:
                    progress(t0 + (i + 1) * h)
            ctx.step, ctx.h, ctx.m, ctx.every, ctx.params = step, h, m, every, params
            ctx.save_for_backward(*starts)
            return x

        @staticmethod
        def backward(ctx: Any, cotangent: Any) -> tuple[Any, ...]:
            params = ctx.params
            totals: list[Any] = [None] * len(params)
            kept = ctx.saved_tensors
            for j in reversed(range(len(kept))):
                stretch = [kept[j]]  # the stretch's starting states, recomputed without graph
                for _ in range(min(ctx.every, ctx.m - j * ctx.every) - 1):
                    stretch.append(ctx.step(stretch[-1], ctx.h))
                for start in reversed(stretch):
                    with torch.enable_grad():
                        x = start.detach().requires_grad_(True)
                        y = ctx.step(x, ctx.h)
                    grads = torch.autograd.grad(y, (x, *params), cotangent, allow_unused=True)
                    cotangent = grads[0]
                    totals = [t if g is None else g if t is None else t + g
                              for t, g in zip(totals, grads[1:])]
            return (None, None, None, None, None, None, cotangent, *totals)

    _FUNCTION = Steps
    return Steps
