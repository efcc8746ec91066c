"""Issue 15 part 3 in a real headless Chromium: a run whose post-resume event file is corrupt (unreadable)
is one row of the fleet marked incomplete (not a healthy-looking run beside an error row), the
"Only incomplete" filter keeps it alone, and its header names the file and why."""

from __future__ import annotations

from pathlib import Path

from chromium import WAIT_MS, click_run_name, fleet_page, fleet_rows_when, needs_chromium, settled
from dashboard_runs import write_run
from dashboard_server import running_dashboard

pytestmark = needs_chromium


def write_corrupt_fleet(root: Path) -> tuple[Path, str]:
    """A healthy resumed run and one whose post-resume event file has a byte of its first record flipped
    (no good record opens it, so the file cannot be read); the corrupt file's ref."""
    write_run(root, name="grpo-healthy", resumes=[61], buggy=False, seed=2)
    folder = write_run(root, name="grpo-corrupt", resumes=[61], buggy=False, seed=3)
    (post,) = folder.glob("events.out.tfevents.*.launch1")
    data = bytearray(post.read_bytes())
    data[9] ^= 0xFF  # the first record's length header: nothing of the file is read
    post.write_bytes(bytes(data))
    return root, f"grpo-corrupt/{post.name}"


def test_a_run_with_a_corrupt_post_resume_file_is_marked_incomplete_in_fleet_and_header(tmp_path: Path) -> None:
    fleet, bad_ref = write_corrupt_fleet(tmp_path / "runs")
    with running_dashboard([str(fleet)], log=tmp_path / "dashboard.log") as url, fleet_page(url) as page:
        rows = fleet_rows_when(page, lambda rs: len(rs) == 2, "the fleet never showed the two runs")
        by_name = {r["run"]: (i, r) for i, r in enumerate(rows)}
        assert set(by_name) == {"grpo-healthy", "grpo-corrupt"}  # no separate error row
        assert by_name["grpo-corrupt"][1]["incomplete"].startswith("⚠ incomplete")
        assert by_name["grpo-healthy"][1]["incomplete"] in ("", "-")
        assert "incomplete: 1" in page.locator("[data-testid=stMarkdown]", has_text="incomplete:").first.inner_text()

        click_run_name(page, by_name["grpo-corrupt"][0])
        page.locator(".st-key-run_view h2", has_text="grpo-corrupt").wait_for(timeout=WAIT_MS)
        box = page.locator(".st-key-run_incomplete")
        box.wait_for(timeout=WAIT_MS)
        settled(page)
        text = box.inner_text()
        assert "Incomplete run" in text and bad_ref in text and "corrupt event file" in text, text
        assert "incomplete" in page.locator(".st-key-run_view").inner_text()

        # the filter state, from a link: only the incomplete run is listed
        page.goto(f"{url}/?incomplete=1", timeout=WAIT_MS)
        rows = fleet_rows_when(page, lambda rs: [r["run"] for r in rs] == ["grpo-corrupt"],
                          "Only incomplete did not keep the corrupt run alone")
