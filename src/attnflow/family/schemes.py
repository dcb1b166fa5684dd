"""Normalisation schemes: where the layer norm sits around a sublayer, and so what the state
is (docs/science.md §6, §8).

Tokens are x_i = r_i theta_i (direction theta_i, radius r_i > 0). A sublayer s (attention or
the feed-forward term) reads its input u = N_in(x) and returns s(u); a scheme turns that into
the velocity of the state and into the drift D of an Euler step x <- retract(x + h D):

=======  =========  ==========================  ============================================
scheme   state      velocity dx_i/dt            Transformer sublayer it idealises (h = 1)
=======  =========  ==========================  ============================================
post     sphere     P_x(s(x))                   x <- LN(x + s(x))  (the paper's; BERT with
                                                a trained LayerNorm: R^d, N(x + s(x)) - x)
pre      R^d        s(N(x))                     x <- x + s(N(x))  (GPT-2, LLaMA/RMSNorm)
peri     R^d        N_out(s(N(x)))              x <- x + N_out(s(N(x)))  (sandwich, Gemma)
ngpt     sphere     alpha P_x(s(x) / |s(x)|)    x <- norm(x + alpha s(x) / |s(x)|)  (nGPT)
flat     R^d        s(x)                        x <- x + s(x)  (no normalisation at all: the
                                                mean-field "Gaussian closure" setting)
=======  =========  ==========================  ============================================

N and N_out are `attnflow.family.norms` objects: the direction x / |x| (default; the theory's
idealisation) or RMSNorm with a gain and eps (a trained model's). With directions, pre-LN in
polar form is dr/dt = <theta, s>, dtheta/dt = P_theta(s) / r: the radius grows and slows the
angular motion; peri-LN is the same with s / |s| (0 where s = 0). On the sphere the input is
the state itself (unit rows).

The flat scheme reads x itself: nothing is of unit norm, so the options made for unit tokens
are refused with the argument named (`Flat.check_attention`): memory points (on the sphere)
and the harmonic kernels (which need queries and keys of one norm). Every mask makes sense in
R^d; QK-norm (which normalises queries and keys, not tokens) is allowed; the geodesic method
needs the sphere (refused by `simulate` for every R^d scheme). Its Jacobian is the attention
sublayer's own (`exact_jacobian`), since the velocity is the sublayer output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnflow._checks import fail, number
from attnflow.family.jacobian import tangent_jacobian
from attnflow.family.norms import Direction, Norm, norm_from_record, unit
from attnflow.family.parts import Part, register
from attnflow.kernels import get_kernel
from attnflow.manifolds import EUCLIDEAN, SPHERE, Manifold
from attnflow.sphere import project

__all__ = ["NGPT", "SCHEMES", "Flat", "Peri", "Post", "Pre", "Scheme", "make_scheme"]


@register
@dataclass(frozen=True, eq=False)
class Scheme(Part):
    """A normalisation scheme (module docstring): its state space, the sublayer's input, and
    how the sublayer's output moves the state."""

    name: ClassVar[str] = "norm"
    slot: ClassVar[str] = "scheme"
    help: ClassVar[str] = ("Normalisation scheme: post (the paper's, on the sphere) | pre | peri "
                           "(tokens in R^d) | ngpt | flat (none: attention reads x itself).")
    text_help: ClassVar[str] = "post | pre | peri | ngpt[:ALPHA] | flat"
    manifold: ClassVar[Manifold] = SPHERE
    # True when the sublayer reads unit vectors (the state on the sphere, its direction or its
    # RMSNorm): zero tokens are then refused, and options made for unit tokens apply.
    unit_inputs: ClassVar[bool] = True

    def inputs(self, X: np.ndarray) -> np.ndarray:
        """The sublayer's input u (..., n, d) at the state X: X itself on the sphere."""
        return X

    def field(self, X: np.ndarray, S: np.ndarray) -> np.ndarray:
        """The velocity dX/dt (..., n, d) given the sublayer output S = s(inputs(X))."""
        raise NotImplementedError

    def drift(self, X: np.ndarray, S: np.ndarray) -> np.ndarray:
        """The ambient drift D of an Euler step x <- retract(x + h D)."""
        return self.field(X, S)

    @property
    def exact_jacobian(self) -> bool:
        """True when blocks with this scheme have a closed-form Jacobian (post-LN, flat)."""
        return False

    def jacobian(self, X: np.ndarray, a: np.ndarray, Da: np.ndarray) -> np.ndarray:
        """The Jacobian (..., n, d, n, d) of the velocity at X, given the sublayer output a
        (..., n, d) at inputs(X) = X and its derivative Da = da/dX (`exact_jacobian` only)."""
        raise NotImplementedError

    def check(self, d: int | None, name: str) -> None:
        """Raise ValueError if the scheme's norms cannot act on tokens of dimension d."""

    def check_attention(self, attention: Any) -> None:
        """Raise ValueError, naming the option, for an attention sublayer (a
        `SelfAttention`) with options this scheme's inputs make meaningless."""

    @property
    def idealised(self) -> bool:
        """True when every norm is the direction x / |x| (the family's idealisation)."""
        return True

    def params(self) -> dict[str, Any]:
        """The scheme's scalar parameters for the record."""
        return {}

    @classmethod
    def parse(cls, text: str, name: str | None = None) -> Scheme:
        head, _, rest = str(text).partition(":")
        if head not in SCHEMES or (rest and head != "ngpt"):
            raise fail(name or cls.name, f"one of {', '.join(SCHEMES)} (ngpt[:ALPHA])",
                       repr(text))
        if rest:
            try:
                return NGPT(float(rest))
            except ValueError:
                raise fail(name or cls.name, "ngpt:ALPHA with a number ALPHA > 0",
                           repr(text)) from None
        return SCHEMES[head]()

    def text(self) -> str:
        return self.kind

    def to_record(self, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta: dict[str, Any] = {"kind": self.kind, **self.params()}
        arrays: dict[str, np.ndarray] = {}
        for attr in ("norm", "out_norm"):
            n = getattr(self, attr, None)
            if n is not None and n != Direction(attr == "out_norm"):
                meta[attr], a = n.to_record(f"{prefix}{attr}_")
                arrays.update(a)
        return meta, arrays

    @classmethod
    def from_record(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Scheme:
        kwargs = {k: v for k, v in meta.items() if k not in ("kind", "norm", "out_norm")}
        for attr in ("norm", "out_norm"):
            if attr in meta:
                kwargs[attr] = norm_from_record(meta[attr], arrays)
        return SCHEMES[meta["kind"]](**kwargs)


@dataclass(frozen=True, eq=False)
class Post(Scheme):
    """Post-LN: x <- N(x + s(x)). With the direction (default) the state is on the sphere and
    the velocity P_x(s(x)) (the paper's model). With a trained norm (LayerNorm with gain and
    bias, BERT; RMSNorm), which is no projection (N(N(x)) != N(x)), the state is the
    normalised residual stream in R^d and the velocity the relaxation N(x + s(x)) - x: its
    Euler step of size 1 is the layer x <- N(x + s(x)) exactly, and smaller steps move x part
    of the way toward it."""

    norm: Norm = Direction()
    kind: ClassVar[str] = "post"

    @property
    def manifold(self) -> Manifold:  # type: ignore[override]
        return SPHERE if self.idealised else EUCLIDEAN

    def field(self, X, S):
        return project(X, S) if self.idealised else self.norm(X + S) - X

    def drift(self, X, S):
        return S if self.idealised else self.norm(X + S) - X

    def check(self, d, name):
        self.norm.check(d, f"{name}.norm")

    @property
    def exact_jacobian(self) -> bool:
        return self.idealised

    def jacobian(self, X, a, Da):
        return tangent_jacobian(X, a, Da)

    @property
    def idealised(self) -> bool:
        return isinstance(self.norm, Direction)


@dataclass(frozen=True, eq=False)
class Pre(Scheme):
    """Pre-LN: the sublayer reads N(x), its output adds to the residual stream."""

    norm: Norm = Direction()
    kind: ClassVar[str] = "pre"
    manifold: ClassVar[Manifold] = EUCLIDEAN

    def inputs(self, X):
        return self.norm(X)

    def field(self, X, S):
        return S

    def check(self, d, name):
        self.norm.check(d, f"{name}.norm")

    @property
    def idealised(self) -> bool:
        return isinstance(self.norm, Direction)


@dataclass(frozen=True, eq=False)
class Peri(Pre):
    """Peri-LN (sandwich): N_out(s(N(x))) adds to the residual stream."""

    out_norm: Norm = Direction(zero_safe=True)
    kind: ClassVar[str] = "peri"

    def field(self, X, S):
        return self.out_norm(S)

    def check(self, d, name):
        super().check(d, name)
        self.out_norm.check(d, f"{name}.out_norm")

    @property
    def idealised(self) -> bool:
        return isinstance(self.norm, Direction) and isinstance(self.out_norm, Direction)

    def check_attention(self, attention):
        _refuse_strength(attention, self.kind)


@dataclass(frozen=True, eq=False)
class NGPT(Scheme):
    """nGPT (Loshchilov et al.): the step toward the normalised sublayer output, alpha."""

    alpha: float = 0.2
    kind: ClassVar[str] = "ngpt"

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", number("alpha", self.alpha, 0.0, low_open=True))

    def field(self, X, S):
        return self.alpha * project(X, unit(S))

    def drift(self, X, S):
        return self.alpha * unit(S)

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def text(self) -> str:
        return f"ngpt:{self.alpha!r}"

    def check_attention(self, attention):
        _refuse_strength(attention, self.kind)


@dataclass(frozen=True, eq=False)
class Flat(Scheme):
    """No normalisation: the sublayer reads the state x in R^d itself and its output is the
    velocity, dx/dt = s(x) (Castin, Ablin, Carrillo, Peyre's setting, in which a Gaussian law
    of tokens stays Gaussian in the mean-field limit; docs/science.md §11.5)."""

    kind: ClassVar[str] = "flat"
    manifold: ClassVar[Manifold] = EUCLIDEAN
    unit_inputs: ClassVar[bool] = False

    def field(self, X, S):
        return S

    @property
    def exact_jacobian(self) -> bool:
        return True

    def jacobian(self, X, a, Da):
        return Da

    def check_attention(self, attention):
        if attention.memory is not None:
            raise fail("memory", "None with norm 'flat' (memory points are unit vectors on "
                       "the sphere; flat tokens live in R^d with any norm)",
                       f"{len(attention.memory[1])} memory points")
        if getattr(get_kernel(attention.backend), "reads_directions", False):
            raise fail("backend", "a kernel for queries and keys of any norm with norm 'flat' "
                       "(the harmonic kernels need queries and keys of one norm: unit tokens)",
                       repr(attention.backend))


def _refuse_strength(attention: Any, scheme: str) -> None:
    """Peri-LN and nGPT normalise the sublayer's output, so a strength K != 1 would cancel."""
    if attention.strength != 1.0:
        raise fail("strength", f"1 with norm '{scheme}' (the scheme normalises the attention "
                   "output, so the factor K would cancel: use post, pre or flat)",
                   repr(attention.strength))


SCHEMES: dict[str, type[Scheme]] = {cls.kind: cls for cls in (Post, Pre, Peri, NGPT, Flat)}


def make_scheme(norm: str | Scheme, alpha: float = 0.2, name: str = "norm") -> Scheme:
    """The scheme `norm` (an object, or "post", "pre", "peri", "ngpt", "flat", or "ngpt:ALPHA"
    as on the command line); alpha is nGPT's step when `norm` is the bare name "ngpt"."""
    if isinstance(norm, Scheme):
        if type(norm) is Scheme:
            raise fail(name, "a concrete scheme (Post, Pre, Peri, NGPT, Flat)",
                       "the base Scheme")
        return norm
    if isinstance(norm, str) and ":" in norm:
        return Scheme.parse(norm, name)
    if not isinstance(norm, str) or norm not in SCHEMES:
        raise fail(name, f"one of {tuple(SCHEMES)} or a Scheme", repr(norm))
    return NGPT(alpha) if norm == "ngpt" else SCHEMES[norm]()
