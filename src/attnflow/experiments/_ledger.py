"""The claims ledger: every claim of every recipe, with its criteria, read from `claims.toml`.

An entry (``[recipe.key]`` in the file, id ``"recipe.key"``) holds the claim's statement, its
source, what the paper says, the measured quantities with their units (``[[...measure]]``), the
criteria for "reproduced" and for "partly" as comparisons of a measured quantity with a
threshold (``[[...reproduced]]``, ``[[...partly]]``), the reason of each threshold, and what
the quick size can resolve. A recipe measures the quantities and hands them to `claim`, which
applies the criteria: reproduced when every "reproduced" comparison holds, else partly when
the "partly" comparisons hold (all of them, or any one when ``partly_rule = "any"``), else not
reproduced. The verdict's "why" states the criterion and the measured numbers, whatever the
outcome, so no threshold lives in recipe code.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import operator
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from attnflow.experiments._recipe import (
    NOT_REPRODUCED,
    NOT_RUN,
    PARTLY,
    REPRODUCED,
    Claim,
    Output,
)

__all__ = ["Criterion", "Entry", "KINDS", "OPS", "claim", "entries", "entry", "not_run"]

#: What a threshold's reason may rest on: a statistical argument (standard errors, a stated
#: error rate), a numerical one (integration or rounding error, measured), the paper's own
#: number, the claim's own definition (e.g. "several" is more than one), or a stated
#: convention (a band's edge with no sharper argument; the reason says so).
KINDS = ("statistical", "numerical", "paper", "definition", "convention")
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
       "==": operator.eq}


@dataclass(frozen=True)
class Criterion:
    """One comparison `measure op threshold`, and why the threshold is what it is."""

    measure: str
    op: str
    threshold: float
    kind: str
    reason: str

    def holds(self, value: float) -> bool:
        return bool(OPS[self.op](float(value), self.threshold))  # NaN never holds

    def text(self) -> str:
        return f"{self.measure} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class Entry:
    """A claim of the ledger (see the module docstring)."""

    id: str
    recipe: str
    statement: str
    source: str
    paper: str
    measures: dict[str, tuple[str, str]]  # name -> (what it is, unit)
    reproduced: tuple[Criterion, ...]
    partly: tuple[Criterion, ...]
    partly_rule: str  # "all" or "any"
    quick: str
    cause: str = ""  # a verdict short of "reproduced": its measured cause (a number, its run)

    def criterion(self) -> str:
        """The criterion in words: 'reproduced if a >= 1 and b < 2; partly if ...'."""
        text = "reproduced if " + " and ".join(c.text() for c in self.reproduced)
        if self.partly:
            join = " or " if self.partly_rule == "any" else " and "
            text += "; partly if " + join.join(c.text() for c in self.partly)
        return text

    def verdict(self, values: dict[str, Any]) -> str:
        """REPRODUCED, PARTLY or NOT_REPRODUCED for measured `values` (name -> number)."""
        if all(c.holds(values[c.measure]) for c in self.reproduced):
            return REPRODUCED
        rule = any if self.partly_rule == "any" else all
        if self.partly and rule(c.holds(values[c.measure]) for c in self.partly):
            return PARTLY
        return NOT_REPRODUCED


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    v = float(value)
    return f"{v:.4g}" if math.isfinite(v) else str(v)


def claim(id: str, measured: str, values: dict[str, Any], note: str = "",
          **fields: Any) -> Claim:
    """The claim `id` judged on measured `values` (every measure its criteria name; numbers or
    booleans). `measured` describes the measurement; `note` adds to the "why"; `fields` fill
    the {placeholders} of the entry's statement and paper text (see `_fill`)."""
    e = entry(id)
    missing = sorted({c.measure for c in (*e.reproduced, *e.partly)} - set(values))
    unknown = sorted(set(values) - set(e.measures))
    if missing or unknown:
        raise ValueError(f"values: expected the measures of {id!r} {sorted(e.measures)}, "
                         f"received {sorted(values)} (missing {missing}, unknown {unknown})")
    verdict = e.verdict(values)
    numbers = ", ".join(f"{k} = {_number(v)}" for k, v in values.items())
    why = f"{e.criterion()}; measured {numbers}" + (f"; {note}" if note else "")
    return Claim(claim=_fill(e.statement, fields), paper=_fill(e.paper, fields),
                 measured=measured, verdict=verdict, why=why, id=id, criterion=e.criterion())


def not_run(id: str, measured: str, **fields: Any) -> Claim:
    """The claim `id` not run (a missing input, said in `measured`)."""
    e = entry(id)
    return Claim(claim=_fill(e.statement, fields), paper=_fill(e.paper, fields),
                 measured=measured, verdict=NOT_RUN, why="not run: " + measured, id=id,
                 criterion=e.criterion())


def without_torch(ids: tuple[str, ...], **fields: Any) -> Output | None:
    """None where torch is importable; else an Output with every claim of `ids` "not run",
    naming the install line (the recipes that take gradients need torch, an optional extra)."""
    if importlib.util.find_spec("torch") is not None:
        return None
    why = "torch is not installed: pip install 'attnflow[torch]' (this recipe takes gradients)"
    return Output({}, [not_run(id, why, **fields) for id in ids], notes=[f"Not run: {why}."])


def _fill(text: str, fields: dict[str, Any]) -> str:
    """The text with its {placeholders} filled, when the recipe gives fields (an entry with
    placeholders writes other braces doubled)."""
    return text.format(**fields) if fields else text


def entry(id: str) -> Entry:
    """The ledger entry `id` ("recipe.key")."""
    table = entries()
    if id not in table:
        raise KeyError(f"id: expected a claim of the ledger (claims.toml), received {id!r}")
    return table[id]


@functools.cache
def entries() -> dict[str, Entry]:
    """Every entry of claims.toml, by id, in the file's order."""
    text = resources.files("attnflow.experiments").joinpath("claims.toml").read_text("utf-8")
    out = {}
    for recipe, claims in tomllib.loads(text).items():
        for key, raw in claims.items():
            out[f"{recipe}.{key}"] = _entry(f"{recipe}.{key}", recipe, raw)
    return out


def _entry(id: str, recipe: str, raw: dict[str, Any]) -> Entry:
    def criteria(rows: list[dict[str, Any]]) -> tuple[Criterion, ...]:
        out = []
        for row in rows:
            c = Criterion(row["measure"], row["op"], float(row["threshold"]), row["kind"],
                          row["reason"])
            if c.op not in OPS or c.kind not in KINDS or c.measure not in measures:
                raise ValueError(f"claims.toml: {id}: expected an op among {list(OPS)}, a kind "
                                 f"among {KINDS} and a declared measure, received {row}")
            out.append(c)
        return tuple(out)

    measures = {m["name"]: (m["what"], m["unit"]) for m in raw["measure"]}
    return Entry(id=id, recipe=recipe, statement=raw["statement"], source=raw["source"],
                 paper=raw["paper"], measures=measures,
                 reproduced=criteria(raw["reproduced"]), partly=criteria(raw.get("partly", [])),
                 partly_rule=raw.get("partly_rule", "all"), quick=raw["quick"],
                 cause=raw.get("cause", ""))
