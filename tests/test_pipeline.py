"""The pipeline: read -> stitch -> cut -> judge, orchestrated once for every face."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from klwatch.findings import LrScheduleRestartConfig
from klwatch.model import Segment, Series, SourceRead
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage, judge_reads, matches_pattern, read_sources, scan
from synthetic import KLRun, segments_for

SAMPLES = Path(__file__).resolve().parents[1] / "sample_runs"


def _segments(*, buggy: bool, name: str = "run", seed: int = 0, metric: str = "train/kl_penalty") -> list[Segment]:
    run = KLRun(amplitude=0.05, tau=10.0, noise=0.08, every=1, resumes=[50], buggy=[buggy], last_step=90)
    return segments_for(run, np.random.default_rng(seed), name=name, metric=metric)


def test_read_sources_keeps_each_pattern_and_gives_the_read_its_whole_spec():
    seen: list[str] = []
    reads = read_sources(["a/#grpo-*", "b/"], read=lambda base: SourceRead(spec=base), progress=seen.append)
    assert [(r.spec, p) for r, p in reads] == [("a/#grpo-*", "grpo-*"), ("b/", None)]
    assert seen == ["a/#grpo-*", "b/"]


def test_judge_reads_leaves_the_reads_alone_and_reports_a_pattern_that_keeps_no_run():
    read = SourceRead(spec="store#nothing-*", segments=_segments(buggy=True), kinds=["wandb-offline"])
    before = copy.deepcopy(read.errors)
    result = judge_reads([(read, "nothing-*")], config=ScanConfig())
    assert read.errors == before  # the caller's (cached) read is not touched
    assert result.results == []
    said = "store#nothing-*: no training run matches #nothing-* (a glob on the run's name or id; runs there: run)"
    assert result.sources[0].errors == [] and result.unreadable == []  # bad usage (exit 2), not a read failure
    assert result.sources[0].unmatched == said and result.unmatched == [said]


def test_a_matching_pattern_keeps_the_run_and_judges_it():
    read = SourceRead(spec="store", segments=_segments(buggy=True, name="grpo-a"), kinds=["wandb-offline"])
    result = judge_reads([(read, "grpo-*")], config=ScanConfig())
    [r] = result.results
    assert r.lineage.name == "grpo-a" and r.status == "reference_reset"
    assert matches_pattern("grpo-*", r.lineage) and not matches_pattern("ppo-*", r.lineage)


def test_two_launches_of_one_run_become_one_lineage_with_a_boundary_at_the_resume():
    [lin] = build_lineages(_segments(buggy=False), config=ScanConfig())
    assert len(lin.segments) == 2 and len(lin.pieces) == 2
    [b] = lin.boundaries
    assert b.step == 51 and lin.kl_metric == "train/kl_penalty" and not lin.kl_negated


def test_a_kl_logged_negated_is_marked_once_on_its_lineage():
    segs = _segments(buggy=True, metric="ppo_actor/kl_rewards/avg")
    for s in segs:
        for ser in s.series.values():
            ser.values = -ser.values
    [lin] = build_lineages(segs, config=ScanConfig())
    assert lin.kl_negated
    assert all(np.all(k.values >= 0) for k in lin.kl_pieces() if k is not None)
    assert judge_lineage(lin, config=ScanConfig()).status == "reference_reset"


def test_the_framework_global_step_is_the_axis_when_the_tracker_restarts_its_own():
    """W&B's ``_step`` starts again in every launch; ``train/global_step`` goes on."""
    segs = _segments(buggy=False)
    for s in segs:
        kl = s.series["train/kl_penalty"]
        tracker = np.arange(len(kl))
        s.series = {"train/kl_penalty": Series(tracker, kl.values, kl.wall_times),
                    "train/global_step": Series(tracker, kl.steps.astype(float), kl.wall_times)}
    [lin] = build_lineages(segs, config=ScanConfig())
    assert lin.step_axis == "train/global_step"
    assert [b.step for b in lin.boundaries] == [51]


def test_findings_run_after_the_verdict_and_their_configs_come_from_the_scan_config():
    source = str(SAMPLES / "tensorboard" / "lr-restart")
    [default] = scan([source]).results
    assert any(f.detector == "lr_schedule_restart" for f in default.findings)
    blind = ScanConfig(finding_configs=(("lr_schedule_restart", LrScheduleRestartConfig(min_jump=1e9)),))
    [tuned] = scan([source], config=blind).results
    assert not any(f.detector == "lr_schedule_restart" for f in tuned.findings)
    assert [v.verdict for v in tuned.verdicts] == [v.verdict for v in default.verdicts]
    [none] = scan([source], config=ScanConfig(findings=False)).results
    assert none.findings == []


def test_an_unknown_finding_detector_in_the_config_is_refused_by_name():
    with pytest.raises(ValueError, match="no_such_detector"):
        ScanConfig(finding_configs=(("no_such_detector", LrScheduleRestartConfig()),))


@pytest.mark.parametrize("buggy", [True, False])
def test_scan_gives_the_verdict_the_detector_gives(buggy):
    read = SourceRead(spec="store", segments=_segments(buggy=buggy), kinds=["wandb-offline"])
    [r] = judge_reads([(read, None)], config=ScanConfig()).results
    assert r.status == ("reference_reset" if buggy else "ok")
    assert [v.boundary.step for v in r.verdicts] == [51]
