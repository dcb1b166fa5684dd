"""`attnflow reproduce`: every claim and figure of the paper and of the follow-up literature,
with numbers, pictures, a report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from attnflow.cli._app import app


@app.command()
def reproduce(
    names: list[str] = typer.Argument(None, help="Recipes to run (default: all of the "
                                      "suite). `attnflow reproduce --list` shows them."),
    suite: str = typer.Option("all", help="paper (the seed paper's recipes), followups (the "
                              "follow-up literature, a real model), closedforms (the 2025-26 "
                              "closed forms), gradients (fits by autograd) or all."),
    full: bool = typer.Option(False, "--full/--quick", help="The paper's sizes (slow) or the "
                              "quick default sizes (all recipes in minutes)."),
    out: Path = typer.Option(Path("reproduction"), "--out", "-o", help="Output folder."),
    seed: int = typer.Option(0, min=0, help="Master seed of every recipe."),
    force: bool = typer.Option(False, help="Rerun recipes whose results already exist."),
    model: Path = typer.Option(None, help="Checkpoint folder for the `spectra` recipe "
                               "(default: the MiniLM weights if installed)."),
    list_: bool = typer.Option(False, "--list", help="List the recipes and their claims "
                               "(the ledger's criteria) and exit."),
    summary: Path = typer.Option(None, "--summary", help="Write the results page from the "
                                 "result files under DIR (DIR/quick/<recipe>/result.json, "
                                 "DIR/full/...) to --out when it ends in .md "
                                 "(e.g. -o docs/results.md), else print it; then exit."),
    set_: list[str] = typer.Option(None, "--set", help="Override one parameter of one recipe, "
                                   "RECIPE.KEY=VALUE with VALUE in JSON (e.g. --set fig2.n=40 "
                                   "--set 'fig2.snapshots=[0,10]'); repeatable."),
    progress: bool = typer.Option(True, help="Show a progress bar per recipe."),
) -> None:
    """Run the reproduction recipes; write per-recipe figures and JSON, and
    OUT/report.md + OUT/report.html led by a claims table.

    Finished recipes in OUT are reused when their size, parameters and seed match.
    """
    from attnflow.experiments import RECIPES, SUITE_OF
    from attnflow.report import claims_table, write_report
    from attnflow.reproduce import load_results, recipe_names
    from attnflow.reproduce import reproduce as run

    console = Console()
    if summary is not None:
        from attnflow._files import write_text
        from attnflow.results_page import results_page

        page = results_page(summary)
        if out.suffix == ".md":
            write_text(out, page)
            console.print(f"Results page: {out}")
        else:
            typer.echo(page, nl=False)
        return
    chosen = recipe_names(names, suite)
    if list_:
        from attnflow.experiments._ledger import entries

        for name in chosen:
            recipe = RECIPES[name]
            console.print(f"[bold]{name:16}[/bold] {SUITE_OF[name]:10} {recipe.TITLE}  "
                          f"(full size: about {recipe.FULL_MINUTES} min on 2 cores)",
                          highlight=False)
            for e in (e for e in entries().values() if e.recipe == name):
                console.print(f"  {e.id}: {e.statement}\n      {e.criterion()}",
                              highlight=False, markup=False)
        return
    size = "full" if full else "quick"
    if full:
        minutes = sum(RECIPES[n].FULL_MINUTES for n in chosen if n in RECIPES)
        console.print(f"Full sizes: expect about {minutes} minutes on 2 cores.")
    overrides: dict[str, dict] = {"spectra": {"model": str(model)}} if model is not None and \
        "spectra" in chosen else {}
    for item in set_ or []:
        name, key, value = _parse_set(item)
        overrides.setdefault(name, {})[key] = value
    columns = (TextColumn("{task.description:16}"), BarColumn(), TextColumn(
        "{task.percentage:>3.0f}%"), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress) as bar:
        def track(name: str):
            task = bar.add_task(name, total=1.0)
            return lambda fraction: bar.update(task, completed=fraction)

        def on_start(name: str, reused: bool) -> None:
            if reused:
                bar.add_task(f"{name} (reused)", total=1.0, completed=1.0)

        run(chosen, size=size, out=out, seed=seed, force=force, overrides=overrides,
            progress=track, on_start=on_start, suite=suite)
    results = load_results(out)
    md, html = write_report(results, out)
    table = Table("recipe", "claim", "measured", "criterion", "verdict", show_lines=False)
    for row in claims_table([r for r in results if r["name"] in chosen]):
        table.add_row(row[0], row[1], row[3], row[4], row[5])
    console.print(table)
    console.print(f"Report: {md} and {html}")


def _parse_set(item: str) -> tuple[str, str, object]:
    """'RECIPE.KEY=VALUE' -> (recipe, key, value); VALUE is JSON, else taken as a string."""
    import json

    from attnflow._checks import fail

    target, sep, text = item.partition("=")
    name, dot, key = target.partition(".")
    if not (sep and dot and name and key):
        raise fail("--set", "RECIPE.KEY=VALUE", repr(item))
    try:
        return name, key, json.loads(text)
    except json.JSONDecodeError:
        return name, key, text
