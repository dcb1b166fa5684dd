"""The influence of each initial token on one target token: d x_target(t) / d x_j(0) for
every token j, from one forward run of `attnflow.simulate` on torch tensors and one backward
pass (docs/science.md §11.7; the closed forms of its linearisation are in
`attnflow.analysis.influence`).

On the circle (d = 2, a sphere scheme) the influence is the scalar
d theta_target(t) / d theta_j(0): the covector of theta = atan2(x) at x_target(t), the vector
(-x_2, x_1) / |x|^2, pulled back by reverse mode and read on the tangent (-x_2, x_1) of each
x_j(0). On S^{d-1} (d >= 3) it is the whole (d, d) block B_j = d x_target(t) / d x_j(0),
whose size is measured in the tangent spaces: the operator norm (largest singular value) of
P_target B_j P_j, P_x = I - x x^T the tangent projection at x_target(t) and at x_j(0): the
largest stretch of a tangent perturbation of x_j(0) seen in the target's tangent space (a
radial perturbation of x_j(0) is not a perturbation of a token on the sphere). On the
circle this is |d theta_target / d theta_j|. In R^d (pre-, peri-LN and flat schemes, whose
states are not on a sphere) the blocks are measured whole (no projection).

Reverse mode pulls back one covector of x_target(t) per backward pass, through the graph of
the one forward run: on the circle one pass per save time (one in all at t_end alone), off
it d per save time (the rows of the blocks), each costing about one forward run, whatever n.
The leading axes of x0 are independent runs sharing every pass: a run's target does not
depend on another run's tokens. (torch's vectorised pass, `is_grads_batched`, cost as much
as the passes one after the other, measured at n = 160, 8 runs, 3 save times, and needs
every autograd function on the way to support vmap.) torch is imported only by
`influence`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._array import is_tensor
from attnflow._checks import describe, fail
from attnflow._repr import ShortRepr
from attnflow.family import Model
from attnflow.manifolds import SPHERE
from attnflow.simulate import simulate

__all__ = ["Influence", "influence"]


@dataclass(frozen=True, repr=False)
class Influence(ShortRepr):
    """The influence of every initial token on the target token (module docstring).

    Attributes
    ----------
    times : (T,) the save times t at which the target is read (default: t_end alone).
    blocks : on the circle (d = 2, sphere schemes) the derivatives
        d theta_target(t) / d theta_j(0), shape (T, ..., n) (radians per radian); otherwise
        the blocks d x_target(t) / d x_j(0), shape (T, ..., n, d, d), row index the target's
        coordinate, column index token j's.
    norms : (T, ..., n) the size of each block: |d theta_target / d theta_j| on the circle,
        the operator norm of the block between the tangent spaces on S^{d-1}, of the whole
        block in R^d.
    target : the target token's index, from 0.
    target_states : (T, ..., d) x_target(t), the target token at the save times.
    record : the run's record (`Trajectory.record`: the model, the integrator, the seed,
        the version).
    """

    times: np.ndarray
    blocks: np.ndarray
    norms: np.ndarray
    target: int
    target_states: np.ndarray
    record: dict[str, Any]

    def _summary(self) -> dict[str, Any]:
        return {"times": self.times, "blocks": self.blocks, "norms": self.norms,
                "target": self.target, "method": self.record["integrator"]["method"]}

    @property
    def circle(self) -> bool:
        """True when `blocks` are the circle's scalar derivatives d theta / d theta."""
        return self.blocks.ndim == self.norms.ndim


def influence(model: Model, x0: Any, t_end: float, *, target: int = -1, save_at: Any = None,
              **options: Any) -> Influence:
    """The influence d x_target(t) / d x_j(0) of every initial token j on the token `target`
    at the save times t (module docstring), by one run of `attnflow.simulate` on torch
    tensors and reverse mode: one backward pass per save time on the circle, d off it.

    Parameters
    ----------
    model : a block or a Stack, as for `simulate`.
    x0 : (..., n, d) initial tokens, a numpy array (converted to a tensor: float64 unless it
        is float32) or a torch tensor (used on its device and in its dtype; a detached copy
        is differentiated, x0 itself is not touched). Leading axes are independent runs.
    t_end : the final time, as for `simulate`.
    target : the index of the target token among the n (default -1, the last one).
    save_at : the times at which the target is read (default: t_end alone); t_end is
        always among them, as in `simulate`.
    **options : any other keyword argument of `simulate` (method, dt, noise with its seed,
        device, checkpoint, ...); the run keeps its states ("states", the default store).

    Returns an `Influence` (numpy arrays). Raises ImportError in one line when torch is
    missing, ValueError for bad input.
    """
    try:
        import torch
    except ImportError:
        raise ImportError("influence needs torch (reverse mode through simulate): "
                          "pip install 'attnflow[torch]'") from None
    x = _leaf(torch, x0)
    index = _target(target, x.shape[-2])
    run = simulate(model, x, t_end, save_at=[t_end] if save_at is None else save_at, **options)
    states = run.states  # (T, ..., n, d), in the graph of x
    T, d = states.shape[0], states.shape[-1]
    y = states[..., index, :].detach()  # (T, ..., d)
    circle = model.manifold == SPHERE and d == 2
    if circle:  # the covector of theta = atan2(x_2, x_1) at each save time
        covectors = torch.stack([-y[..., 1], y[..., 0]], dim=-1) / (y * y).sum(-1, keepdim=True)
    # one backward pass per save time t and, off the circle, per row a of the blocks
    passes = [(t, a) for t in range(T) for a in ([0] if circle else range(d))]
    pulled = []
    for i, (t, a) in enumerate(passes):
        seed = torch.zeros_like(states)
        if circle:
            seed[t, ..., index, :] = covectors[t]
        else:
            seed[t, ..., index, a] = 1
        (grad,) = torch.autograd.grad(states, x, seed, retain_graph=i < len(passes) - 1)
        pulled.append(grad)
    rows = torch.stack(pulled)  # (T, ..., n, d) on the circle, (T d, ..., n, d) otherwise
    rows_np = rows.detach().cpu().numpy()
    x0_np = x.detach().cpu().numpy()
    y_np = y.cpu().numpy()
    if circle:  # read on the tangent (-x_2, x_1) of each x_j(0)
        blocks = rows_np[..., 1] * x0_np[..., 0] - rows_np[..., 0] * x0_np[..., 1]
        norms = np.abs(blocks)
    else:
        blocks = np.moveaxis(rows_np.reshape(T, d, *rows_np.shape[1:]), 1, -2)
        norms = _tangent_norms(blocks, y_np, x0_np, model.manifold == SPHERE)
    return Influence(times=np.asarray(run.times, dtype=float), blocks=blocks, norms=norms,
                     target=index, target_states=y_np, record=run.record())


def _leaf(torch: Any, x0: Any) -> Any:
    """x0 as a tensor leaf that requires gradients: a detached copy of a tensor, or a numpy
    array converted (float32 kept, anything else as float64)."""
    if is_tensor(x0):
        x = x0.detach().clone()
    else:
        try:
            arr = np.asarray(x0)
        except (TypeError, ValueError) as err:
            raise fail("x0", "tokens of shape (..., n, d): a numeric array or a tensor",
                       repr(x0)) from err
        if arr.dtype.kind not in "biuf":
            raise fail("x0", "tokens of shape (..., n, d): a real numeric array", describe(arr))
        x = torch.from_numpy(np.array(arr, dtype=np.float32 if arr.dtype == np.float32
                                      else np.float64))
    if x.ndim < 2 or not x.is_floating_point():
        raise fail("x0", "floating tokens of shape (..., n, d)", describe(x0))
    return x.requires_grad_()


def _target(target: Any, n: int) -> int:
    """The target's index in 0..n-1 from an integer in [-n, n)."""
    if isinstance(target, (bool, np.bool_)) or not isinstance(target, (int, np.integer)) \
            or not -n <= target < n:
        raise fail("target", f"an integer token index in [-{n}, {n}) (n = {n} tokens)",
                   repr(target))
    return int(target) % n


def _tangent_norms(blocks: np.ndarray, y: np.ndarray, x0: np.ndarray, sphere: bool
                   ) -> np.ndarray:
    """The operator norms (T, ..., n) of blocks (T, ..., n, d, d) between the tangent spaces
    at the targets y (T, ..., d) and the tokens x0 (..., n, d) on the sphere; of the whole
    blocks in R^d."""
    if sphere:
        eye = np.eye(blocks.shape[-1])
        u = y / np.linalg.norm(y, axis=-1, keepdims=True)
        v = x0 / np.linalg.norm(x0, axis=-1, keepdims=True)
        left = eye - u[..., None, :, None] * u[..., None, None, :]  # (T, ..., 1, d, d)
        right = eye - v[..., :, None] * v[..., None, :]  # (..., n, d, d)
        blocks = left @ blocks @ right
    return np.linalg.norm(blocks, ord=2, axis=(-2, -1))
