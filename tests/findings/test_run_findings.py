from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from finding_helpers import BUGGY_REFERENCE, FAULTS, HEALTHY, SCENARIOS, alarms

from detectors.findings import DETECTORS, run_findings
from detectors.findings.base import FindingDetector
from detectors.model import Finding, LineageResult, Segment, Series
from detectors.pipeline import ScanConfig, build_lineages
from detectors.report import lineage_dict


def test_every_detector_is_registered_under_the_name_of_its_module():
    assert set(DETECTORS) == {"lr_schedule_restart", "optimizer_state_lost", "data_order_restart", "kl_coef_reset",
                              "lost_steps", "suspected_restart", "kl_ratchet"}
    for name, cls in DETECTORS.items():
        assert cls.name == name
        assert importlib.import_module(f"detectors.findings.{name}").__dict__[cls.__name__] is cls
        assert cls.__module__ == f"detectors.findings.{name}" and (cls.__doc__ or importlib.import_module(cls.__module__).__doc__)


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
    from detectors.findings import LrScheduleRestartConfig

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


@st.composite
def odd_processes(draw):
    """1-4 processes of any length (0 included), steps that repeat or go back, values with NaN, inf,
    zeros, negatives and constants."""
    procs = []
    start = 1
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 30))
        first = draw(st.integers(max(1, start - 10), start + 10))
        steps = sorted(draw(st.lists(st.integers(first, first + 60), min_size=n, max_size=n)))
        start = (steps[-1] + 1) if steps else start
        proc = {}
        for name in draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=4, unique=True)):
            vals = draw(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                                           st.just(0.0), st.just(1.0)), min_size=n, max_size=n))
            proc[name] = Series(np.array(steps, dtype=np.int64), np.array(vals, dtype=float),
                                1.7e9 + np.arange(n, dtype=float) + 1e4 * len(procs))
        procs.append(proc)
    return procs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_processes())
def test_detectors_never_fail_on_odd_series(procs):
    segs = [Segment(kind="wandb-offline", ref=f"r{k}", source="odd", run_id=f"r{k}", name="odd", group="odd",
                    series=p, store="odd") for k, p in enumerate(procs)]
    cfg = ScanConfig(findings=False)
    for lineage in build_lineages(segs, config=cfg):
        for f in run_findings(LineageResult(lineage, lineage.kl_metric, "ok")):
            assert "failed" not in f.message, f.message
            json.dumps(f.data, allow_nan=False)
