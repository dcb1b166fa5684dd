"""The lost-in-the-middle closed forms (arXiv 2605.09213, docs/science.md §11.1), the positional
weighting they need, and the lostmiddle recipe at a tiny size. Truth: the linearised label
equation solved by solve_ivp on a fine grid, the source's series re-implemented here with
scipy's Bessel functions, quadrature, and plain numpy attention."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp
from scipy.special import iv
from typer.testing import CliRunner

from attnflow import Attention, load
from attnflow.analysis.closedforms import (
    alibi_memory,
    causal_memory,
    cell_memory,
    hardy_label,
    recency_time,
    soft_accuracy,
    token_memory,
)
from attnflow.cli import app
from attnflow.experiments import SUITE_OF
from attnflow.family.weighting import Weighting
from attnflow.kernels import dense, harmonic
from attnflow.kernels.options import LinearBias
from attnflow.reproduce import reproduce

VERDICTS = ("reproduced", "partly", "not reproduced")


def _source_profile(s: float, beta: float, t: float, lam: float, M: float = 8.0,
                    modes: int = 20) -> float:
    """The source's soft accuracy in its own time (velocity with the factor beta), from its
    definitions: a_n = n^2 I_n(beta), the series of psi, its ALiBi factor."""
    y = math.log(math.expm1(lam) / math.expm1(lam * s))
    total = 0.0
    for n in range(1, modes + 1):
        c = n * n * iv(n, beta) * t
        psi = sum(c ** (m + 1) * y**m / (math.factorial(m) * math.factorial(m + 1))
                  for m in range(60))
        total += math.exp(-0.5 * (math.pi * n / M) ** 2) * lam * math.exp(lam * s) / math.expm1(
            lam) * psi
    return total


def test_the_alibi_average_is_the_hardy_operator_in_the_label_sigma():
    # (1/(1 - e^{-l s})) int_0^s l e^{-l (s - s')} sigma(s')^p ds' = sigma(s)^p / (p + 1)
    lam, s = 2.5, 0.7
    for p in (0, 1, 2.5):
        avg = quad(lambda x, p=p: lam * np.exp(-lam * (s - x)) * hardy_label(x, lam) ** p, 0, s,
                   epsabs=1e-13)[0] / -np.expm1(-lam * s)
        assert avg == pytest.approx(hardy_label(s, lam) ** p / (p + 1), rel=1e-10)
    assert np.allclose(hardy_label([0.1, 0.9], 0.0), [0.1, 0.9])


@pytest.mark.parametrize("beta, lam, t", [(1.0, 1.0, 2.0), (2.0, 3.0, 0.8)])
def test_alibi_memory_solves_the_linearised_label_equation(beta, lam, t):
    # the label equation d eps / dt = r P eps, P the ALiBi average over the earlier labels, on
    # M labels (strictly earlier ones, position weights normalised per row): a point at s0
    # reaches the last label with M eps_M(t) -> alibi_memory(s0), to O(1/M)
    M = 1000
    i = np.arange(M)
    P = np.where(i[None, :] < i[:, None], np.exp(-lam * (i[:, None] - i[None, :]) / M), 0.0)
    P[1:] /= P[1:].sum(axis=1, keepdims=True)
    r = 1 ** 2 * iv(1, beta) / beta
    j = (np.array([0.1, 0.5, 0.9]) * M).astype(int) - 1  # the points s0 = (j + 1) / M
    y0 = np.zeros((M, 3))
    y0[j, range(3)] = 1.0
    sol = solve_ivp(lambda _, y: r * (P @ y.reshape(M, 3)).ravel(), (0, t), y0.ravel(),
                    method="DOP853", rtol=1e-10, atol=1e-14)
    numeric = M * sol.y[:, -1].reshape(M, 3)[-1]
    assert np.allclose(numeric, alibi_memory((j + 1) / M, t, beta, lam), rtol=4e-3)


@pytest.mark.parametrize("lam", [0.0, 1.3])
@pytest.mark.parametrize("self_key", [True, False])
def test_token_memory_is_the_n_token_linear_equation_and_tends_to_cell_memory(lam, self_key):
    # truth: the n x n matrix W (rows: the earlier tokens' ALiBi weights over the row's
    # normaliser, with or without the token itself) exponentiated by scipy; and the n -> inf
    # limit, the closed form cell_memory
    from scipy.linalg import expm

    n, edges, tau = 60, np.array([0.0, 0.3, 0.7, 0.9, 1.0]), np.array([1.9, 0.7])
    W = np.zeros((n, n))
    for i in range(1, n):
        keys = np.arange(i + 1 if self_key else i)
        W[i, :i] = np.exp(-lam * (i - np.arange(i)) / n) / np.exp(-lam * (i - keys) / n).sum()
    cell = np.searchsorted(edges, np.arange(1, n + 1) / n * (1 - 1e-12)) - 1
    exact = [[n * expm(t * W)[np.ix_(cell == 3, cell == b)].mean() for b in range(3)]
             for t in tau]
    assert np.allclose(token_memory(n, edges, tau, lam, self_key=self_key), exact, rtol=1e-8)
    edges = np.array([0.0, 0.5, 0.9, 0.95, 1.0])
    closed = np.array([cell_memory((edges[b], edges[b + 1]), (0.95, 1.0), 1.5, slope=lam)
                       for b in range(3)])
    err = [np.abs(token_memory(n, edges, 1.5, lam, self_key=self_key)[0] / closed - 1).max()
           for n in (2000, 20_000)]
    assert err[1] < min(err[0] / 2, 1e-2), err


def test_soft_accuracy_and_recency_time_follow_the_source_formulas():
    for beta, t_src, lam, s in ((1.0, 1.5, 1.0, 0.3), (2.0, 0.5, 3.0, 0.7)):
        # attnflow's time is the source's times beta (its velocity carries beta)
        assert soft_accuracy(s, beta * t_src, beta, lam) == pytest.approx(
            _source_profile(s, beta, t_src, lam), rel=1e-12)
    beta, lam = 1.0, 1.0
    tc = recency_time(beta, lam)
    h = 1e-5

    def slope(t):  # the source profile's slope at its right end, by differences
        return (_source_profile(1 - h, beta, t, lam) - _source_profile(1 - 2 * h, beta, t,
                                                                       lam)) / h
    assert slope(0.97 * tc) > 0 > slope(1.03 * tc)
    assert recency_time(beta, 0.0) == 0.0  # no ALiBi, no recency


def test_alibi_memory_without_alibi_is_the_hardy_profile_and_cells_average_it():
    s = np.array([0.2, 0.6])
    beta, t = 1.5, 2.0
    rate = iv(1, beta) / beta  # the unnormalised rate of mode 1
    softmax_rate = iv(1, beta) / (beta * iv(0, beta))
    # causal_memory uses softmax's rate: the same kernel at the time scaled by the rates' ratio
    assert np.allclose(alibi_memory(s, t, beta, 0.0),
                       causal_memory(s, t * rate / softmax_rate, beta), rtol=1e-12)
    lam, tau = 2.0, 1.3
    s_cell, u_cell = (0.3, 0.4), (0.9, 1.0)
    direct = quad(lambda u: quad(lambda x: np.exp(lam * x) / hardy_label(u, lam)
                                 * _psi(tau, np.log(hardy_label(u, lam) / hardy_label(x, lam))),
                                 *s_cell)[0], *u_cell)[0] / 0.1 / 0.1
    assert cell_memory(s_cell, u_cell, tau, slope=lam) == pytest.approx(direct, rel=1e-9)


def _psi(tau: float, y: float) -> float:
    return sum(tau ** (m + 1) * y**m / (math.factorial(m) * math.factorial(m + 1))
               for m in range(60))


@pytest.mark.parametrize("mask", ["causal", "full", ("window", 5)])
@pytest.mark.parametrize("slope", [0.0, 0.2])
def test_positional_weights_in_dense_and_harmonic_match_plain_numpy(mask, slope):
    rng = np.random.default_rng(3)
    n, beta = 40, 1.7
    theta = rng.uniform(0, 2 * np.pi, (2, n))
    x = np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    i = np.arange(n)
    allowed = {"causal": i[None, :] <= i[:, None], "full": np.ones((n, n), bool)}.get(
        mask if isinstance(mask, str) else "", (i[None, :] <= i[:, None])
        & (i[None, :] > i[:, None] - 5))
    position = np.where(allowed, np.exp(-slope * np.abs(i[:, None] - i[None, :])), 0.0)
    position /= position.sum(axis=1, keepdims=True)
    expected = (position * np.exp(beta * x @ np.swapaxes(x, -1, -2))) @ x
    bias = LinearBias(slope) if slope else None
    got_dense = dense.attend(x, x, x, beta, mask, bias=None if bias is None else bias.matrix(n),
                             normalization="positional")
    got_harmonic = harmonic.attend(x, x, x, beta, mask, bias=bias, normalization="positional")
    assert np.allclose(got_dense, expected, atol=1e-12)
    assert np.allclose(got_harmonic, expected, atol=1e-11)


def test_positional_weighting_through_the_model_cli_and_record(tmp_path):
    assert Weighting.parse("positional").kernel_arg == "positional"
    with pytest.raises(ValueError, match="positional"):
        Weighting.parse("positionl")
    path = tmp_path / "lm.nc"
    result = CliRunner().invoke(app, [
        "simulate", "--n", "30", "--d", "2", "--t-end", "0.5", "--beta", "1", "--attention",
        "positional", "--alibi", "0.05", "--out", str(path), "--no-progress"])
    assert result.exit_code == 0, result.output
    traj = load(path)
    assert traj.model.weighting.method == "positional"
    x = traj.states[0]
    position = traj.model.attention.weights(x) * np.exp(-x @ x.T)  # (n, n): e^{-0.05 (i - j)} / P_i
    i = np.arange(30)
    assert np.allclose(position.sum(axis=1), 1.0)
    assert np.allclose(position[-1, :-1] / position[-1, 1:], np.exp(-0.05))
    rebuilt = Attention.from_record(*traj.model.to_record())
    assert rebuilt.weighting == traj.model.weighting and np.allclose(
        rebuilt.attention.weights(x), traj.model.attention.weights(x))
    assert np.all(position[i[:, None] < i[None, :]] == 0)


def test_lostmiddle_recipe_at_a_tiny_size(tmp_path):
    (res,) = reproduce(["lostmiddle"], out=tmp_path, overrides={"lostmiddle": {
        "n": 600, "runs": 16, "groups": 4, "factors": [0.5, 1.0], "cells": 4}})
    assert res["suite"] == "closedforms" == SUITE_OF["lostmiddle"]
    assert [c["id"] for c in res["claims"]] == ["lostmiddle.profile", "lostmiddle.recency"]
    assert all(c["verdict"] in VERDICTS and c["measured"] and c["why"] for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / "lostmiddle" / fig).stat().st_size > 10_000
    (setting,) = res["numbers"]["settings"]
    closed = np.array(setting["closed"])
    assert closed.shape == np.array(setting["particles"]).shape == (2, 8)
    # the cell averages lie near the point profile at the cells' centres (independent of
    # cell_memory's incomplete-gamma series)
    edges = np.array(res["numbers"]["edges"])
    centres = (edges[:-1] + edges[1:])[:-1] / 2
    point = [_source_profile(s, 1.0, setting["times"][0], 1.0) for s in centres[1:]]
    assert np.allclose(closed[0, 1:], point, rtol=0.05)
    # before t_crit the closed form is U-shaped: primacy, recency, a minimum between
    assert closed[0, 0] > closed[0].min() < closed[0, -1] and closed[0].argmin() not in (0, 7)
