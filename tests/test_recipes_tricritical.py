"""The tricritical recipe at tiny sizes: structure, the threshold against the closed form
written here (scipy's iv), the linear fluctuation theory, the sweeps' code path and the
switching-bracket measures on hand-made sweeps."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import iv

from attnflow.analysis.closedforms import linear_fluctuation
from attnflow.experiments import SUITE_OF
from attnflow.experiments.tricritical import _first_order_measures
from attnflow.reproduce import reproduce

VERDICTS = ("reproduced", "partly", "not reproduced", "not run")
TINY = {"rate_betas": [2.0], "fluct_betas": [1.0], "fluct_ratios": [0.7], "fluct_n": 60,
        "fluct_runs": 6, "fluct_t": 1.0, "phase_betas": 0}


def _run(tmp_path, **params) -> dict:
    (res,) = reproduce(["tricritical"], out=tmp_path, overrides={"tricritical": params})
    assert res["suite"] == "closedforms" == SUITE_OF["tricritical"]
    assert len(res["claims"]) == 6
    assert all(c["verdict"] in VERDICTS and c["measured"] and c["why"] for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / "tricritical" / fig).stat().st_size > 10_000
    return res


def test_threshold_claims_and_sweeps_not_run_at_quick(tmp_path):
    res = _run(tmp_path, **TINY)
    (row,) = res["numbers"]["rates"]
    closed = 2.0 / (2 * iv(1, 2.0))  # beta / (2 I_1(beta)) at sigma = 1
    assert row["K_sharp"] == pytest.approx(closed, rel=1e-12)
    assert row["K_zero"] == pytest.approx(closed, rel=1e-8)
    assert res["claims"][0]["verdict"] == "reproduced"
    (f,) = res["numbers"]["fluctuations"]
    a = 0.5 * 2 * (1 - 0.7 * (1 - 1 / 60))  # (sigma^2/2)(d - 1)(1 - K'/K_#)
    S = 2 / (2 * a)
    assert f["theory"] == pytest.approx(S + (1 - S) * np.exp(-2 * a * 1.0), rel=1e-12)
    assert [c["verdict"] for c in res["claims"][2:]] == ["not run"] * 4
    assert res["figures"] == ["tricritical_threshold.png", "tricritical_phase.png"]


def test_linear_fluctuation_at_the_threshold_grows_linearly():
    t = np.array([0.0, 1.0, 2.5])
    np.testing.assert_allclose(linear_fluctuation(1.0, t, 3), 1 + 2 * t)
    np.testing.assert_allclose(linear_fluctuation(1.0 - 1e-7, t, 3), 1 + 2 * t, rtol=1e-6)


@pytest.mark.slow
def test_sweeps_code_path_at_tiny_sizes(tmp_path):
    res = _run(tmp_path, **TINY, sweeps=True, circle_low=1.5, circle_high=4.0, sphere_low=1.0,
               sphere_high=4.0, low_ratios=[0.8, 1.3], courant=1.9, circle_low_modes=12,
               circle_hold_low=2.0, kick_low=1e-2, tol_low=1e-3, circle_high_modes=12,
               circle_hold_high=1.0, kick_high=1e-2, tol_high=1e-2,
               circle_up=["0.98 sharp", "1.1 sharp"], circle_down=["0.9 sn"],
               sphere_up=["0.9 sharp", "1.1 sharp"], sphere_down=["0.9 sn"], sweep_n=40,
               sweep_runs=1, sweep_dt=0.1, sweep_hold=0.4)
    sweeps = res["numbers"]["sweeps"]
    assert sorted(sweeps) == ["d2_high", "d2_low", "d3_high", "d3_low"]
    high = sweeps["d3_high"]
    assert high["K_sn"] < high["K_c"] < high["K_sharp"]
    assert len(high["r_up"]) == 2 and len(high["r_down"]) == 1
    assert all(c["verdict"] != "not run" for c in res["claims"])
    assert "tricritical_circle.png" in res["figures"]


def _sweep(up, r_up, down, r_down, theory):
    return {"K_sharp": 1.0, "K_sn": 0.8, "r_sn": 0.4, "up": up, "r_up": r_up, "down": down,
            "r_down": r_down, "theory": theory}


def test_first_order_measures_on_hand_made_sweeps():
    theory = {0.7: 0.0, 0.85: 0.6, 0.95: 0.7, 1.1: 0.9}
    ideal = _sweep([0.7, 0.95, 1.1], [0.01, 0.02, 0.9], [0.95, 0.85, 0.7], [0.7, 0.6, 0.01],
                   theory)
    m = _first_order_measures(ideal)
    assert m == {"loop": pytest.approx(0.68), "switch_off": 0.0, "branch_off": 0.0}
    # down sweep falls already at 0.85 > K_sn = 0.8: the bracket [0.85, 0.95] misses K_sn
    early = _sweep([0.7, 0.95, 1.1], [0.01, 0.02, 0.9], [0.95, 0.85, 0.7], [0.7, 0.05, 0.01],
                   theory)
    assert _first_order_measures(early)["switch_off"] == pytest.approx(0.05)
    # no jump on the way up: no bracket at all
    stuck = _sweep([0.7, 0.95, 1.1], [0.01, 0.02, 0.05], [0.95], [0.04], theory)
    assert _first_order_measures(stuck)["switch_off"] == np.inf
