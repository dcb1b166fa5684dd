"""The claims ledger (claims.toml): complete, reasoned, applied as written, and the only place
where thresholds live; the committed results and docs/results.md agree with it."""

from __future__ import annotations

import ast
import itertools
import json
import operator
import re
import tomllib
from pathlib import Path

import pytest

from attnflow.experiments import RECIPES
from attnflow.experiments._ledger import KINDS, OPS, claim, entries, entry
from attnflow.experiments._recipe import NOT_REPRODUCED, NOT_RUN, PARTLY, REPRODUCED
from attnflow.results_page import results_page

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "src" / "attnflow" / "experiments"
RESULTS = ROOT / "docs" / "results"
RAW = tomllib.loads((EXPERIMENTS / "claims.toml").read_text(encoding="utf-8"))
# The comparisons, read here with Python's own operators (not the ledger's code).
PY_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
          "==": operator.eq}
IDS = [f"{recipe}.{key}" for recipe, claims in RAW.items() for key in claims]


def _raw(id: str) -> dict:
    recipe, key = id.split(".", 1)
    return RAW[recipe][key]


def test_every_recipe_has_claims_and_every_claim_a_recipe():
    assert set(RAW) == set(RECIPES)
    assert list(entries()) == IDS


@pytest.mark.parametrize("id", IDS)
def test_every_threshold_has_a_kind_and_a_reason(id):
    raw = _raw(id)
    for key in ("statement", "source", "paper", "quick"):
        assert raw[key].strip(), f"{id}: empty {key}"
    names = [m["name"] for m in raw["measure"]]
    assert len(set(names)) == len(names)
    for m in raw["measure"]:
        assert m["what"].strip() and m["unit"].strip(), f"{id}: measure {m['name']}"
    assert raw["reproduced"], f"{id}: no criterion for reproduced"
    assert raw.get("partly_rule", "all") in ("all", "any")
    for c in raw["reproduced"] + raw.get("partly", []):
        assert c["measure"] in names and c["op"] in OPS, f"{id}: {c}"
        assert isinstance(c["threshold"], (int, float)), f"{id}: {c}"
        assert c["kind"] in KINDS, f"{id}: kind {c['kind']!r}"
        assert len(c["reason"].split()) >= 3, f"{id}: reason {c['reason']!r}"


def _candidates(raw: dict, name: str) -> list[float]:
    """Values of a measure on both sides of, and at, each of its thresholds."""
    out = set()
    for c in raw["reproduced"] + raw.get("partly", []):
        if c["measure"] == name:
            t = float(c["threshold"])
            eps = abs(t) * 1e-3 + 1e-15
            out |= {t - eps, t, t + eps}
    return sorted(out) or [0.0]


def _expected(raw: dict, values: dict[str, float]) -> str:
    def holds(c: dict) -> bool:
        return PY_OPS[c["op"]](values[c["measure"]], float(c["threshold"]))

    if all(holds(c) for c in raw["reproduced"]):
        return REPRODUCED
    partly = raw.get("partly", [])
    rule = any if raw.get("partly_rule", "all") == "any" else all
    return PARTLY if partly and rule(holds(c) for c in partly) else NOT_REPRODUCED


@pytest.mark.parametrize("id", IDS)
def test_verdict_logic_on_both_sides_of_every_criterion(id):
    """Every combination of measured values at and around the thresholds: the ledger's
    verdict is the criterion as written; every band is reached; crossing each threshold alone
    changes the verdict somewhere (no criterion is dead)."""
    raw, e = _raw(id), entry(id)
    names = [m["name"] for m in raw["measure"]]
    grids = [_candidates(raw, name) for name in names]
    seen, got = set(), {}
    for combo in itertools.product(*grids):
        values = dict(zip(names, combo))
        verdict = e.verdict(values)
        assert verdict == _expected(raw, values), (id, values)
        seen.add(verdict)
        got[combo] = verdict
    assert {REPRODUCED, NOT_REPRODUCED} <= seen
    assert (PARTLY in seen) == bool(raw.get("partly"))
    for c in raw["reproduced"] + raw.get("partly", []):
        k = names.index(c["measure"])
        flips = [a for a in got for b in got
                 if a[:k] == b[:k] and a[k + 1:] == b[k + 1:] and got[a] != got[b]
                 and PY_OPS[c["op"]](a[k], c["threshold"]) != PY_OPS[c["op"]](b[k],
                                                                            c["threshold"])]
        assert flips, f"{id}: crossing {c['measure']} {c['op']} {c['threshold']} never matters"


def test_claim_states_the_criterion_and_the_numbers_and_refuses_other_measures():
    c = claim("thm41.converged", "m", {"converged": 0.95}, note="a note")
    assert c.verdict == PARTLY and c.id == "thm41.converged"
    assert c.criterion == "reproduced if converged >= 1; partly if converged >= 0.9"
    assert c.why == f"{c.criterion}; measured converged = 0.95; a note"
    with pytest.raises(ValueError, match="values: expected the measures of 'thm41.converged'"):
        claim("thm41.converged", "m", {})
    with pytest.raises(ValueError, match="unknown"):
        claim("thm41.converged", "m", {"converged": 1.0, "other": 2.0})
    with pytest.raises(KeyError, match="id: expected a claim of the ledger"):
        entry("thm41.nope")


def _literal(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    return None


def test_no_threshold_lives_in_recipe_code():
    """No comparison in experiments/ with a numeric literal other than the small integers of
    structure (0 to 3: lengths, dimensions, counts), no verdict built outside the ledger."""
    found = []
    for path in sorted(EXPERIMENTS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    value = _literal(side)
                    if value is not None and not (type(value) is int and 0 <= value <= 3):
                        found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            if path.name != "_ledger.py" and isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ("Claim", "verdict"):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:60]}")
    assert not found, "\n".join(found)


def _committed(size: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((RESULTS / size).glob("*/result.json"))]


def test_every_reported_claim_has_an_entry_and_every_entry_is_reported():
    """The committed default run reports exactly the ledger's claims, with its criteria (an
    entry with placeholders, e.g. one criterion for several models, may be reported more than
    once); the paper-size runs report ledger claims only."""
    quick = _committed("quick")
    assert {r["name"] for r in quick} == set(RECIPES)
    reported = [c["id"] for r in quick for c in r["claims"]]
    assert sorted(set(reported)) == sorted(IDS)
    for r in quick + _committed("full"):
        for c in r["claims"]:
            assert c["id"].startswith(r["name"] + ".") and c["criterion"] == \
                entry(c["id"]).criterion(), c["id"]
            assert c["why"].startswith(c["criterion"]) or c["verdict"] == "not run"


def test_results_page_is_generated_from_the_committed_results():
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page == results_page(RESULTS), ("docs/results.md differs from its result files: "
                                           "attnflow reproduce --summary docs/results -o "
                                           "docs/results.md")


def test_committed_results_are_small_and_hold_no_trajectories():
    for path in RESULTS.glob("*/*/*"):
        assert path.name == "result.json", path  # no figures, no stores
        assert path.stat().st_size < 400_000, path


#: How a cause names the run that measured it (claims.toml's header): the committed result of a
#: size, a diagnostic script's path (it must exist), or diagnostic runs described in the text.
RUN = re.compile(r"\b(full|quick) result\b|\bdiagnostic runs?\b"
                 r"|\b(scripts/diagnostics|benchmarks)/[\w./-]+\.py\b")
SCRIPT = re.compile(r"\b(?:scripts/diagnostics|benchmarks)/[\w./-]+\.py\b")


def _cause_problem(cause: str) -> str:
    """What a cause lacks of the ledger's convention ("" when it has it all)."""
    if not cause.strip():
        return "no cause"
    if not re.search(r"\d", cause):
        return "no number in the cause"
    if not RUN.search(cause):
        return ("the cause names no run (expected 'full result', 'quick result', 'diagnostic "
                "run(s)' or a script under scripts/diagnostics/ or benchmarks/)")
    absent = [p for p in SCRIPT.findall(cause) if not (ROOT / p).is_file()]
    return f"the cause names scripts that do not exist: {absent}" if absent else ""


def test_every_verdict_short_of_reproduced_has_a_measured_cause():
    """Every claim with a committed "partly" or "not reproduced" (docs/results/quick and full)
    has a cause in its ledger entry: a number and the run that produced it."""
    lacking = set()
    for size in ("quick", "full"):
        for r in _committed(size):
            for c in r["claims"]:
                if c["verdict"] in (PARTLY, NOT_REPRODUCED):
                    problem = _cause_problem(entry(c["id"]).cause)
                    if problem:
                        lacking.add(f"{c['id']} ({size}: {c['verdict']}): {problem}")
    assert not lacking, (f"{len(lacking)} claims short of reproduced without a measured cause "
                         "in claims.toml:\n" + "\n".join(sorted(lacking)))


def test_cause_convention_rejects_guesses():
    assert _cause_problem("") == "no cause"
    assert _cause_problem("the hold was too short") == "no number in the cause"
    assert "names no run" in _cause_problem("r fell by 0.17, probably the hold")
    assert _cause_problem("r fell to 0.168 in the quick result (hold 15)") == ""
    assert _cause_problem("z = 2.1 at n = 1e4 (diagnostic runs, seed 0)") == ""
    assert "do not exist" in _cause_problem("z = 2 (scripts/diagnostics/no_such_script.py)")


def test_every_claim_not_run_at_quick_size_says_what_quick_cannot_show():
    """A claim "not run" in the committed default run says so in its ledger's quick field, in
    one line: "not run at the quick size (" and what the quick size cannot show."""
    bad = [f"{c['id']}: {entry(c['id']).quick!r}" for r in _committed("quick")
           for c in r["claims"] if c["verdict"] == NOT_RUN
           and not (entry(c["id"]).quick.startswith("not run at the quick size (")
                    and "\n" not in entry(c["id"]).quick)]
    assert not bad, "\n".join(bad)
