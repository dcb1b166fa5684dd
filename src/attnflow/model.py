"""The attention model (one layer) and its velocity field (docs/science.md §1, §6).

For tokens X of shape (..., n, d) (rows are tokens) with directions theta = x / |x| and one head
(Q, K, V), the attention output at token k is

    A_k = sum_j w_kj V theta_j,  w_kj = softmax_j(beta <Q theta_k, K theta_j> + b_kj), j in mask(k)

and the state moves by dX/dt = scheme(X, A) (`attnflow.schemes`): with the default post-LN
scheme the tokens stay on the sphere and dx_k/dt = P_{x_k}(A_k), the paper's dynamics. Several
heads are summed (``combine="sum"``, the default, as in a Transformer layer whose head outputs
add into the residual stream) or averaged (``combine="mean"``). The scores may be changed by
positional encodings (`attnflow.positional`: RoPE rotates q and k, ALiBi and any (n, n) array
add a bias b), and the weights normalised otherwise than by softmax ("unnormalised",
"sinkhorn"). Memory tokens (fixed points m_j with multiplicities a_j) join every token's keys
and values with log a_j added to their scores: the frozen-centers model of Theorem 5.2 is
causal attention with memory. A model whose weights change with depth is a `Stack` of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from attnflow._checks import describe, fail, finite_array, nonnegative, square_matrix
from attnflow.jacobian import head_jacobian, tangent_jacobian
from attnflow.kernels import SUPPORTS, Kernel, Memory, auto, get_kernel, options
from attnflow.kernels.dense import attention_weights
from attnflow.kernels.masks import (
    MaskSpec,
    check_mask,
    is_lower_triangular,
    mask_from_record,
    mask_matrix,
    mask_to_record,
)
from attnflow.positional import (
    ALiBi,
    Encoding,
    RoPE,
    ScoreBias,
    as_alibi,
    as_rope,
    encoding_from_record,
)
from attnflow.schemes import Scheme, directions, make_scheme

__all__ = ["Attention", "check_normalization"]

Head = tuple[Any, Any, Any]
Normalization = Union[str, tuple]
SINKHORN_ITERATIONS = 20  # default number of Sinkhorn iterations


class Attention:
    """One attention layer: its velocity field on the sphere (post-LN, the paper's) or in R^d.

    Parameters
    ----------
    Q, K : query and key matrices acting on column vectors, (e, d) with the same head size e
        (the score of (k, j) is beta theta_k^T Q^T K theta_j). None means the identity (e = d).
    V : (d, d) value matrix; None means the identity.
    beta : inverse temperature, >= 0.
    mask : "causal" (default), "full", ("window", w) or a boolean (n, n) array.
    memory : optional (points (m, d) on the sphere, weights (m,) > 0): fixed tokens every
        token also attends to, each counted with multiplicity a_j (Theorem 5.2 uses a_j >= 1).
    heads : optional list of (Q, K, V) triples for several heads; then Q, K, V must be None.
        Grouped-query heads share their K and V: pass the same arrays.
    combine : "sum" (default) or "mean" over heads.
    backend : name of the attention kernel (`attnflow.kernels.KERNELS`): "auto" (default)
        picks the fastest kernel that has the model's options per call; "dense" is the
        readable reference.
    norm : normalisation scheme (`attnflow.schemes`): "post" (default; tokens on the sphere),
        "pre", "peri" (tokens in R^d, radius in the state) or "ngpt".
    alpha : nGPT's step (default 0.2), used only with norm="ngpt".
    attention : weight normalisation: "softmax" (default), "unnormalised" (weights
        exp(score) / N, N = n plus the memory multiplicities) or "sinkhorn" / ("sinkhorn", it)
        (doubly stochastic by `it` Sinkhorn iterations, default 20; full mask, no memory).
    rope : rotary position embedding: an `attnflow.RoPE`, a base, or None.
    alibi : linear score biases: an `attnflow.ALiBi`, a slope, one slope per head, or None.
    bias : an additive (n, n) score bias shared by the heads (entries may be -inf), or None.
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
        norm: str = "post",
        alpha: float = 0.2,
        attention: Normalization = "softmax",
        rope: RoPE | float | None = None,
        alibi: ALiBi | float | Sequence[float] | None = None,
        bias: Any = None,
    ) -> None:
        self.beta = nonnegative("beta", beta)
        self.mask = check_mask(mask)
        if combine not in ("sum", "mean"):
            raise fail("combine", "'sum' or 'mean'", repr(combine))
        self.combine = combine
        get_kernel(backend)  # validates the name
        self.backend = backend
        self.scheme: Scheme = make_scheme(norm, alpha)
        self.normalization = check_normalization(attention)
        if heads is not None:
            if any(m is not None for m in (Q, K, V)):
                raise fail("heads", "None when Q, K or V is given (one way to give heads)",
                           "both heads and Q/K/V")
            if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence):
                raise fail("heads", "a list of (Q, K, V) triples", repr(heads))
            if len(heads) == 0:
                raise fail("heads", "a non-empty list of (Q, K, V) triples", "an empty list")
            raw = list(heads)
        else:
            raw = [(Q, K, V)]
        for h, triple in enumerate(raw):
            if not isinstance(triple, (tuple, list)) or len(triple) != 3:
                raise fail(f"heads[{h}]", "a (Q, K, V) triple", repr(triple)[:80])
        self.d = _common_dimension(raw, memory)
        self.heads: list[tuple[np.ndarray | None, ...]] = [
            _check_head(triple, self.d, h if heads is not None else None)
            for h, triple in enumerate(raw)]
        self.memory = None if memory is None else _check_memory(memory, self.d)
        self.encodings: tuple[Encoding, ...] = tuple(
            e for e in (as_rope(rope), as_alibi(alibi),
                        None if bias is None else ScoreBias(bias)) if e is not None)
        for e in self.encodings:  # (head size None: identities of any d, checked on X)
            for Qh, Kh, _ in self.heads:
                e.check(self.head_size(Qh, Kh), len(self.heads))
        self._check_options()

    def _check_options(self) -> None:
        """Options that exclude each other, rows left with nothing to attend to, a backend
        without the model's options."""
        if isinstance(self.normalization, tuple) and (self.mask != "full"
                                                       or self.memory is not None):
            raise fail("attention", "'sinkhorn' with mask='full' and no memory (a doubly "
                       "stochastic matrix needs every token to see every token)",
                       f"mask {_mask_name(self.mask)!r}"
                       + (" with memory" if self.memory is not None else ""))
        n = self.fixed_n
        if n is not None and self.memory is None:
            allowed = mask_matrix(self.mask, n)
            for e in self.encodings:
                b = e.bias(n, 0, len(self.heads))
                if b is not None:
                    allowed = allowed & np.isfinite(b)
            empty = np.flatnonzero(~allowed.any(axis=1))
            if empty.size:
                raise fail("mask", "every row to allow at least one key (or memory tokens "
                           "to attend to)", f"no key allowed in row(s) {empty[:10].tolist()}")
        if self.backend != "auto":
            missing = self.options - SUPPORTS[self.backend]
            if missing:
                raise fail("backend", f"a kernel with the options {sorted(self.options)} "
                           f"(kernels: { {k: sorted(v) for k, v in SUPPORTS.items()} })",
                           f"{self.backend!r}, which lacks {sorted(missing)}")

    # ------------------------------------------------------------------ properties
    @property
    def is_causal(self) -> bool:
        """True when token k depends on tokens 1..k only (causal or windowed mask)."""
        return is_lower_triangular(self.mask)

    @property
    def layers(self) -> tuple[Attention, ...]:
        """The model as a sequence of layers: one layer (tied weights at every time)."""
        return (self,)

    def layer_at(self, t: float) -> Attention:
        """The layer acting at time t: this one at every time."""
        return self

    @property
    def manifold(self) -> str:
        """Where the state lives: "sphere" (post, ngpt) or "euclidean" (pre, peri)."""
        return self.scheme.manifold

    @property
    def norm(self) -> str:
        """The normalisation scheme's name."""
        return self.scheme.name

    @property
    def fixed_n(self) -> int | None:
        """The number of tokens fixed by a boolean mask or a bias array (None: any n)."""
        if isinstance(self.mask, np.ndarray):
            return self.mask.shape[0]
        for e in self.encodings:
            if isinstance(e, ScoreBias):
                return e.n
        return None

    @property
    def options(self) -> frozenset[str]:
        """The kernel options this model needs ("bias", "unnormalised", "sinkhorn")."""
        bias = np.zeros(0) if any(e.adds_bias for e in self.encodings) else None
        return options.needed(bias, self.normalization)

    @property
    def has_exact_jacobian(self) -> bool:
        """True when `jacobian` is available: post-LN, softmax, no positional encoding."""
        return self.norm == "post" and self.normalization == "softmax" and not self.encodings

    def head_size(self, Q: np.ndarray | None, K: np.ndarray | None, d: int | None = None
                  ) -> int | None:
        """The size e of a head's queries and keys (d, or self.d, for identities)."""
        m = Q if Q is not None else K
        if m is not None:
            return m.shape[0]
        return self.d if d is None else d

    def __repr__(self) -> str:
        mask = "array" if isinstance(self.mask, np.ndarray) else self.mask
        mem = 0 if self.memory is None else len(self.memory[1])
        extra = "".join(f", {e.kind}" for e in self.encodings)
        return (f"Attention(d={self.d}, beta={self.beta}, mask={mask!r}, heads={len(self.heads)},"
                f" combine={self.combine!r}, memory={mem}, norm={self.norm!r}, "
                f"attention={self.normalization!r}{extra}, backend={self.backend!r})")

    # ------------------------------------------------------------------ the field
    def check_tokens(self, X: Any, name: str = "X") -> np.ndarray:
        """Validate a token array of shape (..., n, d) for this model."""
        X = finite_array(name, X, min_ndim=2)
        if not np.issubdtype(X.dtype, np.floating):
            X = X.astype(float)
        if self.d is not None and X.shape[-1] != self.d:
            raise fail(name, f"an array of shape (..., n, {self.d})", describe(X))
        if X.shape[-2] == 0 or X.shape[-1] == 0 or X.size == 0:
            raise fail(name, "at least one token of dimension >= 1", describe(X))
        for e in self.encodings:
            for Qh, Kh, _ in self.heads:
                e.check(self.head_size(Qh, Kh, X.shape[-1]), len(self.heads))
        n = self.fixed_n
        if n is not None and n != X.shape[-2]:
            raise fail(name, f"n = {n} tokens to match the model's (n, n) mask or bias",
                       describe(X))
        return X

    def kernel_for(self, X: np.ndarray) -> Kernel:
        """The kernel for tokens shaped like X (..., n, d): the backend's, or for "auto" the
        one it picks for that shape and the model's options. `simulate` fixes it for a whole
        run, so that stepping shares of the runs in parallel never switches kernels."""
        if self.backend != "auto":
            return get_kernel(self.backend)
        e = max(self.head_size(Q, K, X.shape[-1]) for Q, K, _ in self.heads)
        q = np.broadcast_to(np.zeros((), X.dtype), (*X.shape[:-1], e))
        return auto.choose(q, X, bias=self.score_bias(X.shape[-2], 0),
                           normalization=self.normalization)

    def attention_output(self, theta: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """A: the sum (or mean) over heads of the attention-weighted values, at the token
        directions theta (..., n, d) -> (..., n, d). `kernel` defaults to the backend's."""
        kernel = get_kernel(self.backend) if kernel is None else kernel
        n = theta.shape[-2]
        positions = np.arange(n, dtype=float)
        out = None
        cache: dict[tuple[int, str], np.ndarray] = {}  # shared K, V of grouped-query heads
        for h, (Q, K, V) in enumerate(self.heads):
            q = self._rotated(theta if Q is None else theta @ Q.T, positions)
            if K is Q:  # queries and keys are rotated alike: Q = K gives k = q
                cache[(id(K), "k")] = q
            k = cache.get((id(K), "k"))
            if k is None:
                k = cache[(id(K), "k")] = self._rotated(theta if K is None else theta @ K.T,
                                                        positions)
            v = cache.get((id(V), "v"))
            if v is None:
                v = cache[(id(V), "v")] = theta if V is None else theta @ V.T
            y = kernel(q, k, v, self.beta, self.mask, self._memory(K, V),
                       bias=self.score_bias(n, h), normalization=self.normalization)
            out = y if out is None else out + y
        if self.combine == "mean" and len(self.heads) > 1:
            out = out / len(self.heads)
        return out

    def _rotated(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        for e in self.encodings:
            x = e.rotate(x, positions)
        return x

    def score_bias(self, n: int, head: int) -> np.ndarray | None:
        """The additive (n, n) score bias of one head (sum of the encodings'), or None."""
        total = None
        for e in self.encodings:
            b = e.bias(n, head, len(self.heads))
            if b is not None:
                total = b if total is None else total + b
        return total

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
        """The velocity field F(X), shape (..., n, d), after checking X."""
        return self.tangent_field(self.check_tokens(X))

    def tangent_field(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """`field` without the input checks: the integrators' hot path (tangent to the
        sphere for the sphere schemes)."""
        return self.scheme.field(X, self.attention_output(self._directions(X), kernel))

    def drift(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """The ambient drift of an explicit Euler step (`attnflow.schemes`): with post-LN the
        attention output itself, so that normalize(x + drift) is one post-LN layer."""
        return self.scheme.drift(X, self.attention_output(self._directions(X), kernel))

    def _directions(self, X: np.ndarray) -> np.ndarray:
        return X if self.manifold == "sphere" else directions(X)

    def jacobian(self, X: Any) -> np.ndarray:
        """The exact Jacobian of `field` at X (..., n, d): shape (..., n, d, n, d), with
        [..., i, :, k, :] = dF_i/dx_k (`attnflow.jacobian`; dense, for the implicit methods).
        Available when `has_exact_jacobian` (post-LN softmax attention without positions)."""
        if not self.has_exact_jacobian:
            raise fail("model", "post-LN softmax attention without positional encodings for "
                       "the exact Jacobian", repr(self))
        X = self.check_tokens(X)
        a = Da = None
        for Q, K, V in self.heads:
            a_h, Da_h = head_jacobian(X, Q, K, V, self.beta, self.mask, self._memory(K, V))
            a, Da = (a_h, Da_h) if a is None else (a + a_h, Da + Da_h)
        if self.combine == "mean" and len(self.heads) > 1:
            a, Da = a / len(self.heads), Da / len(self.heads)
        return tangent_jacobian(X, a, Da)

    def attention_matrix(self, X: Any, head: int = 0) -> np.ndarray:
        """The attention weights of one head (0-based), (..., n, n + m) (m memory columns
        last), at the directions of X."""
        X = self.check_tokens(X)
        if (isinstance(head, bool) or not isinstance(head, (int, np.integer))
                or not 0 <= head < len(self.heads)):
            raise fail("head", f"a head index in [0, {len(self.heads) - 1}]", repr(head))
        theta = self._directions(X)
        n = X.shape[-2]
        positions = np.arange(n, dtype=float)
        Q, K, V = self.heads[head]
        q = self._rotated(theta if Q is None else theta @ Q.T, positions)
        k = self._rotated(theta if K is None else theta @ K.T, positions)
        return attention_weights(q, k, self.beta, self.mask, self._memory(K, V),
                                 bias=self.score_bias(n, head),
                                 normalization=self.normalization)

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
        encodings = []
        for e in self.encodings:
            meta_e, arrays_e = e.to_record()
            encodings.append(meta_e)
            arrays.update(arrays_e)
        normalization = (list(self.normalization) if isinstance(self.normalization, tuple)
                         else self.normalization)
        meta = {
            "d": self.d,
            "beta": self.beta,
            "mask": mask_to_record(self.mask),
            "combine": self.combine,
            "backend": self.backend,
            "n_heads": len(self.heads),
            "identity": identity,
            "norm": self.norm,
            **self.scheme.params(),
            "attention": normalization,
            "encodings": encodings,
        }
        return meta, arrays

    @classmethod
    def from_record(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Attention:
        """Inverse of `to_record` (records written before the model family read as post-LN
        softmax attention without positions)."""
        heads = []
        for h, ident in enumerate(meta["identity"]):
            heads.append(tuple(None if ident[i] else arrays[f"{name}_{h}"]
                               for i, name in enumerate("QKV")))
        memory = None
        if "memory_points" in arrays:
            memory = (arrays["memory_points"], arrays["memory_weights"])
        attention = meta.get("attention", "softmax")
        kwargs: dict[str, Any] = dict(
            beta=meta["beta"], mask=mask_from_record(meta["mask"]), memory=memory,
            combine=meta["combine"], backend=meta["backend"], norm=meta.get("norm", "post"),
            alpha=meta.get("alpha", 0.2),
            attention=tuple(attention) if isinstance(attention, list) else attention)
        for rec in meta.get("encodings", []):
            e = encoding_from_record(rec, arrays)
            key = {"rope": "rope", "alibi": "alibi", "bias": "bias"}[e.kind]
            kwargs[key] = e.matrix if isinstance(e, ScoreBias) else e
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


def check_normalization(attention: Any) -> Normalization:
    """The canonical weight normalisation: "softmax", "unnormalised" or ("sinkhorn", it)
    ("sinkhorn" alone: `SINKHORN_ITERATIONS` iterations)."""
    if isinstance(attention, str) and attention == "sinkhorn":
        return ("sinkhorn", SINKHORN_ITERATIONS)
    try:
        return options.check_normalization(attention)
    except ValueError:
        raise fail("attention", "'softmax', 'unnormalised', 'sinkhorn' or ('sinkhorn', "
                   "iterations) with an integer >= 1", repr(attention)) from None


def _mask_name(mask: MaskSpec) -> str:
    return "array" if isinstance(mask, np.ndarray) else str(mask)


def _check_head(triple: Head, d: int | None, h: int | None) -> tuple[np.ndarray | None, ...]:
    """Q, K as (e, d) with one head size e, V as (d, d); None stays the identity."""
    names = ("Q", "K", "V") if h is None else (f"heads[{h}].Q", f"heads[{h}].K",
                                               f"heads[{h}].V")
    Q, K, V = (None if m is None else finite_array(name, m, ndim=2, dtype=float)
               for name, m in zip(names, triple))
    V = None if V is None else square_matrix(names[2], V, d)
    sizes = {name: m.shape[0] for name, m in zip(names[:2], (Q, K)) if m is not None}
    for name, m in zip(names[:2], (Q, K)):
        if m is not None and (m.shape[0] == 0 or (d is not None and m.shape[1] != d)):
            raise fail(name, f"an (e, {d}) matrix with e >= 1", describe(m))
    if len(set(sizes.values()) | ({d} if len(sizes) == 1 else set())) > 1:
        raise fail(f"{names[0]}, {names[1]}", "one head size e for Q (e, d) and K (e, d) (e = d "
                   "when one of them is the identity)", f"row counts {sizes}")
    return Q, K, V


def _common_dimension(heads: list[Head], memory: Any) -> int | None:
    """The dimension d fixed by the given matrices or memory (None: any d)."""
    # Matrices act on column vectors of R^d: d is their column count (Q, K may be (e, d)).
    dims = {np.shape(m)[-1] for triple in heads for m in triple
            if m is not None and np.ndim(m) >= 1}
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
