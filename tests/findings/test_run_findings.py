from __future__ import annotations

import importlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from finding_helpers import BUGGY_REFERENCE, FAULTS, HEALTHY, SCENARIOS, alarms, odd_processes, odd_results

from klwatch.findings import DETECTORS, run_findings
from klwatch.findings.base import FindingDetector
from klwatch.model import Finding, LineageResult
from klwatch.report import lineage_dict


def test_every_detector_is_registered_under_the_name_of_its_module():
    assert set(DETECTORS) == {"lr_schedule_restart", "optimizer_state_lost", "data_order_restart", "kl_coef_reset",
                              "lost_steps", "suspected_restart", "kl_ratchet", "training_guard"}
    for name, cls in DETECTORS.items():
        assert cls.name == name
        assert importlib.import_module(f"klwatch.findings.{name}").__dict__[cls.__name__] is cls
        assert cls.__module__ == f"klwatch.findings.{name}" and (cls.__doc__ or importlib.import_module(cls.__module__).__doc__)


def test_detection_table_on_the_generated_runs(sample):
    """Each planted fault is found by its own detector and by no other; the healthy runs and the
    reference-reset runs raise no alarm (info summaries aside)."""
    table = {name: alarms(sample(name)) for name in SCENARIOS}
    expected = {name: set() for name in HEALTHY + BUGGY_REFERENCE}
    expected.update({name: {det} for name, det in FAULTS.items()})
    assert table == expected


def test_findings_reach_the_json_report(sample):
    result = sample("data-restart")
    doc = json.loads(json.dumps(lineage_dict(result)))
    [f] = [f for f in doc["findings"] if f["detector"] == "data_order_restart"]
    assert f["step"] == result.lineage.boundaries[0].step and f["severity"] == "error" and "consumed_samples" in f["message"]


class _Broken(FindingDetector[dict]):
    name = "broken"
    config_class = dict

    def detect(self, result: LineageResult) -> list[Finding]:
        raise RuntimeError("bad data")


def test_a_failing_detector_is_reported_and_the_others_still_run(sample, monkeypatch):
    result = sample("lr-restart")
    monkeypatch.setitem(DETECTORS, "broken", _Broken)
    found = run_findings(result)
    assert any(f.detector == "broken" and f.severity == "warning" and "bad data" in f.message for f in found)
    assert any(f.detector == "lr_schedule_restart" and f.severity == "error" for f in found)


def test_only_and_configs_select_and_tune_detectors(sample):
    from klwatch.findings import LrScheduleRestartConfig

    result = sample("lr-restart")
    assert [f.detector for f in run_findings(result, only=["lr_schedule_restart"])] == ["lr_schedule_restart"]
    assert run_findings(result, only=["lr_schedule_restart"],
                        configs={"lr_schedule_restart": LrScheduleRestartConfig(min_jump=10.0)}) == []
    with pytest.raises(ValueError, match="unknown finding detector"):
        run_findings(result, only=["no_such_detector"])


def test_finding_data_is_plain_json(sample):
    for name in SCENARIOS:
        for f in sample(name).findings:
            json.dumps(f.data, allow_nan=False)


_NAMES = ["train/lr", "actor/grad_norm", "train/loss", "consumed_samples", "train/epoch", "train/mean_prompt_length",
          "actor/kl_coef", "train/kl_penalty", "train/reward"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_processes(_NAMES))
def test_detectors_never_fail_on_odd_series(procs):
    for result in odd_results(procs):
        for f in run_findings(result):
            assert "failed" not in f.message, f.message
            json.dumps(f.data, allow_nan=False)