"""The documentation site's sources: every page in the navigation exists, the getting-started
page shows the README's two commands verbatim, the API reference covers the public modules.
(`mkdocs build --strict`, which also checks every link and anchor, runs in .ci/run.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.M)


def test_every_page_of_the_navigation_exists_and_every_page_is_in_it():
    pages = _nav_pages()
    assert len(pages) == len(set(pages)) > 20
    for page in pages:
        assert (ROOT / "docs" / page).is_file(), page
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == set(pages)


def test_getting_started_shows_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)[:2]
    assert commands[1].endswith("python3 -m pytest")
    page = (ROOT / "docs" / "getting-started.md").read_text()
    for command in commands:
        assert command in page
    assert 'pip install -e ".[docs]" && mkdocs build --strict' in readme


def test_the_api_reference_covers_the_public_modules():
    text = "".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    for name in ("attnflow.family.block.Attention", "attnflow.simulate.simulate",
                 "attnflow.family.stack.Stack",
                 "attnflow.trajectory.Trajectory", "attnflow.sphere", "attnflow.plot",
                 "attnflow.sweeps", "attnflow.analysis.clusters", "attnflow.analysis.family",
                 "attnflow.pretrained.spectra", "attnflow.reproduce", "attnflow.report"):
        assert f"::: {name}\n" in text, name


def test_docs_extra_and_ci_build_the_site():
    project = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^docs = \[.*"mkdocs>=.*"mkdocs-material>=.*"mkdocstrings\[python\]',
                     project, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci and '.[all,torch,test,docs,gpu]' in ci


def test_prose_after_the_colon_becomes_the_description():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("prose", ROOT / "docs/_ext/prose_params.py")
    prose = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prose)
    doc = ("Run.\n\nParameters\n----------\nx0 : (..., n, d) tokens; leading axes\n    are runs."
           "\nrtol, atol : tolerances.\n\nReturns a Trajectory : not a parameter.\n\n"
           "Notes\n-----\na : b stays.")
    assert prose.rewrite(doc) == (
        "Run.\n\nReturns a Trajectory : not a parameter.\n\nParameters\n----------\nx0\n"
        "    (..., n, d) tokens; leading axes\n    are runs.\nrtol, atol\n    tolerances.\n\n"
        "Notes\n-----\na : b stays.")


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def test_every_code_fence_is_closed():
    for page in _pages():
        fences = re.findall(r"^ {0,3}(```|~~~)", page.read_text(), re.M)
        assert len(fences) % 2 == 0, f"{page.relative_to(ROOT)}: a code fence left open"


def _links(text: str) -> list[str]:
    markdown = pytest.importorskip("markdown")
    body = markdown.markdown(text, extensions=["tables", "attr_list", "md_in_html",
                                               "pymdownx.superfences"])
    return re.findall(r'<a [^>]*href="([^"]*)"', body)


def test_every_link_of_the_docs_leads_somewhere():
    # Markdown reads "E[R^2](t)" as a link to "t": newer mkdocs refuses such links in strict
    # builds, so each link must be a URL, an anchor or a file beside the page
    for page in _pages():
        for href in _links(page.read_text()):
            if re.match(r"(https?:|mailto:|#)", href):
                continue
            target = (page.parent / href.split("#")[0]).resolve()
            assert target.exists(), f"{page.relative_to(ROOT)}: a link to {href!r}"


def test_results_table_cells_are_read_literally():
    from attnflow.results_page import _cell

    row = "| " + " | ".join(_cell(c) for c in ("n E[R^2](t) = S", "a | b", "[x](y.md)")) + " |"
    table = "| a | b | c |\n|---|---|---|\n" + row + "\n"
    assert _links(table) == []
    assert "n E[R^2](t) = S" in pytest.importorskip("markdown").markdown(
        table, extensions=["tables"])
