"""Headless Chromium for the browser tests (Debian's `chromium` and `chromium-driver`,
installed by .ci/run): its paths, a skip mark when it is missing, and a driver."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
DRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                    reason="headless Chromium and chromedriver not installed")


def chromium(window: str = "1280,900", logs: bool = True) -> Any:
    """A headless Chromium driver (its browser console kept with `logs`); quit it after use."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--window-size={window}"):
        options.add_argument(arg)
    if logs:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(60)
    return driver
