"""The attention model and its velocity field on the sphere (SCIENCE.md §1).

For tokens X of shape (..., n, d) (rows are tokens) and one head (Q, K, V), token k moves by

    dx_k/dt = P_{x_k}( sum_j A_kj V x_j ),  A_kj = softmax_j( beta <Q x_k, K x_j> ), j in mask(k)

with P_x y = y - <x, y> x. Several heads are summed (``combine="sum"``, the default, as in a
Transformer layer whose head outputs add into the residual stream) or averaged
(``combine="mean"``). Memory tokens (fixed points m_j with multiplicities a_j) join every
token's keys and values with log a_j added to their scores: the frozen-centers model of
Theorem 5.2 is causal attention with memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array, nonnegative, square_matrix
from attnflow.jacobian import head_jacobian, tangent_jacobian
from attnflow.kernels import Kernel, Memory, auto, get_kernel
from attnflow.kernels.dense import attention_weights
from attnflow.kernels.masks import (
    MaskSpec,
    check_mask,
    is_lower_triangular,
    mask_from_record,
    mask_to_record,
)
from attnflow.sphere import project

__all__ = ["Attention"]

Head = tuple[Any, Any, Any]


class Attention:
    """Self-attention dynamics on the unit sphere S^{d-1}.

    Parameters
    ----------
    Q, K, V : (d, d) matrices acting on column vectors (score of (k, j) is
        beta x_k^T Q^T K x_j). None means the identity (of whatever d the tokens have).
    beta : inverse temperature, >= 0.
    mask : "causal" (default), "full", ("window", w) or a boolean (n, n) array.
    memory : optional (points (m, d) on the sphere, weights (m,) > 0): fixed tokens every
        token also attends to, each counted with multiplicity a_j (Theorem 5.2 uses a_j >= 1).
    heads : optional list of (Q, K, V) triples for several heads; then Q, K, V must be None.
    combine : "sum" (default) or "mean" over heads.
    backend : name of the attention kernel (`attnflow.kernels.KERNELS`): "auto" (default)
        picks the fastest of the numpy kernels per call; "dense" is the readable reference.
    """

    def __init__(
        self,
        Q: Any = None,
        K: Any = None,
        V: Any = None,
        beta: float = 1.0,
        mask: MaskSpec = "causal",
        memory: tuple[Any, Any] | None = None,
        heads: Sequence[Head] | None = None,
        combine: str = "sum",
        backend: str = "auto",
    ) -> None:
        self.beta = nonnegative("beta", beta)
        self.mask = check_mask(mask)
        if combine not in ("sum", "mean"):
            raise fail("combine", "'sum' or 'mean'", repr(combine))
        self.combine = combine
        get_kernel(backend)  # validates the name
        self.backend = backend
        if heads is not None:
            if any(m is not None for m in (Q, K, V)):
                raise fail("heads", "None when Q, K or V is given (one way to give heads)",
                           "both heads and Q/K/V")
            if len(heads) == 0:
                raise fail("heads", "a non-empty list of (Q, K, V) triples", "an empty list")
            raw = list(heads)
        else:
            raw = [(Q, K, V)]
        self.d = _common_dimension(raw, memory)
        self.heads: list[tuple[np.ndarray | None, ...]] = []
        for h, triple in enumerate(raw):
            if len(triple) != 3:
                raise fail(f"heads[{h}]", "a (Q, K, V) triple", f"{len(triple)} entries")
            names = ("Q", "K", "V") if heads is None else (f"heads[{h}].Q", f"heads[{h}].K",
                                                           f"heads[{h}].V")
            self.heads.append(tuple(
                None if m is None else square_matrix(name, m, self.d)
                for name, m in zip(names, triple)
            ))
        self.memory = None if memory is None else _check_memory(memory, self.d)

    # ------------------------------------------------------------------ properties
    @property
    def is_causal(self) -> bool:
        """True when token k depends on tokens 1..k only (causal or windowed mask)."""
        return is_lower_triangular(self.mask)

    def __repr__(self) -> str:
        mask = "array" if isinstance(self.mask, np.ndarray) else self.mask
        mem = 0 if self.memory is None else len(self.memory[1])
        return (f"Attention(d={self.d}, beta={self.beta}, mask={mask!r}, heads={len(self.heads)},"
                f" combine={self.combine!r}, memory={mem}, backend={self.backend!r})")

    # ------------------------------------------------------------------ the field
    def check_tokens(self, X: Any, name: str = "X") -> np.ndarray:
        """Validate a token array of shape (..., n, d) for this model."""
        X = finite_array(name, X, min_ndim=2)
        if not np.issubdtype(X.dtype, np.floating):
            X = X.astype(float)
        if self.d is not None and X.shape[-1] != self.d:
            raise fail(name, f"an array of shape (..., n, {self.d})", describe(X))
        if isinstance(self.mask, np.ndarray) and self.mask.shape[0] != X.shape[-2]:
            raise fail(name, f"n = {self.mask.shape[0]} tokens to match the (n, n) mask",
                       describe(X))
        return X

    def kernel_for(self, X: np.ndarray) -> Kernel:
        """The kernel for tokens shaped like X (..., n, d): the backend's, or for "auto" the
        one it picks for that shape. `simulate` fixes it for a whole run, so that stepping
        shares of the runs in parallel never switches kernels (nor rounding)."""
        if self.backend != "auto":
            return get_kernel(self.backend)
        return auto.choose(X, X)

    def attention_output(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """The attention update before projection: sum (or mean) over heads of A V x.
        X (..., n, d) -> (..., n, d); `kernel` defaults to the backend's."""
        kernel = get_kernel(self.backend) if kernel is None else kernel
        out = None
        for Q, K, V in self.heads:
            q = X if Q is None else X @ Q.T
            k = X if K is None else X @ K.T
            v = X if V is None else X @ V.T
            y = kernel(q, k, v, self.beta, self.mask, self._memory(K, V))
            out = y if out is None else out + y
        if self.combine == "mean" and len(self.heads) > 1:
            out = out / len(self.heads)
        return out

    def _memory(self, K: np.ndarray | None, V: np.ndarray | None) -> Memory | None:
        """Memory keys and values of one head, or None without memory."""
        if self.memory is None:
            return None
        points, weights = self.memory
        return Memory(
            k=points if K is None else points @ K.T,
            v=points if V is None else points @ V.T,
            log_weights=np.log(weights),
        )

    def field(self, X: Any) -> np.ndarray:
        """The velocity field F(X) = P_X(attention output), shape (..., n, d), after checking X."""
        return self.tangent_field(self.check_tokens(X))

    def tangent_field(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """`field` without the input checks: the integrators' hot path."""
        return project(X, self.attention_output(X, kernel))

    def jacobian(self, X: Any) -> np.ndarray:
        """The exact Jacobian of `field` at X (..., n, d): shape (..., n, d, n, d), with
        [..., i, :, k, :] = dF_i/dx_k (`attnflow.jacobian`; dense, for the implicit methods)."""
        X = self.check_tokens(X)
        a = Da = None
        for Q, K, V in self.heads:
            a_h, Da_h = head_jacobian(X, Q, K, V, self.beta, self.mask, self._memory(K, V))
            a, Da = (a_h, Da_h) if a is None else (a + a_h, Da + Da_h)
        if self.combine == "mean" and len(self.heads) > 1:
            a, Da = a / len(self.heads), Da / len(self.heads)
        return tangent_jacobian(X, a, Da)

    def attention_matrix(self, X: Any, head: int = 0) -> np.ndarray:
        """The attention weights A of one head, (..., n, n + m) (m memory columns last)."""
        X = self.check_tokens(X)
        Q, K, V = self.heads[head]
        q = X if Q is None else X @ Q.T
        k = X if K is None else X @ K.T
        return attention_weights(q, k, self.beta, self.mask, self._memory(K, V))

    # ------------------------------------------------------------------ records
    def to_record(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A JSON-friendly description and a dict of named arrays, enough to rebuild the model
        bit-identically with `Attention.from_record`."""
        arrays: dict[str, np.ndarray] = {}
        identity: list[list[bool]] = []
        for h, triple in enumerate(self.heads):
            identity.append([m is None for m in triple])
            for name, m in zip("QKV", triple):
                if m is not None:
                    arrays[f"{name}_{h}"] = m
        if self.memory is not None:
            arrays["memory_points"], arrays["memory_weights"] = self.memory
        meta = {
            "d": self.d,
            "beta": self.beta,
            "mask": mask_to_record(self.mask),
            "combine": self.combine,
            "backend": self.backend,
            "n_heads": len(self.heads),
            "identity": identity,
        }
        return meta, arrays

    @classmethod
    def from_record(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Attention:
        """Inverse of `to_record`."""
        heads = []
        for h, ident in enumerate(meta["identity"]):
            heads.append(tuple(None if ident[i] else arrays[f"{name}_{h}"]
                               for i, name in enumerate("QKV")))
        memory = None
        if "memory_points" in arrays:
            memory = (arrays["memory_points"], arrays["memory_weights"])
        kwargs = dict(beta=meta["beta"], mask=mask_from_record(meta["mask"]),
                      memory=memory, combine=meta["combine"], backend=meta["backend"])
        if meta["n_heads"] > 1:
            return cls(heads=heads, **kwargs)
        Q, K, V = heads[0]
        return cls(Q, K, V, **kwargs)

    @classmethod
    def from_pretrained(cls, model_dir: Any, layer: int, head: int | None = None,
                        **kwargs: Any) -> Attention:
        """One head (or all heads, summed) of a layer of a Hugging Face checkpoint directory,
        read offline: heads (I, B_h, V_h) with B_h = W_Q^T W_K / sqrt(d_head), V_h = W_O W_V.
        See `attnflow.pretrained.attention_from_pretrained` (kwargs: beta, mask, backend)."""
        from attnflow.pretrained import attention_from_pretrained

        return attention_from_pretrained(model_dir, layer, head, **kwargs)


def _common_dimension(heads: list[Head], memory: Any) -> int | None:
    """The dimension d fixed by the given matrices or memory (None: any d)."""
    dims = {np.shape(m)[0] for triple in heads for m in triple if m is not None and np.ndim(m) >= 1}
    if memory is not None:
        try:
            points = np.asarray(memory[0])
        except (TypeError, IndexError) as err:
            raise fail("memory", "a (points, weights) pair", repr(memory)) from err
        if points.ndim == 2:
            dims.add(points.shape[1])
    if len(dims) > 1:
        raise fail("Q, K, V, memory", "matrices and memory points of one dimension d",
                   f"dimensions {sorted(dims)}")
    return dims.pop() if dims else None


def _check_memory(memory: Any, d: int | None) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(memory, (tuple, list)) or len(memory) != 2:
        raise fail("memory", "a (points, weights) pair", repr(memory))
    points = finite_array("memory points", memory[0], ndim=2, dtype=float)
    weights = finite_array("memory weights", memory[1], ndim=1, dtype=float)
    if d is not None and points.shape[1] != d:
        raise fail("memory points", f"an (m, {d}) array", describe(points))
    if weights.shape[0] != points.shape[0]:
        raise fail("memory weights", f"an array of shape ({points.shape[0]},)", describe(weights))
    if np.any(weights <= 0):
        raise fail("memory weights", "multiplicities > 0", f"min {weights.min()}")
    off = float(np.max(np.abs(np.linalg.norm(points, axis=1) - 1.0)))
    if off > 1e-8:
        raise fail("memory points", "unit vectors (points on the sphere)",
                   f"norms off 1 by up to {off:.3g}")
    return points, weights
