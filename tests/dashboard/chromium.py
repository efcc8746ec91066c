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


def url_showing(page, pattern: str) -> str:
    """The page's URL once its query matches the regular expression ``pattern``: the dashboard writes the
    open run into the URL at the end of the run that drew it, after the chart a test may have waited for."""
    page.wait_for_function("(p) => new RegExp(p).test(location.search)", arg=pattern, timeout=WAIT_MS)
    return page.url


_GRID_SNAPSHOT = """() => {
  const grid = document.querySelector('[data-testid=stDataFrame] table[role=grid]');
  if (!grid) return null;
  const text = (c) => c.innerText.trim();
  const header = [...grid.querySelectorAll('thead th')].map(text);
  const rows = [...grid.querySelectorAll('tbody tr')].map((tr) => [...tr.querySelectorAll('td')].map(text));
  return {header, rows};
}"""


def _whole_grid(snapshot: dict | None) -> list[dict[str, str]] | None:
    """The rows of one snapshot of the grid, or None when it was caught half-drawn (no header yet, or a
    row with fewer cells than the header: Streamlit redraws the grid in place)."""
    if not snapshot or not snapshot["header"]:
        return None
    header = snapshot["header"]
    if any(len(cells) != len(header) for cells in snapshot["rows"]):
        return None
    return [dict(zip(header, cells)) for cells in snapshot["rows"]]


def fleet_rows(page) -> list[dict[str, str]]:
    """The fleet table as its accessible grid holds it (the visible grid is a canvas), read in one
    step inside the page so a redraw cannot mix two renderings; a half-drawn grid is read again once
    the page has settled, within the deadline."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        settled(page)
        rows = _whole_grid(page.evaluate(_GRID_SNAPSHOT))
        if rows is not None:
            return rows
        assert time.monotonic() < deadline, "the fleet grid never finished drawing"
        page.wait_for_timeout(250)  # a poll interval while the grid redraws


def fleet_rows_when(page, ready, what: str) -> list[dict[str, str]]:
    """The table rows once ``ready(rows)`` holds (findings arrive from the background, the page may
    still be redrawing), within the deadline."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
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
    """The run chart once it is drawn for ``name`` and is the only chart in its place: while a script run
    is on (or just over, on a busy machine) Streamlit may still show the previous run's chart beside the
    new one. Times out when a second chart stays."""
    page.wait_for_function("(name) => { const plots = document.querySelectorAll('.st-key-run_chart .js-plotly-plot');"
                           " const title = plots.length === 1 && plots[0].querySelector('.gtitle');"
                           " return !!title && title.textContent.startsWith(name + ':'); }", arg=name, timeout=WAIT_MS)
    settled(page)
    return page.locator(".st-key-run_chart .js-plotly-plot")


def points_per_panel(page) -> dict[str, int]:
    """The points plotly drew in the run chart, per panel (its full data: the typed arrays decoded)."""
    return page.evaluate("() => { const gd = document.querySelector('.st-key-run_chart .js-plotly-plot');"
                         " const n = {}; for (const t of gd._fullData) { if (!t.yaxis || !t.x) continue;"
                         " n[t.yaxis] = (n[t.yaxis] || 0) + t.x.length; } return n; }")
