"""Run the reproduction recipes and keep their results: one folder per recipe, reused on rerun.

Each recipe writes into ``OUT/<name>/``: its PNG figures and ``result.json`` (numbers, claims,
exact parameters, seed, version, wall and CPU time of this process, when it finished, and its
suite: "paper", "followups", "closedforms" or "gradients"). The folder is built
under a temporary name and renamed into place when complete, so an interrupted run leaves no
half-written recipe. A rerun with the same OUT reuses every finished recipe whose size,
parameters and seed match, unless forced.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnflow._checks import fail, integer
from attnflow._files import atomic_path
from attnflow.experiments import RECIPES, SUITE_OF, SUITES
from attnflow.experiments._recipe import Progress, to_jsonable

__all__ = ["reproduce", "load_results", "recipe_names", "SIZES", "SUITE_CHOICES"]

SIZES = ("quick", "full")
SUITE_CHOICES = (*SUITES, "all")


def recipe_names(names: list[str] | None = None, suite: str = "all") -> list[str]:
    """The recipes to run, in registry order: `names` when given (each must belong to `suite`),
    else every recipe of `suite` (a key of `SUITES` or "all")."""
    if suite not in SUITE_CHOICES:
        raise fail("suite", f"one of {SUITE_CHOICES}", repr(suite))
    allowed = list(RECIPES) if suite == "all" else list(SUITES[suite])
    if not names:
        return allowed
    unknown = [n for n in names if n not in allowed]
    if unknown:
        where = "" if suite == "all" else f" of the suite {suite!r}"
        raise fail("names", f"recipe names{where} among {allowed}", unknown)
    return list(names)


def reproduce(
    names: list[str] | None = None,
    size: str = "quick",
    out: str | os.PathLike = "reproduction",
    seed: int = 0,
    force: bool = False,
    overrides: dict[str, dict[str, Any]] | None = None,
    progress: Callable[[str], Progress] | None = None,
    on_start: Callable[[str, bool], None] | None = None,
    suite: str = "all",
) -> list[dict[str, Any]]:
    """Run recipes (all of `suite` by default, in registry order) and return their results.

    size : "quick" (default sizes, minutes) or "full" (the paper's sizes).
    suite : a key of `attnflow.experiments.SUITES` or "all" (default); `names` must belong
        to it.
    overrides : per-recipe parameter overrides, e.g. {"fig3": {"runs": 50}}.
    progress : given a recipe name, returns a callback receiving the fraction done.
    on_start : called with (name, reused) before each recipe.
    Results are also written under `out` (see module docstring).
    """
    if size not in SIZES:
        raise fail("size", f"one of {SIZES}", repr(size))
    seed = integer("seed", seed, 0, expected="a non-negative integer (the master seed)")
    names = recipe_names(names, suite)
    overrides = overrides or {}
    for name, changes in overrides.items():
        if name not in RECIPES:
            raise fail("overrides", f"recipe names among {list(RECIPES)}", repr(name))
        known = set(RECIPES[name].QUICK) | set(RECIPES[name].FULL)
        if set(changes) - known:
            raise fail(f"overrides[{name!r}]", f"parameters among {sorted(known)}",
                       sorted(set(changes) - known))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        recipe = RECIPES[name]
        params = {**(recipe.QUICK if size == "quick" else recipe.FULL), **overrides.get(name, {})}
        target = out / name
        previous = _read(target / "result.json")
        reuse = (not force and previous is not None and previous["size"] == size
                 and previous["seed"] == seed and previous["params"] == to_jsonable(params))
        if on_start is not None:
            on_start(name, reuse)
        if reuse:
            results.append({**previous, **_suite(name)})
            continue
        results.append(_run_one(name, recipe, params, size, seed, target,
                                progress(name) if progress else (lambda f: None)))
    return results


def _run_one(name, recipe, params, size, seed, target: Path, report: Progress) -> dict[str, Any]:
    from attnflow._version import machine, provenance

    with atomic_path(target) as tmp:
        tmp.mkdir()
        start, cpu = time.perf_counter(), time.process_time()
        output = recipe.run(params, seed, tmp, report)
        result = {"name": name, "title": recipe.TITLE, **_suite(name), "size": size,
                  "seed": seed, "params": to_jsonable(params), **provenance(), "machine": machine(),
                  "wall_time": time.perf_counter() - start,
                  "cpu_time": time.process_time() - cpu,
                  "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  **output.to_dict()}
        (tmp / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def load_results(out: str | os.PathLike) -> list[dict[str, Any]]:
    """The results of every finished recipe under `out`, in registry order, each with its
    `suite` (also for results written before recipes had suites)."""
    out = Path(out)
    found = {name: _read(out / name / "result.json") for name in RECIPES}
    return [{**r, **_suite(name)} for name, r in found.items() if r is not None]


def _suite(name: str) -> dict[str, str]:
    """{"suite": ...} for a registered recipe; nothing for one added to RECIPES at run time
    (the report then files it under its default suite)."""
    return {"suite": SUITE_OF[name]} if name in SUITE_OF else {}
