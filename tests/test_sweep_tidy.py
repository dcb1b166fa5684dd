"""Sweeps over n say that their runs are nested, and their tables are tidy."""

from __future__ import annotations

import pytest

pytest.importorskip("dask")
pytest.importorskip("pandas")

from typer.testing import CliRunner  # noqa: E402

from attnflow.cli import app  # noqa: E402
from attnflow.sweeps import nested_note, parse_spec, sweep, to_dataframe  # noqa: E402

GRID = {"beta": 4.0, "n": [4, 6], "d": 2, "t_end": 1.0, "dt": 0.1, "save_at": 3, "seeds": 2}


@pytest.fixture(scope="module")
def result():
    return sweep(GRID, {"metrics": ["cluster_count", "max_distance_to_first"]},
                 scheduler="serial")


def test_a_causal_sweep_over_n_says_its_runs_are_nested(result):
    assert "share their first tokens" in result.attrs["note"]
    assert "nested" in result.attrs["note"]


def test_the_note_depends_on_the_mask_and_the_n_axis():
    full = nested_note(parse_spec({"grid": {**GRID, "mask": "full"}}))
    assert "share their first tokens" in full and "nested" not in full
    assert "nested" in nested_note(parse_spec({"grid": {**GRID, "mask": ["full", "window:2"]}}))
    assert nested_note(parse_spec({"grid": {**GRID, "n": 4}})) is None


def test_the_table_is_tidy(result):
    df = to_dataframe(result)
    assert list(df.columns) == ["n", "seed", "time", "cluster_count", "max_distance_to_first",
                                "status"]
    assert len(df) == 2 * 2 * 3  # n values x seeds x times
    assert df.attrs["constants"]["beta"] == 4.0 and df.attrs["constants"]["d"] == 2
    assert "nested" in df.attrs["note"]
    # xarray's own table repeats every constant coordinate in every row
    assert {"beta", "d", "t_end"} & set(result.to_dataframe().reset_index().columns)
    with pytest.raises(ValueError, match=r"variables: expected names among"):
        to_dataframe(result, ["energy_of_nothing"])


def test_the_command_line_prints_the_note(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('[grid]\nbeta = 4.0\nn = [4, 6]\nd = 2\nt_end = 1.0\ndt = 0.1\n'
                    'save_at = 3\nseeds = 2\n')
    out = CliRunner().invoke(app, ["sweep", str(spec), "--scheduler", "serial",
                                   "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "note" in out.output and "nested" in out.output
