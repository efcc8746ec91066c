"""End to end in a real headless Chromium: `klwatch dashboard` serves the page, a person finds the
flagged run in the fleet table, opens it and sees the KL chart with its resume markers.

Runs on ``sample_runs/`` when it holds a flagged run, else on a small fleet written to tmp. Set
``KLWATCH_SCREENSHOT=FILE`` to also save the run view there as a PNG.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from chromium import ARGS, CHROMIUM, WAIT_MS, fleet_rows, needs_chromium, run_chart, settled, tick_run, url_showing
from dashboard_runs import write_fleet
from dashboard_server import REPO, running_dashboard

pytestmark = needs_chromium


def _sources(tmp_path: Path) -> list[str]:
    """The repository's sample runs when their logs are there (folders beside the generator), else a tmp fleet."""
    sample = REPO / "sample_runs"
    if sample.is_dir() and any(p.is_dir() and not p.name.startswith(("_", ".")) for p in sample.iterdir()):
        return [str(sample)]
    return [str(write_fleet(tmp_path / "runs"))]


_settled = settled


def _open_run(page, name: str) -> list[str]:
    """Wait until the run view shows ``name`` and plotly has drawn its chart, alone; its boundary labels."""
    page.locator(".st-key-run_view h2", has_text=name).wait_for(timeout=WAIT_MS)
    chart = run_chart(page, name)
    texts = [t.strip() for t in chart.locator("g.annotation text").all_text_contents()]
    return [t for t in texts if MARKER.fullmatch(t)]


MARKER = re.compile(r"(RESET|ok|intentional|\?) [01]\.\d\d")


def test_flagged_run_opens_from_the_fleet_table_with_its_resume_markers(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    sources = _sources(tmp_path)
    with running_dashboard(sources, log=tmp_path / "dashboard.log", timeout=60) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1200}, accept_downloads=True)
            page.goto(url, timeout=WAIT_MS)
            page.locator("[data-testid=stDataFrame] table[role=grid]").first.wait_for(state="attached", timeout=WAIT_MS)
            _settled(page)
            rows = fleet_rows(page)  # the rows in view (the grid renders only those)
            flagged = [i for i, r in enumerate(rows) if r.get("status") == "reference_reset"]
            assert flagged, f"no flagged run in the fleet table: {rows}"
            others = [i for i, r in enumerate(rows) if r.get("status") != "reference_reset"] or flagged[1:]
            assert others, f"only one run in view: {rows}"

            # open another run first (a healthy one if one is in view), so the flagged one truly opens
            other = rows[others[0]]
            tick_run(page, others[0])
            other_markers = _open_run(page, other["run"])
            url_showing(page, r"[?&]run=")
            assert any(m.startswith("RESET") for m in other_markers) == (other["status"] == "reference_reset"), other_markers

            # then the flagged one, from the same table: its chart carries a RESET label at the resume
            bad_name = rows[flagged[0]]["run"]
            tick_run(page, flagged[0])
            markers = _open_run(page, bad_name)
            resets = [m for m in markers if m.startswith("RESET")]
            assert resets, markers
            assert len(markers) == int(rows[flagged[0]]["resumes"])  # one label per resume boundary
            assert page.locator(".st-key-run_chart g.shapelayer path").count() >= len(markers)

            # the JSON report downloads from the page, with the flagged run flagged
            with page.expect_download(timeout=WAIT_MS) as download:
                page.get_by_role("button", name="Download JSON report").click()
            report = json.loads(Path(download.value.path()).read_text())
            assert report["schema"] == "klwatch.report/1"
            assert bad_name in {lin["name"] for lin in report["lineages"] if lin["status"] == "reference_reset"}

            # the link is the view: opening the URL again shows the same run
            link = page.url
            page.goto(link, timeout=WAIT_MS)
            _open_run(page, bad_name)

            # an instant scroll is done when it returns: nothing to wait for before the picture
            page.evaluate("() => document.querySelector('.st-key-run_view h2')"
                          ".scrollIntoView({block: 'start', behavior: 'instant'})")
            shot = tmp_path / "run-view.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 20_000
            if os.environ.get("KLWATCH_SCREENSHOT"):
                target = Path(os.environ["KLWATCH_SCREENSHOT"])
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, target)
        finally:
            browser.close()
