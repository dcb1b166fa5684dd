"""The event-locating integrator of hardmax dynamics (method "events", docs/science.md §11.6).

At beta = +-inf each token i follows its leaders L_i (the allowed keys of largest signed
score s_ij, ties within the kernel's tolerance sharing the weight): the field is smooth while
every L_i holds and jumps when some token's leaders change (an event). The integrator

1. steps RK4 (fixed step dt, as the fixed-step methods: each interval between save times in
   equal steps of at most dt) with the leader sets frozen (`Switching.field`);
2. after each step checks every token's margin
       m_i = min_{j in L_i} s_ij - max_{j allowed, not in L_i} s_ij   (>= 0 while L_i holds),
   lowered to tol_i - spread_i for a tied set whose scores have spread apart by more than
   the tie tolerance, at 8 points of the step's cubic Hermite interpolant (the state and the
   field at both ends, retracted onto the manifold; order 4 like the step);
3. where a margin turned negative, finds the first bracket of that sign change and its root
   by brentq (scipy), takes the point just past the root, and redoes the step from its start
   to that time by RK4 (so the event state has RK4's accuracy, not the interpolant's);
4. gives the crossing tokens their new leaders: the keys tied for the top score past the
   crossing, minus the old leaders (the key that overtook), or, if none is new (a tied set
   that split), the top keys; then continues.

Every event is recorded as (t, run, token, old leaders, new leaders); runs are the flattened
leading axes. The integrator imports no kernel or model: `simulate` hands it the signed
scores, the tie rule and the frozen-leader field as functions.

Sliding: where a single new leader b, once taken, would at once lose to the old one a (the
field points into the switching surface s_ia = s_ib from both sides), the token slides on
the pair (Filippov): weight w on a and 1 - w on b, with w solving d/dt (s_ia - s_ib) = 0
(the field is affine in w and the derivative of the gap along a velocity linear, its
coefficients by central differences; several sliding tokens share one linear system). The
event's new leaders are then [a, b]. Sliding ends when w leaves [0, 1] (the token keeps the
key its weight went to) or a third key overtakes the pair. What this does not resolve (a
token returning to its previous leaders 3 times in a row, each within one step dt: sliding
on more than two keys, chattering) stops the run with `SlidingError` naming the token, as do
more than `max_events` events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from attnflow._checks import fail
from attnflow.ensembles import Progress
from attnflow.integrate import Solution, rk4_step
from attnflow.manifolds import Manifold

__all__ = ["MAX_EVENTS", "SAMPLES", "SlidingError", "Event", "Switching", "integrate_events"]

SAMPLES = 8  # interpolant points per step at which the margins are checked
MAX_EVENTS = 100_000  # default cap on the events of one call

Event = tuple[float, int, int, list[int], list[int]]  # t, run, token, old, new leaders


class SlidingError(ValueError):
    """The flow slides along a switching surface (or makes more than `max_events` events):
    the events method stops there (module docstring); the message names the token."""


@dataclass(frozen=True)
class Switching:
    """A piecewise smooth field: the velocity while fixed leader sets hold, and what decides
    the leaders.

    scores : X (..., n, d) -> (s, tol): signed scores s (..., n, n) (-inf where the mask
        forbids a key) and the tie tolerance tol (..., n) of each row.
    leaders : (s, tol) -> the boolean leader sets (..., n, n) (ties within tol).
    field : (X, W) -> the velocity (..., n, d) with the attention weights W (..., n, n)
        frozen (1 / |L_i| on row i's leaders).
    """

    scores: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    leaders: Callable[[np.ndarray, np.ndarray], np.ndarray]
    field: Callable[[np.ndarray, np.ndarray], np.ndarray]


def margins(s: np.ndarray, tol: np.ndarray, lead: np.ndarray,
            sliding: np.ndarray | None = None) -> np.ndarray:
    """m_i (..., n): how far row i's leader set still holds (module docstring); < 0 when a
    key outside L_i overtook it or a tied set spread apart by more than tol_i. Rows marked
    in `sliding` (..., n) keep their pair tied by construction: only keys outside count."""
    inside = np.where(lead, s, np.inf).min(axis=-1)
    top = np.where(lead, s, -np.inf).max(axis=-1)
    outside = np.where(lead, -np.inf, s).max(axis=-1)
    with np.errstate(invalid="ignore"):  # rows whose every allowed key leads: inf - -inf
        m = inside - outside
    m = np.where(np.isfinite(outside), m, np.inf)
    spread = np.where(lead.sum(axis=-1) > 1, tol - (top - inside), np.inf)
    if sliding is not None:
        spread = np.where(sliding, np.inf, spread)
    return np.minimum(m, spread)


class _Mode:
    """The leader sets of a segment, and the tokens sliding on a pair (a, b) of them with
    the Filippov weight w on a, 1 - w on b that keeps s_ia - s_ib = 0 (equivalent control:
    the field is affine in the w's, the derivative of the score gaps along a field linear,
    so one linear system per evaluation, its coefficients by central differences)."""

    def __init__(self, switching: Switching, lead: np.ndarray,
                 pairs: tuple[tuple[int, int, int, int], ...] = ()) -> None:
        self.switching = switching
        self.lead = lead
        self.pairs = pairs  # (run, token, a, b) with flat run indices
        n = lead.shape[-1]
        flat = np.zeros((int(np.prod(lead.shape[:-2], dtype=int)), n), bool)
        for run, token, _a, _b in pairs:
            flat[run, token] = True
        self.sliding = flat.reshape(lead.shape[:-1])
        self.base = lead / lead.sum(axis=-1, keepdims=True)

    def gaps(self, y: np.ndarray) -> np.ndarray:
        """s_ia - s_ib of every sliding pair at y."""
        s = self.switching.scores(y)[0].reshape(-1, *self.lead.shape[-2:])
        return np.array([s[r, i, a] - s[r, i, b] for r, i, a, b in self.pairs])

    def solve(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the field at y, the sliding weights w at y)."""
        if not self.pairs:
            return self.switching.field(y, self.base), np.zeros(0)
        flat_shape = (-1, *self.lead.shape[-2:])
        WA, WB = self.base.reshape(flat_shape).copy(), self.base.reshape(flat_shape).copy()
        for r, i, a, b in self.pairs:
            WA[r, i], WB[r, i] = 0.0, 0.0
            WA[r, i, a], WB[r, i, b] = 1.0, 1.0
        FA = self.switching.field(y, WA.reshape(self.lead.shape))
        FB = self.switching.field(y, WB.reshape(self.lead.shape))
        rows = FA.reshape(-1, *y.shape[-2:]) - FB.reshape(-1, *y.shape[-2:])
        deltas = []
        for r, i, _a, _b in self.pairs:
            dF = np.zeros_like(rows)
            dF[r, i] = rows[r, i]
            deltas.append(dF.reshape(y.shape))
        rhs = -self.rate(y, FB)
        J = np.stack([self.rate(y, dF) for dF in deltas], axis=1)
        w = np.linalg.lstsq(J, rhs, rcond=None)[0]
        return FB + sum(wk * dF for wk, dF in zip(w, deltas)), w

    def rate(self, y: np.ndarray, v: np.ndarray) -> np.ndarray:
        """d/dt of the sliding gaps along the velocity v (central difference)."""
        scale = float(np.max(np.abs(v)))
        if scale == 0:
            return np.zeros(len(self.pairs))
        eps = 1e-5 / scale
        return (self.gaps(y + eps * v) - self.gaps(y - eps * v)) / (2 * eps)

    def field(self, y: np.ndarray) -> np.ndarray:
        return self.solve(y)[0]

    def margins(self, y: np.ndarray) -> np.ndarray:
        """Every row's margin at y; a sliding row's also min(w, 1 - w) (leaving the pair)."""
        s, tol = self.switching.scores(y)
        m = margins(s, tol, self.lead, self.sliding)
        if self.pairs:
            w = self.solve(y)[1]
            flat = m.reshape(-1, m.shape[-1])
            for (r, i, _a, _b), wk in zip(self.pairs, w):
                flat[r, i] = min(flat[r, i], wk, 1 - wk)
        return m


def integrate_events(switching: Switching, x0: np.ndarray, times: np.ndarray, dt: float,
                     progress: Progress | None, manifold: Manifold,
                     max_events: int = MAX_EVENTS) -> tuple[Solution, list[Event]]:
    """Integrate the hardmax dynamics from x0 (..., n, d) at times[0] through `times`
    (increasing; the first is the start and is saved); returns the Solution and the events
    in time order (module docstring)."""
    x = x0
    t = float(times[0])
    mode = _Mode(switching, switching.leaders(*switching.scores(x)))
    out = [x0]
    events: list[Event] = []
    recent: dict[tuple[int, int], tuple[float, int, list[int] | None]] = {}  # (run, token):
    # the last event's time, the returns in a row, the last old leaders
    n_evals = n_steps = 0
    for t_next in times[1:]:
        while t < t_next:
            m = max(1, int(np.ceil((t_next - t) / dt * (1 - 1e-12))))
            h = (t_next - t) / m
            x1 = rk4_step(mode.field, x, h, manifold)
            theta = _locate(mode, x, x1, h, manifold)
            n_evals += 6  # the step's 4 stages, the interpolant's 2 end slopes
            if theta is None:
                t, x = (t_next if m == 1 else t + h), x1
                n_steps += 1
                if progress is not None:
                    progress(t)
                continue
            x = rk4_step(mode.field, x, theta * h, manifold)
            n_evals += 4
            n_steps += 1
            t = t + theta * h
            before = len(events)
            mode = _switch(mode, x, t, events)
            for e in events[before:]:
                key = (e[1], e[2])
                t_last, count, last_old = recent.get(key, (-np.inf, 0, None))
                back = e[4] == last_old and t - t_last <= dt  # A -> B -> A within a step
                recent[key] = (t, count + 1 if back else 0, e[3])
                if recent[key][1] >= 3 or len(events) > max_events:
                    error = fail("method", "'events' on a flow it resolves (a token's "
                                 "leaders switching back and forth at one time, sliding "
                                 "other than on a pair of keys; at most "
                                 f"{max_events} events)", f"{len(events)} events by t = "
                                 f"{t:.6g}, the last for token {e[2]} of run {e[1]} "
                                 f"({e[3]} -> {e[4]})")
                    raise SlidingError(*error.args)
            if progress is not None:
                progress(t)
        out.append(x)
    return Solution(np.asarray(times), np.stack(out), n_evals, n_steps, 0), events


def _locate(mode: _Mode, x0: np.ndarray, x1: np.ndarray, h: float, manifold: Manifold
            ) -> float | None:
    """The fraction theta in (0, 1] of the step at which a margin first turns negative on
    the step's Hermite interpolant (just past the root); None when every margin stays >= 0
    at the sample points."""
    f0, f1 = mode.field(x0), mode.field(x1)

    def at(theta: float) -> np.ndarray:
        t2, t3 = theta * theta, theta ** 3
        return manifold.retract((2 * t3 - 3 * t2 + 1) * x0 + (t3 - 2 * t2 + theta) * h * f0
                                + (-2 * t3 + 3 * t2) * x1 + (t3 - t2) * h * f1)

    def worst(theta: float) -> float:
        return float(np.min(mode.margins(at(theta))))

    a = 0.0
    for j in range(1, SAMPLES + 1):
        b = j / SAMPLES
        if worst(b) < 0:
            break
        a = b
    else:
        return None
    root = a if worst(a) < 0 else brentq(worst, a, b, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    step = 4 * np.finfo(float).eps
    theta = root
    while theta < b and worst(theta) >= 0:  # just past the root: the new leader is ahead
        theta = min(b, theta + step)
        step *= 2
    return max(theta, np.finfo(float).tiny)


def _switch(mode: _Mode, x: np.ndarray, t: float, events: list[Event]) -> _Mode:
    """The next segment's mode at the event state x: rows whose margin is negative get new
    leaders (the tied top keys minus the old ones, or the top keys when none is new; a
    sliding row leaving its pair keeps the key its weight went to); a single new leader
    whose own margin would shrink at once (the field pointing back into the surface from
    both sides) starts sliding on the pair. Recorded as events."""
    switching = mode.switching
    s, tol = switching.scores(x)
    lead = mode.lead
    m = mode.margins(x)
    broken = m < 0
    tied = switching.leaders(s, tol)
    fresh = tied & ~lead
    new = np.where(fresh.any(axis=-1, keepdims=True), fresh, tied)
    out = np.where(broken[..., None], new, lead)
    n = lead.shape[-1]
    flat_old = lead.reshape(-1, n, n)
    flat_out = out.reshape(-1, n, n)
    flat_broken = broken.reshape(-1, n)
    weights = dict(zip(((r, i) for r, i, _a, _b in mode.pairs), mode.solve(x)[1]))
    pairs = []
    for r, i, a, b in mode.pairs:
        if not flat_broken[r, i]:
            pairs.append((r, i, a, b))
        elif flat_out[r, i].sum() == 2 and flat_out[r, i, a] and flat_out[r, i, b]:
            flat_out[r, i] = False  # left the pair through its weight: to the side it chose
            flat_out[r, i, a if weights[(r, i)] > 0.5 else b] = True
    candidates = []
    for r, i in zip(*np.nonzero(flat_broken)):
        old, new_set = np.flatnonzero(flat_old[r, i]), np.flatnonzero(flat_out[r, i])
        if len(old) == 1 and len(new_set) == 1 and old[0] != new_set[0] and \
                (int(r), int(i)) not in weights:
            candidates.append((int(r), int(i), int(new_set[0]), int(old[0])))
    if candidates:  # does the new leader's margin shrink at once? then slide on the pair
        trial = _Mode(switching, flat_out.reshape(lead.shape))
        rates = _Mode(switching, lead, tuple(candidates)).rate(x, trial.field(x))
        for c, rate in zip(candidates, rates):
            if rate < 0:  # d/dt (s_new - s_old) < 0 under the new leader: back at once
                r, i, a, b = c
                flat_out[r, i, b] = True
                pairs.append(c)
    result = _Mode(switching, flat_out.reshape(lead.shape), tuple(pairs))
    for r, i in zip(*np.nonzero(flat_broken)):
        events.append((float(t), int(r), int(i), np.flatnonzero(flat_old[r, i]).tolist(),
                       np.flatnonzero(flat_out[r, i]).tolist()))
    return result
