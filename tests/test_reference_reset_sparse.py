"""Early and sparse resumes (issue 10, class 5): trainers log the KL every L steps at the multiples of L,
TRL logs the mean over each window, and a run may resume a few steps into training. The detector must
give its verdict from the first 3 logged points after a resume, catch the reset (the first point is the
mean of a regrowth from 0: small, not ~0) and stay quiet on healthy resumes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klwatch.model import Boundary, Series
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage
from klwatch.reference_reset import ReferenceResetConfig, judge_boundary, logging_cadence, typical_kl
from synthetic import KLRun, kl_values, segments_for

METRIC = "train/kl_penalty"


def verdicts(run: KLRun, seed: int = 0) -> list[tuple[int, str, float]]:
    """(boundary step, verdict, score) of every boundary, through the whole pipeline."""
    lineages = build_lineages(segments_for(run, np.random.default_rng(seed), metric=METRIC), config=ScanConfig())
    assert len(lineages) == 1
    return [(v.boundary.step, v.verdict, v.score) for v in judge_lineage(lineages[0], config=ScanConfig()).verdicts]


def trl_run(*, every: int, tau: float, resume: int, buggy: bool, last_step: int = 200, noise: float = 0.05) -> KLRun:
    """One resume of a TRL-like run: KL means logged every ``every`` steps."""
    return KLRun(amplitude=0.05, tau=tau, noise=noise, every=every, resumes=[resume], buggy=[buggy],
                 last_step=last_step, mean_window=True)


def pieces(run: KLRun, seed: int = 0) -> tuple[Series, Series]:
    """The KL before and after the (single) resume, as logged."""
    (s0, v0), (s1, v1) = kl_values(run, np.random.default_rng(seed))
    return Series(s0, v0), Series(s1, v1)


# --- the generator logs as trainers do ---------------------------------------------------------------


def test_generator_logs_at_multiples_of_the_interval_and_first_after_a_resume_at_the_next_multiple():
    run = KLRun(amplitude=0.05, tau=10, noise=0.0, every=10, resumes=[45], buggy=[True], last_step=100)
    (s0, _), (s1, _) = kl_values(run, np.random.default_rng(0))
    assert list(s0) == [10, 20, 30, 40]
    assert list(s1) == [50, 60, 70, 80, 90, 100]


def test_generator_window_mean_after_a_reset_is_the_mean_of_the_regrowth_since_the_resume():
    run = KLRun(amplitude=0.05, tau=10, noise=0.0, every=10, resumes=[45], buggy=[True], last_step=100,
                mean_window=True)
    (_, v0), (_, v1) = kl_values(run, np.random.default_rng(0))
    k = np.arange(1, 6)  # steps 46..50: the window the resume cut short
    assert v1[0] == pytest.approx(float(np.mean(0.05 * (1 - np.exp(-k / 10)))), rel=1e-9)
    assert v0[0] == pytest.approx(float(np.mean(0.05 * (1 - np.exp(-np.arange(1, 11) / 10)))), rel=1e-9)
    assert 0.05 * 0.1 < v1[0] < 0.05 * 0.5  # small, but not about zero


# --- sparse (TRL-averaged) logging, mid-run resumes ----------------------------------------------------


@pytest.mark.parametrize("every,tau", [(5, 10), (10, 10), (5, 30), (10, 30), (1, 10)])
def test_reset_under_averaged_logging_is_caught(every, tau):
    for seed in range(3):
        (step, verdict, score), = verdicts(trl_run(every=every, tau=tau, resume=100, buggy=True), seed)
        assert verdict == "reference_reset" and score >= ReferenceResetConfig().reset_score, (seed, step, score)


@pytest.mark.parametrize("every", [1, 5, 10])
@pytest.mark.parametrize("tau", [5, 10, 30])
def test_healthy_resume_under_averaged_logging_is_ok(every, tau):
    for seed in range(3):
        (_, verdict, score), = verdicts(trl_run(every=every, tau=tau, resume=100, buggy=False), seed)
        assert verdict == "ok", (seed, score)


def test_regrowth_faster_than_the_logging_interval_is_never_called_ok():
    # L=10, tau=5: the first point is ~0.6x the level and the next already at it; the statistic cannot
    # prove a reset from that (the window mark may, where the windows retrace the opening within the run's
    # noise), but a first point this far below the level is not a continuation either
    for seed in range(3):
        (_, verdict, _), = verdicts(trl_run(every=10, tau=5, resume=100, buggy=True), seed)
        assert verdict in ("inconclusive", "reference_reset")


def test_verdict_comes_from_the_first_three_logged_points_after_the_resume():
    run = trl_run(every=10, tau=10, resume=100, buggy=True)
    before, after = pieces(run)
    three = after.take(slice(0, 3))
    b = Boundary(int(after.steps[0]), 100, ["new_tracker_run"], 1)
    v3 = judge_boundary(b, before, three, start=before, scale=0.05)
    v_all = judge_boundary(b, before, after, start=before, scale=0.05)
    assert v3.verdict == v_all.verdict == "reference_reset"
    assert v3.score == pytest.approx(v_all.score, abs=1e-9)
    assert v_all.window_after == (110, 130)


def test_reset_between_two_logged_steps_is_caught_without_knowing_the_checkpoint_step():
    # a resume from step 104 (save_steps not a multiple of logging_steps): the first window holds 6
    # steps of regrowth, and the boundary does not say where the run saved
    for seed in range(3):
        (step, verdict, _), = verdicts(trl_run(every=10, tau=15, resume=104, buggy=True), seed)
        assert (step, verdict) == (110, "reference_reset"), seed


def test_offsets_count_from_the_reset_step_not_from_the_first_logged_point():
    run = trl_run(every=10, tau=10, resume=100, buggy=True)
    before, after = pieces(run)
    b = Boundary(int(after.steps[0]), None, ["new_tracker_run"], 1)
    at_reset = judge_boundary(b, before, after, start=before, scale=0.05, reset_step=100)
    # counting offsets from the first logged point (step 110) predicts ~0 there: a poorer fit
    at_first_point = judge_boundary(b, before, after, start=before, scale=0.05, reset_step=110)
    assert at_reset.verdict == "reference_reset"
    assert at_reset.score > at_first_point.score


def test_cadence_is_read_off_the_points_before_unless_given():
    run = trl_run(every=10, tau=10, resume=100, buggy=True)
    before, after = pieces(run)
    assert logging_cadence(before) == 10
    b = Boundary(int(after.steps[0]), 100, ["new_tracker_run"], 1)
    inferred = judge_boundary(b, before, after, start=before, scale=0.05)
    given_l = judge_boundary(b, before, after, start=before, scale=0.05, cadence=10)
    assert inferred.verdict == given_l.verdict
    assert inferred.score == pytest.approx(given_l.score, abs=1e-9)


def test_one_low_point_then_straight_back_at_the_level_is_not_a_reset():
    rng = np.random.default_rng(0)
    before = Series(np.arange(10, 210, 10), 0.03 * np.exp(rng.normal(0, 0.05, 20)))
    after_vals = 0.03 * np.exp(rng.normal(0, 0.05, 6))
    after_vals[0] = 0.03 * 0.15
    after = Series(np.arange(210, 270, 10), after_vals)
    v = judge_boundary(Boundary(210, 200, ["new_tracker_run"], 1), before, after, start=None, scale=0.03)
    assert v.verdict != "reference_reset"


@pytest.mark.parametrize("every", [1, 10])
@pytest.mark.parametrize("period", [20, 40, 80])
def test_healthy_kl_oscillating_and_resumed_at_a_trough_is_not_a_reset(every, period):
    rng = np.random.default_rng(0)
    s = np.arange(1, 301)
    per_step = 0.05 * (1 - np.exp(-s / 20)) * (1 + 0.7 * np.sin(2 * np.pi * s / period)) * np.exp(rng.normal(0, 0.05, 300))
    logged = s[s % every == 0]
    vals = np.array([per_step[(s > x - every) & (s <= x)].mean() for x in logged])
    resume = ((150 // period) * period + int(0.75 * period)) // every * every
    cut = logged <= resume
    before, after = Series(logged[cut], vals[cut]), Series(logged[~cut], vals[~cut])
    start = before
    v = judge_boundary(Boundary(int(after.steps[0]), resume, ["new_tracker_run"], 1), before, after,
                       start=start, scale=float(np.percentile(vals, 90)))
    assert v.verdict != "reference_reset"


# --- early resumes: a few steps into training ---------------------------------------------------------


@pytest.mark.parametrize("resume,every,tau", [(10, 1, 30), (8, 1, 10)])
def test_early_reset_while_kl_still_grows_is_caught(resume, every, tau):
    for seed in range(3):
        (_, verdict, _), = verdicts(trl_run(every=every, tau=tau, resume=resume, buggy=True, last_step=150), seed)
        assert verdict == "reference_reset", seed


@pytest.mark.parametrize("resume,every,tau", [(10, 1, 30), (8, 1, 10), (20, 5, 30), (30, 10, 30), (4, 1, 10)])
def test_early_healthy_resume_is_never_a_reset_and_an_early_reset_never_ok(resume, every, tau):
    for seed in range(3):
        (_, healthy, _), = verdicts(trl_run(every=every, tau=tau, resume=resume, buggy=False, last_step=150), seed)
        (_, buggy, _), = verdicts(trl_run(every=every, tau=tau, resume=resume, buggy=True, last_step=150), seed)
        assert healthy != "reference_reset", seed
        assert buggy != "ok", seed


def test_early_resume_judges_against_the_opening_continued_not_a_flat_level():
    # KL still growing fast at the resume: the healthy points after it sit well above the level
    # before, which a flat level would call a jump; the opening continued expects exactly that
    for seed in range(3):
        (_, verdict, _), = verdicts(trl_run(every=1, tau=30, resume=10, buggy=False, last_step=150), seed)
        assert verdict == "ok", seed


def test_piece_before_that_begins_at_the_first_logged_step_counts_as_the_opening():
    # a resume after 4 logged steps: too few points for a level, unless they are the run's opening
    run = KLRun(amplitude=0.05, tau=6, noise=0.05, every=1, resumes=[4], buggy=[False], last_step=100,
                mean_window=True)
    before, after = pieces(run)
    b = Boundary(int(after.steps[0]), 4, ["new_tracker_run"], 1)
    # the pipeline may pass no opening; the piece before starts at step 1 <= L, so it is the opening
    as_opening = judge_boundary(b, before, after, start=None, scale=0.05)
    not_opening = judge_boundary(b, before, after, start=None, scale=0.05, opening_max_step=0)
    assert "too few" not in as_opening.explanation and as_opening.verdict != "reference_reset"
    assert not_opening.verdict == "inconclusive" and "too few" in not_opening.explanation


def test_three_points_of_an_opening_are_enough_to_be_judged_but_not_two():
    run = trl_run(every=10, tau=30, resume=30, buggy=False, last_step=150)
    before, after = pieces(run)
    b = Boundary(int(after.steps[0]), 30, ["new_tracker_run"], 1)
    three = judge_boundary(b, before, after, start=None, scale=0.05)
    two = judge_boundary(b, before.take(slice(0, 2)), after, start=None, scale=0.05)
    assert "too few" not in three.explanation
    assert two.verdict == "inconclusive" and "too few" in two.explanation


def test_resume_before_kl_has_grown_stays_inconclusive_under_averaged_logging():
    for seed in range(3):
        (_, verdict, _), = verdicts(trl_run(every=1, tau=60, resume=3, buggy=True, last_step=300), seed)
        assert verdict == "inconclusive", seed


# --- early resumes of real TRL runs (sample_runs/trl: trl.GRPOTrainer, stock report_to callbacks) -------

# The KL of the run's opening, logged every step; a resume from checkpoint-6 with the reference the base model
# (correct) or rebuilt from the checkpoint (buggy). The correct resume carries on the opening's growth: its
# first point (0.474) is far above what a restart of the opening predicts one step after the reset (~0).
TRL_OPENING = [0.0, 0.0586, 0.0976, 0.2027, 0.2091, 0.2942]          # steps 1-6
TRL_CORRECT = [0.4744, 0.3909, 0.2968, 0.945, 0.7032, 0.8753]        # steps 7-12
TRL_BUGGY = [0.0, 0.0069, 0.0351, 0.1394, 0.2543, 0.2927]            # steps 7-12
# the same training relogged through verl's Tracking (actor/kl_loss)
VERL_OPENING = [0.0, 0.2917, 0.3874, 0.47, 0.4998, 0.6123]
VERL_CORRECT = [0.6311, 0.5687, 0.6343, 0.8651, 0.7793, 0.5968]
VERL_BUGGY = [0.0, 0.2488, 0.0768, 0.0641, 0.1031, 0.0805]
# logging_steps=3 (TRL's window means): the opening at steps 3, 6, 9, a resume from checkpoint-9
SPARSE_OPENING = [0.0521, 0.2354, 0.3874]                            # steps 3, 6, 9
SPARSE_CORRECT = [0.8412, 1.3864, 2.1686]                            # steps 12, 15, 18
SPARSE_BUGGY = [0.0155, 0.1793, 0.4578]


def judge_real(opening: list[float], after: list[float], *, every: int = 1, resumed_from: int | None,
               points_after: int | None = None):
    """Judge a resume of a real run as the pipeline does: the opening is the piece before, the scale the
    typical KL of everything logged (of less when the logs end ``points_after`` points after the resume)."""
    after = after[:points_after] if points_after else after
    before = Series(every * np.arange(1, len(opening) + 1), np.array(opening))
    post = Series(every * np.arange(len(opening) + 1, len(opening) + len(after) + 1), np.array(after))
    b = Boundary(int(post.steps[0]), resumed_from, ["new_event_file"], 1)
    return judge_boundary(b, before, post, start=before, scale=typical_kl(np.array(opening + after)))


@pytest.mark.parametrize("points_after", [3, None])
@pytest.mark.parametrize("opening,correct,buggy,every,resumed_from", [
    (TRL_OPENING, TRL_CORRECT, TRL_BUGGY, 1, 6),
    (VERL_OPENING, VERL_CORRECT, VERL_BUGGY, 1, 6),
    (SPARSE_OPENING, SPARSE_CORRECT, SPARSE_BUGGY, 3, 9),
    (SPARSE_OPENING, SPARSE_CORRECT, SPARSE_BUGGY, 3, None),  # W&B: the checkpoint step is not known
], ids=["trl", "verl", "trl-every-3", "trl-every-3-no-checkpoint"])
def test_real_trl_early_resume_correct_is_ok_and_buggy_is_a_reset(opening, correct, buggy, every, resumed_from,
                                                                  points_after):
    ok = judge_real(opening, correct, every=every, resumed_from=resumed_from, points_after=points_after)
    reset = judge_real(opening, buggy, every=every, resumed_from=resumed_from, points_after=points_after)
    assert ok.verdict == "ok" and ok.score <= ReferenceResetConfig().ok_score, (ok.score, ok.explanation)
    assert reset.verdict == "reference_reset", (reset.score, reset.explanation)


@pytest.mark.parametrize("first", [0.3, 0.45, 0.6, 0.9])
def test_first_point_far_above_a_restart_of_the_opening_leans_to_ok(first):
    # a restart of the opening one step after the reset predicts ~0 (TRL's first step logs KL 0), at 4x its
    # speed 0.20; a first point at or above where the opening got to is a continuation, not a reset
    v = judge_real(TRL_OPENING, [first, 0.3909, 0.2968], resumed_from=6)
    assert v.verdict == "ok" and v.score <= ReferenceResetConfig().ok_score, (v.score, v.explanation)


# --- properties ---------------------------------------------------------------------------------------


runs = st.builds(
    lambda every, tau_mult, noise, resume_mult, early, seed: (
        KLRun(amplitude=0.02, tau=max(tau_mult * every, 5.0), noise=noise, every=every,
              resumes=[max(3 * every, int((0.8 if early else 4.0) * resume_mult * max(tau_mult * every, 5.0)))],
              buggy=[False], last_step=0, mean_window=True), seed),
    every=st.sampled_from([1, 5, 10]), tau_mult=st.floats(2.0, 8.0), noise=st.floats(0.02, 0.4),
    resume_mult=st.floats(1.0, 2.0), early=st.booleans(), seed=st.integers(0, 2**16),
)


def _with(run: KLRun, *, buggy: bool) -> KLRun:
    return KLRun(**{**run.__dict__, "buggy": [buggy], "last_step": run.resumes[0] + int(4 * run.tau) + 3 * run.every})


@settings(max_examples=40)
@given(runs)
def test_property_a_healthy_averaged_resume_is_never_a_reset(case):
    run, seed = case
    assert all(v != "reference_reset" for _, v, _ in verdicts(_with(run, buggy=False), seed))


@settings(max_examples=40)
@given(runs)
def test_property_a_reset_under_averaged_logging_is_never_called_ok(case):
    run, seed = case
    assert all(v != "ok" for _, v, _ in verdicts(_with(run, buggy=True), seed))


# the crashed launch logged on to step 55 past its checkpoint at 45; the resumed one, its reference rebuilt there,
# first logs at step 50 (the mean of steps 46-50), every 5 steps; an HF warm-up over the first 24 steps
CRASHED_PAST = [0.00115, 0.00434, 0.00847, 0.01196, 0.01338, 0.01861, 0.01864, 0.02872, 0.02432, 0.0278, 0.03093]
RESUMED_RESET = [0.00732, 0.01141, 0.01466, 0.02512, 0.01683, 0.02051, 0.02842, 0.02697]


def test_a_resumed_from_step_guessed_under_n_step_logging_never_makes_an_early_reset_ok():
    # the boundary's resumed-from step is the pipeline's guess, the step before the first logged after (49): true
    # only for a run logged every step. Taken as the reset step, a regrowth could reach 1 step of progress by step
    # 50 and the first point read as the opening carried on; the checkpoint may be anywhere from 45 to 49.
    before = Series(5 * np.arange(1, 12), np.array(CRASHED_PAST))
    after = Series(50 + 5 * np.arange(8), np.array(RESUMED_RESET))
    b = Boundary(50, 49, ["new_event_file", "step_rewind", "duplicate_steps", "time_gap"], 1)
    v = judge_boundary(b, before, after, start=before, scale=0.07)
    assert v.verdict != "ok", v.explanation
    named = Boundary(50, 49, ["new_event_file", "checkpoint"], 1)  # a checkpoint folder at 49 names it: trusted
    assert judge_boundary(named, before, after, start=before, scale=0.07).verdict == "ok"


def _late_resume(seed: int, *, resume: int, reset: bool, warm: int = 1, dip: float = 0.0, last: int = 1000
                 ) -> tuple[Series, Series]:
    """A slow opening (the KL, or a DPO margin, saturating over ~300 steps of progress; an HF linear warm-up over
    ``warm`` steps) logged as means every 5 steps and resumed late: a reset regrows from 0 at full rate, a healthy
    resume goes on, dipping by ``dip`` at first and recovering over ~10 steps."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, last + 1)
    progress = np.cumsum(np.minimum(1.0, s / warm))
    since = np.where((s > resume) & reset, progress - progress[resume - 1], progress)
    per_step = 0.5 * (1 - np.exp(-since / 300.0)) * np.exp(rng.normal(0, 0.2, last))
    per_step = np.where(s > resume, per_step * (1 - dip * np.exp(-(s - resume - 1) / 10.0)), per_step)
    logged = np.arange(5, last + 1, 5)
    values = np.array([per_step[x - 5:x].mean() for x in logged])
    return Series(logged[logged <= resume], values[logged <= resume]), Series(logged[logged > resume], values[logged > resume])


def _judged(before: Series, after: Series) -> str:
    b = Boundary(int(after.steps[0]), None, ["new_event_file", "time_gap"], 1)
    return judge_boundary(b, before, after, start=before,
                          scale=typical_kl(np.concatenate([before.values, after.values]))).verdict


def test_a_dip_that_only_a_regrowth_far_faster_than_the_runs_opening_explains_is_never_a_reset():
    # the first window at about half the level, the next ones back near it: a 4- or 8-step ramp from 0 explains
    # that, but this run's opening took ~500 steps to get there; a rebuilt reference regrows like the opening did
    # (FRAMEWORKS.md), at most ``opening_speeds`` times faster (a warm-up that ran slower there)
    for seed in range(12):
        assert _judged(*_late_resume(seed, resume=915, reset=False, dip=0.55)) != "reference_reset", seed


@pytest.mark.parametrize("warm", [1, 100, 400])
@pytest.mark.parametrize("resume", [300, 915])
def test_a_late_reset_regrowing_at_the_openings_pace_is_still_caught_after_a_long_warm_up(warm, resume):
    for seed in range(3):
        assert _judged(*_late_resume(seed, resume=resume, reset=True, warm=warm)) == "reference_reset", seed
