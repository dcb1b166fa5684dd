"""The feed-forward term: a token-wise MLP sublayer (docs/science.md §8).

For a sublayer input u (..., n, d), with W_up, W_gate of shape (h, d) (h the hidden width)
and W_down of shape (d, h), and optional biases b_up (h,) and b_down (d,) (BERT's; written
W_up u for W_up u + b_up and likewise W_down below):

==========  ===========================================  ==========================
activation  m(u)                                         used by
==========  ===========================================  ==========================
swiglu      W_down (silu(W_gate u) * (W_up u))           LLaMA, SmolLM2
geglu       W_down (gelu_tanh(W_gate u) * (W_up u))      Gemma
gelu        W_down gelu(W_up u)   (exact, erf)           GPT-2 (tanh form), BERT
relu        W_down relu(W_up u)                          the original Transformer
==========  ===========================================  ==========================

silu(z) = z / (1 + e^-z); gelu(z) = z Phi(z); gelu_tanh(z) = z (1 + tanh(c (z + 0.044715 z^3)))
/ 2 with c = sqrt(2 / pi). The MLP acts on each token alone, so its Jacobian is block
diagonal (`MLP.jacobian`, used by the implicit methods).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.special import erf, expit

from attnflow._array import check_parameter, like, namespace
from attnflow._array import erf as any_erf
from attnflow._checks import describe, fail, integer
from attnflow._memory import check_allocation

__all__ = ["ACTIVATIONS", "MLP"]

from attnflow.family.parts import Part, register

_C = np.sqrt(2.0 / np.pi)
GATED = ("swiglu", "geglu")
ACTIVATIONS = (*GATED, "gelu", "relu")


def _act(name: str, z: np.ndarray) -> np.ndarray:
    """The activation sigma(z), elementwise (z may be overwritten: pass a temporary): the
    values of `_act_derivative`'s first output without its derivative's passes over z, bit
    for bit but for silu, z / (1 + e^-z) here (numpy's vectorised exp: 2-5 times faster than
    z expit(z), equal to it within 4 ulp). Tensors: the same formulas, out of place (the
    autograd graph keeps its inputs)."""
    if not isinstance(z, np.ndarray):
        xp = namespace(z)
        if name == "swiglu":
            return z / (1 + xp.exp(-z))
        if name == "geglu":
            return 0.5 * z * (1 + xp.tanh(_C * (z + 0.044715 * z**3)))
        if name == "gelu":
            return z * (0.5 * (1 + any_erf(z / np.sqrt(2.0))))
        return xp.where(z > 0, z, xp.zeros_like(z))
    if name == "swiglu":
        s = np.negative(z)
        with np.errstate(over="ignore"):  # e^-z = inf for z << 0: silu(z) = -0
            np.exp(s, out=s)
        s += 1
        return np.divide(z, s, out=s)
    if name == "geglu":
        t = np.tanh(_C * (z + 0.044715 * z**3))
        t += 1
        t *= z
        t *= 0.5
        return t
    if name == "gelu":
        cdf = 0.5 * (1 + erf(z / np.sqrt(2.0)))
        cdf *= z
        return cdf
    return np.maximum(z, 0, out=z)


def _act_derivative(name: str, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The activation sigma(z) and its derivative sigma'(z), elementwise."""
    if name == "swiglu":
        s = expit(z)
        return z * s, s * (1 + z * (1 - s))
    if name == "geglu":
        inner = _C * (z + 0.044715 * z**3)
        t = np.tanh(inner)
        dinner = _C * (1 + 3 * 0.044715 * z**2)
        return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * dinner
    if name == "gelu":
        cdf = 0.5 * (1 + erf(z / np.sqrt(2.0)))
        return z * cdf, cdf + z * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    return np.maximum(z, 0), (z > 0).astype(z.dtype)


@register
@dataclass(frozen=True, eq=False)
class MLP(Part):
    """A feed-forward sublayer (module docstring): W_up (h, d), W_down (d, h), W_gate (h, d)
    for the gated activations (None otherwise); biases b_up (h,), b_down (d,) or None."""

    W_up: Any = None
    W_down: Any = None
    W_gate: Any = None
    activation: str = "swiglu"
    b_up: Any = None
    b_down: Any = None
    name: ClassVar[str] = "mlp"
    slot: ClassVar[str] = "feedforward"
    help: ClassVar[str] = ("Feed-forward sublayer; from text: Gaussian weights of variance 1/d "
                           "(in) and 1/h (out), seeded.")
    text_help: ClassVar[str] = "none | swiglu|geglu|gelu|relu:WIDTH[:SEED]"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise fail("mlp.activation", f"one of {ACTIVATIONS}", repr(self.activation))
        for attr in ("W_up", "W_down", "W_gate"):
            m = getattr(self, attr)
            if m is not None:
                object.__setattr__(self, attr, check_parameter(f"mlp.{attr}", m, ndim=2))
        up, down, gate = self.W_up, self.W_down, self.W_gate
        if up is None or down is None:
            raise fail("mlp", "W_up (h, d) and W_down (d, h)",
                       f"W_up {describe(up)}, W_down {describe(down)}")
        h, d = up.shape
        if tuple(down.shape) != (d, h):
            raise fail("mlp.W_down", f"shape ({d}, {h}) to match W_up ({h}, {d})",
                       describe(down))
        if self.activation in GATED:
            if gate is None or tuple(gate.shape) != tuple(up.shape):
                raise fail("mlp.W_gate", f"shape ({h}, {d}) for the gated activation "
                           f"{self.activation!r}", describe(gate))
        elif gate is not None:
            raise fail("mlp.W_gate", f"None for the activation {self.activation!r} (gated: "
                       f"{GATED})", describe(gate))
        for attr, size in (("b_up", h), ("b_down", d)):
            b = getattr(self, attr)
            if b is not None:
                b = check_parameter(f"mlp.{attr}", b, ndim=1)
                if tuple(b.shape) != (size,):
                    raise fail(f"mlp.{attr}", f"shape ({size},)", describe(b))
                object.__setattr__(self, attr, b)

    @property
    def d(self) -> int:
        """The token dimension."""
        return self.W_up.shape[1]

    @property
    def width(self) -> int:
        """The hidden width h."""
        return self.W_up.shape[0]

    @classmethod
    def random(cls, d: int, width: int, activation: str = "swiglu", seed: int = 0,
               dtype: Any = np.float64) -> MLP:
        """Gaussian weights, variance 1/d into the hidden layer and 1/width out of it."""
        if activation not in ACTIVATIONS:
            raise fail("mlp.activation", f"one of {ACTIVATIONS}", repr(activation))
        _check_width("width", d, width, activation)
        rng = np.random.default_rng(integer("seed", seed, 0))

        def w(rows: int, cols: int) -> np.ndarray:
            return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(dtype)

        up, gate = w(width, d), (w(width, d) if activation in GATED else None)
        return cls(up, w(d, width), gate, activation)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        """m(u), (..., n, d) -> (..., n, d) (numpy or tensors, `attnflow._array`)."""
        if not isinstance(u, np.ndarray):
            z = self._up(u)
            if self.W_gate is not None:
                z = _act(self.activation, u @ like(self.W_gate, u).T) * z
            else:
                z = _act(self.activation, z)
            out = z @ like(self.W_down, u).T
            return out if self.b_down is None else out + like(self.b_down, u)
        dt = u.dtype
        z = self._up(u)
        if self.W_gate is None:
            hidden = _act(self.activation, z)
        else:
            hidden = _act(self.activation, u @ self.W_gate.T.astype(dt, copy=False))
            hidden *= z
        out = hidden @ self.W_down.T.astype(dt, copy=False)
        if self.b_down is not None:
            out += self.b_down.astype(dt, copy=False)
        return out

    def _up(self, u: np.ndarray) -> np.ndarray:
        """W_up u + b_up, in u's dtype."""
        if not isinstance(u, np.ndarray):
            z = u @ like(self.W_up, u).T
            return z if self.b_up is None else z + like(self.b_up, u)
        z = u @ self.W_up.T.astype(u.dtype, copy=False)
        if self.b_up is not None:
            z += self.b_up.astype(u.dtype, copy=False)
        return z

    def jacobian(self, u: np.ndarray) -> np.ndarray:
        """dm/du per token: (..., n, d, d)."""
        z = self._up(u)
        if self.W_gate is None:
            ds = _act_derivative(self.activation, z)[1]
            return np.einsum("ak,...k,kb->...ab", self.W_down, ds, self.W_up)
        s, ds = _act_derivative(self.activation, u @ self.W_gate.T)
        # d/du [sigma(G u) * (U u)] = diag(sigma'(G u) * U u) G + diag(sigma(G u)) U
        return (np.einsum("ak,...k,kb->...ab", self.W_down, ds * z, self.W_gate)
                + np.einsum("ak,...k,kb->...ab", self.W_down, s, self.W_up))

    @classmethod
    def parse(cls, text: str | None, name: str | None = None, d: int | None = None
              ) -> MLP | None:
        """``ACT:WIDTH[:SEED]`` with random weights for dimension d (`random`)."""
        name = name or cls.name
        if text is None or text == "none":
            return None
        parts = str(text).split(":")
        expected = f"none or ACT:WIDTH[:SEED] with ACT in {ACTIVATIONS} and integers >= 1, >= 0"
        if len(parts) not in (2, 3) or parts[0] not in ACTIVATIONS or not all(
                p.isdigit() for p in parts[1:]) or int(parts[1]) < 1:
            raise fail(name, expected, repr(text))
        if d is None:
            raise fail(name, "a model dimension d to draw the weights for", "d unknown")
        _check_width(name, d, int(parts[1]), parts[0])
        return cls.random(d, int(parts[1]), parts[0], int(parts[2]) if len(parts) == 3 else 0)


def _check_width(name: str, d: int, width: int, activation: str) -> None:
    """Refuse, naming `name`, a hidden width whose float64 weights (d x width, two or three
    matrices) cannot fit in memory."""
    integer(name, width, 1, expected="a hidden width >= 1 (an integer)")
    matrices = 3 if activation in GATED else 2
    check_allocation(name, 8 * matrices * integer("d", d, 1) * width,
                     f"width {width} x d = {d}, {matrices} float64 matrices")
