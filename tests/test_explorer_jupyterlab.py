"""The explorer widget in a real JupyterLab (slow: `pytest -m slow`): a server on 127.0.0.1,
headless Chromium runs a notebook that shows `af.explore(traj)`; the widget draws its canvas
and moving the page's slider moves the kernel's `frame` (written to a file by an observer).
Skipped without jupyterlab, ipykernel, anywidget, Chromium or chromedriver (none of the
extras brings jupyterlab: `pip install "jupyterlab>=4"` first; it uses no user settings).
About 30 s."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from headless import chromium, needs_chromium

pytestmark = pytest.mark.slow
for module in ("jupyterlab", "ipykernel", "anywidget"):
    pytest.importorskip(module)
pytest.importorskip("selenium.webdriver")
SRC = Path(__file__).resolve().parents[1] / "src"

CELL = """
import numpy as np, attnflow as af
traj = af.simulate(af.Attention(beta=9.0, mask="causal"), af.sphere.uniform(40, 2, seed=0),
                   4.0, method="rk4", dt=0.1, save_at=np.linspace(0, 4, 9))
w = af.explore(traj)
w.observe(lambda change: open({path!r}, "w").write(str(change["new"])), names="frame")
w
"""


def _until(condition, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


@needs_chromium
def test_the_widget_draws_and_syncs_in_jupyterlab(tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    frame_file = tmp_path / "frame.txt"
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {},
                           "outputs": [], "source": CELL.format(path=str(frame_file))}],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "explore.ipynb").write_text(json.dumps(notebook))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shares = dict.fromkeys(str(Path(p) / "share" / "jupyter") for p in (sys.prefix,
                                                                        sys.base_prefix))
    env = {**os.environ, "PYTHONPATH": str(SRC), "JUPYTER_PATH": os.pathsep.join(shares),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}  # nothing of the user's touched
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=t0ken",
         f"--ServerApp.root_dir={tmp_path}", f"--LabApp.workspaces_dir={tmp_path}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("w"))
    driver = chromium(window="1280,1000", logs=False)
    try:
        url = f"http://127.0.0.1:{port}/lab/tree/explore.ipynb?token=t0ken"
        _until(lambda: _up(port) or server.poll() is not None, 90, "the server")
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
        driver.get(url)
        _until(lambda: driver.find_elements(By.CSS_SELECTOR, ".jp-Cell .cm-content"), 120,
               "the notebook's cell")
        _until(lambda: "Idle" in driver.find_element(By.TAG_NAME, "body").text, 120,
               "the kernel")
        time.sleep(2)  # the notebook settles (its cells are rendered again once)
        driver.find_element(By.CSS_SELECTOR, ".jp-Cell .cm-content").click()
        ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT) \
            .perform()  # run the cell
        _until(lambda: driver.find_elements(By.ID, "af-main"), 180, "the widget's canvas")
        ink = driver.execute_script(
            "const c = document.getElementById('af-main');"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let k = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 200) k++; return k;")
        assert ink > 300
        driver.execute_script("const s = document.getElementById('af-slider'); s.value = 6;"
                              "s.dispatchEvent(new Event('input'));")
        _until(lambda: frame_file.exists() and frame_file.read_text() == "6", 60,
               "the kernel's frame to follow the slider")
        assert driver.find_element(By.ID, "af-time").text == "3"
    finally:
        driver.quit()
        server.terminate()
        server.wait(30)


def _up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
