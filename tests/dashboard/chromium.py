"""The real headless Chromium the browser tests drive (Debian's, through Playwright), waiting for a
Streamlit page to settle, and reading and clicking the dashboard's fleet grid and run chart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 90_000  # generous: the CI machine may be busy; a normal run takes well under a minute in all

needs_chromium = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (scripts/setup.sh --test installs it)"),
]


@contextmanager
def fleet_page(url: str, *, timeout: int = WAIT_MS) -> Iterator:
    """A real headless Chromium on the dashboard at URL, once its fleet grid is there: the page (the
    browser is ``page.context.browser``), closed afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(url, timeout=timeout)
            page.locator("[data-testid=stDataFrame] table[role=grid]").first.wait_for(state="attached", timeout=timeout)
            yield page
        finally:
            browser.close()


def settled(page) -> None:
    """Wait until the script run is over (Streamlit shows its 'running' widget meanwhile). Called once
    the page shows what the run drew, so the run has started; no fixed pause is needed."""
    page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=WAIT_MS)


def fleet_rows(page) -> list[dict[str, str]]:
    """The fleet table as its accessible grid holds it (the visible grid is a canvas)."""
    grid = page.locator("[data-testid=stDataFrame]").first.locator("table[role=grid]")
    header = [c.inner_text().strip() for c in grid.locator("th").all()]
    return [dict(zip(header, [c.inner_text().strip() for c in tr.locator("td").all()]))
            for tr in grid.locator("tbody tr").all()]


def fleet_rows_when(page, ready, what: str) -> list[dict[str, str]]:
    """The table rows once ``ready(rows)`` holds (findings arrive from the background, the page may
    still be redrawing), within the deadline."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        settled(page)
        rows = fleet_rows(page)
        if ready(rows):
            return rows
        assert time.monotonic() < deadline, f"{what}: {rows}"
        page.wait_for_timeout(250)  # a poll interval while the page redraws, not a fixed pause before an assertion


def _grid_click(page, index: int, x: int) -> None:
    """Click row ``index`` of the grid's canvas ``x`` px from its left (header and rows are 35 px tall)."""
    box = page.locator("[data-testid=stDataFrame]").first.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + x, box["y"] + 35 + 35 * index + 17)


def click_run_name(page, index: int) -> None:
    """Click the run's name cell (not its selection box): the whole row opens the run."""
    _grid_click(page, index, 140)


def tick_run(page, index: int) -> None:
    """Tick the row's selection box."""
    _grid_click(page, index, 18)


def run_chart(page, name: str):
    """The run chart once it is drawn for ``name``."""
    page.wait_for_function("(name) => [...document.querySelectorAll('.st-key-run_chart .gtitle')]"
                           ".some(t => t.textContent.startsWith(name + ':'))", arg=name, timeout=WAIT_MS)
    settled(page)
    return page.locator(".st-key-run_chart .js-plotly-plot")


def points_per_panel(page) -> dict[str, int]:
    """The points plotly drew in the run chart, per panel (its full data: the typed arrays decoded)."""
    return page.evaluate("() => { const gd = document.querySelector('.st-key-run_chart .js-plotly-plot');"
                         " const n = {}; for (const t of gd._fullData) { if (!t.yaxis || !t.x) continue;"
                         " n[t.yaxis] = (n[t.yaxis] || 0) + t.x.length; } return n; }")
