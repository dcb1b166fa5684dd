"""A block: one layer of the family, an attention sublayer and an optional feed-forward
sublayer, each inside its normalisation scheme (docs/science.md §6, §8).

With attention s_a and feed-forward s_m in schemes sigma_a, sigma_m (`attnflow.family.schemes`)
the block has two time-stepping forms:

* **continuous** (default): the velocity is the sum of the sublayers' velocities,
  dX/dt = sigma_a(X, s_a) + sigma_m(X, s_m); every method integrates this ODE, and a finer
  dt converges to it;
* **sequential**: an Euler step of size h applies the sublayers one after the other,
  Y = retract(X + h D_a(X)), then X' = retract(Y + h D_m(Y)) (Lie-Trotter splitting of the
  same ODE, first order in h). With h = 1 this is exactly a Transformer layer: attention,
  then the MLP on the updated residual stream. Only the Euler method steps this form.

Without a feed-forward sublayer the two forms are the same. `Attention` is the convenience
constructor of a block from flat keyword arguments (the paper's model is `Attention()` with
its defaults); `Block` composes already-built parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.family.attention import SelfAttention
from attnflow.family.feedforward import MLP
from attnflow.family.heads import ProjectionBias, QKNorm, common_dimension
from attnflow.family.parts import Part
from attnflow.family.positional import ALiBi, Encoding, RoPE, ScoreBias, as_alibi, as_rope
from attnflow.family.schemes import Scheme, make_scheme
from attnflow.family.strength import Strength
from attnflow.family.weighting import Weighting
from attnflow.kernels import Kernel, get_kernel
from attnflow.kernels.masks import MaskSpec
from attnflow.manifolds import SPHERE, Manifold
from attnflow.sphere import normalize

__all__ = ["FORMS", "Attention", "Block"]

FORMS = ("continuous", "sequential")
Field = Callable[[np.ndarray], np.ndarray]

# What a block answers for its attention sublayer (read-only views).
_ATTENTION_VIEWS = ("heads", "beta", "mask", "memory", "combine", "backend", "encodings",
                    "normalization", "weighting", "qk_norm", "biases", "options", "fixed_n",
                    "head_size", "score_bias", "strength")


class Block:
    """One layer: attention (a `SelfAttention`) in the scheme `norm`, then optionally a
    feed-forward `MLP` in the scheme `mlp_norm` (default: a scheme of the same kind as
    `norm`, with directions), stepped in `form` "continuous" or "sequential" (module
    docstring). Schemes may be given by name ("post", "pre", "peri", "ngpt", "flat")."""

    def __init__(self, attention: SelfAttention, mlp: MLP | None = None,
                 norm: Scheme | str = "post", mlp_norm: Scheme | str | None = None,
                 form: str = "continuous") -> None:
        if not isinstance(attention, SelfAttention):
            raise fail("attention", "an attnflow.family.SelfAttention",
                       type(attention).__name__)
        if mlp is not None and not isinstance(mlp, MLP):
            raise fail("mlp", "an attnflow.MLP or None", type(mlp).__name__)
        if form not in FORMS:
            raise fail("form", f"one of {FORMS}", repr(form))
        self.attention = attention
        self.mlp = mlp
        self.scheme: Scheme = make_scheme(norm)
        self.scheme.check_attention(attention)
        self.mlp_scheme: Scheme | None = None
        if mlp is not None:
            self.mlp_scheme = make_scheme(
                mlp_norm if mlp_norm is not None else self.scheme.kind,
                getattr(self.scheme, "alpha", 0.2), name="mlp_norm")
            if self.mlp_scheme.manifold != self.scheme.manifold:
                raise fail("mlp_norm", f"a scheme on the {self.scheme.manifold} like norm "
                           f"{self.scheme.kind!r}", repr(self.mlp_scheme.kind))
            if attention.d is not None and mlp.d != attention.d:
                raise fail("mlp", f"weights for tokens of dimension d = {attention.d} "
                           "(W_up of shape (h, d))", f"d = {mlp.d}")
        elif mlp_norm is not None:
            raise fail("mlp_norm", "None without an mlp", repr(mlp_norm))
        self.form = form
        self.d: int | None = attention.d if attention.d is not None else (
            None if mlp is None else mlp.d)
        self.scheme.check(self.d, "norm")
        if self.mlp_scheme is not None:
            self.mlp_scheme.check(self.d, "mlp_norm")

    def __getattr__(self, name: str) -> Any:
        if name in _ATTENTION_VIEWS:
            return getattr(self.__dict__["attention"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ the model protocol
    @property
    def layers(self) -> tuple[Block, ...]:
        """The model as a sequence of layers: this one block (tied weights at every time)."""
        return (self,)

    def layer_at(self, t: float) -> Block:
        """The layer acting at time t: this one at every time."""
        return self

    @property
    def manifold(self) -> Manifold:
        """The state space: the sphere (post, ngpt) or R^d (pre, peri, flat)."""
        return self.scheme.manifold

    @property
    def norm(self) -> str:
        """The attention scheme's name ("post", "pre", "peri", "ngpt", "flat")."""
        return self.scheme.kind

    @property
    def is_causal(self) -> bool:
        """True when token k depends on tokens 1..k only (the MLP acts token by token)."""
        return self.attention.is_causal

    @property
    def has_exact_jacobian(self) -> bool:
        """True when `jacobian` is available: post-LN (with directions) or flat softmax
        attention without positions, QK-norm or biases, and a feed-forward term in the same
        scheme if any."""
        return (self.attention.has_exact_jacobian and self.scheme.exact_jacobian
                and (self.mlp_scheme is None or self.mlp_scheme.exact_jacobian))

    def __repr__(self) -> str:
        mlp = "" if self.mlp is None else (f", mlp={self.mlp.activation}:{self.mlp.width}"
                                           f" in {self.mlp_scheme.kind!r}, form={self.form!r}")
        return f"{type(self).__name__}({self.attention!r}, norm={self.norm!r}{mlp})"

    def check_tokens(self, X: Any, name: str = "X") -> np.ndarray:
        """Validate a token array of shape (..., n, d) for this block."""
        X = self.attention.check_tokens(X, name)
        if self.mlp is not None and X.shape[-1] != self.mlp.d:
            raise fail(name, f"an array of shape (..., n, {self.mlp.d}) (the MLP's d)",
                       f"shape {X.shape}")
        self.scheme.check(X.shape[-1], "norm")
        if self.mlp_scheme is not None:
            self.mlp_scheme.check(X.shape[-1], "mlp_norm")
        return X

    # ------------------------------------------------------------------ the field
    def kernel_for(self, X: np.ndarray) -> Kernel:
        """The attention kernel for states shaped like X (`SelfAttention.kernel_for`; no
        harmonic kernel where the scheme's inputs are not unit vectors)."""
        return self.attention.kernel_for(X, self.scheme.unit_inputs)

    def attention_output(self, u: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """The attention sublayer's output at its inputs u (..., n, d)."""
        return self.attention.output(u, kernel)

    def attention_inputs(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """The attention sublayer's input at the state X: the scheme's, except that a
        harmonic kernel (`attnflow.kernels.harmonic`, or auto's `harmonic_or_blocked`: a
        kernel with `reads_directions`) on a sphere scheme reads the directions X / |X|: the
        stages of RK4 and dopri5 lie off the sphere by O(dt^2), where the plain extension's
        queries and keys have no common norm. On the sphere the field is the same; off it
        this is the extension the implicit methods use."""
        u = self.scheme.inputs(X)
        kernel = get_kernel(self.attention.backend) if kernel is None else kernel
        if self.scheme.manifold is SPHERE and getattr(kernel, "reads_directions", False):
            return normalize(u)
        return u

    def sublayers(self, kernel: Kernel | None = None) -> list[tuple[Field, Field]]:
        """(velocity, Euler drift) of each sublayer as functions of the state, in order."""
        att, sch = self.attention, self.scheme

        def a_field(X: np.ndarray) -> np.ndarray:
            return sch.field(X, att.output(self.attention_inputs(X, kernel), kernel))

        def a_drift(X: np.ndarray) -> np.ndarray:
            return sch.drift(X, att.output(self.attention_inputs(X, kernel), kernel))

        out = [(a_field, a_drift)]
        if self.mlp is not None:
            mlp, msch = self.mlp, self.mlp_scheme

            def m_field(X: np.ndarray) -> np.ndarray:
                return msch.field(X, mlp(msch.inputs(X)))

            def m_drift(X: np.ndarray) -> np.ndarray:
                return msch.drift(X, mlp(msch.inputs(X)))

            out.append((m_field, m_drift))
        return out

    def field(self, X: Any) -> np.ndarray:
        """The velocity field F(X), shape (..., n, d), after checking X (continuous form)."""
        return self.tangent_field(self.check_tokens(X))

    def tangent_field(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """`field` without the input checks: the integrators' hot path (tangent to the
        sphere for the sphere schemes)."""
        out = self.scheme.field(X, self.attention.output(self.attention_inputs(X, kernel),
                                                         kernel))
        if self.mlp is not None:
            out = out + self.mlp_scheme.field(X, self.mlp(self.mlp_scheme.inputs(X)))
        return out

    def drift(self, X: np.ndarray, kernel: Kernel | None = None) -> np.ndarray:
        """The ambient drift of an explicit Euler step of the continuous form: with post-LN
        the sublayers' outputs themselves, so that normalize(x + drift) is one post-LN
        layer of attention only."""
        out = self.scheme.drift(X, self.attention.output(self.attention_inputs(X, kernel),
                                                         kernel))
        if self.mlp is not None:
            out = out + self.mlp_scheme.drift(X, self.mlp(self.mlp_scheme.inputs(X)))
        return out

    def splitting(self, kernel: Kernel | None = None) -> tuple[Field, ...] | None:
        """The sublayers' Euler drifts, in order, for the sequential form (None: the
        continuous form, or a single sublayer)."""
        if self.form != "sequential" or self.mlp is None:
            return None
        return tuple(drift for _, drift in self.sublayers(kernel))

    def hardmax_scores(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """At beta = +-inf: the signed scores (..., n, n) of the (one) head at the sublayer
        inputs of the state X, and each row's tie tolerance (..., n)
        (`SelfAttention.hardmax_scores`; the events method's leaders)."""
        return self.attention.hardmax_scores(self.scheme.inputs(X))

    def jacobian(self, X: Any) -> np.ndarray:
        """The exact Jacobian of `field` at X (..., n, d): shape (..., n, d, n, d), with
        [..., i, :, k, :] = dF_i/dx_k (dense, for the implicit methods). Available when
        `has_exact_jacobian`."""
        if not self.has_exact_jacobian:
            raise fail("model", "post-LN softmax attention (or flat: no normalisation) at a "
                       "finite beta without positional encodings or QK-norm (and an MLP in the "
                       "same scheme) for the exact Jacobian (at beta = +-inf the field jumps "
                       "where leaders change: no Jacobian there)", repr(self))
        X = self.check_tokens(X)
        a, Da = self.attention.jacobian_parts(X)
        if self.mlp is not None:
            n = X.shape[-2]
            a = a + self.mlp(X)
            Dm = self.mlp.jacobian(X)  # (..., n, d, d), token by token
            idx = np.arange(n)
            Da = Da.copy()
            Da[..., idx, :, idx, :] += np.moveaxis(Dm, -3, 0)
        return self.scheme.jacobian(X, a, Da)

    def attention_matrix(self, X: Any, head: int = 0) -> np.ndarray:
        """The attention weights of one head (0-based), (..., n, n + m) (m memory columns
        last), at the sublayer inputs of the state X."""
        X = self.check_tokens(X)
        return self.attention.weights(self.scheme.inputs(X), head)

    def attention_patterns(self, X: Any) -> np.ndarray:
        """Every head's attention weights at the state X: (..., H, n, n + m)."""
        X = self.check_tokens(X)
        u = self.scheme.inputs(X)
        return np.stack([self.attention.weights(u, h) for h in range(len(self.heads))],
                        axis=-3)

    # ------------------------------------------------------------------ records
    def to_record(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A JSON-friendly description and named arrays, enough to rebuild the block
        bit-identically with `Attention.from_record` (one-layer records of earlier versions
        have the same form, without the feed-forward keys)."""
        meta, arrays = self.attention.to_record()
        meta["norm"] = self.norm
        meta.update(self.scheme.params())
        if not self.scheme.idealised:
            meta["scheme"], scheme_arrays = self.scheme.to_record("norm_")
            arrays.update(scheme_arrays)
        if self.mlp is not None:
            meta["mlp"], mlp_arrays = self.mlp.to_record("ffn_")
            meta["mlp_norm"], mlp_norm_arrays = self.mlp_scheme.to_record("ffn_norm_")
            meta["form"] = self.form
            arrays.update(mlp_arrays)
            arrays.update(mlp_norm_arrays)
        return meta, arrays

    @classmethod
    def from_record(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Attention:
        """Inverse of `to_record`, as an `Attention` (records written before the model family
        read as post-LN softmax attention without positions)."""
        if "scheme" in meta:
            scheme = Scheme.from_record(meta["scheme"], arrays)
        else:
            scheme = make_scheme(meta.get("norm", "post"), meta.get("alpha", 0.2))
        mlp = mlp_norm = None
        if "mlp" in meta:
            mlp = MLP.from_record(meta["mlp"], arrays)
            mlp_norm = Scheme.from_record(meta["mlp_norm"], arrays)
        block = object.__new__(Attention)
        Block.__init__(block, SelfAttention.from_record(meta, arrays), mlp, scheme, mlp_norm,
                       meta.get("form", "continuous"))
        return block


class Attention(Block):
    """One block from flat keyword arguments: its velocity field on the sphere (post-LN, the
    paper's) or in R^d.

    Every option also takes the text form of the command line (``attnflow simulate --help``,
    `attnflow.family.text`): ``mask="window:5"``, ``attention="sinkhorn:10"``,
    ``rope="10000:adjacent"``, ``alibi="default"``, ``qk_norm="rms"``, ``norm="ngpt:0.3"``,
    ``mlp="gelu:64"`` (random weights; d from Q, K or V, which must then be given).

    Parameters
    ----------
    Q, K : query and key matrices acting on column vectors, (e, d) with the same head size e
        (the score of (k, j) is beta theta_k^T Q^T K theta_j). None means the identity (e = d).
    V : (d, d) value matrix; None means the identity.
    beta : inverse temperature, a finite number of either sign (beta < 0: repulsive).
    mask : "causal" (default), "full", ("window", w) or "window:W", a boolean (n, n) array
        or the name of an .npy file holding one.
    memory : optional (points (m, d) on the sphere, weights (m,) > 0): fixed tokens every
        token also attends to, each counted with multiplicity a_j (Theorem 5.2 uses a_j >= 1).
    heads : optional list of (Q, K, V) triples or (Q, K, V, O) quadruples for several heads;
        then Q, K, V must be None. Grouped-query heads share their K and V: pass the same
        arrays.
    combine : "sum" (default) or "mean" over heads.
    backend : name of the attention kernel (`attnflow.kernels.KERNELS`): "auto" (default)
        picks the fastest kernel that has the model's options per call; "dense" is the
        readable reference.
    norm : normalisation scheme: "post" (default; tokens on the sphere), "pre", "peri" (tokens
        in R^d, radius in the state), "ngpt" or "ngpt:ALPHA", "flat" (no normalisation:
        attention reads x in R^d itself; no memory, no harmonic backend), or a scheme object
        (`attnflow.family.schemes`, e.g. ``Pre(RMSNorm(gain, eps))``).
    alpha : nGPT's step (default 0.2), used only with norm="ngpt".
    attention : weight normalisation: "softmax" (default), "unnormalised" (weights
        exp(score) / N, N = n plus the memory multiplicities), "positional" (exp(score) times
        the row's position weights exp(bias) normalised over the keys it sees) or "sinkhorn" /
        "sinkhorn:IT" / ("sinkhorn", it) (doubly stochastic by `it` Sinkhorn iterations,
        default 20; full mask, no memory).
    rope : rotary position embedding: an `attnflow.RoPE`, a base, "BASE[:PAIRING[:OFFSET]]",
        or None.
    alibi : linear score biases: an `attnflow.ALiBi`, a slope, one slope per head, "default",
        "S" or "S1,S2,...", or None.
    bias : an additive (n, n) score bias shared by the heads (entries may be -inf), or None.
    qk_norm : an `attnflow.QKNorm` (RMSNorm of queries and keys per head), "rms", "rms:EPS",
        or None.
    biases : an `attnflow.ProjectionBias` (biases of the q, k, v projections per head and of
        the output; BERT) or None.
    mlp : an `attnflow.MLP` feed-forward sublayer, "ACT:WIDTH[:SEED]" (random weights), or
        None (attention only, the paper's).
    mlp_norm : the MLP's scheme (default: `norm`'s kind, with directions).
    form : "continuous" (default) or "sequential" (module docstring).
    strength : the interaction strength K > 0 (a number, its text form or an
        `attnflow.family.Strength`): the attention sublayer's output times K, so that with
        noise sigma the SDE is dX = K F dt + sigma P_X dW (`attnflow.family.strength`: the
        equivalent time rescaling). Default 1.
    parts : further registered parts (`attnflow.family.PARTS`), e.g. an `Encoding` of a new
        kind; each kind at most once.
    """

    def __init__(
        self,
        Q: Any = None,
        K: Any = None,
        V: Any = None,
        beta: float = 1.0,
        mask: MaskSpec = "causal",
        memory: tuple[Any, Any] | None = None,
        heads: Sequence[tuple] | None = None,
        combine: str = "sum",
        backend: str = "auto",
        norm: str | Scheme = "post",
        alpha: float = 0.2,
        attention: str | tuple | Weighting = "softmax",
        rope: RoPE | float | None = None,
        alibi: ALiBi | float | Sequence[float] | None = None,
        bias: Any = None,
        qk_norm: QKNorm | None = None,
        biases: ProjectionBias | None = None,
        mlp: MLP | None = None,
        mlp_norm: str | Scheme | None = None,
        form: str = "continuous",
        parts: Sequence[Part] = (),
        strength: Strength | float | str = 1.0,
    ) -> None:
        if heads is not None:
            if any(m is not None for m in (Q, K, V)):
                raise fail("heads", "None when Q, K or V is given (one way to give heads)",
                           "both heads and Q/K/V")
            if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence):
                raise fail("heads", "a list of (Q, K, V) triples", repr(heads))
            raw = list(heads)
        else:
            raw = [(Q, K, V)]
        encodings: list[Encoding] = [e for e in (as_rope(rope), as_alibi(alibi),
                                                 None if bias is None else ScoreBias(bias))
                                     if e is not None]
        for p in parts:
            if not isinstance(p, Part) or p.slot == "scheme":
                raise fail("parts", "registered parts other than schemes (give norm=...)",
                           repr(p)[:80])
            if p.slot == "encoding":
                encodings.append(p)
            elif p.slot == "weighting":
                attention = _once("attention", attention, "softmax", p)
            elif p.slot == "qk_norm":
                qk_norm = _once("qk_norm", qk_norm, None, p)
            elif p.slot == "biases":
                biases = _once("biases", biases, None, p)
            elif p.slot == "feedforward":
                mlp = _once("mlp", mlp, None, p)
            elif p.slot == "strength":
                strength = _once("strength", strength, 1.0, p)
        if isinstance(qk_norm, str):
            qk_norm = QKNorm.parse(qk_norm, "qk_norm")
        if isinstance(mlp, str):
            mlp = MLP.parse(mlp, "mlp", d=common_dimension(raw, memory)[0])
        scheme = make_scheme(norm, alpha) if isinstance(norm, str) else make_scheme(norm)
        sub = SelfAttention(raw, beta=beta, mask=mask, memory=memory, combine=combine,
                            backend=backend, weighting=attention, encodings=encodings,
                            qk_norm=qk_norm, biases=biases, single=heads is None,
                            strength=strength)
        super().__init__(sub, mlp, scheme, mlp_norm, form)


def _once(name: str, given: Any, default: Any, part: Part) -> Any:
    """`part` for an option not given otherwise; a part given twice is an error."""
    if given is not default and given != default:
        raise fail(name, "one value (a part given once)", f"{given!r} and {part!r}")
    return part

