"""The snapshot mark: a first point at the estimator's floor right after the checkpoint, then the opening
retraced, decides early resumes the regrowth statistic leaves open; nothing else earns it."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.model import Boundary, Lineage, Series
from klwatch.reference_reset import ReferenceResetDetector
from klwatch.snapshot_mark import off_the_floor, snapshot_mark


def opening_kl(k: np.ndarray, *, tau: float) -> np.ndarray:
    """A k3 KL k steps into a run (or after a reset): exactly 0 at k = 1, where the loss is computed before the
    first update with the policy equal to its reference, then growing (slowly: a long run's opening)."""
    return 0.9 * (1 - np.exp(-(k - 1.0) / tau))


def early_run(*, resume: int, buggy: bool, seed: int, last: int = 600, tau: float = 300.0,
              noise: float = 0.15) -> Lineage:
    rng = np.random.default_rng(seed)
    steps = np.arange(1, last + 1)
    k = steps - (resume if buggy else 0) * (steps > resume)
    kl = opening_kl(k.astype(float), tau=tau) * np.exp(rng.normal(0, noise, len(steps)))
    pieces = [{"kl": Series(steps[:resume], kl[:resume])}, {"kl": Series(steps[resume:], kl[resume:])}]
    return Lineage(id="r", name="r", segments=[], pieces=pieces, piece_segments=[0, 1], kl_metric="kl",
                   boundaries=[Boundary(step=resume + 1, resumed_from_step=resume, evidence=["checkpoint"], piece_index=1)])


@pytest.mark.parametrize("seed", range(8))
def test_an_early_buggy_resume_is_a_reset_and_a_healthy_one_is_not(seed):
    resume = 30 + 5 * seed  # 5-12% of the run, while the KL is still near its opening level
    buggy = ReferenceResetDetector().judge(early_run(resume=resume, buggy=True, seed=seed))
    healthy = ReferenceResetDetector().judge(early_run(resume=resume, buggy=False, seed=seed))
    assert buggy.status == "reference_reset"
    assert healthy.status != "reference_reset"


def _mark(pre: list[float], post: list[float], *, opening: list[float] | None = None, first_post: int = 11):
    before = Series(np.arange(first_post - len(pre), first_post), np.array(pre))
    after = Series(np.arange(first_post, first_post + len(post)), np.array(post))
    start = Series(np.arange(1, len(opening) + 1), np.array(opening)) if opening is not None else before
    return snapshot_mark(before, after, reset_step=first_post - 1, opening=start)


OPENING = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09]


def test_the_floor_then_the_opening_retraced_is_the_mark():
    mark = _mark(OPENING, [0.0, 0.011, 0.019], opening=OPENING)
    assert mark is not None and mark.reset_step == 10 and mark.first_step == 11


def test_a_kl_that_stays_at_zero_is_a_penalty_switched_off_not_the_mark():
    assert _mark(OPENING, [0.0, 0.0, 0.0], opening=OPENING) is None


def test_a_zero_that_returns_at_once_to_the_level_is_a_dropout_not_the_mark():
    assert _mark(OPENING, [0.0, 0.09, 0.1], opening=OPENING) is None


def test_a_regrowth_far_faster_or_slower_than_the_opening_is_not_the_mark():
    assert _mark(OPENING, [0.0, 0.08, 0.085], opening=OPENING) is None  # 8x the opening at offset 2
    assert _mark(OPENING, [0.0, 0.001, 0.002], opening=OPENING) is None  # 10x slower


def test_a_kl_that_had_not_left_zero_gives_no_mark():
    assert _mark([0.0, 0.0, 0.0001, 0.0, 0.0], [0.0, 0.01, 0.02], opening=OPENING) is None


def test_a_first_point_after_a_skipped_step_gives_no_mark():
    # the first logged point is not the first step after the checkpoint: a window mean, not the floor
    before = Series(np.arange(1, 11), np.array(OPENING))
    after = Series(np.array([13, 14, 15]), np.array([0.0, 0.01, 0.02]))
    assert snapshot_mark(before, after, reset_step=10, opening=before) is None


def test_no_opening_in_the_logs_gives_no_mark():
    before = Series(np.arange(1, 11), np.array(OPENING))
    after = Series(np.arange(11, 14), np.array([0.0, 0.01, 0.02]))
    assert snapshot_mark(before, after, reset_step=10, opening=None) is None


# --- the converse: far off the floor at the first step after a named checkpoint -------------------------------


def _off(pre: list[float], post: list[float], *, opening: list[float], first_post: int = 11,
         reset_step: int | None = 10) -> str | None:
    before = Series(np.arange(first_post - len(pre), first_post), np.array(pre))
    after = Series(np.arange(first_post, first_post + len(post)), np.array(post))
    return off_the_floor(before, after, reset_step=reset_step, opening=Series(np.arange(1, len(opening) + 1),
                                                                              np.array(opening)))


def test_a_kl_far_off_the_floor_right_after_a_named_checkpoint_rules_a_reset_out():
    said = _off(OPENING, [0.1, 0.11, 0.1], opening=OPENING)
    assert said is not None and "step 11" in said and "checkpoint of step 10" in said


def test_off_the_floor_needs_the_run_to_open_at_the_floor():
    """An estimator that is not at a floor when policy equals reference (verl's KL over several mini-batch
    updates, a KL of generation-engine log-probs) says nothing by being off it."""
    opening = [0.004] + OPENING[1:]
    assert _off(opening, [0.1, 0.11, 0.1], opening=opening) is None


def test_off_the_floor_needs_a_named_checkpoint_and_the_very_next_step():
    assert _off(OPENING, [0.1, 0.11, 0.1], opening=OPENING, reset_step=None) is None
    assert _off(OPENING, [0.1, 0.11, 0.1], opening=OPENING, reset_step=8) is None  # two steps later: regrown a bit


def test_a_small_kl_after_the_checkpoint_is_not_off_the_floor():
    """A reset's first point is at the floor, its next ones low: under half the level nothing is ruled out."""
    assert _off(OPENING, [0.03, 0.05, 0.06], opening=OPENING) is None


def test_a_window_mean_is_not_read_for_the_floor():
    before = Series(np.arange(10, 101, 10), np.array(OPENING))
    after = Series(np.array([110, 120, 130]), np.array([0.1, 0.11, 0.1]))
    assert off_the_floor(before, after, reset_step=100, opening=before) is None


def test_an_early_healthy_resume_off_the_floor_is_ok_and_the_buggy_twin_a_reset():
    """Four points before the resume: too few for the regrowth statistic, but the first step after a named
    checkpoint tells them apart (trl.RLOOTrainer's KL is exactly 0 at its own first step)."""
    steps = np.arange(1, 9)
    healthy = np.array([0.0, 0.31, 0.44, 1.41, 1.82, 1.07, 1.50, 1.62])
    buggy = np.array([0.0, 0.31, 0.44, 1.41, 0.0, 0.29, 0.47, 0.9])
    for kl, want in ((healthy, "ok"), (buggy, "reference_reset")):
        lin = Lineage(id="r", name="r", segments=[], piece_segments=[0, 1], kl_metric="kl",
                      pieces=[{"kl": Series(steps[:4], kl[:4])}, {"kl": Series(steps[4:], kl[4:])}],
                      boundaries=[Boundary(step=5, resumed_from_step=4, evidence=["checkpoint"], piece_index=1)])
        assert ReferenceResetDetector().judge(lin).status == want, (want, ReferenceResetDetector().judge(lin).verdicts)


def test_a_regrowth_still_under_the_floor_tolerance_is_the_mark_when_the_opening_was_as_slow():
    """Inside a learning-rate warm-up the opening's first steps sit far under 1% of the level it reached: a
    regrowth as small at the same offsets retraces it (it was refused as a penalty switched off)."""
    opening = [0.0, 1e-6, 4e-6, 1e-5, 0.002, 0.004, 0.006, 0.008, 0.009, 0.01]
    mark = _mark(opening, [0.0, 2e-6, 6e-6], opening=opening)
    assert mark is not None and mark.first_step == 11
    assert _mark(opening, [0.0, 0.0, 0.0], opening=opening) is None  # exactly 0 on: switched off
    assert _mark(opening, [0.0, 1e-9 / 2, 1e-9 / 2], opening=opening) is None  # float noise at the floor: no regrowth
    assert _mark(opening, [0.0, 1e-8, 2e-8], opening=opening) is None  # slower than the opening by far


def _warm_up_resume(*, buggy: bool) -> tuple[Series, Series, Series]:
    """A run logged every step whose HF warm-up (8 steps, first update at rate 0) is still on at the checkpoint of
    step 6: the KL as a power of the distance moved since the reference, without noise."""
    steps = np.arange(1, 13)
    lr_next = 1e-5 * np.minimum(1.0, np.arange(0, 13) / 8)  # the rate logged at step s, run by update s + 1
    moved = np.concatenate([[0.0], np.cumsum(lr_next[:-1])])[:-1] / 1e-5  # before update t
    since = np.where((steps > 6) & buggy, moved - moved[6], moved)
    kl = 0.01 * since ** 1.5
    return Series(steps[:6], kl[:6]), Series(steps[6:], kl[6:]), Series(steps, lr_next[1:])


def test_a_regrowth_as_fast_as_the_warm_up_rate_explains_is_the_mark_when_the_rate_is_logged():
    before, after, lr = _warm_up_resume(buggy=True)
    assert abs(float(after.values[0])) < 1e-12 and float(after.values[2]) > float(before.values[-1])  # back above at once
    assert snapshot_mark(before, after, reset_step=6, opening=before) is None
    mark = snapshot_mark(before, after, reset_step=6, opening=before, lr=lr)
    assert mark is not None and mark.reset_step == 6 and mark.first_step == 7


def test_a_zero_then_the_level_the_warm_up_had_reached_is_not_the_mark_even_with_the_rate():
    before, after, lr = _warm_up_resume(buggy=False)
    dropout = Series(after.steps, np.concatenate([[0.0], after.values[1:]]))
    assert snapshot_mark(before, dropout, reset_step=6, opening=before, lr=lr) is None
