"""The import graph: no module of attnflow imports itself through others (no circles), and the
layer contracts of pyproject.toml hold (the same check as `lint-imports` in .ci/run)."""

import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def _package_graph() -> grimp.ImportGraph:
    """attnflow's import graph without the top-level __init__'s own imports (it re-exports
    everything by design). Only its edges go: `remove_module("attnflow")` would remove every
    module below it too and leave an empty graph, in which no circle can be found."""
    graph = grimp.build_graph("attnflow")
    for imported in graph.find_modules_directly_imported_by("attnflow"):
        graph.remove_import(importer="attnflow", imported=imported)
    return graph


def test_no_module_imports_itself_in_a_circle():
    graph = _package_graph()
    # the check looks inside every subpackage, the command line's included
    assert {"attnflow.cli", "attnflow.cli.simulate", "attnflow.kernels.dense"} <= graph.modules
    assert _cycles(graph) == []


def test_the_command_modules_import_the_app_not_the_package():
    """A subcommand importing `app` from attnflow.cli, whose __init__ imports the subcommands,
    is a circle: they import it from attnflow.cli._app."""
    graph = _package_graph()
    commands = graph.find_modules_directly_imported_by("attnflow.cli") - {"attnflow.cli._app"}
    assert "attnflow.cli.simulate" in commands
    assert [m for m in sorted(commands)
            if "attnflow.cli" in graph.find_modules_directly_imported_by(m)] == []


def test_a_cycle_is_found_when_there_is_one():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_layer_contracts_hold():
    pytest.importorskip("importlinter")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import "
                          "lint_imports_command as c; c()"], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout
