"""The reproduction report: a summary per suite, the claims table, one section per recipe.

Writes ``report.md`` (figures linked) and a self-contained ``report.html`` (figures and GIF
animations embedded as data URIs, the stylesheet `report.css` inlined: it loads nothing from
the network), both atomically. The HTML opens with the summary (per suite: claims reproduced,
partly, not reproduced, not run; total time; machine; version and commit) and a table of
contents; every claim row links to its recipe's section and figures; every figure has a
caption (`captions.toml`: what it shows and what to look for); each recipe shows the papers
whose claims it checks (`attnflow.references`) and its parameters and seed in a collapsible
block. Verdicts are text badges styled by CSS (no emoji font needed); the page reads at
phone width (the claims table becomes one card per claim) and in print.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import os
import tomllib
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

from attnflow._files import write_text
from attnflow.experiments import cause_of, references_of
from attnflow.references import REFERENCES, SEED

__all__ = ["write_report", "claims_table", "summary", "VERDICTS", "caption"]

VERDICTS = ("reproduced", "partly", "not reproduced", "not run")
DEFAULT_SUITE = "paper"  # results written before suites existed belong to the paper's
_MIME = {".png": "image/png", ".gif": "image/gif", ".jpg": "image/jpeg", ".svg": "image/svg+xml"}


def claims_table(results: list[dict[str, Any]]) -> list[list[str]]:
    """Rows (recipe, claim, paper, measured, criterion, verdict and why) over all results;
    the criterion is the ledger's (claims.toml), and the "why" after the verdict gives the
    measured numbers (results written before the ledger have no criterion: "-"), then, for a
    verdict short of "reproduced", the ledger's measured cause ("cause: ...")."""
    return [[res["name"], c["claim"], c["paper"], c["measured"], c.get("criterion") or "-",
             c["verdict"] + (f": {_reason(c)}" if _reason(c) else "")
             + (f"; cause: {_cause(c)}" if _cause(c) else "")]
            for res in results for c in res["claims"]]


def _cause(c: dict[str, Any]) -> str:
    """The ledger's measured cause of a "partly" or "not reproduced" claim ("" otherwise)."""
    short = c["verdict"] in ("partly", "not reproduced")
    return cause_of(c["id"]) if short and c.get("id") else ""


def _reason(c: dict[str, Any]) -> str:
    """The claim's "why" without the criterion it starts with (shown in its own column)."""
    why, criterion = c.get("why", ""), c.get("criterion", "")
    return why[len(criterion):].lstrip("; ") if criterion and why.startswith(criterion) else why


def summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per suite (in order of first appearance) and "total": the number of claims with each
    verdict (keys of VERDICTS), "claims", "recipes" and "seconds" (summed recipe wall time)."""
    table: dict[str, dict[str, Any]] = {}
    for res in results:
        counts = Counter(c["verdict"] for c in res["claims"])
        for key in (res.get("suite", DEFAULT_SUITE), "total"):
            row = table.setdefault(key, {**dict.fromkeys(VERDICTS, 0), "claims": 0,
                                         "recipes": 0, "seconds": 0.0})
            for verdict, k in counts.items():
                row[verdict] = row.get(verdict, 0) + k
            row["claims"] += len(res["claims"])
            row["recipes"] += 1
            row["seconds"] += float(res.get("wall_time", 0.0))
    if "total" in table:
        table["total"] = table.pop("total")  # last
    return table


@functools.cache
def _captions() -> dict[str, dict[str, str]]:
    text = resources.files("attnflow").joinpath("captions.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def caption(recipe: str, figure: str) -> str | None:
    """The caption of a recipe's figure file (what it shows, what to look for), or None."""
    return _captions().get(recipe, {}).get(figure)


def _css() -> str:
    return resources.files("attnflow").joinpath("report.css").read_text(encoding="utf-8")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def _provenance(results: list[dict[str, Any]]) -> tuple[str, str]:
    """(attnflow versions with commits, machines) over the results, as text."""
    made = sorted({str(r.get("version", "?")) + (f" (git {_short(r['commit'])})"
                                                if r.get("commit") else "") for r in results})
    machines = sorted({r["machine"] for r in results if r.get("machine")})
    return ", ".join(made) or "unknown", "; ".join(machines) or "not recorded"


def _short(commit: str) -> str:
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


def _figure_id(recipe: str, i: int) -> str:
    return f"fig-{_slug(recipe)}-{i + 1}"


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cite(ref_id: str) -> str:
    return REFERENCES[ref_id].text()


def _markdown(results: list[dict[str, Any]]) -> str:
    made, machines = _provenance(results)
    table = summary(results)
    lines = ["# attnflow reproduction report", "",
             f"Reproduces {_cite(SEED)} Made by attnflow {made} on {machines}. Each recipe's "
             "exact parameters, seed and numbers are in `<recipe>/result.json`.", "",
             "## Summary", "", "| suite | recipes | claims | " + " | ".join(VERDICTS)
             + " | time |", "|---" * (4 + len(VERDICTS)) + "|"]
    for suite, row in table.items():
        lines.append(f"| {suite} | {row['recipes']} | {row['claims']} | "
                     + " | ".join(str(row[v]) for v in VERDICTS)
                     + f" | {_duration(row['seconds'])} |")
    lines += ["", "## Claims", "", "| recipe | claim | paper | measured | criterion | verdict |",
              "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in claims_table(results)]
    for res in results:
        refs = references_of(res["name"])
        lines += ["", f"## {res['name']}: {res['title']}", "",
                  f"Suite {res.get('suite', DEFAULT_SUITE)}, size `{res['size']}`, seed "
                  f"{res['seed']}, {res['wall_time']:.1f} s. Parameters: "
                  f"`{json.dumps(res['params'])}`", ""]
        if refs:
            lines += ["Checks: " + " ".join(r.text() for r in refs), ""]
        lines += [f"* {note}" for note in res.get("notes", [])]
        for fig in res["figures"]:
            text = caption(res["name"], fig) or fig
            lines += ["", f"![{fig}]({res['name']}/{fig})", "", f"*{text}*"]
    lines += ["", "## References", ""]
    lines += [f"* {REFERENCES[i].text()}" for i in _cited(results)]
    return "\n".join(lines) + "\n"


def _cited(results: list[dict[str, Any]]) -> list[str]:
    """arXiv ids cited by the results' recipes, seed paper first, each once."""
    ids = [SEED] + [r.arxiv for res in results for r in references_of(res["name"])]
    return list(dict.fromkeys(ids))


def _badge(verdict: str) -> str:
    return f"<span class='badge {_slug(verdict)}'>{html.escape(verdict)}</span>"


def _data_uri(path: Path) -> str:
    mime = _MIME.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def _html(results: list[dict[str, Any]], out: Path) -> str:
    esc = html.escape
    made, machines = _provenance(results)
    table = summary(results)
    total = table.get("total", {"seconds": 0.0})
    suites = [s for s in table if s != "total"]
    p = ["<!doctype html>", "<html lang='en'><head><meta charset='utf-8'>",
         "<meta name='viewport' content='width=device-width, initial-scale=1'>",
         "<title>attnflow reproduction report</title>", f"<style>{_css()}</style>",
         "</head><body>", "<header><h1>attnflow reproduction report</h1>",
         f"<p>Reproduces {_ref_link(SEED)}; follow-up papers are checked by the recipes that "
         f"cite them.</p><p class='meta'>attnflow {esc(made)} &middot; {esc(machines)} "
         f"&middot; total recipe time {_duration(total['seconds'])}</p></header>"]
    # Summary
    p.append("<section id='summary'><h2>Summary</h2><div class='scroll'>"
             "<table class='summary'><thead><tr><th>suite</th><th class='num'>recipes</th>"
             "<th class='num'>claims</th>"
             + "".join(f"<th class='num'>{_badge(v)}</th>" for v in VERDICTS)
             + "<th class='num'>time</th></tr></thead><tbody>")
    for suite, row in table.items():
        p.append(f"<tr class='{'total' if suite == 'total' else 'suite'}' "
                 f"data-suite='{esc(suite)}'><td>{esc(suite)}</td>"
                 f"<td class='num' data-label='recipes'>{row['recipes']}</td>"
                 f"<td class='num' data-label='claims'>{row['claims']}</td>"
                 + "".join(f"<td class='num' data-label='{esc(v)}' data-verdict='{esc(v)}'>"
                           f"{row[v]}</td>" for v in VERDICTS)
                 + f"<td class='num' data-label='time'>{_duration(row['seconds'])}</td></tr>")
    p.append("</tbody></table></div></section>")
    # Contents
    p.append("<nav id='contents'><h2>Contents</h2><ol><li><a href='#summary'>Summary</a></li>"
             "<li><a href='#claims'>Claims</a></li>")
    for suite in suites:
        items = "".join(f"<li><a href='#recipe-{_slug(r['name'])}'>{esc(r['name'])}</a>: "
                        f"{esc(r['title'])}</li>" for r in results
                        if r.get("suite", DEFAULT_SUITE) == suite)
        p.append(f"<li>Recipes of the {esc(suite)} suite<ol>{items}</ol></li>")
    p.append("<li><a href='#references'>References</a></li></ol></nav>")
    # Claims
    p.append("<section id='claims'><h2>Claims</h2><div class='scroll'><table class='claims'>"
             "<thead><tr><th>recipe</th><th>claim</th><th>paper</th><th>measured</th>"
             "<th>criterion</th><th>verdict</th><th>figures</th></tr></thead><tbody>")
    for res in results:
        name = res["name"]
        figs = " ".join(f"<a href='#{_figure_id(name, i)}'>Fig. {i + 1}</a>"
                        for i in range(len(res["figures"])))
        for c in res["claims"]:
            why = f"<span class='why'>{esc(_reason(c))}</span>" if _reason(c) else ""
            if _cause(c):
                why += f"<span class='why cause'>cause: {esc(_cause(c))}</span>"
            p.append(f"<tr data-verdict='{esc(c['verdict'])}' "
                     f"data-suite='{esc(res.get('suite', DEFAULT_SUITE))}'>"
                     f"<td data-label='recipe'><a href='#recipe-{_slug(name)}'>{esc(name)}</a>"
                     f"</td><td data-label='claim'>{esc(c['claim'])}</td>"
                     f"<td data-label='paper'>{esc(c['paper'])}</td>"
                     f"<td data-label='measured'>{esc(c['measured'])}</td>"
                     f"<td data-label='criterion'>{esc(c.get('criterion') or '-')}</td>"
                     f"<td data-label='verdict'>{_badge(c['verdict'])}{why}</td>"
                     f"<td data-label='figures'>{figs or '&ndash;'}</td></tr>")
    p.append("</tbody></table></div></section>")
    # Recipes
    for res in results:
        p.append(_recipe_html(res, out))
    # References
    p.append("<section id='references'><h2>References</h2><ol>")
    p += [f"<li id='ref-{_slug(i)}'>{esc(REFERENCES[i].text())} <a href='{REFERENCES[i].url}'>"
          f"{REFERENCES[i].url}</a></li>" for i in _cited(results)]
    p.append("</ol></section>")
    # Printing opens the collapsible blocks, so the parameters are on paper too.
    p.append("<script>window.addEventListener('beforeprint',function(){document.querySelectorAll"
             "('details').forEach(function(d){d.open=true;});});</script></body></html>")
    return "\n".join(p)


def _ref_link(ref_id: str) -> str:
    ref = REFERENCES[ref_id]
    who = (", ".join(ref.authors) + ", ") if ref.authors else ""
    venue = f" ({ref.venue})" if ref.venue else ""
    return (f"{html.escape(who)}<i>{html.escape(ref.title)}</i>{html.escape(venue)}, "
            f"<a href='#ref-{_slug(ref_id)}'>arXiv:{ref_id}</a>")


def _recipe_html(res: dict[str, Any], out: Path) -> str:
    esc = html.escape
    name = res["name"]
    refs = references_of(name)
    counts = Counter(c["verdict"] for c in res["claims"])
    p = [f"<section class='recipe' id='recipe-{_slug(name)}'>",
         f"<h2>{esc(name)}: {esc(res['title'])}</h2>",
         "<p>" + " ".join(f"{_badge(v)} {counts[v]}" for v in VERDICTS if counts[v]) + "</p>"]
    if refs:
        p.append("<p class='cites'>Checks: " + "; ".join(_ref_link(r.arxiv) for r in refs)
                 + "</p>")
    p.append(f"<details><summary>Run parameters and seed</summary><p>Suite "
             f"{esc(res.get('suite', DEFAULT_SUITE))}, size <code>{esc(res['size'])}</code>, "
             f"seed <code>{res['seed']}</code>, {res['wall_time']:.1f} s, attnflow "
             f"{esc(str(res.get('version', '?')))}"
             + (f", git <code>{esc(res['commit'])}</code>" if res.get("commit") else "")
             + (f", {esc(res['machine'])}" if res.get("machine") else "")
             + f".</p><pre>{esc(json.dumps(res['params'], indent=1))}</pre></details>")
    if res.get("notes"):
        p.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in res["notes"]) + "</ul>")
    for i, fig in enumerate(res["figures"]):
        text = caption(name, fig) or f"{fig} ({res['title']})."
        p.append(f"<figure id='{_figure_id(name, i)}'><img alt='{esc(text)}' "
                 f"src='{_data_uri(out / name / fig)}'><figcaption><b>{esc(name)}, Fig. "
                 f"{i + 1}.</b> {esc(text)}</figcaption></figure>")
    p.append("</section>")
    return "\n".join(p)


def write_report(results: list[dict[str, Any]], out: str | os.PathLike) -> tuple[Path, Path]:
    """Write out/report.md and out/report.html; return their paths."""
    out = Path(out)
    return (write_text(out / "report.md", _markdown(results)),
            write_text(out / "report.html", _html(results, out)))
