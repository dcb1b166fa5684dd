"""The attention sublayer: heads, scores, weights, values (docs/science.md §1, §6).

For sublayer inputs u of shape (..., n, d) (rows are tokens; the directions theta = x / |x|
of the state for the idealised schemes, RMSNorm(x) for a trained model's, see
`attnflow.family.schemes`) and one head (Q, K, V), the output at token k is

    A_k = sum_j w_kj V u_j,  w_kj = softmax_j(beta <Q u_k, K u_j> + b_kj), j in mask(k)

Several heads are summed (``combine="sum"``, the default, as in a Transformer layer whose head
outputs add into the residual stream) or averaged (``combine="mean"``). The scores may be
changed by positional encodings (`attnflow.family.positional`: RoPE rotates q and k, ALiBi and
any (n, n) array add a bias b), by QK-norm and by the biases of affine projections
(`attnflow.family.heads`), and the weights
normalised otherwise than by softmax (`attnflow.family.weighting`). Memory tokens (fixed points
m_j with multiplicities a_j) join every token's keys and values with log a_j added to their
scores: the frozen-centers model of Theorem 5.2 is causal attention with memory. A block
(`attnflow.family.block`) puts this sublayer, and optionally a feed-forward one, into a scheme.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnflow._array import (
    arange,
    check_parameter,
    check_tokens,
    is_tensor,
    like,
    scalar,
    tensor_scalar,
    to_numpy,
)
from attnflow._checks import describe, fail, inverse_temperature
from attnflow.family.heads import (
    Head,
    ProjectionBias,
    QKNorm,
    StackedHeads,
    check_head,
    common_dimension,
)
from attnflow.family.jacobian import head_jacobian
from attnflow.family.parts import part_from_record
from attnflow.family.positional import (
    Encoding,
    ScoreBias,
    encoding_from_record,
)
from attnflow.family.strength import Strength, as_strength
from attnflow.family.weighting import Weighting, as_weighting
from attnflow.kernels import SUPPORTS, Kernel, Memory, auto, get_kernel, hardmax, options, supports
from attnflow.kernels.dense import attention_weights
from attnflow.kernels.masks import (
    MaskSpec,
    check_mask,
    is_lower_triangular,
    mask_from_record,
    mask_matrix,
    mask_to_record,
)
from attnflow.manifolds import sphere_tolerance

__all__ = ["SelfAttention"]


class SelfAttention:
    """The attention sublayer of a block (module docstring).

    Parameters
    ----------
    heads : a non-empty list of (Q, K, V) triples or (Q, K, V, O) quadruples
        (`attnflow.family.heads`); Q, K of shape (e, d) with one head size e per head, None
        the identity. Grouped-query heads share their K and V: pass the same arrays.
    beta : inverse temperature, a real number of either sign (beta < 0: repulsive), or +-inf:
        hardmax attention (each token attends to its leaders, the keys of largest score,
        of smallest at -inf; ties share; `attnflow.kernels.hardmax`), without score
        biases, memory or another weighting.
    mask : "causal" (default), "full", ("window", w) (a causal sliding window of w tokens) or
        a boolean (n, n) array.
    memory : optional (points (m, d) on the sphere, weights (m,) > 0): fixed tokens every
        token also attends to, each counted with multiplicity a_j (Theorem 5.2: a_j >= 1).
    combine : "sum" (default) or "mean" over heads.
    backend : the attention kernel (`attnflow.kernels.KERNELS`): "auto" (default) picks the
        fastest kernel that has the sublayer's options per call; "dense" is the reference.
    weighting : a `Weighting` or its short forms: "softmax" (default), "unnormalised",
        "positional", "sinkhorn" / ("sinkhorn", it).
    encodings : positional encodings (`Encoding` parts: RoPE, ALiBi, ScoreBias, ...), applied
        in order.
    qk_norm : a `QKNorm` or None.
    biases : a `ProjectionBias` (the biases of q, k, v per head and of the output) or None.
    single : the one head was given as Q, K, V (errors name "Q", not "heads[0].Q").
    strength : the interaction strength K > 0 (a number or a `Strength`): the output is K
        times the sum (or mean) above; 1 (default) leaves it as it is.
    """

    def __init__(
        self,
        heads: Sequence[Head],
        beta: float = 1.0,
        mask: MaskSpec = "causal",
        memory: tuple[Any, Any] | None = None,
        combine: str = "sum",
        backend: str = "auto",
        weighting: Weighting | str | tuple = "softmax",
        encodings: Sequence[Encoding] = (),
        qk_norm: QKNorm | None = None,
        biases: ProjectionBias | None = None,
        single: bool = False,
        strength: Strength | float = 1.0,
    ) -> None:
        self.beta = (tensor_scalar("beta", beta, expected="a finite beta (a tensor beta: "
                                   "gradients reach it)") if is_tensor(beta)
                     else inverse_temperature("beta", beta))
        self.strength = as_strength(strength)
        self.mask = check_mask(mask)
        if combine not in ("sum", "mean"):
            raise fail("combine", "'sum' or 'mean'", repr(combine))
        self.combine = combine
        get_kernel(backend)  # validates the name
        self.backend = backend
        self.weighting = as_weighting(weighting)
        if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence):
            raise fail("heads", "a list of (Q, K, V) triples", repr(heads))
        if len(heads) == 0:
            raise fail("heads", "a non-empty list of (Q, K, V) triples", "an empty list")
        raw = list(heads)
        for h, head in enumerate(raw):
            if not isinstance(head, (tuple, list)) or len(head) not in (3, 4):
                raise fail(f"heads[{h}]", "a (Q, K, V) triple or a (Q, K, V, O) quadruple",
                           repr(head)[:80])
        self.d, self._d_source = common_dimension(raw, memory, single)
        self._stacked = StackedHeads([check_head(head, self.d, None if single else h)
                                      for h, head in enumerate(raw)])
        self.heads: list[tuple[np.ndarray | None, ...]] = self._stacked.heads
        self.memory = None if memory is None else _check_memory(memory, self.d)
        for e in encodings:
            if not isinstance(e, Encoding):
                raise fail("encodings", "positional encodings (attnflow Encoding parts)",
                           type(e).__name__)
        kinds = [e.kind for e in encodings]
        twice = sorted({k for k in kinds if kinds.count(k) > 1})
        if twice:
            raise fail(twice[0], "one encoding of each kind (a part given once)",
                       f"{kinds.count(twice[0])} of kind {twice[0]!r}")
        self.encodings: tuple[Encoding, ...] = tuple(encodings)
        if qk_norm is not None and not isinstance(qk_norm, QKNorm):
            raise fail("qk_norm", "an attnflow.QKNorm or None", type(qk_norm).__name__)
        self.qk_norm = qk_norm
        if biases is not None:
            if not isinstance(biases, ProjectionBias):
                raise fail("biases", "an attnflow.ProjectionBias or None", type(biases).__name__)
            biases.check(self.heads, self.d)
            if self.memory is not None:
                raise fail("biases", "None with memory tokens (memory keys and values are "
                           "unbiased points)", "biases and memory")
        self.biases = biases
        for Qh, Kh, *_ in self.heads:  # (head size None: identities of any d, checked on X)
            e = self.head_size(Qh, Kh)
            for enc in self.encodings:
                enc.check(e, len(self.heads))
            if qk_norm is not None:
                qk_norm.check(e)
        self._check_options()

    @property
    def normalization(self) -> str | tuple[str, int]:
        """The kernels' normalization argument ("softmax", "unnormalised", "positional",
        ("sinkhorn", it))."""
        return self.weighting.kernel_arg

    # ------------------------------------------------------------------ properties
    def _check_options(self) -> None:
        """Options that exclude each other, rows left with nothing to attend to, a backend
        without the sublayer's options."""
        if self.weighting.method == "sinkhorn" and (self.mask != "full"
                                                    or self.memory is not None):
            raise fail("attention", "'sinkhorn' with mask='full' and no memory (a doubly "
                       "stochastic matrix needs every token to see every token)",
                       f"mask {_mask_name(self.mask)!r}"
                       + (" with memory" if self.memory is not None else ""))
        if self.is_hardmax:
            other = sorted(self.options - {"hardmax"}) + (
                ["memory"] if self.memory is not None else [])
            if other:
                raise fail("beta", "a finite beta with " + " and ".join(other) + " (at beta = "
                           "+-inf, hardmax, a finite score bias or memory log-weight is "
                           "negligible and unnormalised or Sinkhorn weights have no limit)",
                           repr(self.beta))
        n = self.fixed_n
        if n is not None and self.memory is None:
            allowed = mask_matrix(self.mask, n)
            b = options.check_bias(self.score_bias(n, 0), n)
            if b is not None:
                allowed = allowed & np.isfinite(b)
            empty = np.flatnonzero(~allowed.any(axis=1))
            if empty.size:
                raise fail("mask", "every row to allow at least one key (or memory tokens "
                           "to attend to)", f"no key allowed in row(s) {empty[:10].tolist()}")
        if self.backend != "auto":
            missing = self.options - supports(self.backend)
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
        """The kernel options this sublayer needs ("bias", "unnormalised", "positional",
        "sinkhorn", "hardmax")."""
        bias = np.zeros(0) if any(e.adds_bias for e in self.encodings) else None
        return options.needed(bias, self.normalization, self.beta)

    @property
    def is_hardmax(self) -> bool:
        """True at beta = +-inf (hardmax attention)."""
        return options.is_hardmax(self.beta)

    @property
    def has_exact_jacobian(self) -> bool:
        """True when `jacobian_parts` is available: softmax at a finite beta, no positional
        encoding, no QK-norm, no biases, no factored (Q, K, V, O) heads."""
        return (self.normalization == "softmax" and not self.encodings and not self.is_hardmax
                and self.qk_norm is None and self.biases is None
                and all(len(h) == 3 for h in self.heads))

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
        extra += ", qk_norm" if self.qk_norm is not None else ""
        extra += ", biases" if self.biases is not None else ""
        extra += f", strength={self.strength!r}" if self.strength != 1.0 else ""
        return (f"d={self.d}, beta={self.beta}, mask={mask!r}, heads={len(self.heads)}, "
                f"combine={self.combine!r}, memory={mem}, attention={self.normalization!r}"
                f"{extra}, backend={self.backend!r}")

    # ------------------------------------------------------------------ the output
    def check_tokens(self, X: Any, name: str = "X") -> np.ndarray:
        """Validate a token array of shape (..., n, d) for this sublayer (a float array, or
        a floating torch tensor, kept as it is)."""
        X = check_tokens(name, X, min_ndim=2)
        if self.d is not None and X.ndim >= 1 and X.shape[-1] != self.d:
            raise self._dimension_error(X, name)
        if X.shape[-2] == 0 or X.shape[-1] == 0 or np.prod(X.shape) == 0:
            raise fail(name, "at least one token of dimension >= 1", describe(X))
        for Qh, Kh, *_ in self.heads:
            e = self.head_size(Qh, Kh, X.shape[-1])
            for enc in self.encodings:
                enc.check(e, len(self.heads))
            if self.qk_norm is not None:
                self.qk_norm.check(e)
        n = self.fixed_n
        if n is not None and n != X.shape[-2]:
            raise fail(name, f"n = {n} tokens to match the model's (n, n) mask or bias",
                       describe(X))
        return X

    def _dimension_error(self, X: np.ndarray, name: str) -> ValueError:
        """Tokens of another dimension than the sublayer's d: the error names the array that
        fixed d (Q, V, memory, ...), since the tokens' d is usually the one meant."""
        source, shape = self._d_source
        what = "points" if source == "memory" else "a matrix"
        return fail(source, f"{what} for d = {X.shape[-1]}, the dimension of {name} (..., n, "
                    f"{X.shape[-1]})", f"shape {shape}, which makes d = {self.d}")

    def kernel_for(self, X: np.ndarray, unit_tokens: bool = True) -> Kernel:
        """The kernel for tokens shaped like X (..., n, d): the backend's, or for "auto" the
        one it picks for that shape and the sublayer's options (never a harmonic one unless
        `unit_tokens`: inputs of one norm). `simulate` fixes it for a whole run, so that
        stepping shares of the runs in parallel never switches kernels. Torch tensors get a
        kernel on their device (`auto.choose_tensor`; backend "auto", or "torch": SDPA)."""
        e = max(self.head_size(Q, K, X.shape[-1]) for Q, K, *_ in self.heads)
        if is_tensor(X):
            if self.backend not in ("auto", "torch"):
                raise fail("backend", "'auto' or 'torch' for torch tensors (the other kernels "
                           "are numpy's)", repr(self.backend))
            return auto.choose_tensor(X, e, bias=self.score_bias(X.shape[-2], 0),
                                      normalization=self.normalization, mask=self.mask,
                                      beta=self.beta, memory=self.memory is not None,
                                      backend=self.backend)
        if self.backend != "auto":
            return get_kernel(self.backend)
        q = np.broadcast_to(np.zeros((), X.dtype), (*X.shape[:-1], e))
        return auto.choose(q, X, bias=self.score_bias(X.shape[-2], 0),
                           normalization=self.normalization,
                           mask=self.mask if unit_tokens else None, beta=self.beta)

    def output(self, u: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """A: the sum (or mean) over heads of the attention-weighted values at the inputs
        u (..., n, d) -> (..., n, d). `kernel` defaults to the backend's."""
        if kernel is None:
            kernel = self.kernel_for(u) if is_tensor(u) else get_kernel(self.backend)
        n = u.shape[-2]
        positions = arange(n, u)
        projected = self._stacked.project(u)  # u M^T of every distinct Q, K, V: one GEMM

        def product(M: np.ndarray | None) -> np.ndarray:
            return u if M is None else projected[id(M)]

        ys = []
        keys: dict[int, np.ndarray] = {}  # shared K of grouped-query heads, rotated once
        b = self.biases
        for h, head in enumerate(self.heads):
            Q, K, V = head[:3]
            q = self._query_key(product(Q), positions, "q", h)
            if b is None:  # (per-head biases make every head's keys its own)
                if K is Q:  # normalised and rotated alike: Q = K gives k = q
                    keys[id(K)] = q
                k = keys.get(id(K))
                if k is None:
                    k = keys[id(K)] = self._query_key(product(K), positions, "k", h)
            else:
                k = self._query_key(product(K), positions, "k", h)
            v = product(V) if b is None else b.add("v", product(V), h)
            ys.append(kernel(q, k, v, self.beta, self.mask, self._memory(K, V, u),
                             bias=self.score_bias(n, h), normalization=self.normalization))
        out = self._stacked.combine(ys)
        if self.combine == "mean" and len(self.heads) > 1:
            out = out / len(self.heads)
        out = out if b is None else b.add("o", out)
        if not is_tensor(self.strength) and self.strength == 1.0:
            return out
        return self.strength * out

    def _query_key(self, x: np.ndarray, positions: np.ndarray, which: str, head: int
                   ) -> np.ndarray:
        """Queries (which = "q") or keys ("k") of one head from x = u M^T: biased, QK-normed,
        rotated."""
        if self.biases is not None:
            x = self.biases.add(which, x, head)
        if self.qk_norm is not None:
            x = (self.qk_norm.q if which == "q" else self.qk_norm.k)(x)
        for e in self.encodings:
            x = e.rotate(x, positions)
        return x

    def score_bias(self, n: int, head: int) -> np.ndarray | options.LinearBias | None:
        """The additive score bias of one head, or None: one encoding's as it gives it (a
        structured `LinearBias` stays one, for the harmonic kernels), the (n, n) sum of
        several."""
        parts = []  # a loop, not a comprehension with :=, which torch.compile cannot trace
        for e in self.encodings:
            b = e.bias(n, head, len(self.heads))
            if b is not None:
                parts.append(b)
        if len(parts) <= 1:
            return parts[0] if parts else None
        return sum(options.check_bias(b, n) for b in parts)

    def _memory(self, K: np.ndarray | None, V: np.ndarray | None, u: Any = None
                ) -> Memory | None:
        """Memory keys and values of one head, or None without memory (in the library,
        dtype and device of the inputs u where u is a tensor)."""
        if self.memory is None:
            return None
        points, weights = self.memory
        if is_tensor(u):
            points = like(points, u)
            return Memory(k=points if K is None else points @ like(K, u).T,
                          v=points if V is None else points @ like(V, u).T,
                          log_weights=like(weights, u).log())
        return Memory(
            k=points if K is None else points @ K.T,
            v=points if V is None else points @ V.T,
            log_weights=np.log(weights),
        )

    def jacobian_parts(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The output a (..., n, d) at inputs X and its derivative Da (..., n, d, n, d)
        (`attnflow.family.jacobian`), when `has_exact_jacobian`."""
        a = Da = None
        for Q, K, V in self.heads:
            a_h, Da_h = head_jacobian(X, Q, K, V, self.beta, self.mask, self._memory(K, V))
            a, Da = (a_h, Da_h) if a is None else (a + a_h, Da + Da_h)
        if self.combine == "mean" and len(self.heads) > 1:
            a, Da = a / len(self.heads), Da / len(self.heads)
        if self.strength != 1.0:  # the strength scales the output and its derivative
            a, Da = self.strength * a, self.strength * Da
        return a, Da

    def hardmax_scores(self, u: np.ndarray, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """At beta = +-inf: the signed scores sign(beta) <q_i, k_j> (..., n, n) of one head
        at the inputs u (-inf where the mask forbids a key) and each row's tie tolerance
        (..., n) (`attnflow.kernels.hardmax`)."""
        positions = np.arange(u.shape[-2], dtype=float)
        Q, K = self.heads[head][:2]
        q, k = (self._query_key(u if M is None else u @ M.T, positions, which, head)
                for M, which in ((Q, "q"), (K, "k")))
        return (hardmax.scores(q, k, self.beta, self.mask),
                hardmax.tie_tolerance(q, k, self.mask))

    def weights(self, u: np.ndarray, head: int = 0) -> np.ndarray:
        """The attention weights of one head (0-based), (..., n, n + m) (m memory columns
        last), at the inputs u."""
        if (isinstance(head, bool) or not isinstance(head, (int, np.integer))
                or not 0 <= head < len(self.heads)):
            raise fail("head", f"a head index in [0, {len(self.heads) - 1}]", repr(head))
        n = u.shape[-2]
        positions = np.arange(n, dtype=float)
        Q, K, V = self.heads[head][:3]
        q, k = (self._query_key(u if M is None else u @ M.T, positions, which, head)
                for M, which in ((Q, "q"), (K, "k")))
        return attention_weights(q, k, self.beta, self.mask, self._memory(K, V),
                                 bias=self.score_bias(n, head),
                                 normalization=self.normalization)

    # ------------------------------------------------------------------ records
    def to_record(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A JSON-friendly description and a dict of named arrays (the format of attnflow's
        one-layer records since the first release, plus "qk_norm" and factored heads)."""
        arrays: dict[str, np.ndarray] = {}
        identity: list[list[bool]] = []
        for h, head in enumerate(self.heads):
            identity.append([m is None for m in head])
            for name, m in zip("QKVO", head):
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
            "beta": scalar(self.beta),
            "mask": mask_to_record(self.mask, arrays),
            "combine": self.combine,
            "backend": self.backend,
            "n_heads": len(self.heads),
            "identity": identity,
            "attention": normalization,
            "encodings": encodings,
        }
        if self.qk_norm is not None:
            meta["qk_norm"], qk_arrays = self.qk_norm.to_record("qk_")
            arrays.update(qk_arrays)
        if self.biases is not None:
            meta["biases"], bias_arrays = self.biases.to_record("bias_")
            arrays.update(bias_arrays)
        if self.strength != 1.0:  # (absent at K = 1: records of earlier versions read as 1)
            meta["strength"] = Strength(scalar(self.strength)).to_record()[0]
        return meta, arrays

    @classmethod
    def from_record(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]
                    ) -> SelfAttention:
        """Inverse of `to_record` (records written before the model family read as softmax
        attention without positions)."""
        heads = []
        for h, ident in enumerate(meta["identity"]):
            heads.append(tuple(None if ident[i] else arrays[f"{name}_{h}"]
                               for i, name in enumerate("QKVO"[:len(ident)])))
        memory = None
        if "memory_points" in arrays:
            memory = (arrays["memory_points"], arrays["memory_weights"])
        attention = meta.get("attention", "softmax")
        qk = meta.get("qk_norm")
        biases = meta.get("biases")
        return cls(heads, beta=meta["beta"], mask=mask_from_record(meta["mask"], arrays),
                   memory=memory, combine=meta["combine"], backend=meta["backend"],
                   weighting=tuple(attention) if isinstance(attention, list) else attention,
                   encodings=[encoding_from_record(rec, arrays)
                              for rec in meta.get("encodings", [])],
                   qk_norm=None if qk is None else QKNorm.from_record(qk, arrays),
                   biases=None if biases is None else ProjectionBias.from_record(biases, arrays),
                   single=meta["n_heads"] == 1,
                   strength=(part_from_record(meta["strength"], arrays) if "strength" in meta
                             else 1.0))


def _mask_name(mask: MaskSpec) -> str:
    return "array" if isinstance(mask, np.ndarray) else str(mask)


def _check_memory(memory: Any, d: int | None) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(memory, (tuple, list)) or len(memory) != 2:
        raise fail("memory", "a (points, weights) pair", repr(memory))
    # tensors stay themselves (their gradients reach the memory); the checks read host copies
    points = check_parameter("memory points", memory[0], ndim=2, dtype=float)
    weights = check_parameter("memory weights", memory[1], ndim=1, dtype=float)
    host_points, host_weights = to_numpy(points), to_numpy(weights)
    if d is not None and points.shape[1] != d:
        raise fail("memory points", f"an (m, {d}) array", describe(host_points))
    if weights.shape[0] != points.shape[0]:
        raise fail("memory weights", f"an array of shape ({points.shape[0]},)",
                   describe(host_weights))
    if np.any(host_weights <= 0):
        raise fail("memory weights", "multiplicities > 0", f"min {host_weights.min()}")
    off = float(np.max(np.abs(np.linalg.norm(host_points, axis=1) - 1.0)))
    if off > sphere_tolerance(host_points.dtype):
        raise fail("memory points", "unit vectors (points on the sphere)",
                   f"norms off 1 by up to {off:.3g}")
    return points, weights
