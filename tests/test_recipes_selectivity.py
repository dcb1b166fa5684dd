"""The selectivity recipe at a tiny size: its output's structure, its limit law against the d = 3
closed form and its sampled numbers against plain numpy re-computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import exp1, ive

from attnflow.experiments import SUITE_OF, SUITES
from attnflow.experiments import selectivity as recipe
from attnflow.reproduce import reproduce

VERDICTS = ("reproduced", "partly", "not reproduced")
TINY = {"d": [2, 3], "keys": [1.0, 0.25], "n": [50, 400], "trials": 60, "log_gamma": [1.0, 8.0],
        "log_trials": 3, "limit_draws": 400, "chunk": 25}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("selectivity")
    (res,) = reproduce(["selectivity"], out=out, overrides={"selectivity": TINY})
    return res, out


def test_registered_in_its_own_suite():
    assert SUITE_OF["selectivity"] == "closedforms" and "selectivity" in SUITES["closedforms"]


def test_output_structure_and_claims(result):
    res, out = result
    assert res["suite"] == "closedforms"
    assert [c["id"] for c in res["claims"]] == ["selectivity.limit", "selectivity.offcritical"]
    assert all(c["verdict"] in VERDICTS and c["measured"] and c["why"] for c in res["claims"])
    assert res["figures"] == ["selectivity.png", "selectivity_hist.png"]
    for fig in res["figures"]:
        assert (out / "selectivity" / fig).stat().st_size > 10_000
    by_d = res["numbers"]["by_d"]
    assert [r["d"] for r in by_d] == [2, 3]
    for r in by_d:
        assert len(r["critical"]) == len(r["log"]) == 2
        for c in r["critical"]:
            for stats in c["critical"] + c["super"]:
                assert set(stats) == set(recipe.STATS)
                assert 0 < stats["max_weight"][0] <= 1 and stats["effective_keys"][0] >= 1


def test_gamma_grid_and_limit_law_on_s2(result):
    res, _ = result
    r = res["numbers"]["by_d"][1]
    # on S^2, b = c_3 (2 / gamma) = 1 / (2 gamma)
    assert np.allclose(r["gammas"], [0.5, 2.0])
    def ein(t):
        return 0.5772156649015329 + np.log(t) + exp1(t) if t > 1e-8 else t

    for b, lim in zip(TINY["keys"], r["limit"]):
        want = quad(lambda t, b=b: np.exp(-t - b * ein(t)), 0, np.inf, epsabs=1e-13,
                    limit=200)[0]
        assert lim["max_weight"] == pytest.approx(want, rel=1e-7)


def test_log_scale_law_of_large_numbers_line(result):
    res, _ = result
    r = res["numbers"]["by_d"][1]  # d = 3: E[e^{-beta(1 - s)}] = (1 - e^{-2 beta}) / (2 beta)
    for c in r["log"]:
        beta = np.array(TINY["log_gamma"]) * np.log(c["n"])
        m1 = (1 - np.exp(-2 * beta)) / (2 * beta)
        m2 = (1 - np.exp(-4 * beta)) / (4 * beta)
        assert np.allclose(c["lln_keys"], c["n"] * m1**2 / m2, rtol=1e-12)
    # and d = 2 through the Bessel form: E = e^{-beta} I_0(beta)
    r2 = res["numbers"]["by_d"][0]["log"][0]
    beta = np.array(TINY["log_gamma"]) * np.log(r2["n"])
    assert np.allclose(r2["lln_max_weight"], 1 / (r2["n"] * ive(0, beta)), rtol=1e-12)


def test_sampled_statistics_by_hand():
    # `sampled` at one n against weights computed here from the same draws
    n, d, gammas = 30, 3, [0.7]
    got = recipe.sampled(n, d, gammas, 40, 40, np.random.default_rng(4))
    from attnflow.analysis.closedforms import nearest_gaps
    gaps = nearest_gaps(n, d, got["k"], 40, np.random.default_rng(4))
    assert got["k"] == n and got["truncation"] == 0.0
    logits = -gammas[0] * n * gaps
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    assert got["critical"][0]["max_weight"][0] == pytest.approx(w.max(axis=1).mean(), rel=1e-12)
    assert got["critical"][0]["effective_keys"][0] == pytest.approx(
        (1 / (w**2).sum(axis=1)).mean(), rel=1e-12)
