"""Declared reference updates, read as each framework means them (SPEC "Metrics": a declared reset is
``intentional``): TRL's switch, period and mixing weight; klwatch's own keys; SPEC's interval names."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.declarations import explain_boundary, reference_schedules, touched_steps
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage
from synthetic import KLRun, segments_for

TRL_DEFAULTS = {"sync_ref_model": False, "ref_model_sync_steps": 512, "ref_model_mixup_alpha": 0.6, "beta": 0.04}


@pytest.mark.parametrize("config", [
    TRL_DEFAULTS,
    {"ref_model_sync_steps": 512},
    {"ref_model_mixup_alpha": 1.0, "ref_model_sync_steps": 10},
    {"my_ref_sync_flag": True},
    {"ref_sync_every": 10, "reference_refresh": True},
    {"sync_ref_model": "False", "ref_model_sync_steps": "64"},  # MLflow params are strings
    {"sync_ref_model": True, "ref_model_sync_steps": 64, "beta": 0.0},  # no reference at all
    {"reference_reset_interval": 0},
    {"ref_update_interval": "none"},
    {"lr": 1e-6, "kl_coef": 0.1},
])
def test_keys_that_only_look_like_a_declaration_declare_nothing(config):
    assert reference_schedules(config) == []


def test_trl_sync_is_read_with_its_period_and_mixing_weight_from_mlflow_strings():
    [s] = reference_schedules({"sync_ref_model": "True", "ref_model_sync_steps": "64", "ref_model_mixup_alpha": "0.6"})
    assert (s.source, s.period) == ("trl", 64) and s.alpha == pytest.approx(0.6) and not s.full
    assert "sync_ref_model=True" in s.describe()


def test_a_boundary_is_explained_only_when_the_schedule_touches_its_step():
    [s] = reference_schedules({"args": {"sync_ref_model": True, "ref_model_sync_steps": 10, "ref_model_mixup_alpha": 1.0}})
    assert explain_boundary([s], step=21, resumed_from=20, last_before=20) is not None  # sync after step 20
    assert explain_boundary([s], step=25, resumed_from=17, last_before=17) is not None  # 20 lies in 17..24
    assert explain_boundary([s], step=18, resumed_from=17, last_before=17) is None
    assert explain_boundary([s], step=13, resumed_from=None, last_before=12) is None


def test_klwatch_keys_declare_steps_offsets_and_resnapshots_at_resume():
    [s] = reference_schedules({"klwatch": {"reference_reset_interval": 25, "reference_reset_offset": 5}})
    assert s.touches(6, 29) is None and s.touches(6, 30) == 30  # updates after 5, 30, 55, ...
    [steps] = reference_schedules({"klwatch.reference_reset_steps": "100, 250"})
    assert steps.touches(90, 120) == 100 and steps.touches(101, 249) is None
    [resume] = reference_schedules({"klwatch.reference_reset_on_resume": "true"})
    assert explain_boundary([resume], step=41, resumed_from=40, last_before=40) is not None


def test_spec_interval_names_keep_their_meaning_as_a_period():
    [s] = reference_schedules({"loss_fn": {"reference_reset_interval": 50}})
    assert s.period == 50 and s.touches(50, 50) == 50
    [s] = reference_schedules({"ref_update_interval": "10"})
    assert s.period == 10


def test_touched_steps_are_the_steps_right_after_each_update():
    [s] = reference_schedules({"sync_ref_model": True, "ref_model_sync_steps": 10})
    assert touched_steps([s], lo=1, hi=35) == {11, 21, 31}


def _buggy_resume_at_50(config: dict, *, tau: float = 10, **scan) -> object:
    run = KLRun(amplitude=0.05, tau=tau, noise=0.1, every=1, resumes=[50], buggy=[True], last_step=90)
    segs = segments_for(run, np.random.default_rng(0))
    for seg in segs:
        seg.config = config
    cfg = ScanConfig(**scan)
    return judge_lineage(build_lineages(segs, config=cfg)[0], config=cfg)


def test_a_real_trl_config_with_syncing_off_does_not_excuse_a_rebuilt_reference():
    result = _buggy_resume_at_50(TRL_DEFAULTS)
    assert result.status == "reference_reset" and [v.verdict for v in result.verdicts] == ["reference_reset"]


def test_syncing_on_excuses_a_reset_only_on_its_schedule():
    on_schedule = _buggy_resume_at_50({"sync_ref_model": True, "ref_model_sync_steps": 25, "ref_model_mixup_alpha": 1.0})
    assert [v.verdict for v in on_schedule.verdicts] == ["intentional"]
    assert "ref_model_sync_steps=25" in on_schedule.verdicts[0].explanation
    off_schedule = _buggy_resume_at_50({"sync_ref_model": True, "ref_model_sync_steps": 64, "ref_model_mixup_alpha": 1.0})
    [v] = off_schedule.verdicts
    assert v.verdict == "reference_reset" and "every 64 steps" in v.explanation


def test_a_collapse_far_deeper_than_a_partial_sync_predicts_is_not_excused():
    """A sync mixing 0.6 of the policy leaves ~16 % of the KL; a slow regrowth from ~2 % is a rebuilt reference."""
    result = _buggy_resume_at_50({"sync_ref_model": True, "ref_model_sync_steps": 25, "ref_model_mixup_alpha": 0.6},
                                 tau=40)
    [v] = result.verdicts
    assert v.verdict == "inconclusive" and "rebuilt" in v.explanation


def test_a_reset_declared_on_the_command_line_is_intentional():
    result = _buggy_resume_at_50(TRL_DEFAULTS, intentional_resets=(51,))
    assert [v.verdict for v in result.verdicts] == ["intentional"] and "--intentional-reset" in result.verdicts[0].explanation
