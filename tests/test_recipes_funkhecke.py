"""Recipe `funkhecke` at a tiny size: every claim of the ledger judged, the deterministic ones
(the solver's Funk-Hecke rates and K_#) reproduced as at full size, the figure written."""

from __future__ import annotations

from attnflow.experiments import funkhecke
from attnflow.experiments._ledger import entries

TINY = {**funkhecke.QUICK, "betas": [4.0], "unnormalised_betas": [], "lmax": 2,
        "threshold_betas": [1.0], "hold": 1.0, "particle_betas": [4.0], "n": 400, "runs": 4,
        "t_max": 0.5}


def test_recipe_judges_every_claim_and_reproduces_the_rates_at_tiny_size(tmp_path):
    out = funkhecke.run(TINY, 0, tmp_path, lambda fraction: None)
    verdicts = {c.id: c.verdict for c in out.claims}
    assert set(verdicts) == {k for k, e in entries().items() if e.recipe == "funkhecke"}
    assert verdicts["funkhecke.rates"] == "reproduced"
    assert verdicts["funkhecke.threshold"] == "reproduced"
    assert (tmp_path / "funkhecke.png").stat().st_size > 10_000
