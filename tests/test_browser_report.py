"""The reproduction report in a real browser: headless Chromium driven by selenium (both from
the Debian packages `chromium` and `chromium-driver`, installed by .ci/run). Skipped cleanly
where either is missing.

Checked: no console errors; every image decodes (naturalWidth > 0); every in-page link
resolves; the summary's counts equal the claims table's; no horizontal scrolling of the page
at 390 px; screenshots at 1280 and 390 px are not blank. Set ATTNFLOW_SCREENSHOTS=DIR to keep
the screenshots there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from headless import chromium, needs_chromium
from report_fixture import write_results

from attnflow.report import VERDICTS, write_report

pytest.importorskip("selenium.webdriver")
pytestmark = needs_chromium


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser")
    _, html = write_report(write_results(out), out)
    driver = chromium()
    try:
        driver.get(html.as_uri())
        yield driver
    finally:
        driver.quit()


def test_page_loads_without_console_errors(page):
    assert page.title == "attnflow reproduction report"
    errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_every_image_decodes(page):
    sizes = page.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth]);")
    assert len(sizes) == 6
    assert all(done and width > 0 for done, width in sizes), sizes


def test_every_in_page_link_resolves(page):
    missing = page.execute_script(
        "return Array.from(document.querySelectorAll('a[href^=\"#\"]'))"
        ".map(a => a.getAttribute('href').slice(1))"
        ".filter(id => !document.getElementById(id));")
    links = page.execute_script("return document.querySelectorAll('a[href^=\"#\"]').length;")
    assert missing == [] and links > 20


def test_summary_counts_equal_the_claims_table(page):
    shown = page.execute_script("""
        const out = {};
        for (const row of document.querySelectorAll('table.summary tbody tr')) {
          out[row.dataset.suite] = Object.fromEntries(Array.from(
            row.querySelectorAll('td[data-verdict]'), td => [td.dataset.verdict,
                                                             Number(td.textContent)]));
        }
        return out;""")
    counted = page.execute_script("""
        const out = {};
        for (const row of document.querySelectorAll('table.claims tbody tr')) {
          for (const suite of [row.dataset.suite, 'total']) {
            out[suite] = out[suite] || {};
            out[suite][row.dataset.verdict] = (out[suite][row.dataset.verdict] || 0) + 1;
          }
        }
        return out;""")
    assert set(shown) == {"paper", "followups", "total"} == set(counted)
    for suite, row in shown.items():
        assert row == {v: counted[suite].get(v, 0) for v in VERDICTS}, suite


@pytest.mark.parametrize("width", [1280, 390])
def test_screenshots_are_not_blank_and_fit_the_width(page, width, tmp_path):
    from PIL import Image

    page.set_window_size(width, 1400)
    page.execute_script("window.scrollTo(0, 0);")
    inner = page.execute_script("return window.innerWidth;")
    overflow = page.execute_script(
        "return document.documentElement.scrollWidth - window.innerWidth;")
    assert overflow <= 1, f"the page scrolls sideways by {overflow} px at {inner} px"
    path = tmp_path / f"report-{width}.png"
    assert page.save_screenshot(str(path))
    image = np.asarray(Image.open(path).convert("L"), dtype=float)
    assert image.shape[1] == inner
    assert image.std() > 20 and (image < 128).mean() > 0.01  # text and figures, not blank
    keep = os.environ.get("ATTNFLOW_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
