"""The influence of each token on the last one (docs/science.md §11.7): the backward pass
against central differences of the numpy engine, causality, the exact integration-by-parts
identity, the linearised prediction against independent computations (the discrete linear
system by solve_ivp, a closed form at t -> 0, brute-force quadrature), the recipe at a tiny
size."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp

torch = pytest.importorskip("torch")

from attnflow.analysis.closedforms import (  # noqa: E402
    dispersion_rate,  # noqa: E402
    influence_recency_time,
    mean_influence,
    rms_influence,
)
from attnflow.analysis.influence import kernels, mean_abs_cosines  # noqa: E402
from attnflow.experiments import SUITE_OF  # noqa: E402
from attnflow.experiments.influence import _jacobian_rows  # noqa: E402
from attnflow.family import Attention  # noqa: E402
from attnflow.reproduce import reproduce  # noqa: E402
from attnflow.simulate import simulate  # noqa: E402

BETA, SLOPE = 1.0, 1.0


def model(n, backend="auto"):
    return Attention(beta=BETA, mask="causal", attention="positional", alibi=SLOPE / n,
                     backend=backend)


def last_angle(theta0, t, n):
    """theta_n(t) from the numpy engine (dense kernel: the tensor kernel's extension off the
    circle, so the two runs agree to rounding)."""
    x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
    x = simulate(model(n, "dense"), x0, t, save_at=[t], dt=0.25).states[-1][..., -1, :]
    return np.arctan2(x[..., 1], x[..., 0])


def test_backward_pass_equals_central_differences_of_the_numpy_engine():
    n, t, h = 7, 1.5, 1e-5
    theta0 = np.random.default_rng(1).uniform(0, 2 * np.pi, (2, n))
    J, theta_n = _jacobian_rows(model(n), theta0, [t], 0.25)
    assert np.allclose(theta_n[0], last_angle(theta0, t, n), atol=1e-13)
    fd = np.zeros((2, n))
    for j in range(n):
        up, down = theta0.copy(), theta0.copy()
        up[:, j] += h
        down[:, j] -= h
        fd[:, j] = np.angle(np.exp(1j * (last_angle(up, t, n) - last_angle(down, t, n)))) / (2 * h)
    assert np.max(np.abs(J[0] - fd)) < 1e-8 * np.max(np.abs(fd))


def test_causality_and_the_identity_at_time_zero():
    n = 6
    theta0 = np.random.default_rng(2).uniform(0, 2 * np.pi, (3, n))
    J, _ = _jacobian_rows(model(n), theta0, [0.0, 1.0], 0.25)
    assert np.array_equal(J[0], np.tile(np.eye(n)[-1], (3, 1)))  # t = 0: the identity's row
    # a token does not see later ones: d theta_3(t) / d theta_j(0) = 0 for j > 3
    x0 = torch.from_numpy(np.stack([np.cos(theta0), np.sin(theta0)], -1)).requires_grad_()
    run = simulate(model(n), x0, 1.0, save_at=[1.0], dt=0.25)
    (grad,) = torch.autograd.grad(run.states[-1, :, 2].sum(), x0)
    assert torch.all(grad[:, 3:] == 0) and torch.all(grad[:, :3].abs().sum(-1) > 0)


def test_integration_by_parts_identity_is_exact():
    """E[J e^{ik(theta_n(t) - theta_j(0))}] = E[e^{ik(theta_n(t) - theta_j(0))}] over theta_j(0)
    uniform, the other tokens fixed: on M equal angles the trapezoid rule of a smooth periodic
    function is exact to rounding."""
    n, j, M, t = 6, 2, 96, 2.0
    base = np.random.default_rng(3).uniform(0, 2 * np.pi, n)
    theta0 = np.tile(base, (M, 1))
    theta0[:, j] = 2 * np.pi * np.arange(M) / M
    J, theta_n = _jacobian_rows(model(n), theta0, [t], 0.25)
    for k in (1, 2, 3):
        phase = np.exp(1j * k * (theta_n[0] - theta0[:, j]))
        assert abs(np.mean(J[0, :, j] * phase) - np.mean(phase)) < 1e-12
        assert abs(np.mean(phase)) > 1e-3  # not trivially zero


def test_kernels_against_the_discrete_linear_system():
    """The projected expected Jacobian n E[J_{n j} e^{ik(theta_n - theta_j)}] solves
    u' = r_k A u on n labels (A: ALiBi's causal weights normalised over the keys a token sees,
    itself included, as attnflow's mask): by solve_ivp at n = 400 it is the series K_k to the
    labels' O(1/n) (tolerance 4 / n)."""
    n, t = 400, 2.0
    i = np.arange(n)
    bias = np.exp(-SLOPE * (i[:, None] - i[None, :]) / n) * (i[:, None] >= i[None, :])
    A = np.tril(bias / bias.sum(1, keepdims=True), -1)
    for j in (120, 240, 360):
        for k in (1, 2, 3):
            r = float(dispersion_rate(k, BETA, attention="unnormalised"))
            u0 = np.eye(n)[j - 1]
            sol = solve_ivp(lambda _, u, r=r: r * (A @ u), (0, t), u0, method="DOP853",
                            rtol=1e-10, atol=1e-13)
            series = kernels(j / n, t, BETA, SLOPE)[k - 1]
            assert abs(n * sol.y[-1, -1] / series - 1) < 4 / n


def test_mean_and_rms_against_brute_force_and_the_short_time_limit():
    c = kernels(0.3, 2.0, BETA, SLOPE) * 2
    phi = np.linspace(0, 2 * np.pi, 2**18, endpoint=False)
    brute = np.mean(np.abs(np.cos(np.outer(phi, np.arange(1, c.size + 1))) @ c))
    assert abs(mean_abs_cosines(c) / brute - 1) < 1e-8
    assert np.isclose(rms_influence(0.3, 2.0, BETA, SLOPE),
                      np.sqrt(np.mean((np.cos(np.outer(phi, np.arange(1, c.size + 1))) @ c)**2)),
                      rtol=1e-12)
    # t -> 0: n J = t p(s) g(phi), g = e^{beta cos phi}(cos phi - beta sin^2 phi) in closed form
    g = lambda x: abs(np.exp(BETA * np.cos(x)) * (np.cos(x) - BETA * np.sin(x) ** 2))  # noqa: E731
    Eg = quad(g, 0, np.pi, limit=200, points=[1.0, 2.0])[0] / np.pi
    s, t = np.array([0.2, 0.7]), 1e-7
    p = SLOPE * np.exp(SLOPE * s) / np.expm1(SLOPE)
    assert np.allclose(mean_influence(s, t, BETA, SLOPE) / t, p * Eg, rtol=1e-5)


def test_right_end_stops_rising_at_t_I():
    t_I = influence_recency_time(BETA, SLOPE)
    slope = lambda t: (mean_influence(0.9999, t, BETA, SLOPE)  # noqa: E731
                       - mean_influence(0.9989, t, BETA, SLOPE))
    assert slope(0.97 * t_I) > 0 > slope(1.03 * t_I)


def test_influence_recipe_at_a_tiny_size(tmp_path):
    (res,) = reproduce(["influence"], out=tmp_path, overrides={"influence": {
        "n": 40, "runs": 8, "factors": [0.25, 1.0], "cells": 4, "chunk": 8}})
    assert res["suite"] == "gradients" == SUITE_OF["influence"]
    assert [c["id"] for c in res["claims"]] == ["influence.green", "influence.identity",
                                               "influence.shape"]
    assert all(c["verdict"] in ("reproduced", "partly", "not reproduced") and c["why"]
               for c in res["claims"])
    (setting,) = res["numbers"]["settings"]
    measured, predicted = np.array(setting["influence"]), np.array(setting["predicted"])
    assert measured.shape == predicted.shape == (2, 4)
    assert np.all(np.abs(measured[0] / predicted[0] - 1) < 0.3)  # t = 0.25 t_crit
    assert (tmp_path / "influence" / res["figures"][0]).stat().st_size > 10_000
