"""report.html in headless Chromium: no console errors, every plot decoded, the first screen not blank.

Needs the Debian packages chromium and chromium-driver (`make browser`, part of `make test`, installs
them) and selenium (test extra). Never skipped: without the binaries the test fails and says what to install.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")



@pytest.fixture()
def browser(tmp_path: Path):
    if not (CHROMIUM and DRIVER):
        pytest.fail("chromium / chromedriver not installed: run `make browser` "
                    "(apt-get install chromium chromium-driver)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def test_report_renders_in_chromium(bench_run, browser) -> None:
    from PIL import Image

    report = bench_run.out / "report.html"
    html = report.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained
    browser.get(report.as_uri())
    assert browser.title == "lookahead benchmark report"
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight]);")
    assert len(images) == 6
    for alt, complete, w, h in images:
        assert complete and w > 200 and h > 100, alt
    first = browser.execute_script(
        "const v = document.querySelector('.verdict'); const r = v.getBoundingClientRect();"
        "return [v.innerText, r.top, window.innerHeight];")
    assert first[0].startswith("Verdict:") and first[1] < first[2]  # the verdict is on the first screen
    severe = [e for e in browser.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]
    assert severe == [], severe
    shot = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L")
    lo, hi = shot.getextrema()
    assert hi - lo > 100  # text and plots, not a blank page
    hist = shot.histogram()
    assert max(hist) < 0.97 * sum(hist)  # no single shade covers the whole screen
    browser.execute_script("document.images[0].scrollIntoView();")
    plot = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L")
    assert sum(1 for c in plot.histogram() if c) > 20  # a rendered figure has many shades
