"""The follow-up recipes (docs/science.md §6) at tiny sizes: their numbers against the closed
forms they compare with, and their verdict logic on both sides of each criterion."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from attnflow.analysis import (
    k_star,
    kuramoto_order,
    noise_threshold,
    output_correlation,
    uniform_fluctuation,
)
from attnflow.experiments import (
    RECIPES,
    SUITE_OF,
    SUITES,
    longcontext,
    meanfield,
    noise,
    normalization,
)
from attnflow.experiments import energy as energy_recipe
from attnflow.reproduce import recipe_names, reproduce

VERDICTS = ("reproduced", "partly", "not reproduced")


def _run(name: str, tmp_path, **params) -> dict:
    (res,) = reproduce([name], out=tmp_path, overrides={name: params})
    assert res["suite"] == "followups"
    assert res["claims"] and all(c["verdict"] in VERDICTS and c["measured"] and c["why"]
                                 for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / name / fig).stat().st_size > 10_000
    return res


def test_suites_partition_the_recipes():
    assert set(SUITES) == {"paper", "followups"}
    assert sorted(n for names in SUITES.values() for n in names) == sorted(RECIPES)
    assert {"normalization", "noise", "longcontext", "energy", "meanfield"} <= set(
        SUITES["followups"])
    assert SUITE_OF["fig2"] == "paper" and recipe_names(None, "paper") == list(SUITES["paper"])
    assert recipe_names(["noise"], "followups") == ["noise"]
    with pytest.raises(ValueError, match="names: expected recipe names of the suite 'paper'"):
        recipe_names(["noise"], "paper")
    with pytest.raises(ValueError, match="suite: expected one of"):
        recipe_names(None, "both")


def test_longcontext_matches_the_finite_n_formula(tmp_path):
    res = _run("longcontext", tmp_path, n_exact=[20, 40], n_random=[60], d_random=32,
               gamma_over_critical=[0.25, 2.5, 19])
    num = res["numbers"]
    rho, ratios = num["rho"], np.array(num["gamma_over_critical"])
    assert {1.0, 0.5, 2.0} <= set(ratios.tolist())
    for row in num["exact"]:
        want = output_correlation(row["n"], ratios / (1 - rho), rho)
        np.testing.assert_allclose(row["corr"], want, atol=1e-12)
        assert row["width_formula"] == pytest.approx(longcontext.formula_width(row["n"], rho))
    (rand,) = num["random"]
    assert abs(rand["input_correlation"] - rho) < 3 * (1 - rho) / np.sqrt(32 * 60)
    assert res["claims"][0]["verdict"] == "reproduced"


def test_longcontext_width_and_verdicts():
    rho, ratios = 0.5, np.linspace(0.25, 2.5, 401)
    corr = output_correlation(100.0, ratios / (1 - rho), rho)
    assert longcontext.transition_width(ratios, corr, rho) == pytest.approx(
        longcontext.formula_width(100.0, rho), rel=1e-3)
    assert np.isnan(longcontext.transition_width(ratios[:50], corr[:50], rho))  # not crossed
    params = dict(longcontext.QUICK)
    limits = np.array([1.0, 0.8, 0.5])
    close = [{"n": 10, "at_checks": limits + [-0.02, 0.02, 0.02]},
             {"n": 100, "at_checks": limits + [-0.005, 0.001, 0.004]}]
    far = [close[0], {"n": 100, "at_checks": limits + [-0.015, 0.001, 0.004]}]
    worse = [close[1], close[0]]
    assert longcontext._limits_claim(close, limits, params).verdict == "reproduced"
    assert longcontext._limits_claim(far, limits, params).verdict == "partly"
    assert longcontext._limits_claim(worse, limits, params).verdict == "not reproduced"
    rows = [{"n": 10, "max_error": 1e-13}, {"n": 20, "max_error": 2e-9}]
    assert longcontext._formula_claim(rows[:1], params).verdict == "reproduced"
    assert longcontext._formula_claim(rows, params).verdict == "not reproduced"


def test_meanfield_numbers_and_verdicts(tmp_path):
    res = _run("meanfield", tmp_path, n=40, runs=2, betas=[4, 16], merge_n=10, merge_runs=2,
               merge_betas=[3, 4], merge_t_end=1e4, merge_saves=120)
    first = res["numbers"]["first_phase"]
    assert first["k_star"] == [k_star(4.0), k_star(16.0)]
    assert all(1 <= c <= 40 for row in first["counts"] for c in row)
    share = res["numbers"]["merging"]["energy_share_in_merges"]
    assert all(0.0 <= s <= 1.0 for s in share if s == s)
    params = dict(meanfield.QUICK)
    good = {"betas": [4, 100], "mean": np.array([3.0, 14.0]), "k_star": np.array([3, 14]),
            "slope": 0.48, "slope_k_star": 0.48}
    off = {**good, "mean": np.array([3.0, 8.0]), "slope": 0.30}
    assert meanfield._first_claim(good, params).verdict == "reproduced"
    assert meanfield._first_claim(off, params).verdict == "not reproduced"
    waits = {"betas": [3, 4], "t_one_median": np.array([100.0, 900.0]), "fit_c": 2.2}
    assert meanfield._waiting_claim(waits, params).verdict == "reproduced"
    flat = {**waits, "t_one_median": np.array([100.0, np.inf]), "fit_c": float("nan")}
    assert meanfield._waiting_claim(flat, params).verdict == "not reproduced"
    drops = np.array([False, False, False, True, False, False])
    assert meanfield._windows(drops, 2, 1).tolist() == [False, True, True, True, True, False]


def test_noise_numbers_and_verdicts(tmp_path):
    res = _run("noise", tmp_path, n=40, runs=2, kappas=[1.0, 4.0], t_end=12.0, burn_in=6.0,
               block=2.0, cluster_n=16, cluster_runs=2, cluster_kappas=[3.0, 8.0],
               cluster_t_end=20.0, cluster_burn_in=5.0)
    num = res["numbers"]
    assert num["kappa_c"] == pytest.approx(float(noise_threshold(4.0)))
    for row in num["kuramoto"]:
        assert row["root"] == pytest.approx(float(kuramoto_order(row["kappa"])))
        if row["kappa"] < 2:  # above the threshold the result keeps "inf" (JSON)
            assert row["nR2_theory"] == pytest.approx(float(uniform_fluctuation(row["kappa"])))
    params = dict(noise.QUICK)
    near = [{"kappa": 3.0, "R": 0.72, "R_se": 0.01, "root": 0.7242}]
    assert noise._root_claim(near, params).verdict == "reproduced"
    assert noise._root_claim([{**near[0], "R": 0.66}], params).verdict == "not reproduced"
    X = np.stack([np.cos([0.0, 0.05, 3.0]), np.sin([0.0, 0.05, 3.0])], axis=-1)
    assert noise.circle_modes(X, 16.0, 0.05) == 2  # two groups
    assert noise.circle_modes(X[:2], 16.0, 0.05) == 1
    assert noise.order_parameter(X[:2]) == pytest.approx(np.cos(0.025))


def test_energy_numbers_and_verdicts(tmp_path):
    res = _run("energy", tmp_path, settings=[[2, 6]], betas=[1.0], runs=8, t_end=4.0,
               n_saves=41)
    (row,) = res["numbers"]["rows"]
    assert row["full_softmax"]["min_step"] >= -1e-9
    assert row["full_unnormalised"]["min_step"] >= -1e-9
    assert res["claims"][0]["verdict"] == "reproduced"
    log_e = np.log(np.array([[1.0, 1.0], [2.0, 1.5], [1.0, 1.6], [3.0, 1.7]]))
    np.testing.assert_allclose(energy_recipe.running_fall(log_e), [0.5, 0.0])
    params = dict(energy_recipe.QUICK)
    rows = [{"d": 2, "n": 6, "beta": 1.0,
             **{f"{m}_{a}": {"min_step": 1e-6, "share_falling": 0.0, "max_fall": 0.0}
                for m in ("full", "causal") for a in ("softmax", "unnormalised")}}]
    assert energy_recipe._causal_claim(rows, params).verdict == "not reproduced"
    rows[0]["causal_softmax"] = {"min_step": -1e-3, "share_falling": 0.1, "max_fall": 0.01}
    assert energy_recipe._causal_claim(rows, params).verdict == "reproduced"
    rows[0]["full_softmax"] = {"min_step": -1e-6, "share_falling": 0.1, "max_fall": 1e-6}
    assert energy_recipe._full_claim(rows, params).verdict == "not reproduced"


def test_normalization_laws_and_fits(tmp_path):
    res = _run("normalization", tmp_path, n=4, d=6,
               t_end={"post": 20.0, "pre": 1e4, "peri": 1e4, "ngpt": 80.0},
               random_d=6, random_n=12, random_runs=2, heads=2, random_t_end=20.0,
               slow_t_end=10.0)
    laws = {e["norm"]: (e["fit"]["law"], e["fit"]["rate"], e["ode_error"])
            for e in res["numbers"]["equiangular"]}
    assert laws["post"][0] == "exponential" and laws["post"][1] == pytest.approx(2, rel=0.01)
    assert laws["ngpt"][0] == "exponential" and laws["ngpt"][1] == pytest.approx(0.4, rel=0.01)
    for norm in ("pre", "peri"):
        assert laws[norm][0] == "power" and laws[norm][1] == pytest.approx(2, rel=0.05)
    assert max(v[2] for v in laws.values()) < 1e-8
    t = np.linspace(0.1, 10, 50)
    assert normalization.fit_decay(t, 3 * np.exp(-2 * t), (1e-12, 1.0))["law"] == "exponential"
    fit = normalization.fit_decay(t, 0.5 / t**2, (1e-12, 1.0))
    assert fit["law"] == "power" and fit["rate"] == pytest.approx(2.0)
    e = {"fit": {"law": "power", "rate": 2.04}, "expected_law": "power", "expected_rate": 2.0}
    assert normalization._law_ok(e, 0.05)
    assert not normalization._law_ok({**e, "fit": {"law": "power", "rate": 2.2}}, 0.05)
    assert not normalization._law_ok({**e, "fit": {"law": "exponential", "rate": 2.0}}, 0.05)


def test_cli_lists_a_suite():
    run = subprocess.run([sys.executable, "-m", "attnflow", "reproduce", "--list", "--suite",
                          "followups"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0
    listed = [line.split()[0] for line in run.stdout.splitlines() if line.strip()]
    assert listed == list(SUITES["followups"])
