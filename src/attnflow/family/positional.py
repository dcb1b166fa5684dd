"""Positional encodings of the attention scores (docs/science.md §6).

Token k of a sequence sits at position m_k = k + offset (indices from 0). An encoding changes
the scores of one head in one of two ways, and only those:

* it rotates queries and keys alike by their positions (`RoPE`): score(i, j) = beta <R_{m_i} q_i,
  R_{m_j} k_j>, which depends on the positions only through m_i - m_j;
* it adds a bias to the scores (`ALiBi`, `ScoreBias`): score(i, j) = beta <q_i, k_j> + b_ij.

Every encoding is a small frozen dataclass with `rotate(x, positions)` (identity when it
does not rotate), `bias(n, head, n_heads)` (None when it adds nothing), and a JSON record.
A new encoding is one more `Encoding` subclass (a registered part); the model composes them
without knowing which they are. Memory tokens (fixed keys) have no position: they are never
rotated nor biased.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnflow._array import check_parameter, is_tensor, namespace, to_numpy
from attnflow._checks import describe, fail, finite_array, number, positive
from attnflow.family.parts import Part, part_from_record, register
from attnflow.kernels.options import LinearBias

__all__ = ["ALiBi", "Encoding", "RoPE", "ScoreBias", "encoding_from_record"]

PAIRINGS = ("halves", "adjacent")


@dataclass(frozen=True)
class Encoding(Part):
    """Base class: an encoding that changes nothing (see the module docstring)."""

    slot: ClassVar[str] = "encoding"
    adds_bias: ClassVar[bool] = False  # True when `bias` returns an array

    def check(self, head_size: int | None, n_heads: int) -> None:
        """Raise ValueError if the encoding cannot act on heads of this size (None: not known
        yet) and number."""

    def rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Queries or keys (..., n, e) after the encoding, for tokens at `positions` (n,)
        (queries and keys are rotated alike)."""
        return x

    def bias(self, n: int, head: int, n_heads: int) -> np.ndarray | LinearBias | None:
        """The additive (n, n) score bias of one head: an array, a structured `LinearBias`,
        or None (no bias)."""
        return None



@register
@dataclass(frozen=True)
class RoPE(Encoding):
    """Rotary position embedding (Su et al.): pair p of a head's coordinates is rotated by the
    angle m omega_p at position m, with omega_p = base^(-2p/e) for head size e.

    base : > 0 (10000 in most models; 1e5 in SmolLM2). Pair 0 turns at frequency 1 for every
        base, so base -> infinity does not give back the plain model: it leaves that pair.
    pairing : "halves" pairs coordinates (p, p + e/2) (Hugging Face LLaMA weights);
        "adjacent" pairs (2p, 2p + 1) (GGUF files, whose converter permutes W_Q and W_K rows).
    offset : the position of the first token (positions are offset, offset + 1, ...).
    """

    base: float = 10000.0
    pairing: str = "halves"
    offset: float = 0.0
    name: ClassVar[str] = "rope"
    help: ClassVar[str] = "Rotary positions (per layer in a Stack), e.g. 10000:adjacent."
    text_help: ClassVar[str] = "none | BASE[:halves|adjacent[:OFFSET]]"

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", positive("rope.base", self.base))
        if self.pairing not in PAIRINGS:
            raise fail("rope.pairing", f"one of {PAIRINGS}", repr(self.pairing))
        object.__setattr__(self, "offset", number("rope.offset", self.offset))

    def check(self, head_size: int | None, n_heads: int) -> None:
        if head_size is not None and head_size % 2:
            raise fail("rope", "heads of even size (RoPE rotates pairs of coordinates)",
                       f"head size {head_size}")

    def frequencies(self, head_size: int) -> np.ndarray:
        """omega_p = base^(-2p/e), p = 0 .. e/2 - 1."""
        return self.base ** (-2.0 * np.arange(head_size // 2) / head_size)

    def rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        xp = namespace(x)
        e = x.shape[-1]
        freqs = (self.frequencies(e) if xp is np else self.base ** (
            -2.0 * xp.arange(e // 2, dtype=xp.float64, device=positions.device) / e))
        angles = (positions + self.offset)[:, None] * freqs
        # (n, e/2), computed in float64 and used in the dtype of x (float32 stays float32)
        cos, sin = xp.astype(xp.cos(angles), x.dtype), xp.astype(xp.sin(angles), x.dtype)
        half = e // 2
        if self.pairing == "halves":
            a, b = x[..., :half], x[..., half:]
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        if self.pairing == "halves":
            return xp.concat([ra, rb], axis=-1)
        return xp.reshape(xp.stack([ra, rb], axis=-1), x.shape)

    def to_record(self, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"kind": self.kind, "base": self.base, "pairing": self.pairing,
                "offset": self.offset}, {}

    @classmethod
    def parse(cls, text: str | None, name: str | None = None) -> RoPE | None:
        """A RoPE from ``BASE[:PAIRING[:OFFSET]]``, None from ``none`` or None."""
        name = name or cls.name
        if text is None or text == "none":
            return None
        parts = str(text).split(":")
        expected = "none or BASE[:halves|adjacent[:OFFSET]] with numbers BASE > 0 and OFFSET"
        if len(parts) > 3:
            raise fail(name, expected, repr(text))
        try:
            base = float(parts[0])
            offset = float(parts[2]) if len(parts) == 3 else 0.0
        except ValueError:
            raise fail(name, expected, repr(text)) from None
        try:
            return cls(base, parts[1] if len(parts) > 1 else "halves", offset)
        except ValueError as err:
            raise fail(name, expected, f"{text!r} ({err})") from None

    def text(self) -> str:
        return f"{self.base!r}:{self.pairing}:{self.offset!r}"


@register
@dataclass(frozen=True)
class ALiBi(Encoding):
    """Attention with linear biases (Press et al.): b_ij = -lambda_h |i - j| for head h (for
    causal masks only j <= i is seen, so this is -lambda_h (i - j) there).

    slopes : None for the default slopes lambda_h = 2^(-8 h / H), h = 1..H for H heads; one
        number >= 0 for every head; or a sequence of H numbers >= 0. Slope 0 is the plain model.
    """

    slopes: float | tuple[float, ...] | None = None
    name: ClassVar[str] = "alibi"
    help: ClassVar[str] = "Linear score biases; default slopes 2^(-8h/H)."
    text_help: ClassVar[str] = "none | default | S | S1,S2,... (per head)"
    kernel_options: ClassVar[frozenset[str]] = frozenset({"bias"})
    adds_bias: ClassVar[bool] = True

    def __post_init__(self) -> None:
        s = self.slopes
        if s is None:
            return
        if is_tensor(s):  # kept as a tensor (0-d, or one slope per head): gradients reach it
            check_parameter("alibi", s)
            if s.ndim > 1 or not bool((s.detach() >= 0).all()):
                raise fail("alibi", "slopes >= 0 in a 0-d or 1-d tensor", describe(s))
            return
        if isinstance(s, (int, float, np.integer, np.floating)) and not isinstance(s, bool):
            object.__setattr__(self, "slopes", number("alibi", s, 0.0,
                                                      expected="slopes >= 0"))
            return
        arr = finite_array("alibi", s, ndim=1, dtype=float)
        if arr.size == 0 or np.any(arr < 0):
            raise fail("alibi", "one slope >= 0 or a non-empty sequence of slopes >= 0",
                       describe(arr))
        object.__setattr__(self, "slopes", tuple(float(v) for v in arr))

    def slope(self, head: int, n_heads: int) -> float:
        """lambda of head `head` (0-based) among n_heads."""
        if self.slopes is None:
            return 2.0 ** (-8.0 * (head + 1) / n_heads)
        if isinstance(self.slopes, tuple) or (is_tensor(self.slopes) and self.slopes.ndim):
            return self.slopes[head]
        return self.slopes

    def check(self, head_size: int | None, n_heads: int) -> None:
        if (isinstance(self.slopes, tuple) or (is_tensor(self.slopes) and self.slopes.ndim)
                ) and len(self.slopes) != n_heads:
            raise fail("alibi", f"{n_heads} slopes (one per head)",
                       f"{len(self.slopes)} slopes")

    def bias(self, n: int, head: int, n_heads: int) -> LinearBias:
        """-lambda_h |i - j|, kept structured (`attnflow.kernels.options.LinearBias`): the
        harmonic kernels sum it over prefixes; the others receive its (n, n) matrix."""
        return LinearBias(self.slope(head, n_heads))

    def to_record(self, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        slopes = self.slopes
        if is_tensor(slopes):
            slopes = to_numpy(slopes).tolist()
        slopes = list(slopes) if isinstance(slopes, tuple) else slopes
        return {"kind": self.kind, "slopes": slopes}, {}

    @classmethod
    def parse(cls, text: str | None, name: str | None = None) -> ALiBi | None:
        """An ALiBi from ``default``, ``S`` or ``S1,S2,...``; None from ``none`` or None."""
        name = name or cls.name
        if text is None or text == "none":
            return None
        if text == "default":
            return cls()
        expected = "none, default, a slope S >= 0 or slopes S1,S2,... >= 0"
        try:
            values = [float(v) for v in str(text).split(",")]
        except ValueError:
            raise fail(name, expected, repr(text)) from None
        try:
            return cls(values[0] if len(values) == 1 else tuple(values))
        except ValueError:
            raise fail(name, expected, repr(text)) from None

    def text(self) -> str:
        if self.slopes is None:
            return "default"
        if isinstance(self.slopes, tuple):
            return ",".join(repr(v) for v in self.slopes)
        return repr(self.slopes)


@dataclass(frozen=True, eq=False)
class ScoreBias(Encoding):
    """Any additive score bias, one (n, n) float array shared by every head (entries may be
    -inf: a key the query may not see). Fixes the number of tokens to n."""

    matrix: np.ndarray = None  # type: ignore[assignment]
    kind: ClassVar[str] = "bias"
    kernel_options: ClassVar[frozenset[str]] = frozenset({"bias"})
    adds_bias: ClassVar[bool] = True

    def __post_init__(self) -> None:
        try:
            arr = np.array(self.matrix, dtype=float)
        except (TypeError, ValueError):
            raise fail("bias", "a float (n, n) array", repr(self.matrix)) from None
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
            raise fail("bias", "a float (n, n) array", describe(arr))
        if np.isnan(arr).any() or np.isposinf(arr).any():
            raise fail("bias", "finite entries or -inf", f"NaN or +inf in {describe(arr)}")
        arr.setflags(write=False)
        object.__setattr__(self, "matrix", arr)

    @property
    def n(self) -> int:
        return self.matrix.shape[0]

    def bias(self, n: int, head: int, n_heads: int) -> np.ndarray | None:
        if n != self.n:
            raise fail("X", f"n = {self.n} tokens to match the (n, n) bias", f"n = {n}")
        return self.matrix

    def to_record(self, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"kind": self.kind}, {"bias": self.matrix}




def as_rope(value: Any) -> RoPE | None:
    """A RoPE from a RoPE, a base (number), its text form ``BASE[:PAIRING[:OFFSET]]`` or
    ``none`` (as on the command line) or None."""
    if value is None or isinstance(value, RoPE):
        return value
    if isinstance(value, str):
        return RoPE.parse(value, "rope")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise fail("rope", "an attnflow.RoPE, a base > 0 or None", repr(value))
    return RoPE(base=float(value))


def as_alibi(value: Any) -> ALiBi | None:
    """An ALiBi from an ALiBi, slope(s), its text form (``default``, ``S``, ``S1,S2,...``,
    ``none``, as on the command line) or None."""
    if value is None or isinstance(value, ALiBi):
        return value
    if isinstance(value, str):
        return ALiBi.parse(value, "alibi")
    if is_tensor(value):
        return ALiBi(value)
    return ALiBi(value if np.ndim(value) == 0 else tuple(np.asarray(value, dtype=float)))


def encoding_from_record(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Encoding:
    """Inverse of `Encoding.to_record`."""
    kind = meta["kind"]
    if kind == "rope":
        return RoPE(meta["base"], meta["pairing"], meta["offset"])
    if kind == "alibi":
        s = meta["slopes"]
        return ALiBi(tuple(s) if isinstance(s, list) else s)
    if kind == "bias":
        return ScoreBias(arrays["bias"])
    encoding = part_from_record(meta, arrays)  # a registered encoding of another kind
    if not isinstance(encoding, Encoding):
        raise fail("record", "a positional encoding", repr(kind))
    return encoding

