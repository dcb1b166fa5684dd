"""The registry of parts: a part defined only here becomes a CLI flag, a text option, a record
round-trip and a row of the docs table, with no change anywhere else."""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow._checks import fail
from attnflow.cli import app
from attnflow.family import PARTS, Encoding, parts_table, register
from attnflow.family.text import family_options, option_names


@dataclass(frozen=True)
class Recency(Encoding):
    """A test-only encoding: score bias -c (i - j) on every head (ALiBi with one slope)."""

    c: float = 0.5
    name: ClassVar[str] = "recency"
    help: ClassVar[str] = "Test-only recency bias -c (i - j)."
    text_help: ClassVar[str] = "none | C"
    kernel_options: ClassVar[frozenset[str]] = frozenset({"bias"})
    adds_bias: ClassVar[bool] = True

    def bias(self, n, head, n_heads):
        i = np.arange(n, dtype=float)
        return -self.c * np.abs(i[:, None] - i[None, :])

    @classmethod
    def parse(cls, text, name=None):
        if text in (None, "none"):
            return None
        try:
            return cls(float(text))
        except ValueError:
            raise fail(name or cls.name, "none or a number C", repr(text)) from None

    def text(self):
        return repr(self.c)


@pytest.fixture(autouse=True, scope="module")
def registered():
    register(Recency)
    yield
    PARTS.pop("recency")


def test_a_new_part_is_an_option_everywhere(tmp_path):
    assert "recency" in option_names()
    assert "`recency`" in parts_table()
    kwargs = family_options(recency="0.25")
    assert kwargs["parts"] == [Recency(0.25)]
    model = af.Attention(beta=1.0, **kwargs)
    # the same scores as ALiBi with slope 0.25 (an independent built-in part)
    x = af.sphere.uniform(6, 3, seed=0)
    np.testing.assert_allclose(model.field(x), af.Attention(beta=1.0, alibi=0.25).field(x),
                               rtol=1e-13)
    traj = af.simulate(model, x, 1.0, method="rk4", dt=0.1)
    back = af.load(traj.save(tmp_path / "r.nc"))
    assert back.model.encodings == (Recency(0.25),)
    help_text = CliRunner().invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"}).output
    assert "--recency" in help_text and "Test-only recency bias" in help_text
    out = tmp_path / "cli.nc"
    result = CliRunner().invoke(app, ["simulate", "--n", "6", "--d", "3", "--t-end", "0.5",
                                      "--recency", "0.25", "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert af.load(out).model.encodings == (Recency(0.25),)


def test_a_new_part_is_a_sweep_axis():
    from attnflow.sweeps import sweep
    from attnflow.sweeps.spec import parse_spec

    spec = parse_spec({"grid": {"beta": 1.0, "n": 6, "d": 3, "t_end": 0.5, "seeds": [0],
                                "recency": ["none", "0.25"], "method": "euler", "dt": 0.25},
                       "keep": {"states": True}})
    assert spec.values("recency") == ("none", "0.25")
    ds = sweep(spec, scheduler="serial")
    states = ds["states"].sel(recency="0.25").values.reshape(-1, 6, 3)[-1]
    x0 = ds["states"].sel(recency="0.25").values.reshape(-1, 6, 3)[0]
    expected = af.simulate(af.Attention(beta=1.0, alibi=0.25), x0, 0.5, method="euler",
                           dt=0.25).final  # the built-in part with the same scores
    np.testing.assert_allclose(states, expected, rtol=1e-12)
    with pytest.raises(ValueError, match="grid.recency"):
        parse_spec({"grid": {"beta": 1.0, "n": 6, "d": 3, "t_end": 0.5, "seeds": [0],
                             "recency": "x"}})


def test_registering_a_taken_name_or_no_slot_is_refused():
    @dataclass(frozen=True)
    class Clash(Encoding):
        name: ClassVar[str] = "rope"

    with pytest.raises(ValueError, match="part: expected a new name"):
        register(Clash)

    @dataclass(frozen=True)
    class Nowhere(af.family.Part):
        name: ClassVar[str] = "nowhere"

    with pytest.raises(ValueError, match="part: expected a Part subclass with a name and a slot"):
        register(Nowhere)


def test_the_docs_table_of_parts_is_the_registry_s():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "models.md").read_text()
    table = text.split("<!-- parts-table -->\n")[1].split("\n<!-- /parts-table -->")[0]
    registered = {k: v for k, v in PARTS.items() if k != "recency"}  # this module's own part
    saved = dict(PARTS)
    PARTS.clear()
    PARTS.update(registered)
    try:
        assert table == parts_table()
    finally:
        PARTS.clear()
        PARTS.update(saved)
