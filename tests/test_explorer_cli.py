"""`attnflow explore RUN --out PAGE.html`: the page of a saved run, and one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.cli import app


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explore")
    traj = af.simulate(af.Attention(beta=9.0, mask="causal"), af.sphere.uniform(24, 2, seed=0),
                       4.0, method="rk4", dt=0.1, save_at=np.linspace(0, 4, 9))
    return traj, traj.save(folder / "run.nc")


def _explore(*args):
    return CliRunner().invoke(app, ["explore", *map(str, args)])


def test_writes_a_page_holding_the_packed_run(saved, tmp_path):
    traj, path = saved
    result = _explore(path, "--out", tmp_path / "run.html")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"written {tmp_path / 'run.html'} (")
    page = (tmp_path / "run.html").read_text()
    state = json.loads(re.search(r'<script type="application/json" id="af-data">(.*?)</script>',
                                 page, re.S).group(1))
    assert state["data"] == json.loads(json.dumps(af.explorer.pack(traj)))
    assert "export function render" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched: no URL at all
    assert [p.name for p in tmp_path.iterdir()] == ["run.html"]  # no temporary left behind


@pytest.mark.parametrize("args, message", [
    (["--view", "sphere"], "error: --view: expected a view that fits the run ('sphere' needs "
                           "d >= 3; this run has d = 2: use 'circle'), received 'sphere'"),
    (["--run", "2"], "error: --run: expected a run index in [0, 1), received 2"),
])
def test_options_that_do_not_fit_the_run_end_in_one_line(saved, tmp_path, args, message):
    result = _explore(saved[1], "--out", tmp_path / "run.html", *args)
    assert result.exit_code == 2 and result.output.strip() == message
    assert not (tmp_path / "run.html").exists()


def test_a_file_that_is_no_run_ends_in_one_line(tmp_path):
    (tmp_path / "junk.nc").write_text("not a run")
    result = _explore(tmp_path / "junk.nc", "--out", tmp_path / "run.html")
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and line.startswith(
        "error: RUN_FILE: expected a run written by attnflow") and "junk.nc" in line


def test_the_page_must_be_html(saved, tmp_path):
    result = _explore(saved[1], "--out", tmp_path / "run.png")
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: --out: expected a file name ending in .html, "
                                     f"received {tmp_path / 'run.png'}")


def test_density_asks_for_binned_densities(saved, tmp_path):
    _, path = saved
    result = _explore(path, "--out", tmp_path / "dens.html", "--density")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "dens.html").read_text()
    state = json.loads(re.search(r'<script type="application/json" id="af-data">(.*?)</script>',
                                 page, re.S).group(1))
    assert state["data"]["density"]["kind"] == "circle" and state["data"]["frames"] == ""
    counts = af.explorer.unpack_density(state["data"])[1]
    assert counts.sum(axis=1).tolist() == [24] * 9
