"""``Finding.metrics``: every finding names the series its detector looked at, so a face can draw them
without knowing each detector's ``data`` keys (the dashboard used to dig them out of those)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klwatch.findings import DETECTORS
from klwatch.model import Finding
from klwatch.pipeline import scan
from klwatch.report import to_dict

SAMPLE_RUNS = Path(__file__).resolve().parents[2] / "sample_runs"


@pytest.fixture(scope="module")
def sample_scan():
    return scan([str(SAMPLE_RUNS)])


def test_every_finding_detector_names_the_series_it_looked_at_and_the_run_logs_them(sample_scan) -> None:
    seen: set[str] = set()
    for r in sample_scan.results:
        logged = set(r.lineage.metric_names())
        for f in r.findings:
            if f.detector not in DETECTORS:  # kl_metric: the reset detector's note, not a finding detector's
                continue
            seen.add(f.detector)
            assert f.metrics, f
            assert isinstance(f.metrics, tuple) and len(set(f.metrics)) == len(f.metrics)
            assert set(f.metrics) <= logged, (f.detector, f.metrics)
    assert seen >= {"lr_schedule_restart", "optimizer_state_lost", "data_order_restart", "kl_coef_reset",
                    "kl_ratchet", "lost_steps"}


def test_the_series_cited_are_what_the_detector_judged(sample_scan) -> None:
    for r in sample_scan.results:
        for f in r.findings:
            if f.detector == "lr_schedule_restart":
                assert f.metrics == (f.data["metric"],)
            elif f.detector in ("kl_ratchet", "lost_steps"):
                assert f.metrics == (r.metric,)


def test_the_json_finding_lists_its_metrics_and_defaults_to_none() -> None:
    assert Finding("x", None, "info", "m").metrics == ()
    # the report's other finding keys keep their meaning; ``metrics`` is added
    report = to_dict(scan([str(SAMPLE_RUNS / "trl")]))
    for lin in report["lineages"]:
        for f in lin["findings"]:
            assert set(f) == {"detector", "step", "severity", "message", "metrics"}
            assert all(isinstance(m, str) for m in f["metrics"])
