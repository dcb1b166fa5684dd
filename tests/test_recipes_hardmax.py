"""The hardmax recipe at tiny sizes: its outputs' structure, and its starts and numbers
against independent truth (the leader rule on the circle written with angles; exact
stillness of tokens that lead themselves)."""

from __future__ import annotations

import numpy as np

from attnflow.experiments import SUITE_OF
from attnflow.experiments import hardmax as recipe
from attnflow.family import Attention
from attnflow.reproduce import reproduce

VERDICTS = ("reproduced", "partly", "not reproduced")


def test_recipe_runs_and_its_claims_hold_at_tiny_size(tmp_path):
    params = {"vertices": {**recipe.QUICK["vertices"], "n": 6, "runs": 2, "t_end": 4.0},
              "rate": {**recipe.QUICK["rate"], "n": 4, "runs": 1, "betas": [10.0, 1000.0]},
              "causal": {**recipe.QUICK["causal"], "n": 6, "runs": 2, "t_end": 10.0}}
    (res,) = reproduce(["hardmax"], out=tmp_path, overrides={"hardmax": params})
    assert SUITE_OF["hardmax"] == res["suite"] == "closedforms"
    assert [c["id"] for c in res["claims"]] == ["hardmax.vertices", "hardmax.rate",
                                                "hardmax.causal"]
    assert all(c["verdict"] in VERDICTS and c["measured"] and c["why"] for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / "hardmax" / fig).stat().st_size > 10_000
    v, c = res["numbers"]["vertices"], res["numbers"]["causal"]
    assert v["vertex_motion"] <= 1e-12 and v["closed_form_error"] <= 1e-7
    assert v["switches_to_other"] == 0 and v["checked_tokens"] == v["cell_tokens"] > 0
    assert c["identity_motion"] <= 1e-12 and c["token1_motion"] <= 1e-12
    d = res["numbers"]["rate"]["distance"]
    assert d[1] < d[0]


def test_starts_have_vertices_and_cells_only_by_the_angle_rule():
    """Q = R(phi) on the circle: token i's scores are cos(theta_i + phi - theta_j), so its
    leader is the token nearest (on the circle) to theta_i + phi; every drawn start must have
    each token leading itself or led by a token that leads itself."""
    phi = 0.6
    model = Attention(recipe.rotation(phi), None, None, beta=np.inf, mask="full")
    x = recipe._cells_only(model, 7, 5, np.random.default_rng(1))
    theta = np.arctan2(x[..., 1], x[..., 0])
    gap = np.angle(np.exp(1j * (theta[..., :, None] + phi - theta[..., None, :])))
    leader = np.argmin(np.abs(gap), axis=-1)  # (runs, n)
    for lead in leader:
        assert all(lead[lead[i]] == lead[i] for i in range(7))
    assert np.any(leader != np.arange(7))  # not only vertices
