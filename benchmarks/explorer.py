"""Playback rate of the explorer page (`af.explore_html`) in headless Chromium.

    python benchmarks/explorer.py [--seconds 4] [--results benchmarks/RESULTS.md]
                                  [--baseline-js OLD.js]

Four pages: n = 10^4 tokens on the circle and n = 2000 on the sphere (60 frames each, tokens
drifting into clusters: synthetic states, no integration), and n = 10^6 on each as binned
densities (6 frames). For each, a requestAnimationFrame loop in the page moves the slider to
the next frame's time per animation frame (a full redraw: tokens merged into markers or the
density, series, the time and cluster readouts) for `--seconds`, and the rate is frames
drawn per second of wall time (at most the display's 60 Hz). Both colourings of the point
pages are timed (by cluster computes the frame's clusters in JavaScript: sorted angles on
the circle, Prim's O(n^2) tree on the sphere, once per frame). With --baseline-js (another
version's explorer.js, e.g. `git show REV:src/attnflow/explorer/explorer.js > OLD.js`) each
point page is also timed with that module in place of the current one, the two alternating,
and the table gives the ratio. Appends a section to the results file with date, command and
CPU. Needs chromium and chromedriver (Debian packages)
and selenium.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import attnflow as af
from attnflow.explorer.pack import DENSITY_N

LOOP = """
const done = arguments[arguments.length - 1], seconds = arguments[0];
const slider = document.getElementById('af-slider');
const T = JSON.parse(document.getElementById('af-data').textContent).data.times.length;
let frames = 0, start = 0, k = 0;
function step(now) {
  if (!start) start = now;
  if (now - start >= 1000 * seconds) { done(frames / ((now - start) / 1000)); return; }
  k = (k + 1) % T; // equally spaced times: frame k lies at k / (T - 1) of the slider
  slider.value = String(Math.round((Number(slider.max) * k) / (T - 1)));
  slider.dispatchEvent(new Event('input'));
  frames += 1;
  requestAnimationFrame(step);
}
requestAnimationFrame(step);
"""


def synthetic(n: int, d: int, T: int = 60, seed: int = 0) -> af.Trajectory:
    """Tokens moving from uniform positions towards 6 cluster centres over T frames."""
    rng = np.random.default_rng(seed)
    x0 = af.sphere.uniform(n, d, seed=seed)
    centres = af.sphere.uniform(6, d, seed=seed + 1)[rng.integers(0, 6, n)]
    s = np.linspace(0.0, 1.0, T)[:, None, None] ** 0.5
    X = (1 - s) * x0[None] + s * centres[None]
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    return af.Trajectory(times=np.linspace(0.0, 30.0, T), states=X,
                         model=af.Attention(beta=9.0, mask="causal"),
                         integrator={"method": "none"})


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(seconds: float, baseline: str | None = None
            ) -> list[tuple[str, int, int, float, str, float, float | None]]:
    """[(view, n, frames, page MB, colouring, frames per second, the baseline module's)]."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import Select

    from attnflow.explorer.page import module_source

    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("needs chromium and chromedriver on PATH")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_script_timeout(seconds + 60)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for view, n, d, T in (("circle", 10_000, 2, 60), ("sphere", 2000, 3, 60),
                                  ("circle", 1_000_000, 2, 6), ("sphere", 1_000_000, 3, 6)):
                page = af.explore_html(synthetic(n, d, T), Path(tmp) / f"{view}{n}.html")
                mb = page.stat().st_size / 1e6
                dense = n > DENSITY_N
                old = None
                if baseline and not dense:
                    old = Path(tmp) / f"{view}{n}-baseline.html"
                    old.write_text(page.read_text().replace(module_source(), baseline))
                for colouring in ("density",) if dense else ("index", "cluster"):
                    rates = {}
                    for which in ([page, old, page, old] if old else [page]):
                        driver.get(which.as_uri())
                        if not dense:
                            Select(driver.find_element("id", "af-color")).select_by_value(
                                colouring)
                        rate = driver.execute_async_script(LOOP, seconds / 2 if old else seconds)
                        rates.setdefault(which, []).append(float(rate))
                    mean = {k: sum(v) / len(v) for k, v in rates.items()}
                    rows.append((view, n, T, mb, colouring, mean[page], mean.get(old)))
    finally:
        driver.quit()
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--results", type=Path, default=None,
                        help="append the section to this file (default: print only)")
    parser.add_argument("--baseline-js", type=Path, default=None,
                        help="another version's explorer.js, timed on the same point pages")
    args = parser.parse_args(argv)
    rows = measure(args.seconds, args.baseline_js.read_text() if args.baseline_js else None)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    command = " ".join(["python benchmarks/explorer.py"] + (argv if argv is not None
                                                           else sys.argv[1:]))
    lines = [f"## {now}, `{command}`", "",
             f"Explorer playback in headless Chromium (software rendering). CPU: {cpu()}, "
             f"{os.cpu_count()} threads; load average at the end {load}.", "",
             "| view | tokens | frames | page size | colour | frames drawn per second | "
             "baseline module | ratio |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {view} | {n} | {T} | {mb:.2f} MB | {colouring} | {fps:.1f} | "
              + ("- | - |" if old is None else f"{old:.1f} | {fps / old:.2f} |")
              for view, n, T, mb, colouring, fps, old in rows]
    text = "\n".join(lines) + "\n"
    if args.results is not None:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return text


if __name__ == "__main__":
    sys.stdout.write(main())
