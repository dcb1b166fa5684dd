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


def _slide(driver, i, at=None):
    """Move the slider to frame i's time on a linear axis (or to the position `at` in [0, 1])."""
    driver.execute_script(
        "const s = document.getElementById('af-slider');"
        "const t = JSON.parse(document.getElementById('af-data').textContent).data.times;"
        "const at = arguments[1] === null ?"
        "  (t[arguments[0]] - t[0]) / (t[t.length - 1] - t[0]) : arguments[1];"
        "s.value = Math.round(Number(s.max) * at); s.dispatchEvent(new Event('input'));", i, at)


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


# ----- hostile strings (issue 44): a model name or token text holding "<!--<script>" or
# "</script>" must neither end the page's data block nor swallow its module script

PAYLOADS = ["<!--<script>", "</script><b id='pwned'>x</b>", "a & b > c \u2028 <!-- -->"]


def _hostile_pages(out):
    from attnflow.explorer.page import page_html
    from attnflow.pretrained.trace import trace_dataset

    rng = np.random.default_rng(1)
    L, n, d = 2, 6, 8
    pre = rng.normal(size=(L, n, d))
    labels = [PAYLOADS[i % 3] + str(i) for i in range(n)]
    ds = trace_dataset(pre, pre + rng.normal(size=(L, n, d)), np.arange(n), str_tokens=labels,
                       attrs={"model": PAYLOADS[0] + " " + PAYLOADS[1]})
    trace_page = af.explore_html(ds, out / "trace.html", title=PAYLOADS[0])
    X = af.sphere.uniform(30, 3, seed=0)
    packed = af.explorer.pack(af.Trajectory(times=[0.0, 1.0], states=np.stack([X, X]),
                                            model=af.Attention(beta=9.0), integrator={}))
    packed["model"] = " ".join(PAYLOADS)
    run_page = out / "run.html"
    run_page.write_text(page_html(packed, title=PAYLOADS[1]))
    return {"trace": (trace_page, labels, ds.attrs), "run": (run_page, None, None)}


def test_hostile_strings_stay_text_and_the_module_runs(driver, tmp_path):
    for name, (page, labels, _) in _hostile_pages(tmp_path).items():
        _open(driver, page)
        state = driver.execute_script(
            "const el = document.getElementById('af-explorer');"
            "const c = document.getElementById('af-main');"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let ink = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 200) ink++;"
            "return {drawn: Number(el.dataset.drawn || 0), ink,"
            "        scripts: document.scripts.length,"
            "        pwned: document.querySelectorAll('#pwned').length,"
            "        text: el.textContent, title: document.querySelector('h1').textContent,"
            "        labels: JSON.parse(document.getElementById('af-data').textContent)"
            "                .data.labels};")
        assert state["drawn"] >= 1 and state["ink"] > 300, name  # the module ran and drew
        assert state["scripts"] == 2 and state["pwned"] == 0, name
        assert state["labels"] == labels, name
        model = PAYLOADS[0] + " " + PAYLOADS[1] if name == "trace" else " ".join(PAYLOADS)
        assert model in state["text"], name  # shown as text
        assert state["title"] == (PAYLOADS[0] if name == "trace" else PAYLOADS[1])
        assert _errors(driver) == [], name


# ----- the sphere's guides (issue 42): the equator and the meridian through x1 drawn as
# the projected great circles at every n (they broke into chords through the centre for
# n < 97: the guide's 97 points were projected only as far as the token count)

def _great_circles(elev, azim):
    """Screen points (x right, y down, unit radius) and depth of the equator and of the
    meridian through x1, under the page's orthographic camera [elevation, azimuth]."""
    a = np.linspace(0, 2 * np.pi, 2000)
    el, az = np.radians([elev, azim])
    out = []
    for x, y, z in ((np.cos(a), np.sin(a), 0 * a), (np.cos(a), 0 * a, np.sin(a))):
        x1, y1 = np.cos(az) * x - np.sin(az) * y, np.sin(az) * x + np.cos(az) * y
        out.append((x1, -(np.cos(el) * z - np.sin(el) * y1), np.cos(el) * y1 + np.sin(el) * z))
    return out


@pytest.mark.parametrize("n", [50, 5000])
def test_sphere_guides_lie_on_the_projected_great_circles(driver, tmp_path, n):
    import base64
    import io

    from PIL import Image
    from scipy.spatial import cKDTree

    u = np.ones(3) / np.sqrt(3)  # every token at one point, off both guides
    X = np.broadcast_to(u, (2, n, 3))
    traj = af.Trajectory(times=[0.0, 1.0], states=X, model=af.Attention(beta=9.0),
                         integrator={})
    _open(driver, af.explore_html(traj, tmp_path / f"guides{n}.html"))
    url, css = driver.execute_script("const c = document.getElementById('af-main');"
                                     "return [c.toDataURL(), c.getBoundingClientRect().width];")
    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",")[1]))).convert("RGB"),
                     dtype=float)
    scale = img.shape[1] / css
    c, R = css / 2 * scale, 0.44 * css * scale
    (ex, ey, ez), (mx, my, mz) = _great_circles(20.0, -60.0)
    el, az = np.radians([20.0, -60.0])
    tx, ty = np.cos(az) * u[0] - np.sin(az) * u[1], np.sin(az) * u[0] + np.cos(az) * u[1]
    marker = np.array([c + R * tx, c - R * (np.cos(el) * u[2] - np.sin(el) * ty)])
    rows, cols = np.indices(img.shape[:2])
    r_, g_, b_ = img[..., 0], img[..., 1], img[..., 2]
    inside = np.hypot(cols - c, rows - c) < R - 3
    clear = np.hypot(cols - marker[0], rows - marker[1]) > 0.2 * R  # the tokens' marker
    guide = inside & clear & (b_ - r_ >= 10) & (r_ >= 150) & (g_ >= 150)  # the grey-blue guide
    curve = np.concatenate([np.stack([c + R * ex, c + R * ey], 1),
                            np.stack([c + R * mx, c + R * my], 1)])
    ys, xs = np.nonzero(guide)
    dist, _ = cKDTree(curve).query(np.stack([xs, ys], 1))
    assert len(xs) > 2 * R and dist.max() <= 2.5 * scale, \
        f"{np.count_nonzero(dist > 2.5 * scale)} guide pixels off the great circles"
    # and the near halves (solid) are drawn along their whole length
    front = np.concatenate([ez, mz]) > 0.05
    pts = curve[front]
    pts = pts[(np.hypot(*(pts - c).T) < R - 4) & (np.hypot(*(pts - marker).T) > 0.25 * R)]
    near, _ = cKDTree(np.stack([xs, ys], 1)).query(pts)
    assert np.mean(near <= 1.5 * scale) > 0.97
    assert _errors(driver) == []


# ----- markers by mass, the time axis, densities (issue 42)


def _png(driver):
    import base64
    import io

    from PIL import Image

    url, css = driver.execute_script("const c = document.getElementById('af-main');"
                                     "return [c.toDataURL(), c.getBoundingClientRect().width];")
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",")[1]))).convert("RGB")
    img = np.asarray(img, dtype=float)
    return img, img.shape[1] / css, css


def test_a_cluster_marker_covers_its_tokens_ink(driver, tmp_path):
    # 25 tokens at one point and 25 apart (19 px from each other): the cluster's marker
    # covers 25 single tokens' area. A pixel's coverage by a marker is its chroma (its
    # colour less its grey part) over the marker's: white and the grey circle have none.
    theta = np.concatenate([np.zeros(25), np.linspace(0.6 * np.pi, 1.4 * np.pi, 25)])
    X = np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    traj = af.Trajectory(times=[0.0, 1.0], states=np.stack([X, X]),
                         model=af.Attention(beta=9.0, mask="full"), integrator={})
    _open(driver, af.explore_html(traj, tmp_path / "cluster.html"))
    img, scale, css = _png(driver)
    c, R = css / 2 * scale, 0.38 * css * scale
    rows, cols = np.indices(img.shape[:2])
    chroma = np.linalg.norm(img - img.mean(axis=-1, keepdims=True), axis=-1)

    def area(angle, radius):
        """The marker's area (CSS px^2) about the point of the circle at angle."""
        x, y = c + R * np.cos(angle), c - R * np.sin(angle)
        near = np.hypot(cols - x, rows - y) <= radius * scale
        return chroma[near].sum() / chroma[int(round(y)), int(round(x))] / scale ** 2

    single = [area(a, 6) for a in theta[25:]]
    assert np.allclose(single, 25, rtol=0.05)  # a token: 5 x 5 px
    assert area(0.0, 22) == pytest.approx(25 * 25, rel=0.05)  # a disc of 25 tokens' area
    assert _errors(driver) == []


def test_long_runs_get_a_log_time_axis_and_the_slider_moves_by_time(driver, tmp_path):
    from selenium.webdriver.common.keys import Keys

    times = np.concatenate([[0.0], np.geomspace(0.01, 500, 30)])
    X = af.sphere.uniform(20, 2, seed=0)
    traj = af.Trajectory(times=times, states=np.broadcast_to(X, (31, 20, 2)),
                         model=af.Attention(beta=9.0), integrator={})
    _open(driver, af.explore_html(traj, tmp_path / "long.html"))
    log_box = driver.find_element("id", "af-log")
    assert log_box.is_selected()  # 4.7 decades of time

    def nearest(u):
        """The frame the slider's middle lands on: nearest in axis position."""
        pos = np.round(1000 * (u - u[0]) / (u[-1] - u[0]))
        return int(np.argmin(np.abs(pos - 500)))

    _slide(driver, 0, at=0.5)
    assert _shown(driver)[0] == nearest(np.log10(times + 0.01))  # 10^(mid of the logs)
    log_box.click()  # a linear axis: the middle is t = 250
    _slide(driver, 0, at=0.5)
    frame = _shown(driver)[0]
    assert frame == nearest(times) and abs(times[frame] - 250) < 100
    driver.find_element("id", "af-slider").send_keys(Keys.ARROW_LEFT)
    assert _shown(driver)[0] == frame - 1  # the keys step by saved frame
    assert _errors(driver) == []


def test_linear_time_when_the_times_span_few_steps(driver, pages):
    _open(driver, pages["circle"][0])  # 41 times, 0 to 20
    assert not driver.find_element("id", "af-log").is_selected()


@pytest.mark.parametrize("d", [2, 3])
def test_a_page_of_a_million_tokens_draws_their_density(driver, tmp_path, d):
    rng = np.random.default_rng(0)
    X = af.sphere.uniform(1_000_000, d, seed=0)
    X[: 400_000] = X[0] + 0.02 * rng.normal(size=(400_000, d))  # a cluster of 40 %
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    traj = af.Trajectory(times=[0.0], states=X[None], model=af.Attention(beta=9.0),
                         integrator={})
    page = af.explore_html(traj, tmp_path / f"million{d}.html")
    assert page.stat().st_size < 500_000
    _open(driver, page)
    img, scale, css = _png(driver)
    c = css / 2 * scale
    r = np.hypot(*(np.indices(img.shape[:2]) - c)) / scale / css  # radius / width
    coloured = np.ptp(img, axis=-1) > 60  # viridis, not the grey outline or white
    if d == 2:  # bars outward from the circle (radius 0.38), the cluster's the longest
        ring = (r > 0.38) & (r < 0.385)
        assert np.count_nonzero(coloured & ring) > 0.75 * np.count_nonzero(ring)  # all arcs
        assert np.count_nonzero(coloured & (r > 0.46)) > 0
    else:  # shaded cells over the sphere (radius 0.44)
        assert np.count_nonzero(coloured & (r < 0.44)) > 0.5 * np.pi * (0.44 * css) ** 2
    assert driver.find_element("id", "af-clusters").text == "–"
    assert _errors(driver) == []
