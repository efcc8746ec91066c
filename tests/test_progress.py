"""Progress in learning-rate units: the sum of the rates of the updates since a reference was taken, as a
trainer logging window means shows it; a warm-up's fast regrowth after a reset lies on the opening's curve."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.model import Lineage, Series
from klwatch.progress import opening_on_regrowth, retraced_points, run_lr, window_progress


def test_without_a_learning_rate_progress_counts_the_updates_before_each_logged_step():
    # the KL logged at step t is computed before update t: t - 1 updates since step 0, t - 1 - r since r
    assert window_progress(None, np.array([1, 2, 5]), since=0) == pytest.approx([0, 1, 3])
    assert window_progress(None, np.array([11, 12]), since=10) == pytest.approx([0, 1])
    # a first point two steps after the reference averages its window: steps 11 and 12 moved 0 and 1
    assert window_progress(None, np.array([12]), since=10) == pytest.approx([0.5])


def test_a_logging_window_is_the_mean_of_its_steps_progress():
    # windows (0, 4] and (4, 8]: steps 1..4 moved 0..3 updates, steps 5..8 moved 4..7
    assert window_progress(None, np.array([4, 8]), since=0) == pytest.approx([1.5, 5.5])


def test_a_warm_up_first_update_runs_at_zero_as_the_hf_trainer_logs_it():
    # HF logs the rate set for the next update: 1e-6 * step during a warm-up; update 1 ran at the rate of step 0
    lr = Series(np.arange(1, 11), 1e-6 * np.arange(1, 11))
    got = window_progress(lr, np.array([1, 2, 3, 4]), since=0)
    assert got == pytest.approx([0.0, 0.0, 1e-6, 3e-6])


def test_a_warm_up_that_peaked_between_the_first_two_logs_ramps_from_zero_before_the_first():
    # warm-up of 12 steps to 0.5, then a linear decay, logged every 10 steps: the first two logs straddle the peak
    lr = Series(np.array([10, 20, 30]), np.array([0.5 * 10 / 12, 0.49, 0.47]))
    got = window_progress(lr, np.array([10]), since=0)
    ramp = np.concatenate([[0.0], np.cumsum(0.5 / 12 * np.arange(0, 9))])  # updates 1..9 at the rates of steps 0..8
    assert got == pytest.approx([float(np.mean(ramp))])


def test_a_decay_from_the_first_step_is_extended_along_its_first_two_logs():
    lr = Series(np.array([10, 20, 30]), np.array([0.9, 0.8, 0.7]))
    # update 1 runs at the rate of step 0, 1.0 along the decay (a ramp from 0 would give 0)
    assert window_progress(lr, np.array([2]), since=0) == pytest.approx([0.5 * 1.0])


def _lr_run(config: dict) -> Lineage:
    return Lineage(id="r", name="r", segments=[], pieces=[{"train/learning_rate": Series(np.array([5, 10, 15]),
                                                                                         np.full(3, 1e-5))}],
                   piece_segments=[0], config=config)


@pytest.mark.parametrize("config", [{"warmup_steps": 5}, {"warmup_steps": 0, "warmup_ratio": 0.05, "max_steps": 100},
                                    {"warmup_steps": 0.05, "max_steps": 100},
                                    {"actor": {"optim": {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.05,
                                                         "total_training_steps": 100}}}])
def test_a_warm_up_the_config_declares_ramps_the_rate_before_the_first_log(config):
    lr = run_lr(_lr_run(config))  # logged at its peak from the first log on: the ramp left no trace in the logs
    assert lr is not None and lr.steps[0] == 0 and lr.values[0] == pytest.approx(0.0, abs=1e-15)
    assert window_progress(lr, np.array([5]), since=0) == pytest.approx([np.mean([0, 0, 2e-6, 6e-6, 1.2e-5])])


def test_without_a_declared_warm_up_the_logged_rate_is_held_before_the_first_log():
    lr = run_lr(_lr_run({"warmup_steps": 0, "warmup_ratio": 0.0}))
    assert lr is not None and lr.steps[0] == 5


def test_the_run_learning_rate_keeps_the_resumed_launchs_values_for_re_logged_steps():
    first = {"train/learning_rate": Series(np.arange(1, 11), np.full(10, 2.0))}
    second = {"train/learning_rate": Series(np.arange(6, 16), np.full(10, 1.0))}
    lin = Lineage(id="r", name="r", segments=[], pieces=[first, second], piece_segments=[0, 1])
    lr = run_lr(lin)
    assert lr is not None and list(lr.steps) == list(range(1, 16))
    assert lr.values[:5] == pytest.approx([2.0] * 5) and lr.values[5:] == pytest.approx([1.0] * 10)


def test_a_run_without_a_learning_rate_has_none():
    lin = Lineage(id="r", name="r", segments=[], pieces=[{"kl": Series(np.arange(1, 5), np.ones(4))}],
                  piece_segments=[0])
    assert run_lr(lin) is None


def _warm_up_run(warm: int, last: int) -> tuple[Series, np.ndarray]:
    steps = np.arange(0, last + 1)
    return Series(steps[1:], 1e-5 * np.minimum(1.0, steps[1:] / warm)), steps


def test_a_regrowth_inside_a_warm_up_lies_on_the_opening_in_progress_not_in_steps():
    lr, _ = _warm_up_run(warm=40, last=80)
    kl = lambda p: (p / 1e-4) ** 1.5  # noqa: E731  a KL growing as a power of the distance moved
    ends = np.arange(10, 41, 10)
    opening = Series(ends, kl(window_progress(lr, ends, since=0)))
    post_ends = np.array([50, 60])
    after = Series(post_ends, kl(window_progress(lr, post_ends, since=40)))
    assert retraced_points(opening, after, lr=lr, reset_step=40, band=float(np.log(1.2))) == 2
    # read in steps, the same regrowth is far faster than the opening: no retrace
    assert retraced_points(opening, after, lr=None, reset_step=40, band=float(np.log(1.2))) == 0


def test_a_continuation_does_not_retrace_the_opening():
    lr, _ = _warm_up_run(warm=40, last=80)
    kl = lambda p: (p / 1e-4) ** 1.5  # noqa: E731
    ends = np.arange(10, 41, 10)
    opening = Series(ends, kl(window_progress(lr, ends, since=0)))
    after = Series(np.array([50, 60]), kl(window_progress(lr, np.array([50, 60]), since=0)))
    assert retraced_points(opening, after, lr=lr, reset_step=40, band=float(np.log(1.5))) == 0


def test_a_regrowth_faster_than_a_two_window_opening_carries_the_opening_on_its_curve():
    # a warm-up of 15 steps, the reset at 20: the regrowth's second window is past the opening's reach
    lr, _ = _warm_up_run(warm=15, last=60)
    kl = lambda p: (p / 1e-4) ** 1.5  # noqa: E731
    opening = Series(np.array([10, 20]), kl(window_progress(lr, np.array([10, 20]), since=0)))
    post_ends = np.array([30, 40, 50])
    after = Series(post_ends, kl(window_progress(lr, post_ends, since=20)))
    band = float(np.log(1.2))
    assert retraced_points(opening, after, lr=lr, reset_step=20, band=band) == 1
    assert opening_on_regrowth(opening, after, lr=lr, reset_step=20, band=band) == 2
    healthy = Series(post_ends, kl(window_progress(lr, post_ends, since=0)))
    assert opening_on_regrowth(opening, healthy, lr=lr, reset_step=20, band=float(np.log(1.5))) == 0

