"""The framework-neutral resume guard: record at the first launch, check at each resume, judge the KL, act."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from klwatch.integrations import (REFERENCE_MATCH_METRIC, RESUME_RESET_METRIC, ReferenceResetError,
                                  ReferenceResetWarning, ResumeGuard)
from klwatch.model import Boundary, Lineage, Series
from klwatch.reference_reset import ReferenceResetDetector
from synthetic import KLRun, kl_values


def _base() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"model.layers.0.mlp.up_proj.weight": rng.normal(size=(16, 8)).astype(np.float32),
            "lm_head.weight": rng.normal(size=(32, 8)).astype(np.float32)}


def _resumed_weights() -> dict[str, np.ndarray]:
    return {k: v * 1.01 for k, v in _base().items()}


def _launches(buggy: bool, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    run = KLRun(amplitude=0.1, tau=20.0, noise=0.08, every=1, resumes=[200], buggy=[buggy], last_step=240)
    return kl_values(run, np.random.default_rng(seed))


def _resume(guard: ResumeGuard, reference, *, buggy: bool) -> list:
    """A first launch to step 200 (recording), then a resumed launch fed its logged KL; the events."""
    first, second = _launches(buggy)
    ResumeGuard(record=guard.record, on_reset=guard.on_reset).start(_base(), step=0, source="base/")
    guard.start(reference, step=200, source="ckpt/" if buggy else "base/", history=zip(*first))
    for s, kl in zip(*second):
        guard.update(int(s), float(kl))
        if guard.should_stop:
            break
    return guard.events


def test_the_first_launch_records_and_a_correct_resume_passes_silently(tmp_path):
    guard = ResumeGuard(record=tmp_path / "klwatch_reference.json", on_reset="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        events = _resume(guard, _base(), buggy=False)
    assert (tmp_path / "klwatch_reference.json").exists()
    assert [e.reset for e in events] == [False, False]
    assert events[0].check is not None and events[0].check.matches
    assert events[1].verdict is not None and events[1].verdict.verdict == "ok"
    assert not guard.should_stop


def test_a_rebuilt_reference_raises_before_the_first_step(tmp_path):
    guard = ResumeGuard(record=tmp_path / "r.json", on_reset="raise")
    ResumeGuard(record=guard.record).start(_base(), step=0)
    with pytest.raises(ReferenceResetError, match="ckpt/") as caught:
        guard.start(_resumed_weights(), step=200, source="ckpt/")
    assert caught.value.event.check is not None and set(caught.value.event.check.changed) == set(_base())


def test_stop_asks_the_loop_to_end_and_warns(tmp_path):
    guard = ResumeGuard(record=tmp_path / "r.json", on_reset="stop")
    with pytest.warns(ReferenceResetWarning, match="differs from the one recorded"):
        events = _resume(guard, _resumed_weights(), buggy=True)
    assert guard.should_stop and events[0].reset and events[0].metrics() == {REFERENCE_MATCH_METRIC: 0.0}


def test_the_kl_judge_catches_a_reset_it_cannot_see_in_the_weights_within_its_window(tmp_path):
    guard = ResumeGuard(record=tmp_path / "r.json", on_reset="stop", check_reference=False)
    with pytest.warns(ReferenceResetWarning, match="reference_reset"):
        events = _resume(guard, None, buggy=True)
    [event] = events
    assert event.reset and event.verdict is not None and event.verdict.verdict == "reference_reset"
    window = ReferenceResetDetector().config.window_after
    assert event.step == 200 + window  # judged at the point completing the window, then stopped
    assert event.metrics()[RESUME_RESET_METRIC] == pytest.approx(1.0)


def test_the_guard_verdict_is_the_scan_verdict_of_the_same_points(tmp_path):
    first, second = _launches(True, seed=3)
    guard = ResumeGuard(record=tmp_path / "r.json", check_reference=False)
    with pytest.warns(ReferenceResetWarning):
        guard.start(None, step=200, history=zip(*first))
        for s, kl in zip(*second):
            guard.update(int(s), float(kl))
    window = ReferenceResetDetector().config.window_after
    pieces = [{"kl": Series(first[0], first[1])}, {"kl": Series(second[0][:window], second[1][:window])}]
    lineage = Lineage(id="run", name="run", segments=[], pieces=pieces, piece_segments=[0, 0],
                      boundaries=[Boundary(step=int(second[0][0]), resumed_from_step=200, evidence=["declared"],
                                           piece_index=1)], config={}, kl_metric="kl")
    [scanned] = ReferenceResetDetector().judge(lineage).verdicts
    [event] = guard.events
    assert event.verdict.verdict == scanned.verdict
    assert event.verdict.score == pytest.approx(scanned.score)


def test_a_declared_reference_sync_is_never_a_reset(tmp_path):
    config = {"sync_ref_model": True, "ref_model_sync_steps": 50, "ref_model_mixup_alpha": 1.0}
    guard = ResumeGuard(record=tmp_path / "r.json", on_reset="raise", config=config)
    assert guard.reference_declared_moving
    ResumeGuard(record=guard.record, config=config).start(_base(), step=0)
    assert guard.start(_resumed_weights(), step=200, source="ckpt/") is None
    assert not guard.should_stop


def test_a_resume_without_a_record_records_it_for_the_next_one(tmp_path, caplog):
    path = tmp_path / "r.json"
    guard = ResumeGuard(record=path, on_reset="raise")
    with caplog.at_level(logging.WARNING, logger="klwatch.guard"):
        assert guard.start(_base(), step=200) is None
    assert path.exists() and "nothing recorded" in caplog.text
    with pytest.raises(ReferenceResetError):
        ResumeGuard(record=path, on_reset="raise").start(_resumed_weights(), step=300)


def test_a_damaged_record_warns_naming_it_and_training_goes_on(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{broken")
    guard = ResumeGuard(record=path, on_reset="raise")
    with pytest.warns(ReferenceResetWarning, match="r.json"):
        assert guard.start(_base(), step=200) is None
    assert path.read_text() == "{broken"  # the user's file is left as it was


def test_a_process_that_does_not_write_never_creates_the_record(tmp_path):
    ResumeGuard(record=tmp_path / "r.json", write=False).start(_base(), step=0)
    assert not (tmp_path / "r.json").exists()


def test_an_unknown_action_is_refused(tmp_path):
    with pytest.raises(ValueError, match="on_reset"):
        ResumeGuard(record=tmp_path / "r.json", on_reset="ignore")  # type: ignore[arg-type]


def test_points_that_are_not_numbers_are_skipped(tmp_path):
    guard = ResumeGuard(record=tmp_path / "r.json", check_reference=False)
    guard.start(None, step=10, history=[(s, 0.1) for s in range(1, 11)])
    assert guard.update(11, float("nan")) is None and guard.update(12, float("inf")) is None
    assert not guard.events


def test_a_guard_keeping_its_history_judges_a_resume_without_being_handed_the_earlier_points(tmp_path):
    first, second = _launches(True, seed=5)
    record = tmp_path / "ckpt" / "klwatch_reference.json"
    launch1 = ResumeGuard(record=record, keep_history=True)
    launch1.start(_base(), step=0)
    for s, kl in zip(*first):
        launch1.update(int(s), float(kl))
    for s in range(201, 206):  # logged after the checkpoint at 200, then the crash: trained again after the resume
        launch1.update(s, 0.5)
    launch2 = ResumeGuard(record=record, keep_history=True, on_reset="stop", check_reference=False)
    launch2.start(None, step=200)
    kept = [line for line in launch2.history_file.read_text().splitlines()]
    assert len(kept) == len(first[0])  # cut back to the checkpoint's step
    with pytest.warns(ReferenceResetWarning, match="reference_reset"):
        for s, kl in zip(*second):
            launch2.update(int(s), float(kl))
            if launch2.should_stop:
                break
    assert launch2.events[-1].verdict.verdict == "reference_reset"


def test_a_damaged_line_in_the_kept_history_is_skipped(tmp_path):
    guard = ResumeGuard(record=tmp_path / "r.json", keep_history=True, check_reference=False)
    guard.history_file.write_text('{"step": 1, "kl": 0.1}\nnot json\n{"step": "x"}\n{"step": 2, "kl": 0.2}\n')
    guard.start(None, step=5)
    assert guard.history_file.read_text().splitlines() == ['{"step": 1, "kl": 0.1}', '{"step": 2, "kl": 0.2}']
