"""The explorer page (`af.explore_html`) in a real browser: headless Chromium driven by
selenium, opened from disk. Skipped cleanly where Chromium or chromedriver is missing.

Checked: the displayed time and cluster count are the data's at every frame shown; moving the
slider and playing change the canvas and advance the frame; dragging turns the sphere (the
canvas changes, the frame does not); colouring by cluster repaints; no console errors; no
sideways scrolling at 390 and 1280 px. Set ATTNFLOW_SCREENSHOTS=DIR to keep the screenshots.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from headless import chromium, needs_chromium

import attnflow as af

pytest.importorskip("selenium.webdriver")
pytestmark = needs_chromium


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    out = tmp_path_factory.mktemp("explorer")
    found = {}
    for name, d, n in (("circle", 2, 120), ("sphere", 3, 150)):
        traj = af.simulate(af.Attention(beta=9.0, mask="causal"),
                           af.sphere.uniform(n, d, seed=0), 20.0, method="rk4", dt=0.1,
                           save_at=np.linspace(0, 20, 41))
        found[name] = (af.explore_html(traj, out / f"{name}.html"), af.explorer.pack(traj))
    return found


@pytest.fixture(scope="module")
def driver():
    browser = chromium()
    try:
        yield browser
    finally:
        browser.quit()


def _open(driver, page):
    driver.get(page.as_uri())
    driver.find_element("id", "af-time")  # rendered
    return driver


def _pixels(driver):
    return driver.execute_script("return document.getElementById('af-main').toDataURL();")


def _shown(driver):
    return driver.execute_script(
        "const t = document.getElementById('af-time');"
        "return [Number(t.dataset.frame), t.textContent,"
        "        document.getElementById('af-clusters').textContent];")


def _slide(driver, i):
    driver.execute_script("const s = document.getElementById('af-slider'); s.value = arguments[0];"
                          "s.dispatchEvent(new Event('input'));", i)


def _errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _expected(packed, i):
    """[frame, time, cluster count] as the page shows them (the time to 4 digits)."""
    shown = float(f"{packed['times'][i]:.4g}")
    return [i, f"{shown:g}", str(packed["clusters"][i])]


@pytest.mark.parametrize("name", ["circle", "sphere"])
def test_slider_shows_the_data_of_each_frame(driver, pages, name):
    page, packed = pages[name]
    _open(driver, page)
    assert _shown(driver) == _expected(packed, 0)
    ink = driver.execute_script(
        "const c = document.getElementById('af-main');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let k = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 200) k++; return k;")
    assert ink > 500  # tokens and the circle drawn, not a blank canvas
    before = _pixels(driver)
    for i in (7, 40, 20):
        _slide(driver, i)
        assert _shown(driver) == _expected(packed, i)
    assert _pixels(driver) != before
    _slide(driver, 0)
    assert _pixels(driver) == before  # the same frame draws the same picture
    assert _errors(driver) == []


def test_play_advances_and_pause_stops(driver, pages):
    page, packed = pages["circle"]
    _open(driver, page)
    before = _pixels(driver)
    play = driver.find_element("id", "af-play")
    play.click()
    time.sleep(1.0)  # 10 frames per second by default
    play.click()
    assert play.text == "Play"
    frame, shown_time, count = _shown(driver)
    assert 2 <= frame < 40 and [frame, shown_time, count] == _expected(packed, frame)
    assert _pixels(driver) != before
    time.sleep(0.4)
    assert _shown(driver)[0] == frame  # paused
    assert _errors(driver) == []


def test_dragging_turns_the_sphere_and_keeps_the_frame(driver, pages):
    from selenium.webdriver.common.action_chains import ActionChains

    page, _ = pages["sphere"]
    _open(driver, page)
    _slide(driver, 10)
    before = _pixels(driver)
    canvas = driver.find_element("id", "af-main")
    ActionChains(driver).move_to_element(canvas).click_and_hold().move_by_offset(60, 25) \
        .release().perform()
    assert _pixels(driver) != before
    assert _shown(driver)[0] == 10
    assert _errors(driver) == []


def test_colouring_by_cluster_repaints(driver, pages):
    from selenium.webdriver.support.ui import Select

    page, _ = pages["circle"]
    _open(driver, page)
    _slide(driver, 40)
    before = _pixels(driver)
    Select(driver.find_element("id", "af-color")).select_by_value("cluster")
    assert _pixels(driver) != before
    Select(driver.find_element("id", "af-color")).select_by_value("index")
    assert _pixels(driver) == before
    assert _errors(driver) == []


@pytest.mark.parametrize("width", [390, 1280])
@pytest.mark.parametrize("name", ["circle", "sphere"])
def test_screenshots_fit_the_width(driver, pages, name, width, tmp_path):
    from PIL import Image

    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": 1100, "deviceScaleFactor": 1, "mobile": width < 500})
    try:
        _open(driver, pages[name][0])
        _slide(driver, 20)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth;")
        assert overflow <= 1, f"the page scrolls sideways by {overflow} px at {width} px"
        path = tmp_path / f"explorer-{name}-{width}.png"
        assert driver.save_screenshot(str(path))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    image = np.asarray(Image.open(path).convert("L"), dtype=float)
    assert image.shape[1] == width and image.std() > 20
    assert _errors(driver) == []
    keep = os.environ.get("ATTNFLOW_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


# ----- a trace of a real model (issue 36): layers as time, patterns per layer and head


@pytest.fixture(scope="module")
def trace_pages(tmp_path_factory):
    from attnflow.pretrained.trace import trace_dataset

    out = tmp_path_factory.mktemp("trace")
    rng = np.random.default_rng(0)
    L, H, n, d = 4, 3, 20, 32
    pre = rng.normal(size=(L, n, d))
    pattern = rng.random((L, H, n, n)) * np.tri(n)
    pattern /= pattern.sum(axis=-1, keepdims=True)
    words = [f"w{i}" for i in range(n)]
    full = trace_dataset(pre, pre + rng.normal(size=(L, n, d)), np.arange(n), pattern=pattern,
                         str_tokens=words, attrs={"model": "toy"})
    bare = trace_dataset(pre, pre + 1.0, np.arange(n), str_tokens=words)
    return {name: (af.explore_html(ds, out / f"{name}.html"), af.explorer.pack_trace(ds))
            for name, ds in (("full", full), ("bare", bare))}


def _readout(driver):
    return driver.execute_script(
        "const t = document.getElementById('af-time');"
        "return [Number(t.dataset.frame), t.parentElement.textContent,"
        "        document.getElementById('af-cosine').textContent,"
        "        document.getElementById('af-sink').textContent];")


def _canvas(driver, name):
    return driver.execute_script(f"return document.getElementById('{name}').toDataURL();")


def test_trace_page_shows_layers_cosine_sink_and_patterns(driver, trace_pages):
    from selenium.webdriver.support.ui import Select

    page, packed = trace_pages["full"]
    _open(driver, page)
    for i in (0, 2, 4, 1):
        _slide(driver, i)
        frame, text, cosine, sink = _readout(driver)
        assert frame == i and text.startswith(f"layer = {i} · mean cos: ")
        assert cosine == f"{packed['cosine'][i]:.3f}"
        assert sink == ("–" if i == 4 else f"{packed['sink'][i]:.2f}")
    assert "t = " not in driver.find_element("id", "af-time").find_element(
        "xpath", "..").text
    pattern = _canvas(driver, "af-pattern")
    Select(driver.find_element("id", "af-head")).select_by_value("2")
    assert _canvas(driver, "af-pattern") != pattern  # another head
    _slide(driver, 3)
    caption = driver.find_element("id", "af-pattern-caption").text
    assert caption.startswith("attention pattern of layer 3")
    assert driver.find_elements("id", "af-no-attn") == []
    assert _errors(driver) == []


def test_trace_page_without_patterns_says_so(driver, trace_pages):
    page, _ = trace_pages["bare"]
    _open(driver, page)
    _slide(driver, 2)
    assert _readout(driver)[1].startswith("layer = 2 ")
    assert "no attention patterns" in driver.find_element("id", "af-no-attn").text
    assert driver.find_elements("id", "af-pattern") == []
    assert _errors(driver) == []
