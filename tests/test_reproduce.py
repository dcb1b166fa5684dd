"""The reproduction runner, the report, and the lead's recipes at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from attnflow.experiments import RECIPES
from attnflow.experiments._recipe import Claim, Output
from attnflow.report import write_report
from attnflow.reproduce import load_results, reproduce


def fake_recipe(calls: list, explode: bool = False) -> types.ModuleType:
    mod = types.ModuleType("fake")
    mod.NAME, mod.TITLE, mod.FULL_MINUTES = "fake", "a fake recipe", 1
    mod.QUICK, mod.FULL = {"k": 1}, {"k": 2}

    def run(params, seed, out, progress):
        calls.append((params, seed))
        (out / "partial.png").write_bytes(b"not finished")
        if explode:
            raise KeyboardInterrupt
        progress(1.0)
        return Output({"k": np.int64(params["k"]), "x": np.nan},
                      [Claim("c", "paper says", "we saw", "reproduced")], ["partial.png"])

    mod.run = run
    return mod


def test_results_are_reused_unless_forced_or_changed(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(RECIPES, "fake", fake_recipe(calls))
    first = reproduce(["fake"], out=tmp_path, seed=3)
    assert first[0]["numbers"] == {"k": 1, "x": "nan"} and first[0]["params"] == {"k": 1}
    reproduce(["fake"], out=tmp_path, seed=3)
    assert len(calls) == 1  # reused
    reproduce(["fake"], out=tmp_path, seed=4)
    reproduce(["fake"], out=tmp_path, seed=4, force=True)
    reproduce(["fake"], out=tmp_path, seed=4, overrides={"fake": {"k": 5}})
    assert [c[1] for c in calls] == [3, 4, 4, 4] and calls[-1][0] == {"k": 5}
    saved = json.loads((tmp_path / "fake" / "result.json").read_text())
    assert saved["seed"] == 4 and saved["size"] == "quick"


def test_interrupted_recipe_leaves_nothing_half_written(tmp_path, monkeypatch):
    monkeypatch.setitem(RECIPES, "fake", fake_recipe([]))
    reproduce(["fake"], out=tmp_path)
    before = (tmp_path / "fake" / "result.json").read_text()
    monkeypatch.setitem(RECIPES, "fake", fake_recipe([], explode=True))
    with pytest.raises(KeyboardInterrupt):
        reproduce(["fake"], out=tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake"]  # no temporary folder left
    assert (tmp_path / "fake" / "result.json").read_text() == before


def test_report_has_claims_table_and_embedded_figures(tmp_path, monkeypatch):
    monkeypatch.setitem(RECIPES, "fake", fake_recipe([]))
    reproduce(["fake"], out=tmp_path)
    md, html = write_report(load_results(tmp_path), tmp_path)
    text = md.read_text()
    assert "| recipe | claim | paper | measured | verdict |" in text
    assert "| fake | c | paper says | we saw | reproduced |" in text
    assert "data:image/png;base64," in html.read_text()


def test_bad_names_and_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"names: expected recipe names among"):
        reproduce(["nope"], out=tmp_path)
    with pytest.raises(ValueError, match=r"size: expected one of \('quick', 'full'\)"):
        reproduce(["thm41"], size="huge", out=tmp_path)


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_declares_the_contract(name):
    mod = RECIPES[name]
    assert mod.NAME == name and mod.TITLE and mod.FULL_MINUTES > 0
    assert set(mod.QUICK) <= set(mod.FULL) and callable(mod.run)


TINY = {
    "thm41": {"kinds": ["gaussian", "indefinite"], "d": [2, 3], "seeds": 2, "t_end": 100.0},
    "fig2": {"n": 40, "runs": 2, "snapshots": [0, 10, 75, 150], "t_end": 150.0, "dt": 0.1},
    "fig3": {"n": 40, "runs": 4, "chunk": 2, "t_end": 20.0, "n_times": 11, "dt": 0.1},
    "causal_vs_full": {"n": 30, "runs": 2, "t_end": 20.0, "n_times": 6, "dt": 0.1},
    "spectra": {"layers": [4]},
}


@pytest.mark.parametrize("name", list(TINY))
def test_lead_recipes_at_tiny_size(name, tmp_path):
    (res,) = reproduce([name], out=tmp_path, overrides={name: TINY[name]})
    assert res["claims"] and all(
        c["verdict"] in ("reproduced", "partly", "not reproduced", "not run")
        for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / name / fig).stat().st_size > 10_000
    if name == "thm41":
        assert res["numbers"]["fraction_converged"] == 1.0
    if name == "fig3":
        renyi, strong = (np.array(res["numbers"][k]["mean"]) for k in ("renyi", "strong"))
        assert np.all((0 <= strong) & (strong <= renyi + 1e-12) & (renyi <= 1))
    if name == "spectra":  # MiniLM when installed (CI installs it), else a clear "not run"
        if res["claims"][0]["verdict"] == "not run":
            assert "no checkpoint" in res["claims"][0]["measured"]
        else:
            assert res["numbers"]["summary"]["pretrained"]["n_heads"] == 12
            assert res["figures"] == ["spectra.png"]
    if name == "causal_vs_full":
        assert max(res["numbers"]["token1_max_displacement"]["causal"]) == 0.0


def test_cli_lists_recipes():
    out = subprocess.run([sys.executable, "-m", "attnflow", "reproduce", "--list"],
                         capture_output=True, text=True, check=True).stdout
    assert all(name in out for name in RECIPES)
