"""Findings everywhere a status is shown: the fleet table, its filter, the run header, the chart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from klwatch.dashboard import charts, data
from klwatch.pipeline import ScanConfig
from klwatch.reference_reset import ReferenceResetConfig
from klwatch.report import to_dict

from dashboard_runs import write_findings_fleet

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_findings_fleet(tmp_path_factory.mktemp("findings"))


def _fleet_with_findings(fleet_dir: Path) -> tuple[data.Fleet, dict[str, list]]:
    fleet = data.load_fleet([str(fleet_dir)], config=ScanConfig())
    found, pending = data.fleet_findings(fleet, config=ScanConfig(), wait=60)
    assert not pending
    return fleet, found


def test_an_lr_restart_run_is_shown_ok_with_findings_while_the_report_says_ok(fleet_dir: Path) -> None:
    fleet, found = _fleet_with_findings(fleet_dir)
    table = data.fleet_table(fleet, found).set_index("run")
    assert table.loc["grpo-lr-restart", "status"] == data.OK_WITH_FINDINGS
    assert table.loc["grpo-lr-restart", "findings"] == ["lr_schedule_restart"]
    assert table.loc["grpo-resume-fixed", "status"] == "ok" and table.loc["grpo-resume-fixed", "findings"] == []
    assert table.loc["grpo-resume-buggy", "status"] == "reference_reset"
    report = to_dict(data.load_fleet([str(fleet_dir)], config=ScanConfig(), findings=True).scan)
    assert {lin["name"]: lin["status"] for lin in report["lineages"]}["grpo-lr-restart"] == "ok"  # display status only


def test_fleet_findings_never_block_and_are_served_from_the_background_job(fleet_dir: Path) -> None:
    config = ScanConfig(reference_reset=ReferenceResetConfig(reset_score=0.96))  # a configuration no job has run for
    fleet = data.load_fleet([str(fleet_dir)], config=config)
    t = time.perf_counter()
    found, pending = data.fleet_findings(fleet, config=config)  # returns at once, done or not
    assert pending or len(found) == 4
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        found, pending = data.fleet_findings(fleet, config=config, wait=1.0)
    assert not pending and t > 0
    key = next(k for k, r in fleet.runs.items() if r.lineage.name == "grpo-lr-restart")
    assert [f.detector for f in found[key]] == ["lr_schedule_restart"]
    assert data.judged_run(fleet, key, config=config).findings == found[key]  # the job's result, not judged again


def test_the_finding_is_marked_at_its_step_on_the_panel_of_the_series_it_cites(fleet_dir: Path) -> None:
    fleet = data.load_fleet([str(fleet_dir)], config=ScanConfig())
    key = next(k for k, r in fleet.runs.items() if r.lineage.name == "grpo-lr-restart")
    result = data.judged_run(fleet, key, config=ScanConfig())
    (finding,) = result.findings
    assert data.finding_metrics(finding, result.lineage) == ["train/lr"]
    fig = charts.run_figure(result, linked=["train/loss", "train/lr"])
    (mark,) = [a for a in fig.layout.annotations if (a.text or "").startswith("◆")]
    assert mark.text == "◆ lr_schedule_restart" and mark.x == finding.step == 61
    assert mark.yref == "y3"  # the third panel: train/lr, where the schedule restarted
    assert mark.y == pytest.approx(float(result.lineage.pieces[1]["train/lr"].values[0]))
    (line,) = [s for s in fig.layout.shapes if s.type == "line" and s.yref == "y3 domain"]
    assert line.x0 == 61 and line.line.color == charts.FINDING_COLOR


def _run_until_findings(at: AppTest) -> AppTest:
    """Rerun the page until the background findings are in (the browser polls; AppTest does not)."""
    deadline = time.monotonic() + 60
    while "ok, with findings" not in set(at.dataframe(key="fleet_table").value["status"]):
        assert time.monotonic() < deadline, "findings never arrived"
        at.run()
    return at


def test_the_page_badges_filters_and_draws_what_a_finding_cites(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path) -> None:
    monkeypatch.setenv("KLWATCH_DASHBOARD_SOURCES", str(fleet_dir))
    at = _run_until_findings(AppTest.from_file(APP, default_timeout=120).run())
    assert not at.exception
    counts = [m.value for m in at.markdown if "-badge[" in m.value][0]
    assert ":violet-badge[ok, with findings: **1**]" in counts
    at.text_input(key="search").input("FIXED").run()  # the run search: any part of the name, any case
    assert list(at.dataframe(key="fleet_table").value["run"]) == ["grpo-resume-fixed"]
    assert at.query_params.get("q") in (["FIXED"], "FIXED")
    at.text_input(key="search").input("").run()
    at.multiselect(key="finding_filter").set_value(["lr_schedule_restart"]).run()
    table = at.dataframe(key="fleet_table").value
    assert list(table["run"]) == ["grpo-lr-restart"]
    assert at.query_params.get("finding") in (["lr_schedule_restart"], "lr_schedule_restart")
    key = table["key"][0]
    at.selectbox(key="run").set_value(key).run()
    (header,) = [h.value for h in at.header if "grpo" in h.value]
    assert header.startswith(":violet[:material/report:]")
    assert any(":red-badge[:material/report: lr\\_schedule\\_restart · step 61]" in m.value for m in at.markdown)
    assert at.multiselect(key=f"linked::{key}").value[0] == "train/lr"  # the cited series, drawn first
    spec = json.loads(at.get("plotly_chart")[-1].proto.spec)
    assert [a["text"] for a in spec["layout"]["annotations"] if a["text"].startswith("◆")] == ["◆ lr_schedule_restart"]


def test_findings_queued_for_a_threshold_left_behind_are_dropped(fleet_dir: Path) -> None:
    import threading

    gate = threading.Event()
    blocker = data._FINDINGS_POOL.submit(gate.wait, 30)  # hold the one worker: every job below stays queued
    try:
        old = ScanConfig(reference_reset=ReferenceResetConfig(reset_score=0.91))
        new = ScanConfig(reference_reset=ReferenceResetConfig(reset_score=0.92))
        data.fleet_findings(data.load_fleet([str(fleet_dir)], config=old), config=old)
        (queued,) = [j for k, j in data._jobs_started.items() if k[2] == data.config_key(old)]
        data.fleet_findings(data.load_fleet([str(fleet_dir)], config=new), config=new)
        assert queued.cancelled()
    finally:
        gate.set()
        blocker.result()
    fleet = data.load_fleet([str(fleet_dir)], config=old)
    found, pending = data.fleet_findings(fleet, config=old, wait=60)  # going back to it queues it again
    assert not pending and len(found) == 4
