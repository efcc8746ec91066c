"""The window mark: with logging every L > 1 steps, the first window after a buggy resume falls back to the
band of the run's own first window and the next windows climb the opening again (in learning-rate units);
a healthy resume, a dip, a dropout, a penalty switched off and a pause inside one process never earn it."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.model import Boundary, Lineage, Series
from klwatch.reference_reset import ReferenceResetDetector
from klwatch.progress import window_progress
from klwatch.window_mark import WindowMarkConfig, window_mark

LR_MAX = 1e-5


def _lr(steps: np.ndarray, warm: int) -> np.ndarray:
    """An HF linear warm-up then constant: the rate logged at step s is the one the next update runs at."""
    return LR_MAX * np.minimum(1.0, steps / warm) if warm else np.full(len(steps), LR_MAX)


def _kl(progress: np.ndarray, *, tau: float) -> np.ndarray:
    """A k3 KL as a function of the distance moved since the reference (cumulative lr, in LR_MAX steps)."""
    return 0.2 * (1 - np.exp(-progress / tau)) ** 1.5


def window_run(*, resume: int, buggy: bool, seed: int, L: int = 10, warm: int = 0, last: int = 400,
               tau: float = 150.0, noise: float = 0.2, log_lr: bool = True, dip: float = 1.0) -> Lineage:
    """A TRL run logging every L steps (the mean of the per-step KL since its last log; a launch starts its
    own window), resumed from the checkpoint at ``resume`` (a multiple of L)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, last + 1)
    lr_next = _lr(np.arange(0, last + 1), warm)  # index s: the rate logged at step s, run by update s + 1
    moved = np.concatenate([[0.0], np.cumsum(lr_next[:-1])])[:-1] / LR_MAX  # before update t: updates 1..t-1
    since = np.where((steps > resume) & buggy, moved - moved[resume], moved)
    per_step = _kl(since, tau=tau) * np.exp(rng.normal(0, noise, len(steps)))
    per_step[resume:resume + 3] *= dip
    logged = np.arange(L, last + 1, L)
    kl = np.array([per_step[s - L:s].mean() for s in logged])
    cut = int(np.searchsorted(logged, resume, side="right"))
    pieces = []
    for sl in (slice(0, cut), slice(cut, None)):
        piece = {"train/kl": Series(logged[sl], kl[sl])}
        if log_lr:
            piece["train/learning_rate"] = Series(logged[sl], lr_next[logged[sl]])
        pieces.append(piece)
    b = Boundary(step=int(logged[cut]), resumed_from_step=None, evidence=["new_event_file", "time_gap"], piece_index=1)
    return Lineage(id="r", name="r", segments=[], pieces=pieces, piece_segments=[0, 1], kl_metric="train/kl",
                   boundaries=[b])


def _status(lin: Lineage) -> str:
    return ReferenceResetDetector().judge(lin).verdicts[0].verdict


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("warm", [0, 60])
def test_an_early_buggy_resume_at_n_step_logging_is_a_reset_and_a_healthy_one_is_not(seed, warm):
    # 7-15% of the run: too early for the statistic's level. (A reset halfway through a warm-up is out of
    # reach: its regrowth outruns the whole logged opening within one window, leaving one point to compare.)
    resume = 30 + 10 * (seed % 3) + (10 if warm else 0)
    assert _status(window_run(resume=resume, buggy=True, seed=seed, warm=warm)) == "reference_reset"
    assert _status(window_run(resume=resume, buggy=False, seed=seed, warm=warm)) != "reference_reset"


@pytest.mark.parametrize("seed", range(6))
def test_a_reset_after_a_two_window_warm_up_opening_is_read_on_the_regrowths_curve(seed):
    # the warm-up ends inside the opening's second window: the regrowth runs at the full rate and passes the
    # progress the two-window opening reached within one window, so the opening's windows are read on it instead
    kw = dict(resume=20, seed=seed, warm=12)
    assert _status(window_run(buggy=True, **kw)) == "reference_reset"
    assert _status(window_run(buggy=False, **kw)) != "reference_reset"
    assert _status(window_run(buggy=False, dip=0.67, **kw)) != "reference_reset"


@pytest.mark.parametrize("seed", range(6))
def test_a_healthy_resume_that_dips_by_a_third_is_not_a_reset(seed):
    assert _status(window_run(resume=40, buggy=False, seed=seed, dip=0.67)) != "reference_reset"


def test_a_warm_up_regrowth_needs_the_learning_rate_to_read_as_a_retrace():
    lin = window_run(resume=40, buggy=True, seed=3, warm=80, noise=0.05)
    kl = lin.kl_pieces()
    lr = Series.concat([p["train/learning_rate"] for p in lin.pieces])
    with_lr = window_mark(kl[0], kl[1], reset_step=None, opening=kl[0], evidence=["new_event_file"], lr=lr)
    assert with_lr is not None and with_lr.retraced >= 2 and with_lr.reset_step == 40


def _series(start: int, values: list[float], L: int = 10) -> Series:
    return Series(np.arange(start, start + L * len(values), L), np.array(values))


OPENING = [0.001, 0.004, 0.009, 0.016]
AGAIN = [0.0011, 0.0042, 0.0085, 0.016, 0.025, 0.035, 0.044, 0.05, 0.053]
"""The opening climbed again after the resume, then on (its later points measure the run's noise)."""


def _mark(post: list[float], *, pre: list[float] = OPENING, evidence: tuple[str, ...] = ("new_event_file",)):
    before = _series(10, pre)
    return window_mark(before, _series(10 * (len(pre) + 1), post), reset_step=None, opening=before,
                       evidence=list(evidence))


def test_the_first_window_back_in_the_opening_band_then_the_opening_again_is_the_mark():
    mark = _mark(AGAIN)
    assert mark is not None and mark.first_step == 50 and mark.reset_step == 40 and mark.retraced == 3


def test_a_kl_that_carries_on_is_not_the_mark():
    assert _mark([0.02, 0.026, 0.03]) is None


def test_a_penalty_switched_off_stays_down_and_is_not_the_mark():
    assert _mark([0.0, 0.0, 0.0]) is None


def test_a_dropout_that_returns_at_once_to_the_level_is_not_the_mark():
    assert _mark([0.001, 0.02, 0.024], pre=[0.001, 0.01, 0.015, 0.016, 0.017, 0.018, 0.016]) is None


def test_a_pause_inside_one_process_keeps_its_window_and_never_earns_the_mark():
    assert _mark(AGAIN, evidence=("time_gap",)) is None


def test_a_fall_within_the_runs_own_noise_is_not_the_mark():
    noisy = [0.001, 0.012, 0.004, 0.02, 0.006, 0.018, 0.005, 0.016]
    assert _mark([0.004, 0.009, 0.012], pre=noisy) is None


def test_a_run_logged_every_step_is_left_to_the_snapshot_mark():
    before = Series(np.arange(1, 9), np.array([0.0, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.012]))
    after = Series(np.arange(9, 12), np.array([0.0, 0.001, 0.002]))
    assert window_mark(before, after, reset_step=8, opening=before, evidence=["new_event_file"]) is None


def test_a_first_window_at_zero_held_only_the_step_after_a_checkpoint_between_two_logs():
    # checkpoint at 49, logging every 10: the resumed launch's first log (step 50) averages step 50 alone
    before = _series(10, OPENING)
    after = Series(np.arange(50, 150, 10), np.array([0.0, 0.0012, 0.0043, 0.0088, 0.0152, 0.023, 0.031, 0.038,
                                                     0.044, 0.049]))
    mark = window_mark(before, after, reset_step=None, opening=before, evidence=["new_event_file"])
    assert mark is not None and mark.floored and mark.reset_step == 49
    assert "was 0 at step 50, the first step after the checkpoint of step 49" in mark.describe("KL")


def test_a_first_window_at_zero_then_back_at_the_level_at_once_is_not_the_mark():
    before = _series(10, OPENING)
    after = Series(np.array([50, 60, 70, 80]), np.array([0.0, 0.016, 0.018, 0.019]))
    assert window_mark(before, after, reset_step=None, opening=before, evidence=["new_event_file"]) is None


def test_a_checkpoint_between_two_logs_is_weighed_where_no_checkpoint_folder_names_it():
    # save_steps not a multiple of logging_steps: the reference rebuilt at step 34, the first log (40) averages
    # steps 35-40 of its regrowth; read from the last log (30) the windows are off the opening, from 34 on it
    kl = lambda p: 0.02 * (1 - np.exp(-p / 6.0)) ** 1.5  # noqa: E731
    ends, post_ends = np.array([10, 20, 30]), np.arange(40, 130, 10)
    wiggle = np.array([1, 1, 1, 1.06, 0.95, 1.04, 0.96, 1.05, 0.97])
    opening = Series(ends, kl(window_progress(None, ends, since=0)))
    after = Series(post_ends, kl(window_progress(None, post_ends, since=34)) * wiggle)
    kw = dict(reset_step=None, opening=opening, evidence=["new_event_file"])
    mark = window_mark(opening, after, **kw)
    assert mark is not None and mark.retraced == 3 and mark.reset_step == 34
    assert window_mark(opening, after, **kw, config=WindowMarkConfig(between_points=1)) is None  # the last log only
    healthy = Series(post_ends, kl(window_progress(None, post_ends, since=0)) * wiggle)
    assert window_mark(opening, healthy, **kw) is None


def test_a_margin_whose_windows_cross_zero_around_the_resume_never_earns_the_mark():
    # a noisy DPO margin: windows at or under 0 before and after, so its noise is as large as its level
    before = _series(10, [0.001, 0.02, 0.04, -0.01, 0.06, 0.03, 0.07, 0.045, 0.05])
    after = _series(100, [0.0022, 0.03, 0.05, 0.02, -0.005, 0.06, 0.04, 0.07])
    assert window_mark(before, after, reset_step=None, opening=before, evidence=["new_event_file"]) is None


def test_a_first_window_under_zero_is_not_a_retrace_of_the_opening():
    mark = _mark([-0.0011, 0.0042, 0.0085, 0.016, 0.025, 0.035, 0.044, 0.05, 0.053])
    assert mark is None or mark.retraced == 0


NOISY = [0.002, 0.008, 0.014, 0.019, 0.013, 0.018, 0.0125, 0.019, 0.0135, 0.0165]
"""An opening then a level with ~25% noise, logged every 10 steps up to step 100."""


def test_a_first_window_cut_short_by_the_checkpoint_must_fall_further_than_a_full_one():
    # a fall to the opening's first window: 7x, over 4 noise SDs for a full window, under it for one of 1 step
    before = _series(10, NOISY)
    after = Series(np.array([101, 110, 120, 130]), np.array([0.0022, 0.005, 0.009, 0.013]))  # window of 1 step
    full = Series(np.array([110, 120, 130, 140]), after.values)  # the same values, a full first window
    kw = dict(opening=before, evidence=["new_event_file"])
    assert window_mark(before, after, reset_step=100, **kw) is None
    assert window_mark(before, full, reset_step=100, **kw) is not None


def test_windows_far_under_the_steps_the_crashed_launch_logged_there_are_the_mark():
    # the crashed launch ran on to step 110 past its checkpoint at 70; the resumed one re-logs 80.. from ~0
    before = _series(10, [0.001, 0.0031, 0.0056, 0.0077, 0.0113, 0.0150, 0.0169, 0.0191, 0.0238, 0.0258, 0.028])
    after = _series(80, [0.0020, 0.0071, 0.0113, 0.0161, 0.0200, 0.0240, 0.0270, 0.0290, 0.0300, 0.0310])
    mark = window_mark(before, after, reset_step=None, opening=before, evidence=["step_rewind", "duplicate_steps"])
    assert mark is not None and mark.relogged == 3 and mark.reset_step == 70


def test_a_regrowth_closing_in_on_the_crashed_launchs_values_is_still_the_mark():
    # the third re-logged window has climbed to 70% of its twin; the first lies far under its own, all three together too
    before = _series(10, [0.001, 0.0031, 0.0056, 0.0077, 0.0113, 0.0150, 0.0169, 0.0191, 0.0238, 0.0258, 0.028])
    after = _series(80, [0.0020, 0.0090, 0.0180, 0.0200, 0.0240, 0.0270, 0.0290, 0.0300, 0.0310, 0.0320])
    mark = window_mark(before, after, reset_step=None, opening=before, evidence=["step_rewind", "duplicate_steps"])
    assert mark is not None and mark.relogged == 3


def test_a_re_logged_window_over_its_twin_is_no_relogged_mark():
    before = _series(10, [0.001, 0.0031, 0.0056, 0.0077, 0.0113, 0.0150, 0.0169, 0.0191, 0.0238, 0.0258, 0.028])
    after = _series(80, [0.0020, 0.0250, 0.0300, 0.0290, 0.0300, 0.0310, 0.0300, 0.0310, 0.0320, 0.0310])
    mark = window_mark(before, after, reset_step=None, opening=before, evidence=["step_rewind", "duplicate_steps"])
    assert mark is None or mark.relogged == 0


def test_re_logged_steps_about_where_the_crashed_launch_had_them_are_not_the_mark():
    before = _series(10, [0.001, 0.0031, 0.0056, 0.0077, 0.0113, 0.0150, 0.0169, 0.0191, 0.0238, 0.0258, 0.028])
    after = _series(80, [0.0110, 0.0160, 0.0200, 0.0230, 0.0250, 0.0270, 0.0285, 0.0295, 0.0300, 0.0310])  # a dip
    assert window_mark(before, after, reset_step=None, opening=before, evidence=["step_rewind"]) is None


# a healthy DPO margin logged every 10 steps whose launch crashed at 700 past a checkpoint at 673 (between two logs,
# no folder names it); the resumed launch dipped 30% at first, so its first window (674-680, cut short) fell far
# under its twin, while the next ones re-log about what the crashed launch had
NOISY_CRASHED = [0.0048, 0.0101, 0.0244, 0.0264, 0.0627, 0.0459, 0.0252, 0.0142, 0.042, 0.0514, 0.0321, 0.0255, 0.0271,
                 0.043, 0.0609, 0.0761, 0.0354, 0.036, 0.0445, 0.0839, 0.0447, 0.0091, 0.0366, 0.1184, 0.0389, 0.0478,
                 0.0694, 0.0872, 0.0187, 0.064, 0.0875, 0.1364, 0.0398, 0.0715, 0.0755, 0.0742, 0.0784, 0.0425, 0.0967,
                 0.053, 0.065, 0.159, 0.1059, 0.0882, 0.1337, 0.1333, 0.0998, 0.0802, 0.0242, 0.1387, 0.1056, 0.0611,
                 0.0789, 0.0823, 0.1485, 0.0515, 0.0583, 0.0693, 0.166, 0.0853, 0.1978, 0.1081, 0.1383, 0.1403, 0.0373,
                 0.2183, 0.1845, 0.1558, 0.1771, 0.1346]
DIPPED_RELOG = [0.0217, 0.1284, 0.1003, 0.144, 0.1518, 0.1139, 0.183, 0.1007, 0.1242]


def test_one_low_re_logged_window_and_the_next_at_their_twins_is_no_relogged_mark():
    # two windows of evidence, as for a deep fall: the windows after the first must lie clearly under theirs too
    before, after = _series(10, NOISY_CRASHED), _series(680, DIPPED_RELOG)
    mark = window_mark(before, after, reset_step=None, opening=before, evidence=["step_rewind", "duplicate_steps"])
    assert mark is None or mark.relogged == 0
    # the same first window with the next ones as far under their twins as a regrowth leaves them is the mark
    regrowth = _series(680, [0.0217, 0.045, 0.06, 0.08, 0.1, 0.12, 0.13, 0.14, 0.15])
    mark = window_mark(before, regrowth, reset_step=None, opening=before, evidence=["step_rewind", "duplicate_steps"])
    assert mark is not None and mark.relogged == 3
