"""The reproduction report: a claims table, then one section per recipe.

Writes ``report.md`` (figures linked) and a self-contained ``report.html`` (figures embedded
as base64 PNG), both atomically.
"""

from __future__ import annotations

import base64
import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_report", "claims_table"]

VERDICT_MARK = {"reproduced": "✅ reproduced", "partly": "🟡 partly",
                "not reproduced": "❌ not reproduced", "not run": "⏭ not run"}


def claims_table(results: list[dict[str, Any]]) -> list[list[str]]:
    """Rows (recipe, claim, paper, measured, verdict and why) over all results."""
    rows = []
    for res in results:
        for c in res["claims"]:
            mark = VERDICT_MARK.get(c["verdict"], c["verdict"])
            rows.append([res["name"], c["claim"], c["paper"], c["measured"],
                         f"{mark}" + (f": {c['why']}" if c.get("why") else "")])
    return rows


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown(results: list[dict[str, Any]]) -> str:
    lines = ["# attnflow reproduction report", "",
             "Karagodin, Polyanskiy & Rigollet, *Clustering in Causal Attention Masking* "
             "(NeurIPS 2024). Each recipe's exact parameters, seed and numbers are in "
             "`<recipe>/result.json`.", "", "## Claims", "",
             "| recipe | claim | paper | measured | verdict |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in claims_table(results)]
    for res in results:
        lines += ["", f"## {res['name']}: {res['title']}", "",
                  f"Size `{res['size']}`, seed {res['seed']}, {res['wall_time']:.1f} s, "
                  f"attnflow {res['version']}. Parameters: `{json.dumps(res['params'])}`", ""]
        lines += [f"* {note}" for note in res.get("notes", [])]
        lines += [f"![{fig}]({res['name']}/{fig})" for fig in res["figures"]]
    return "\n".join(lines) + "\n"


def _html(results: list[dict[str, Any]], out: Path) -> str:
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             "<title>attnflow reproduction report</title><style>",
             "body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}",
             "table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #bbb;"
             "padding:4px 6px;vertical-align:top}img{max-width:100%}code{font-size:.85em}",
             "</style></head><body><h1>attnflow reproduction report</h1>",
             "<p>Karagodin, Polyanskiy &amp; Rigollet, <i>Clustering in Causal Attention "
             "Masking</i> (NeurIPS 2024).</p><h2>Claims</h2><table><tr><th>recipe</th>"
             "<th>claim</th><th>paper</th><th>measured</th><th>verdict</th></tr>"]
    for row in claims_table(results):
        parts.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    for res in results:
        parts.append(f"<h2>{esc(res['name'])}: {esc(res['title'])}</h2>")
        parts.append(f"<p>Size <code>{esc(res['size'])}</code>, seed {res['seed']}, "
                     f"{res['wall_time']:.1f} s. Parameters: <code>"
                     f"{esc(json.dumps(res['params']))}</code></p>")
        if res.get("notes"):
            parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in res["notes"]) + "</ul>")
        for fig in res["figures"]:
            data = base64.b64encode((out / res["name"] / fig).read_bytes()).decode()
            parts.append(f"<figure><img alt='{esc(fig)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{esc(fig)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(results: list[dict[str, Any]], out: str | os.PathLike) -> tuple[Path, Path]:
    """Write out/report.md and out/report.html; return their paths."""
    out = Path(out)
    paths = out / "report.md", out / "report.html"
    for path, text in zip(paths, (_markdown(results), _html(results, out))):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=out)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return paths
