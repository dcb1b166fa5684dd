"""The recipes of the mean-field limits (causalprofile, convergence, kuramoto) at tiny sizes:
their outputs' structure and numbers against independent truth (the Volterra closed form by
quadrature, the Kuramoto root by scipy's Bessel functions, the particles' own moments)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import iv

from attnflow.analysis.closedforms import hardy_kernel
from attnflow.experiments import SUITE_OF
from attnflow.reproduce import reproduce

VERDICTS = ("reproduced", "partly", "not reproduced")


def _run(name: str, tmp_path, **params) -> dict:
    (res,) = reproduce([name], out=tmp_path, overrides={name: params})
    assert res["suite"] == "followups" == SUITE_OF[name]
    assert res["claims"] and all(c["verdict"] in VERDICTS and c["measured"] and c["why"]
                                 for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / name / fig).stat().st_size > 10_000
    return res


def test_causalprofile_solver_follows_the_closed_form(tmp_path):
    res = _run("causalprofile", tmp_path, n=600, runs=6, cells=6, times=[3.0], mf_sub=2,
               chunk=6)
    nums = res["numbers"]
    closed, solver = np.array(nums["closed_form"]), np.array(nums["solver"])
    assert closed.shape == solver.shape == np.array(nums["particles"]).shape == (1, 5)
    # the cell average of psi is near psi at the cells' centres (independent of cell_memory)
    s = (np.arange(1, 6) - 0.5) / 6
    point = hardy_kernel(nums["lambda_k"] * 3.0, np.log((1 - 1 / 12) / s)) / (1 - 1 / 12)
    assert np.allclose(closed[0, 1:], point[1:], rtol=0.05)
    assert np.max(np.abs(solver / closed - 1)) < 1e-2  # the solver: second order in cells
    assert np.all(np.diff(closed[0]) < 0)  # primacy: the first tokens are remembered most
    assert res["claims"][0]["verdict"] == "reproduced"
    assert np.all(np.array(nums["particles_se"]) > 0)


def test_convergence_rates(tmp_path):
    res = _run("convergence", tmp_path, iid_ns=[200, 800], iid_runs=[4, 4], mf_modes=64,
               small_ns=[8, 16, 32, 64], quantile_ns=[500])
    nums = res["numbers"]
    assert nums["resolution_lost_at"] is None
    # quantile starts: geometric, down to the floor at n = 500
    assert nums["quantile_errors"][0] < 1e-6 and nums["floor"] < 1e-6
    assert nums["small_errors"][-1] < nums["small_errors"][0] / 50
    # iid starts: RMS error of order n^{-1/2}, four times the tokens halve it roughly
    rms = np.array(nums["iid_rms"])
    assert 1.3 < rms[0] / rms[1] < 3.0
    assert res["claims"][1]["verdict"] == "reproduced"


def _root(kappa: float) -> float:
    return brentq(lambda r: iv(1, kappa * r) / iv(0, kappa * r) - r, 1e-3, 1.0, xtol=1e-15)


def test_kuramoto_solver_and_particles_near_the_root(tmp_path):
    res = _run("kuramoto", tmp_path, sigmas=[0.6], mf_t_end=40.0, n=2000, t_end=6.0)
    (row,) = res["numbers"]["rows"]
    root = _root(2 / 0.36)
    assert row["root"] == pytest.approx(root, abs=1e-12)
    assert row["solver"] == pytest.approx(root, abs=1e-8)
    assert row["particles"] == pytest.approx(root, abs=8 * row["particles_se"] + 2e-3)
    assert res["claims"][0]["verdict"] == "reproduced"
