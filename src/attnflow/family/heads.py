"""Attention heads: (Q, K, V) triples or (Q, K, V, O) quadruples, grouped-query sharing, and
QK-norm (docs/science.md §6, §8).

A head acts on the sublayer input u (..., n, d): queries q = u Q^T and keys k = u K^T of one
head size e (Q, K of shape (e, d); None is the identity, e = d), values v = u V^T. With three
matrices V is (d, d) and the head's output is sum_j w_ij v_j; with four, V is (f, d) and O
(d, f): the output is O sum_j w_ij v_j, the factored W_O^h W_V^h of a trained model (cheaper
when f < d). Heads that share a K or V array (grouped-query attention) compute it once.
`StackedHeads` stores a sublayer's matrices as blocks of one matrix per dtype, so that all
queries, keys and values come from one GEMM and all factored outputs from one more.

QK-norm (Gemma 3, OLMo 2) applies an RMSNorm with a gain to every head's queries and keys
before the positional rotation: q <- g_q * q / sqrt(mean(q^2) + eps), likewise k.

`ProjectionBias` holds the biases of a trained model's affine projections (BERT): q = u Q^T +
b_q^h, k = u K^T + b_k^h, v = u V^T + b_v^h per head, and b_o added once to the sublayer's
output. Under softmax a key bias only shifts every score of a row by <q_i, b_k>, which the
weights do not see; it is kept anyway, so that any weighting gets the trained model's scores.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnflow._array import check_parameter, is_tensor, like, namespace
from attnflow._checks import describe, fail, nonnegative
from attnflow.family.norms import RMSNorm
from attnflow.family.parts import Part, register

__all__ = ["Head", "ProjectionBias", "QKNorm", "StackedHeads", "check_head", "common_dimension",
           "dimension_sources"]

Head = tuple[Any, ...]


@register
@dataclass(frozen=True, eq=False)
class QKNorm(Part):
    """RMSNorm of every head's queries and keys: gains gain_q, gain_k of shape (e,) (None:
    ones), eps >= 0."""

    gain_q: Any = None
    gain_k: Any = None
    eps: float = 1e-6
    name: ClassVar[str] = "qk_norm"
    slot: ClassVar[str] = "qk_norm"
    help: ClassVar[str] = "RMSNorm of queries and keys per head (Gemma 3), gains 1 from text."
    text_help: ClassVar[str] = "none | rms[:EPS]"

    def __post_init__(self) -> None:
        for attr in ("gain_q", "gain_k"):
            g = getattr(self, attr)
            if g is not None:
                object.__setattr__(self, attr, check_parameter(f"qk_norm.{attr}", g, ndim=1))
        object.__setattr__(self, "eps", nonnegative("qk_norm.eps", self.eps))

    @property
    def q(self) -> RMSNorm:
        return RMSNorm(self.gain_q, self.eps)

    @property
    def k(self) -> RMSNorm:
        return RMSNorm(self.gain_k, self.eps)

    def check(self, head_size: int | None) -> None:
        """Raise ValueError if a gain does not match the head size e."""
        for attr in ("gain_q", "gain_k"):
            g = getattr(self, attr)
            if g is not None and head_size is not None and g.shape[0] != head_size:
                raise fail(f"qk_norm.{attr}", f"a gain of shape ({head_size},) (the head size)",
                           describe(g))

    @classmethod
    def parse(cls, text: str | None, name: str | None = None) -> QKNorm | None:
        if text is None or text == "none":
            return None
        head, _, eps = str(text).partition(":")
        try:
            if head == "rms":
                return cls(eps=float(eps) if eps else 1e-6)
        except ValueError:
            pass
        raise fail(name or cls.name, "none, rms or rms:EPS with a number EPS >= 0", repr(text))

    def text(self) -> str:
        return f"rms:{self.eps!r}"


@dataclass(frozen=True, eq=False)
class ProjectionBias(Part):
    """Biases of the attention sublayer's projections (module docstring): q, k of shape
    (H, e), v of shape (H, f) (f = d for (Q, K, V) heads, V's rows for (Q, K, V, O) heads), o
    of shape (d,); None is no bias. Given as arrays only (not a text option)."""

    q: Any = None
    k: Any = None
    v: Any = None
    o: Any = None
    kind: ClassVar[str] = "projection_bias"
    slot: ClassVar[str] = "biases"

    def __post_init__(self) -> None:
        for attr, ndim in (("q", 2), ("k", 2), ("v", 2), ("o", 1)):
            b = getattr(self, attr)
            if b is not None:
                object.__setattr__(self, attr, check_parameter(f"biases.{attr}", b, ndim=ndim))

    def check(self, heads: Sequence[tuple[np.ndarray | None, ...]], d: int | None) -> None:
        """Raise ValueError unless each bias has one row per head of its projection's size."""
        for attr, index in (("q", 0), ("k", 1), ("v", 2)):
            b = getattr(self, attr)
            if b is None:
                continue
            sizes = [d if M is None else M.shape[0] for M in (h[index] for h in heads)]
            if b.shape[0] != len(heads) or any(s is not None and s != b.shape[1]
                                               for s in sizes):
                raise fail(f"biases.{attr}", f"shape ({len(heads)}, size) with the sizes "
                           f"{sizes} of the heads' {'QKV'[index]}", describe(b))
        if self.o is not None and d is not None and self.o.shape != (d,):
            raise fail("biases.o", f"shape ({d},)", describe(self.o))

    def add(self, attr: str, x: np.ndarray, head: int | None = None) -> np.ndarray:
        """x plus the bias `attr` ("q", "k", "v": of head `head`; "o"), in x's dtype."""
        b = getattr(self, attr)
        if b is None:
            return x
        return x + like(b if head is None else b[head], x)


def check_head(head: Head, d: int | None, h: int | None) -> tuple[np.ndarray | None, ...]:
    """Q, K as (e, d) with one head size e; V as (d, d), or V (f, d) with O (d, f); None
    stays the identity. Floating arrays keep their dtype (float32 weights stay float32)."""
    prefix = "" if h is None else f"heads[{h}]."
    names = tuple(f"{prefix}{m}" for m in "QKVO"[:len(head)])
    mats = tuple(None if m is None else _matrix(name, m) for name, m in zip(names, head))
    Q, K, V = mats[:3]
    O = mats[3] if len(mats) == 4 else None
    if len(mats) == 4:
        if V is None or O is None:
            raise fail(f"{names[2]}, {names[3]}", "V (f, d) and O (d, f) both given with O",
                       f"V {describe(V)}, O {describe(O)}")
        if (d is not None and V.shape[1] != d) or O.shape != (V.shape[1], V.shape[0]):
            raise fail(f"{names[2]}, {names[3]}", f"V of shape (f, {d}) and O of shape "
                       f"({d}, f)", f"V {describe(V)}, O {describe(O)}")
    elif V is not None and (V.shape[0] != V.shape[1] or (d is not None and V.shape[0] != d)):
        want = f"a ({d}, {d}) matrix" if d is not None else "a square matrix"
        raise fail(names[2], want, describe(V))
    sizes = {name: m.shape[0] for name, m in zip(names[:2], (Q, K)) if m is not None}
    for name, m in zip(names[:2], (Q, K)):
        if m is not None and (m.shape[0] == 0 or (d is not None and m.shape[1] != d)):
            raise fail(name, f"an (e, {d}) matrix with e >= 1", describe(m))
    if len(sizes) == 1 and d is not None and d not in sizes.values():
        (name, m), = [(n, m) for n, m in zip(names[:2], (Q, K)) if m is not None]
        other = names[1] if name == names[0] else names[0]
        raise fail(name, f"a square matrix: {other} is the identity, so the head size e (the "
                   f"rows) must equal d = {d} (the columns)",
                   f"{describe(m)}: {m.shape[0]} rows, {m.shape[1]} columns")
    if len(set(sizes.values())) > 1:
        raise fail(f"{names[0]}, {names[1]}", "one head size e for Q (e, d) and K (e, d) (e = d "
                   "when one of them is the identity)", f"row counts {sizes}")
    return (Q, K, V) if len(mats) == 3 else (Q, K, V, O)


def _matrix(name: str, m: Any) -> np.ndarray:
    """A finite float (rows, cols) matrix; a tensor stays a tensor (`check_parameter`)."""
    return check_parameter(name, m, ndim=2)


def dimension_sources(heads: list[Head], memory: Any, single: bool = False
                      ) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Which given arrays fix the dimension d: name -> (d, shape). Matrices act on column
    vectors of R^d, so d is the column count of Q, K, V and the row count of O; the memory's
    points are (m, d). `single`: the one head was given as Q, K, V (names without heads[0].)."""
    out: dict[str, tuple[int, tuple[int, ...]]] = {}
    for h, head in enumerate(heads):
        prefix = "" if single else f"heads[{h}]."
        for i, (letter, m) in enumerate(zip("QKVO", head)):
            if m is not None and np.ndim(m) == 2:
                shape = np.shape(m)
                out[prefix + letter] = (shape[0] if i == 3 else shape[1], shape)
    if memory is not None:
        try:
            points = memory[0] if is_tensor(memory[0]) else np.asarray(memory[0])
        except (TypeError, IndexError) as err:
            raise fail("memory", "a (points, weights) pair", repr(memory)) from err
        if points.ndim == 2:
            out["memory"] = (points.shape[1], points.shape)
    return out


def common_dimension(heads: list[Head], memory: Any, single: bool = False
                     ) -> tuple[int | None, tuple[str, tuple[int, ...]] | None]:
    """The dimension d fixed by the given matrices or memory (None: any d) and the name and
    shape of the first array that fixes it (`dimension_sources`); arrays that disagree are an
    error that names each with its d."""
    sources = dimension_sources(heads, memory, single)
    dims = {dim for dim, _ in sources.values()}
    if len(dims) > 1:
        raise fail(", ".join(sources), "one dimension d (the columns of Q, K, V, the rows of "
                   "O, the columns of the memory points)",
                   ", ".join(f"{name} of shape {shape} (d = {dim})"
                             for name, (dim, shape) in sources.items()))
    first = next(iter(sources), None)
    return (None, None) if first is None else (sources[first][0], (first, sources[first][1]))


class StackedHeads:
    """Checked heads (`check_head`) whose matrices are views of stacked ones, one per dtype:
    the distinct Q, K, V matrices (an array shared by grouped-query heads counted once) as
    blocks of rows of one (sum of rows, d) matrix, the O matrices of the factored heads as
    blocks of columns of one (d, sum of f) matrix. Then `project` is one GEMM per dtype for
    every head's queries, keys and values, and `combine` one GEMM per dtype for every factored
    head's output (at SmolLM2's shapes, head size 64, nine thin GEMMs took about twice the
    time of one wide one: benchmarks/w6.py). `heads` are the heads with those views (shared
    arrays stay shared); identities (None) stay None. Tensors are not stacked: each is its
    own block, so that gradients and in-place updates reach the tensor the user holds.
    """

    def __init__(self, heads: Sequence[tuple[np.ndarray | None, ...]]) -> None:
        distinct = {id(m): m for head in heads for m in head[:3] if m is not None}
        self.inputs = _stacks(list(distinct.items()), axis=0)
        view = {key: v for _, members in self.inputs for key, v in members}
        factored = [(h, head[3]) for h, head in enumerate(heads) if len(head) == 4]
        self.outputs = _stacks(factored, axis=1)
        o_view = {h: v for _, members in self.outputs for h, v in members}
        self.heads: list[tuple[np.ndarray | None, ...]] = [
            tuple(None if m is None else view[id(m)] for m in head[:3])
            + ((o_view[h],) if len(head) == 4 else ()) for h, head in enumerate(heads)]

    def project(self, u: np.ndarray) -> dict[int, np.ndarray]:
        """u M^T (..., n, rows of M) for every matrix M among the heads' Q, K, V, keyed by
        id(M) (M as in `heads`): column blocks of one product per dtype."""
        out = {}
        for W, members in self.inputs:
            p = u @ like(W, u).T if not isinstance(u, np.ndarray) else u @ W.T
            start = 0
            for _, v in members:
                out[id(v)] = p[..., start:start + v.shape[0]]
                start += v.shape[0]
        return out

    def combine(self, ys: Sequence[np.ndarray]) -> np.ndarray:
        """The sum over heads of their outputs, given their attention-weighted values ys:
        O_h y_h for the factored heads (one product per dtype of the y_h side by side with
        the stacked O), y_h for the others."""
        factored = {h for _, members in self.outputs for h, _ in members}
        out = None
        for h, y in enumerate(ys):
            if h not in factored:
                out = y if out is None else out + y
        for W, members in self.outputs:
            if isinstance(ys[0], np.ndarray):
                y = np.concatenate([ys[h] for h, _ in members], axis=-1) @ W.T
            else:
                y = namespace(ys[0]).concat([ys[h] for h, _ in members], axis=-1) \
                    @ like(W, ys[0]).T
            out = y if out is None else out + y
        return out


def _stacks(items: list[tuple[Hashable, np.ndarray]], axis: int
            ) -> list[tuple[np.ndarray, list[tuple[Hashable, np.ndarray]]]]:
    """Per dtype among the (key, matrix) items, in order: the matrices concatenated along
    `axis` (W) and each item's key with its block of W (a view)."""
    groups: dict[np.dtype, list[tuple[Hashable, np.ndarray]]] = {}
    for key, m in items:
        groups.setdefault(m.dtype, []).append((key, m))
    stacks = []
    for group in groups.values():
        if is_tensor(group[0][1]):  # tensors stay themselves: a fit updating them in place
            stacks.extend((m, [(key, m)]) for key, m in group)  # is seen by the next call
            continue
        W = namespace(*(m for _, m in group)).concat([m for _, m in group], axis=axis)
        members, start = [], 0
        for key, m in group:
            stop = start + m.shape[axis]
            members.append((key, W[start:stop] if axis == 0 else W[:, start:stop]))
            start = stop
        stacks.append((W, members))
    return stacks
