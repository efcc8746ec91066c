"""Post-side evidence: a reset judged from the launch after the resume alone (verl's ``file`` logger keeps only
the last launch), and the late starts that must stay quiet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from klwatch.model import Series
from klwatch.pipeline import ScanConfig, scan
from klwatch.post_side import late_opening


def regrowth(k: np.ndarray, *, amplitude: float = 0.4, tau: float = 15.0) -> np.ndarray:
    """A KL k steps after its reference was snapshotted: exactly 0 at k = 1 (the loss before the first update)."""
    return amplitude * (1 - np.exp(-(k - 1.0) / tau))


def verl_file_log(path: Path, steps: np.ndarray, kl: np.ndarray, seed: int = 0) -> Path:
    """What verl's ``file`` logger leaves after a relaunch: ``{"step", "data"}`` lines of the last launch only."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for s, x in zip(steps, kl):
            fh.write(json.dumps({"step": int(s), "data": {"actor/kl_loss": float(x), "actor/pg_loss": float(rng.normal()),
                                                          "training/global_step": int(s)}}) + "\n")
    return path


@pytest.mark.parametrize("seed", range(4))
def test_a_relaunch_that_opens_at_zero_past_the_first_step_is_a_reset_with_the_earlier_side_missing(tmp_path, seed):
    rng = np.random.default_rng(seed)
    steps = np.arange(26, 61)
    verl_file_log(tmp_path / "exp.jsonl", steps, regrowth(steps - 25.0) * np.exp(rng.normal(0, 0.15, len(steps))))
    (r,) = scan([str(tmp_path)], config=ScanConfig()).results
    assert r.status == "reference_reset"
    (v,) = r.verdicts
    assert v.boundary.step == 26 and v.boundary.evidence == ["starts_past_first_step"] and v.kl_before is None
    assert "not in the logs" in v.explanation


@pytest.mark.parametrize("seed", range(4))
def test_a_healthy_relaunch_logged_alone_is_quiet(tmp_path, seed):
    rng = np.random.default_rng(seed)
    steps = np.arange(26, 61)
    verl_file_log(tmp_path / "exp.jsonl", steps, regrowth(steps.astype(float)) * np.exp(rng.normal(0, 0.15, len(steps))))
    (r,) = scan([str(tmp_path)], config=ScanConfig()).results
    assert r.status == "ok" and not r.verdicts


def test_a_fresh_run_logged_from_its_first_steps_is_not_a_late_start():
    for first in (0, 1, 2, 4):  # a logger counting from 0, from 1, one step off, one interval in
        steps = np.arange(first, first + 40)
        assert late_opening(Series(steps, regrowth(steps - first + 1.0)), cadence=1) is None


def test_a_slowly_growing_kl_that_starts_late_is_not_at_the_floor():
    steps = np.arange(26, 400)
    kl = 1e-4 * np.exp((steps - 26) / 60.0)  # 1e-4 at the resume, 100x that later: small, but never 0
    assert late_opening(Series(steps, kl), cadence=1) is None


def test_a_window_mean_cannot_sit_at_the_floor():
    steps = np.arange(30, 200, 10)
    assert late_opening(Series(steps, regrowth((steps - 25.0) / 10)), cadence=10) is None


def test_a_kl_that_stays_at_zero_after_a_late_start_is_not_a_regrowth():
    steps = np.arange(26, 61)
    assert late_opening(Series(steps, np.zeros(len(steps))), cadence=1) is None


def test_a_first_step_averaging_mini_batches_after_the_reset_is_at_the_floor():
    # verl (and PPO-style loops) log the mean of the step's mini-batch updates: the first after a reset averages 0
    # with one update's KL, ~10x under the next step's, thousands of times under where the launch regrows to
    steps = np.arange(27, 41)
    kl = np.array([7.8e-6, 8.1e-5, 3e-4, 8e-4, 2e-3, 4e-3, 7e-3, 1e-2, 1.4e-2, 1.8e-2, 2.2e-2, 2.6e-2, 3e-2, 3.3e-2])
    mark = late_opening(Series(steps, kl), cadence=1)
    assert mark is not None and mark.first_step == 27


def test_a_late_start_a_few_times_under_its_next_step_but_near_its_level_is_not_at_the_floor():
    steps = np.arange(27, 41)
    kl = np.array([0.004, 0.02, 0.021, 0.019, 0.022, 0.02, 0.021, 0.023, 0.02, 0.022, 0.021, 0.02, 0.022, 0.021])
    assert late_opening(Series(steps, kl), cadence=1) is None
