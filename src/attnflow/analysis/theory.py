"""Formulas of the paper's circle analysis (d = 2, Q = K = V = I), docs/science.md §§1-2.

On the circle, token k at angle phi_k moves by dphi_k/dt = (1/Z_k) sum_{j<k} h(phi_j - phi_k)
with the interaction

    h(x) = exp(beta (cos x - 1)) sin x,
    g(x) = h'(x) = exp(beta (cos x - 1)) (cos x - beta sin^2 x),

strongest at x = tau_beta, cos tau_beta = (-1 + sqrt(4 beta^2 + 1)) / (2 beta) (~ beta^{-1/2}).

* Lemma 5.1: a strong center s_j separated from every earlier token by more than
  c (1 + 2 eps) beta^{-1/2} moves less than eps c beta^{-1/2} on [0, T_j] when
  T_j s_j h(c beta^{-1/2}) < eps c beta^{-1/2}; sufficient:
  T_j s_j < eps exp(c^2/2 - c^4/(24 beta)).
* Theorem 5.2 (frozen centers, c beta^{-1/2}-separated, c > 2 + 2 eps, N = n + sum a_j):
  every token ends within eps beta^{-1/2} of a center when
  (i)  N h((c - 1 - 2 eps) beta^{-1/2}) < h(eps beta^{-1/2}) and
  (ii) -N g((c - 2 eps) beta^{-1/2}) < g(eps beta^{-1/2})
  (with the minus sign of docs/science.md §2; the printed paper omits it, a typo).
* Remark B.2, closed-form sufficient conditions: c >= 5.5 + 2 eps,
  beta >= (c - 1 - 2 eps)^2 / 2 and N < (eps / (c - 1)) exp(3 (c - 1 - 2 eps)^2 / 8).

Every function says which of the exact conditions or the Remark's closed form it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from attnflow._checks import fail, inverse_temperature, nonnegative, positive
from attnflow._repr import ShortRepr

__all__ = [
    "h",
    "g",
    "tau_beta",
    "Lemma51Bound",
    "lemma51_bound",
    "Theorem52Check",
    "RemarkB2Check",
    "theorem52_conditions",
    "remark_b2_conditions",
    "theorem52_min_beta",
    "theorem52_max_N",
]


def h(x: Any, beta: float) -> np.ndarray:
    """The circle interaction h(x) = exp(beta (cos x - 1)) sin x (x in radians, vectorised;
    beta of either sign)."""
    x = np.asarray(x, dtype=float)
    beta = inverse_temperature("beta", beta)
    return np.exp(beta * (np.cos(x) - 1.0)) * np.sin(x)


def g(x: Any, beta: float) -> np.ndarray:
    """g = h' : exp(beta (cos x - 1)) (cos x - beta sin^2 x) (x in radians, vectorised;
    beta of either sign)."""
    x = np.asarray(x, dtype=float)
    beta = inverse_temperature("beta", beta)
    return np.exp(beta * (np.cos(x) - 1.0)) * (np.cos(x) - beta * np.sin(x) ** 2)


def tau_beta(beta: Any) -> np.ndarray:
    """The maximiser of h on [0, pi]: cos tau = (-1 + sqrt(4 beta^2 + 1)) / (2 beta),
    written 2 beta / (1 + sqrt(4 beta^2 + 1)) (so tau = pi/2 at beta = 0) and evaluated
    without cancellation for large |beta|. Radians, vectorised over finite beta of either
    sign; tau ~ beta^{-1/2} for large beta; for beta < 0 (repulsive) tau > pi/2 and
    pi - tau ~ |beta|^{-1/2} as beta -> -infinity."""
    beta = np.asarray(beta, dtype=float)
    if not np.all(np.isfinite(beta)):
        raise fail("beta", "finite values", repr(beta))
    root = np.sqrt(4.0 * beta**2 + 1.0)
    cos = 2.0 * beta / (1.0 + root)
    # 1 -+ cos tau = (1 + root -+ 2 beta) / (1 + root), without cancellation: the one of
    # root -+ 2 beta that is small is root - 2 |beta| = 1 / (root + 2 |beta|). atan2 keeps
    # full precision for tau near 0 (beta -> infinity) and near pi (beta -> -infinity).
    a = 2.0 * np.abs(beta)
    small, large = 1.0 + 1.0 / (root + a), 1.0 + root + a
    one_minus_cos = np.where(beta > 0, small, large) / (1.0 + root)
    one_plus_cos = np.where(beta < 0, small, large) / (1.0 + root)
    return np.arctan2(np.sqrt(one_minus_cos * one_plus_cos), cos)


@dataclass(frozen=True, repr=False)
class Lemma51Bound(ShortRepr):
    """Lemma 5.1 for the j-th strong center (index s_j), in units where one layer = 1.

    separation : c (1 + 2 eps) beta^{-1/2}, the distance to every earlier token required.
    displacement : eps c beta^{-1/2}, the movement bound.
    time : the longest T_j allowed by the exact hypothesis
        T_j s_j h(c beta^{-1/2}) < eps c beta^{-1/2} (a strict bound: T_j < time).
    time_closed_form : the same from the sufficient T_j s_j < eps exp(c^2/2 - c^4/(24 beta));
        never larger than ``time``.
    """

    separation: float
    displacement: float
    time: float
    time_closed_form: float


def lemma51_bound(beta: float, c: float, eps: float, s: float) -> Lemma51Bound:
    """How long a strong Rényi center provably stays put (Lemma 5.1, docs/science.md §2).

    beta > 0, c > 0 (the paper needs c large enough; c > 1 suffices for beta > 1),
    eps > 0, s >= 1 the center's token index (1-based, as in the paper).
    """
    beta, c, eps, s = (positive(name, v) for name, v in
                       (("beta", beta), ("c", c), ("eps", eps), ("s", s)))
    r = beta**-0.5
    displacement = eps * c * r
    with np.errstate(divide="ignore"):
        time = float(displacement / (s * h(c * r, beta)))
    closed = float(eps * np.exp(c**2 / 2.0 - c**4 / (24.0 * beta)) / s)
    return Lemma51Bound(separation=c * (1 + 2 * eps) * r, displacement=displacement,
                        time=time, time_closed_form=closed)


@dataclass(frozen=True, repr=False)
class Theorem52Check(ShortRepr):
    """The exact hypotheses of Theorem 5.2 at one (beta, c, eps, N).

    separated : c > 2 + 2 eps (the theorem's hypothesis).
    fits : c beta^{-1/2} <= pi. Two centers on the circle cannot be further apart, and the
        proof's distances lie in [0, pi], where h >= 0; for smaller beta the inequalities
        below are satisfied vacuously (h changes sign past pi) and mean nothing.
    i_lhs, i_rhs : N h((c - 1 - 2 eps) beta^{-1/2}) and h(eps beta^{-1/2}); (i) is lhs < rhs.
    ii_lhs, ii_rhs : -N g((c - 2 eps) beta^{-1/2}) and g(eps beta^{-1/2}); (ii) is lhs < rhs.
    holds : separated and fits and (i) and (ii).
    """

    separated: bool
    fits: bool
    i_lhs: float
    i_rhs: float
    ii_lhs: float
    ii_rhs: float

    @property
    def i(self) -> bool:
        """Condition (i)."""
        return bool(self.i_lhs < self.i_rhs)

    @property
    def ii(self) -> bool:
        """Condition (ii), with the minus sign (docs/science.md §2)."""
        return bool(self.ii_lhs < self.ii_rhs)

    @property
    def holds(self) -> bool:
        return self.separated and self.fits and self.i and self.ii


@dataclass(frozen=True, repr=False)
class RemarkB2Check(ShortRepr):
    """Remark B.2's closed-form sufficient conditions at one (beta, c, eps, N).

    c_min : 5.5 + 2 eps (need c >= c_min).
    beta_min : (c - 1 - 2 eps)^2 / 2 (need beta >= beta_min).
    N_max : (eps / (c - 1)) exp(3 (c - 1 - 2 eps)^2 / 8) (need N < N_max).
    holds : all three.
    """

    c: float
    beta: float
    N: float
    c_min: float
    beta_min: float
    N_max: float

    @property
    def holds(self) -> bool:
        return self.c >= self.c_min and self.beta >= self.beta_min and self.N < self.N_max


def theorem52_conditions(beta: float, c: float, eps: float, N: float) -> Theorem52Check:
    """Evaluate Theorem 5.2's exact conditions (i) and (ii) (module docstring).

    beta > 0, c > 0 (separation in units of beta^{-1/2}), eps > 0, N >= 0 the total token
    count n + sum a_j. Returns a `Theorem52Check` with both sides of each inequality.
    """
    beta, c, eps = _positive(beta=beta, c=c, eps=eps)
    N = nonnegative("N", N)
    r = beta**-0.5
    return Theorem52Check(
        separated=c > 2 + 2 * eps,
        fits=c * r <= np.pi,
        i_lhs=float(N * h((c - 1 - 2 * eps) * r, beta)), i_rhs=float(h(eps * r, beta)),
        ii_lhs=float(-N * g((c - 2 * eps) * r, beta)), ii_rhs=float(g(eps * r, beta)),
    )


def remark_b2_conditions(beta: float, c: float, eps: float, N: float) -> RemarkB2Check:
    """Evaluate Remark B.2's closed-form sufficient conditions (module docstring).

    With eps = 0.1, c = 6.5 they read beta >= 14.045 and N < 682.9.
    """
    beta, c, eps = _positive(beta=beta, c=c, eps=eps)
    N = nonnegative("N", N)
    gap = c - 1 - 2 * eps
    return RemarkB2Check(c=c, beta=beta, N=N, c_min=5.5 + 2 * eps, beta_min=gap**2 / 2,
                         N_max=float(eps / (c - 1) * np.exp(3 * gap**2 / 8)))


def theorem52_max_N(beta: float, c: float, eps: float, form: str = "exact") -> float:
    """The supremum of N for which Theorem 5.2 applies at (beta, c, eps): conditions hold
    for every N' < N_max (N_max itself excluded: the inequalities are strict).

    form : "exact" for conditions (i)-(ii), "remark" for Remark B.2's closed form.
    Returns 0.0 when no N qualifies (c <= 2 + 2 eps or c beta^{-1/2} > pi for "exact";
    c or beta below the Remark's bounds for "remark") and inf when no upper limit applies.
    """
    beta, c, eps = _positive(beta=beta, c=c, eps=eps)
    if form == "remark":
        check = remark_b2_conditions(beta, c, eps, 0.0)
        ok = c >= check.c_min and beta >= check.beta_min
        return check.N_max if ok else 0.0
    _form(form)
    at_one = theorem52_conditions(beta, c, eps, 1.0)
    if not (at_one.separated and at_one.fits):
        return 0.0
    # Each condition reads N a < b; the N' in [0, N) all satisfy it up to b / a.
    return min(_sup_n(at_one.i_lhs, at_one.i_rhs), _sup_n(at_one.ii_lhs, at_one.ii_rhs))


def theorem52_min_beta(c: float, eps: float, N: float, form: str = "exact",
                       beta_max: float = 1e8) -> float:
    """The smallest beta at which Theorem 5.2 applies to N tokens at (c, eps).

    form : "remark" gives Remark B.2's (c - 1 - 2 eps)^2 / 2 (inf when c < 5.5 + 2 eps or
        N >= its N_max). "exact" returns the infimum of the beta in [(c/pi)^2, beta_max]
        where (i)-(ii) hold (they hold just above it; below (c/pi)^2 they are vacuous, see
        `Theorem52Check.fits`): a scan in steps of 1% (log scale) from (c/pi)^2 finds the
        first beta where they hold, then Brent's method locates the crossing
        N = `theorem52_max_N` to a relative precision of about 1e-13; inf when none in range.
        A window of validity narrower than 1% below the first one found would be missed.
    """
    c, eps = _positive(c=c, eps=eps)
    N = nonnegative("N", N)
    if form == "remark":
        check = remark_b2_conditions(1.0, c, eps, N)
        return check.beta_min if c >= check.c_min and N < check.N_max else np.inf
    _form(form)
    beta_max = positive("beta_max", beta_max)
    beta_min = (c / np.pi) ** 2
    if beta_max < beta_min:
        return np.inf
    grid = np.geomspace(beta_min, beta_max, int(np.ceil(np.log(beta_max / beta_min) / 0.01)) + 2)
    ok = np.flatnonzero([theorem52_max_N(b, c, eps) > N for b in grid])
    if ok.size == 0:
        return np.inf
    first = ok[0]
    if first == 0:
        return float(grid[0])
    with np.errstate(divide="ignore"):
        root = brentq(lambda lb: np.log(theorem52_max_N(np.exp(lb), c, eps) / N),
                      np.log(grid[first - 1]), np.log(grid[first]), xtol=1e-13, rtol=1e-13)
    return float(np.exp(root))


def _sup_n(lhs_at_one: float, rhs: float) -> float:
    """sup{N : N' a < b for all N' in [0, N)} with a = lhs_at_one, b = rhs."""
    if rhs <= 0:
        return 0.0
    if lhs_at_one <= 0:
        return np.inf
    return rhs / lhs_at_one


def _positive(**values: Any) -> tuple[float, ...]:
    return tuple(positive(name, v) for name, v in values.items())


def _form(form: str) -> None:
    if form not in ("exact", "remark"):
        raise fail("form", "'exact' (conditions (i)-(ii)) or 'remark' (Remark B.2)", repr(form))
