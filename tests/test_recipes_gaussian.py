"""The gaussian recipe at tiny sizes: its outputs' structure, and its numbers against
independent truth (the moment ODE re-solved here from its formula, the closed-form blow-up
time, the symmetry that keeps the antithetic mean at 0, the tilt by scipy's sqrtm)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.linalg import sqrtm

from attnflow.experiments import SUITE_OF
from attnflow.experiments.gaussian import CONFIGS, QUICK, tilt
from attnflow.reproduce import reproduce

TINY = {"configs": CONFIGS[1:], "n": 120, "runs": 6, "t_end": 1.0, "save_every": 0.5,
        "check_times": [0.5, 1.0], "blowup_n": 100, "blowup_runs": 4, "levels": [2.0, 4.0],
        "show_level": 8.0, "blowup_saves": 40}


def _moment_ode(m0, S0, times, beta, Q, K, V):
    """The moment ODE written out again: dm = V (m + S A m), dS = V S A S + S A^T S V^T."""
    A = beta * K.T @ Q
    d = m0.size

    def rhs(_t, y):
        m, S = y[:d], y[d:].reshape(d, d)
        return np.concatenate([V @ (m + S @ A @ m),
                               (V @ S @ A @ S + S @ A.T @ S @ V.T).ravel()])

    y = solve_ivp(rhs, (0, times[-1]), np.concatenate([m0, S0.ravel()]), t_eval=times,
                  method="Radau", rtol=1e-11, atol=1e-13).y.T
    return y[:, :d], y[:, d:].reshape(-1, d, d)


def test_gaussian_recipe_against_independent_truth(tmp_path):
    (res,) = reproduce(["gaussian"], out=tmp_path, overrides={"gaussian": TINY})
    assert res["suite"] == "closedforms" == SUITE_OF["gaussian"]
    assert [c["id"] for c in res["claims"]] == ["gaussian.moments", "gaussian.blowup"]
    assert all(c["verdict"] in ("reproduced", "partly", "not reproduced") and c["why"]
               for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / "gaussian" / fig).stat().st_size > 10_000
    m0, S0, beta = np.array(QUICK["m0"]), np.array(QUICK["Sigma0"]), QUICK["beta"]
    for row, cfg in zip(res["numbers"]["moments"], TINY["configs"]):
        Q, K, V = (np.array(cfg[k]) for k in "QKV")
        times = np.array(row["times"])
        m, S = _moment_ode(m0, S0, times, beta, Q, K, V)
        np.testing.assert_allclose(row["ode_m"], m, atol=1e-8)
        np.testing.assert_allclose(row["ode_S"], S, atol=1e-8)
        assert row["tilt"] <= 2.0  # the configurations' design rule
        assert np.isfinite(row["largest_z"]) and row["n_evals"] > 0
    b = res["numbers"]["blowup"]
    lam0 = QUICK["lambda0"]
    assert b["t_star"] == pytest.approx(1 / (2 * QUICK["blowup_beta"] * lam0), rel=1e-14)
    for lvl, k in zip(b["levels"], TINY["levels"]):
        assert lvl["level"] == pytest.approx(k * lam0)
        assert lvl["t_closed_form"] == pytest.approx(b["t_star"] * (1 - 1 / k), rel=1e-12)
    assert b["largest_mean"] < 1e-10  # x -> -x symmetry: the antithetic mean stays 0
    slope, se = b["slope"]  # d(1 / lambda_max)/dt = -2 beta
    assert slope == pytest.approx(-2 * QUICK["blowup_beta"], abs=6 * se + 0.05)


def test_the_tilt_is_the_formula():
    rng = np.random.default_rng(0)
    B = rng.normal(size=(2, 2))
    S, m = B @ B.T + 0.1 * np.eye(2), rng.normal(size=2)
    Q, K = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    root = np.real(sqrtm(S))
    A = 0.7 * K.T @ Q
    expected = np.linalg.norm(root @ A @ m) + 2 * np.linalg.svd(root @ A @ root)[1][0]
    assert tilt(m, S, 0.7, Q, K) == pytest.approx(expected, rel=1e-10)
