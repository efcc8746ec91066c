"""A run judged on part of its logs, as the dashboard's data layer and page show it: marked in the fleet
table (with the core's reasons, scrubbed), filtered by "Only incomplete" from the URL, and its reasons
named under the run's header, escaped like every text from a source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from klwatch.dashboard import data
from klwatch.pipeline import ScanConfig, scan

from dashboard_runs import write_run

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
ODD_NAME = "grpo*[x](javascript:y)"
"""A run folder named with markdown a page must show as text, not as a link or emphasis."""


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A healthy resumed run, and one (oddly named) whose post-resume event file is corrupt (unreadable)."""
    root = tmp_path_factory.mktemp("incomplete")
    write_run(root, name="grpo-healthy", resumes=[61], buggy=False, seed=2)
    folder = write_run(root, name=ODD_NAME, resumes=[61], buggy=False, seed=3)
    (post,) = folder.glob("events.out.tfevents.*.launch1")
    raw = bytearray(post.read_bytes())
    raw[9] ^= 0xFF  # the first record's length header: nothing of the file is read
    post.write_bytes(bytes(raw))
    return root


def _app(monkeypatch: pytest.MonkeyPatch, source: Path, **query: str) -> AppTest:
    monkeypatch.setenv("KLWATCH_DASHBOARD_SOURCES", str(source))
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def test_the_fleet_table_marks_the_incomplete_run_and_says_why(fleet_dir: Path) -> None:
    table = data.fleet_table(data.load_fleet([str(fleet_dir)], config=ScanConfig())).set_index("run")
    assert list(table.index).count(ODD_NAME) == 1 and len(table) == 2  # the unreadable file is no row of its own
    assert table.loc[ODD_NAME, "incomplete"] == f"{data.INCOMPLETE_MARK} (1 file)"
    assert table.loc["grpo-healthy", "incomplete"] == ""
    why = table.loc[ODD_NAME, "why incomplete"]
    assert why.startswith(f"unreadable: {ODD_NAME}/events.out.tfevents.") and "corrupt event file" in why


def test_only_incomplete_from_the_url_keeps_the_incomplete_run(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path) -> None:
    at = _app(monkeypatch, fleet_dir, incomplete="1")
    assert not at.exception
    assert list(at.dataframe(key="fleet_table").value["run"]) == [ODD_NAME]
    assert any("incomplete: **1**" in m.value for m in at.markdown)


def test_the_run_header_names_each_reason_escaped(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path) -> None:
    run = next(r for r in scan([str(fleet_dir)]).results if r.lineage.name == ODD_NAME)
    at = _app(monkeypatch, fleet_dir, run=run.lineage.id)
    assert not at.exception
    (box,) = [w for w in at.warning if "Incomplete run" in w.value]
    assert "corrupt event file" in box.value
    assert "\\[x\\]" in box.value and "[x](javascript:" not in box.value  # escaped: text, never a link
    assert re.sub(r"\\(.)", r"\1", box.value).count("unreadable: grpo*[x](javascript:") == 1
    assert not [e for e in at.error if "corrupt event file" in e.value]  # said once, as a reason
