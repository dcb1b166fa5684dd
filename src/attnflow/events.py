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
scores, the tie rule and the frozen-leader field as functions. Sliding (a token switching
back at once, the field pointing into the switching surface from both sides) is not
resolved: a token changing leaders 4 times in a row, each within one step dt of the last,
stops the run with an error naming it (as do more than `max_events` events).
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


def margins(s: np.ndarray, tol: np.ndarray, lead: np.ndarray) -> np.ndarray:
    """m_i (..., n): how far row i's leader set still holds (module docstring); < 0 when a
    key outside L_i overtook it or a tied set spread apart by more than tol_i."""
    inside = np.where(lead, s, np.inf).min(axis=-1)
    top = np.where(lead, s, -np.inf).max(axis=-1)
    outside = np.where(lead, -np.inf, s).max(axis=-1)
    with np.errstate(invalid="ignore"):  # rows whose every allowed key leads: inf - -inf
        m = inside - outside
    m = np.where(np.isfinite(outside), m, np.inf)
    return np.minimum(m, np.where(lead.sum(axis=-1) > 1, tol - (top - inside), np.inf))


def integrate_events(switching: Switching, x0: np.ndarray, times: np.ndarray, dt: float,
                     progress: Progress | None, manifold: Manifold,
                     max_events: int = MAX_EVENTS) -> tuple[Solution, list[Event]]:
    """Integrate the hardmax dynamics from x0 (..., n, d) at times[0] through `times`
    (increasing; the first is the start and is saved); returns the Solution and the events
    in time order (module docstring)."""
    x = x0
    t = float(times[0])
    s, tol = switching.scores(x)
    lead = switching.leaders(s, tol)
    out = [x0]
    events: list[Event] = []
    recent: dict[tuple[int, int], tuple[float, int]] = {}  # (run, token): last time, repeats
    n_evals = n_steps = 0
    for t_next in times[1:]:
        while t < t_next:
            m = max(1, int(np.ceil((t_next - t) / dt * (1 - 1e-12))))
            h = (t_next - t) / m
            weights = lead / lead.sum(axis=-1, keepdims=True)

            def field(y: np.ndarray, w: np.ndarray = weights) -> np.ndarray:
                return switching.field(y, w)

            x1 = rk4_step(field, x, h, manifold)
            found = _locate(switching, field, x, x1, h, lead, manifold)
            n_evals += 6  # the step's 4 stages, the interpolant's 2 end slopes
            if found is None:
                t, x = (t_next if m == 1 else t + h), x1
                n_steps += 1
                if progress is not None:
                    progress(t)
                continue
            theta, s_b, tol_b = found
            x = rk4_step(field, x, theta * h, manifold)
            n_evals += 4
            n_steps += 1
            t = t + theta * h
            before = len(events)
            lead = _switch(lead, s_b, tol_b, switching.leaders, t, events)
            for e in events[before:]:
                key = (e[1], e[2])
                t_last, count = recent.get(key, (-np.inf, 0))
                recent[key] = (t, count + 1 if t - t_last <= dt else 0)
                if recent[key][1] >= 3 or len(events) > max_events:
                    error = fail("method", "'events' on a flow without sliding (a token's "
                                 "leaders switching back and forth at one time: the field "
                                 "points into the switching surface from both sides, which "
                                 "the events method does not resolve; at most "
                                 f"{max_events} events)", f"{len(events)} events by t = "
                                 f"{t:.6g}, the last for token {e[2]} of run {e[1]} "
                                 f"({e[3]} -> {e[4]})")
                    raise SlidingError(*error.args)
            if progress is not None:
                progress(t)
        out.append(x)
    return Solution(np.asarray(times), np.stack(out), n_evals, n_steps, 0), events


def _locate(switching: Switching, field: Callable[[np.ndarray], np.ndarray], x0: np.ndarray,
            x1: np.ndarray, h: float, lead: np.ndarray, manifold: Manifold
            ) -> tuple[float, np.ndarray, np.ndarray] | None:
    """The fraction theta in (0, 1] of the step at which a margin first turns negative on
    the step's Hermite interpolant (just past the root), with the scores there; None when
    every margin stays >= 0 at the sample points."""
    f0, f1 = field(x0), field(x1)

    def at(theta: float) -> tuple[np.ndarray, np.ndarray]:
        t2, t3 = theta * theta, theta ** 3
        y = ((2 * t3 - 3 * t2 + 1) * x0 + (t3 - 2 * t2 + theta) * h * f0
             + (-2 * t3 + 3 * t2) * x1 + (t3 - t2) * h * f1)
        return switching.scores(manifold.retract(y))

    def worst(theta: float) -> float:
        s, tol = at(theta)
        return float(np.min(margins(s, tol, lead)))

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
    s, tol = at(theta)
    return max(theta, np.finfo(float).tiny), s, tol


def _switch(lead: np.ndarray, s: np.ndarray, tol: np.ndarray,
            leaders: Callable[[np.ndarray, np.ndarray], np.ndarray], t: float,
            events: list[Event]) -> np.ndarray:
    """New leader sets for the rows whose margin is negative at scores s, recorded as events;
    the other rows keep theirs."""
    broken = margins(s, tol, lead) < 0
    tied = leaders(s, tol)
    fresh = tied & ~lead
    new = np.where(fresh.any(axis=-1, keepdims=True), fresh, tied)
    out = np.where(broken[..., None], new, lead)
    flat_broken = broken.reshape(-1, broken.shape[-1])
    flat_old = lead.reshape(-1, *lead.shape[-2:])
    flat_new = out.reshape(-1, *out.shape[-2:])
    for run, token in zip(*np.nonzero(flat_broken)):
        events.append((float(t), int(run), int(token),
                       np.flatnonzero(flat_old[run, token]).tolist(),
                       np.flatnonzero(flat_new[run, token]).tolist()))
    return out
