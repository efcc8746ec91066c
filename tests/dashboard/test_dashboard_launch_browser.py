"""Issue 25, 5: the dashboard draws its fleet, and a viewer's browser fetches nothing from anywhere but the
dashboard, whatever folder it is started from: the parent of a clone named ``klwatch/`` (the clone shadowed the
installed package: ``ImportError: cannot import name '__version__' from 'klwatch' (unknown location)`` on the
page) and outside the repository with the README's other launch line (Streamlit's usage statistics were on
there: the browser fetched ``data.streamlit.io/metrics.json``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chromium import ARGS, CHROMIUM, WAIT_MS, needs_chromium, settled
from dashboard_runs import write_fleet
from dashboard_server import running_dashboard, running_streamlit

pytestmark = needs_chromium


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """A folder holding a clone named ``klwatch/`` (no ``__init__.py`` at its top: a namespace package to Python)
    and the runs to show."""
    (tmp_path / "klwatch" / "detectors").mkdir(parents=True)
    (tmp_path / "klwatch" / "README.md").write_text("the clone\n")
    write_fleet(tmp_path / "runs")
    return tmp_path


def _fleet_drawn_and_nothing_fetched_elsewhere(url: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page()
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, timeout=WAIT_MS)
            page.locator("[data-testid=stDataFrame] table[role=grid]").first.wait_for(state="attached",
                                                                                      timeout=WAIT_MS)
            settled(page)
            body = page.inner_text("body")
            assert "ImportError" not in body and "grpo-resume-buggy" in page.content()
            own = (url.rstrip("/"), "data:", "blob:", "about:")
            assert [u for u in requests if not u.startswith(own)] == []
        finally:
            browser.close()


def test_klwatch_dashboard_started_beside_a_clone_named_klwatch_draws_its_fleet(parent: Path) -> None:
    console = Path(sys.executable).parent / "klwatch"  # what the user runs: klwatch/.venv/bin/klwatch
    with running_dashboard([str(parent / "runs")], log=parent / "dashboard.log", klwatch=[str(console)],
                           cwd=parent) as url:
        _fleet_drawn_and_nothing_fetched_elsewhere(url)


def test_streamlit_run_from_outside_the_repository_fetches_nothing_but_the_dashboard(parent: Path) -> None:
    # the README's other launch line with no option of ours: the app's own .streamlit/config.toml applies
    with running_streamlit([str(parent / "runs")], log=parent / "streamlit.log", cwd=parent) as (url, _):
        _fleet_drawn_and_nothing_fetched_elsewhere(url)
