"""The alibiprofile recipe at a tiny size: its claims, numbers and figure; the solver's bump
profile against the point kernel (`alibi_memory` at the bump's centre, to the bump's width)."""

from __future__ import annotations

import numpy as np

from attnflow.analysis.closedforms import soft_accuracy
from attnflow.experiments import SUITE_OF
from attnflow.reproduce import reproduce

VERDICTS = ("reproduced", "partly", "not reproduced")


def test_alibiprofile_recipe_at_a_tiny_size(tmp_path):
    (res,) = reproduce(["alibiprofile"], out=tmp_path, overrides={"alibiprofile": {
        "factors": [1.0], "sources": [0.5], "labels": 32, "n": 400, "p_labels": 40}})
    assert res["suite"] == "closedforms" == SUITE_OF["alibiprofile"]
    assert [c["id"] for c in res["claims"]] == ["alibiprofile.closed", "alibiprofile.particles"]
    assert all(c["verdict"] in VERDICTS and c["measured"] and c["why"] for c in res["claims"])
    assert res["claims"][0]["verdict"] == "reproduced"
    (setting,) = res["numbers"]["settings"]
    solver = np.array(setting["solver"])
    assert solver.shape == (1, 1)
    # a bump of width 0.08 at s = 0.5 averages the point profile nearby: within 10 %
    point = float(soft_accuracy(0.5, setting["times"][0], 1.0, 1.0))
    assert abs(solver[0, 0] / point - 1) < 0.1
    assert (tmp_path / "alibiprofile" / res["figures"][0]).stat().st_size > 10_000


def test_every_cause_in_the_ledger_names_a_measurement():
    """A ledger entry's `cause` (why a verdict falls short of reproduced) is a measurement:
    it holds numbers, not only words (claims.toml's header)."""
    from attnflow.experiments._ledger import entries

    causes = {i: e.cause for i, e in entries().items() if e.cause}
    assert {"lostmiddle.profile", "lostmiddle.recency"} <= set(causes)
    for i, text in causes.items():
        assert sum(ch.isdigit() for ch in text) >= 3, i
