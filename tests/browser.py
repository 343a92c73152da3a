"""Pages as headless Chromium renders them: the MLflow UI's pages of a run and the docs site's
(`python -m docs.screenshots [--site]`), and the real-server test that takes them where a browser is installed.

Chromium from Debian (`apt-get install chromium`), driven by Playwright's Python package (`pip
install -e '.[docs]'`, no browser download: it starts the system's Chromium).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# As the machine's own check starts it: without the background-networking flags Chromium keeps
# trying hosts this closed network refuses.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def missing() -> str | None:
    """Why no screenshot can be taken here (None: Chromium and Playwright are installed)."""
    if not shutil.which(CHROMIUM):
        return f"no browser at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "no Playwright (pip install -e '.[docs]')"
    return None


def run_pages(base: str, experiment_id: str, run_id: str, folder: Path) -> dict[str, str]:
    """Screenshots of a run's Overview and System Metrics tabs and of its experiment's Models tab,
    `<page>.png` in `folder`; returns each page's visible text, for a test to read."""
    run = f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
    pages = {  # page -> (url, what shows it has loaded its figures)
        "system-metrics": (f"{run}/system-metrics", ".js-plotly-plot"),
        "overview": (run, "text=Registered models"),
        "models": (f"{base}/#/experiments/{experiment_id}/models", "text=epoch-"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    with chromium_page(1600, 1000) as page:
        page.goto(run)
        page.get_by_text("Model training", exact=True).click()  # the UI's classic-ML mode, not GenAI's
        page.get_by_role("button", name="Close").click()  # the assistant's side panel
        for name, (url, loaded) in pages.items():
            page.goto(url)
            page.wait_for_selector(loaded, timeout=60_000)
            page.wait_for_timeout(2000)  # the charts' last fetches and drawing
            page.screenshot(path=str(folder / f"{name}.png"))
            texts[name] = page.inner_text("body")
    return texts


def site_pages(site: Path, folder: Path) -> dict[str, str]:
    """Screenshots of a built docs site's home and API reference pages (`site-home.png`, `site-api.png`
    in `folder`), opened from disk; returns each page's visible text."""
    pages = {"site-home": site / "index.html", "site-api": site / "api" / "index.html"}
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    with chromium_page(1400, 900) as page:
        for name, path in pages.items():
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("h1", timeout=60_000)
            page.screenshot(path=str(folder / f"{name}.png"))
            texts[name] = page.inner_text("body")
    return texts


@contextlib.contextmanager
def chromium_page(width: int, height: int) -> Iterator[Any]:
    """A page of the system's headless Chromium, driven by Playwright; the browser closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
