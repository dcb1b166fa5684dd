"""The paper's idealised attention model fitted to a real layer's motion of directions
(docs/science.md §7; recipe `realfit`).

A layer of a trained decoder maps the residual stream x (n, d) to x'. On the sphere of
directions u_i = x_i / |x_i| its change, projected on the tangent space at u_i, is

    Delta_i = P_{u_i}(u'_i - u_i) = u'_i - <u_i, u'_i> u_i          (|Delta_i| = sin angle)

and is compared with one step (time 1: the step's length is folded into V) of the paper's
model with one causal head (post-LN, on the sphere):

    v_i = P_{u_i}( sum_{j <= i} softmax_j(beta <u_i, R u_j>) V u_j ),
    Q^T K = beta R,  R = exp(S) orthogonal,  V = lam I + A B^T.

S = Z J Z^T is skew of rank 2k (Z (d, 2k), J = [[0, I_k], [-I_k, 0]]): a full rotation of
R^576 has 165 600 parameters, more than a layer's data, so R turns a 2k-dimensional subspace
and fixes its complement. exp(S) is never formed: S^m = Z (J G)^(m-1) J Z^T with G = Z^T Z,
so exp(S) = I + Z phi(J G) J Z^T, phi(M) = sum_m M^m / (m + 1)! (the top-right block of
exp([[M, I], [0, 0]]), 4k x 4k), and <u_i, R u_j> = <u_i, u_j> + (Z^T u_i)^T phi J (Z^T u_j).
A, B (d, r) give V a rank-r extra.

`IdealisedLayer.field` evaluates v this way (d x 2k and d x r products only); the fit
(`fit_idealised`, torch autograd and L-BFGS on the squared misfit) calls it hundreds of
times, where the family's `Attention` with d x d tensors R and V costs 100 ms a call at
d = 576 (its checks and full products). `IdealisedLayer.attention` gives the same model as an
`attnflow.Attention` (Q = I, K = R, V), whose `field` the shares are evaluated with and the
tests compare to.

Baselines (each fitted on the same data, `BASELINES`):
    self   no attention: v_i = P_{u_i}(A B^T u_i) (the same V; lam I drops out);
    drift  one common drift: v_i = P_{u_i}(b), b in R^d (least squares, closed form);
    mean   toward the causal mean: v_i = c P_{u_i}(mean_{j <= i} u_j) (the model at beta = 0,
           V = c I);
    first  toward the first token: v_i = c P_{u_i}(u_1).
The share of the change explained by a prediction v is 1 - |Delta - v|^2 / |Delta|^2
(`share`, per prompt: sums over the prompt's tokens and coordinates).
Arrays: U, Delta of shape (P, n, d), P prompts of n tokens each; torch float64 throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import describe, fail

__all__ = ["BASELINES", "IdealisedLayer", "baseline", "fit_idealised", "misfit", "share",
           "tangent_steps"]

BASELINES = ("self", "drift", "mean", "first")


def _torch() -> Any:
    import torch

    return torch


def tangent_steps(before: Any, after: Any) -> tuple[Any, Any]:
    """(U, Delta) as tensors (float64): the directions before (..., n, d) and the tangent
    projection at U of the directions after (module docstring)."""
    torch = _torch()
    x0 = torch.as_tensor(np.asarray(before, dtype=np.float64))
    x1 = torch.as_tensor(np.asarray(after, dtype=np.float64))
    if x0.shape != x1.shape or x0.ndim < 2:
        raise fail("before, after", "two arrays of one shape (..., n, d)",
                   f"{tuple(x0.shape)} and {tuple(x1.shape)}")
    u0 = x0 / x0.norm(dim=-1, keepdim=True)
    u1 = x1 / x1.norm(dim=-1, keepdim=True)
    return u0, u1 - (u0 * u1).sum(-1, keepdim=True) * u0


def _project(U: Any, Y: Any) -> Any:
    return Y - (U * Y).sum(-1, keepdim=True) * U


def _causal_softmax(scores: Any) -> Any:
    torch = _torch()
    n = scores.shape[-1]
    above = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax(scores.masked_fill(above, float("-inf")), dim=-1)


@dataclass
class IdealisedLayer:
    """The idealised model's parameters (module docstring), torch float64 tensors:
    beta (), lam (), A (d, r), B (d, r), Z (d, 2k)."""

    beta: Any
    lam: Any
    A: Any
    B: Any
    Z: Any

    def parameters(self) -> list[Any]:
        return [self.beta, self.lam, self.A, self.B, self.Z]

    def _phi_J(self) -> Any:
        """phi(J G) J (2k, 2k), G = Z^T Z (module docstring)."""
        torch = _torch()
        k2 = self.Z.shape[1]
        J = torch.zeros(k2, k2, dtype=self.Z.dtype)
        J[: k2 // 2, k2 // 2:] = torch.eye(k2 // 2)
        J[k2 // 2:, : k2 // 2] = -torch.eye(k2 // 2)
        M = J @ (self.Z.T @ self.Z)
        big = torch.zeros(2 * k2, 2 * k2, dtype=self.Z.dtype)
        big[:k2, :k2] = M
        big[:k2, k2:] = torch.eye(k2)
        return torch.linalg.matrix_exp(big)[:k2, k2:] @ J

    def rotation(self) -> Any:
        """R = exp(S) (d, d), orthogonal."""
        torch = _torch()
        return torch.eye(self.Z.shape[0], dtype=self.Z.dtype) \
            + self.Z @ self._phi_J() @ self.Z.T

    def value(self) -> Any:
        """V = lam I + A B^T (d, d)."""
        torch = _torch()
        return self.lam * torch.eye(self.A.shape[0], dtype=self.A.dtype) + self.A @ self.B.T

    def field(self, U: Any) -> Any:
        """v (P, n, d) at unit tokens U (P, n, d), in low-rank form (module docstring)."""
        W = U @ self.Z  # (P, n, 2k)
        scores = U @ U.transpose(-1, -2) + (W @ self._phi_J()) @ W.transpose(-1, -2)
        w = _causal_softmax(self.beta * scores)
        VU = self.lam * U + (U @ self.B) @ self.A.T
        return _project(U, w @ VU)

    def attention(self) -> Any:
        """The same model as an `attnflow.Attention` block (one causal head, Q = I, K = R,
        V, post-LN on the sphere): its `field` equals `field`."""
        from attnflow.family import Attention

        return Attention(heads=[(None, self.rotation(), self.value())], beta=self.beta,
                         mask="causal")

    def numbers(self) -> dict[str, Any]:
        """beta, lam, |A B^T| (Frobenius) and the rotation angle |S| (Frobenius / sqrt 2: the
        root-sum-square of the rotation's angles), as floats."""
        torch = _torch()
        with torch.no_grad():
            G = self.Z.T @ self.Z
            k = G.shape[0] // 2
            # |S|_F^2 = 2 (tr(G11 G22) - tr(G12 G21)) for S = U W^T - W U^T
            s2 = 2 * (torch.trace(G[:k, :k] @ G[k:, k:]) - torch.trace(G[:k, k:] @ G[k:, :k]))
            return {"beta": float(self.beta), "lam": float(self.lam),
                    "extra_norm": float((self.A @ self.B.T).norm()),
                    "rotation_angle": float(torch.sqrt(torch.clamp(s2, min=0) / 2))}


def _check(U: Any, Delta: Any) -> None:
    if U.ndim != 3 or U.shape != Delta.shape:
        raise fail("U, Delta", "two tensors of one shape (P, n, d)",
                   f"{describe(U)} and {describe(Delta)}")


def _misfit(Delta: Any, v: Any) -> Any:
    return ((Delta - v) ** 2).sum() / (Delta ** 2).sum()


def _lbfgs(params: list[Any], loss: Any, steps: int) -> None:
    torch = _torch()
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=steps, history_size=20,
                            tolerance_grad=1e-10, tolerance_change=1e-10,
                            line_search_fn="strong_wolfe")

    def closure() -> Any:
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)


def fit_idealised(U: Any, Delta: Any, rank_v: int, rank_r: int, steps: int = 200,
                  seed: int = 0, init: dict[str, Any] | None = None) -> IdealisedLayer:
    """The idealised layer (rank_v: rank of V's extra, rank_r: k, S of rank 2k) that
    minimises sum |Delta - v(U)|^2 over tokens U (P, n, d) and their tangent steps Delta, by
    L-BFGS (at most `steps` iterations) from beta = init["beta"] (default 1), lam (default:
    the `mean` baseline's slope), A and B (default: small random A, seeded, and B = 0; e.g.
    the `self` baseline's, with a large beta: the self baseline is the model's limit
    beta -> inf at R = I) and small random Z (seeded)."""
    torch = _torch()
    _check(U, Delta)
    d = U.shape[-1]
    for name, r in (("rank_v", rank_v), ("rank_r", rank_r)):
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= d // 2:
            raise fail(name, f"an integer in [0, {d // 2}]", repr(r))
    g = torch.Generator().manual_seed(seed)
    init = {"beta": 1.0, **(init or {})}
    c = _slope(U, Delta, _causal_mean(U))
    layer = IdealisedLayer(
        beta=torch.tensor(float(init["beta"]), dtype=torch.float64),
        lam=torch.tensor(float(init.get("lam", c)), dtype=torch.float64),
        A=torch.as_tensor(init["A"]).clone() if "A" in init else
        0.1 * torch.randn(d, rank_v, generator=g, dtype=torch.float64) / np.sqrt(d),
        B=torch.as_tensor(init["B"]).clone() if "B" in init else
        torch.zeros(d, rank_v, dtype=torch.float64),
        Z=0.1 * torch.randn(d, 2 * rank_r, generator=g, dtype=torch.float64) / np.sqrt(d))
    for p in layer.parameters():
        p.requires_grad_(True)
    _lbfgs(layer.parameters(), lambda: _misfit(Delta, layer.field(U)), steps)
    for p in layer.parameters():
        p.requires_grad_(False)
    return layer


def misfit(U: Any, Delta: Any, v: Any) -> float:
    """sum |Delta - v|^2 / sum |Delta|^2 over all prompts and tokens (the fit's loss)."""
    torch = _torch()
    with torch.no_grad():
        return float(_misfit(Delta, v))


def _causal_mean(U: Any) -> Any:
    torch = _torch()
    counts = torch.arange(1, U.shape[-2] + 1, dtype=U.dtype)[:, None]
    return U.cumsum(dim=-2) / counts


def _slope(U: Any, Delta: Any, target: Any) -> float:
    """c minimising sum |Delta - c P_U(target)|^2."""
    p = _project(U, target)
    return float((Delta * p).sum() / (p * p).sum())


@dataclass
class Baseline:
    """A fitted baseline (`baseline`): its name and parameters; `field(U)` its prediction."""

    name: str
    params: dict[str, Any]

    def field(self, U: Any) -> Any:
        p = self.params
        if self.name == "self":
            return _project(U, (U @ p["B"]) @ p["A"].T)
        if self.name == "drift":
            return _project(U, p["b"].expand_as(U))
        target = _causal_mean(U) if self.name == "mean" else U[..., :1, :].expand_as(U)
        return p["c"] * _project(U, target)


def baseline(name: str, U: Any, Delta: Any, rank_v: int = 1, steps: int = 200,
             seed: int = 0) -> Baseline:
    """The baseline `name` (one of BASELINES, module docstring) fitted to (U, Delta) by least
    squares: closed forms, except "self" (L-BFGS, V's extra of rank `rank_v`)."""
    torch = _torch()
    _check(U, Delta)
    if name not in BASELINES:
        raise fail("name", f"one of {BASELINES}", repr(name))
    d = U.shape[-1]
    if name == "drift":  # normal equations: (N I - sum u u^T) b = sum Delta (Delta tangent)
        u, D = U.reshape(-1, d), Delta.reshape(-1, d)
        gram = u.shape[0] * torch.eye(d, dtype=U.dtype) - u.T @ u
        return Baseline(name, {"b": torch.linalg.solve(gram, D.sum(0))})
    if name in ("mean", "first"):
        target = _causal_mean(U) if name == "mean" else U[..., :1, :].expand_as(U)
        return Baseline(name, {"c": _slope(U, Delta, target)})
    g = torch.Generator().manual_seed(seed)
    A = (0.1 * torch.randn(d, rank_v, generator=g, dtype=U.dtype) / np.sqrt(d))
    B = torch.zeros(d, rank_v, dtype=U.dtype)
    A.requires_grad_(True)
    B.requires_grad_(True)
    fitted = Baseline(name, {"A": A, "B": B})
    _lbfgs([A, B], lambda: _misfit(Delta, fitted.field(U)), steps)
    A.requires_grad_(False)
    B.requires_grad_(False)
    return fitted


def share(Delta: Any, v: Any) -> np.ndarray:
    """(P,) per prompt, the share of the change explained: 1 - |Delta - v|^2 / |Delta|^2
    (sums over the prompt's tokens and coordinates)."""
    torch = _torch()
    with torch.no_grad():
        sse = ((Delta - v) ** 2).sum(dim=(-1, -2))
        sst = (Delta ** 2).sum(dim=(-1, -2))
        return (1.0 - sse / sst).numpy()
