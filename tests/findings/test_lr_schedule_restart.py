from __future__ import annotations

import math

import numpy as np
import pytest
from finding_helpers import FAULTS, SCENARIOS, judge, of, planted_step

from klwatch.findings import LrScheduleRestart, LrScheduleRestartConfig

NAME = "lr_schedule_restart"


def warmup_cosine(k: np.ndarray, *, peak: float = 3e-4, warmup: int = 10, total: int = 200) -> np.ndarray:
    """The LR after ``k`` scheduler steps: linear warm-up, then cosine decay to 10%."""
    k = np.asarray(k, dtype=float)
    frac = np.clip((k - warmup) / max(1, total - warmup), 0.0, 1.0)
    return np.where(k < warmup, peak * (k + 1) / max(warmup, 1), peak * (0.1 + 0.9 * 0.5 * (1 + np.cos(math.pi * frac))))


def lr_run(*, restart: bool, resume: int = 120, total: int = 200, every: int = 1, rewind_to: int | None = None,
           metric: str = "train/lr", schedule=warmup_cosine, config: dict | None = None):
    """Two processes logging the LR; the second resumes from ``rewind_to`` (default: where the first
    stopped) with its scheduler restored, or re-created when ``restart``."""
    start = rewind_to if rewind_to is not None else resume
    s1 = np.arange(1, resume + 1)
    s2 = np.arange(start + 1, total + 1)
    s1, s2 = s1[(s1 - 1) % every == 0], s2[(s2 - start - 1) % every == 0]
    lr1 = schedule(s1 - 1)
    lr2 = schedule(s2 - start - 1) if restart else schedule(s2 - 1)
    return judge([{metric: (s1, lr1)}, {metric: (s2, lr2)}], config=config)


def test_recreated_scheduler_is_an_error_at_the_resume_with_the_numbers():
    result = lr_run(restart=True)
    [f] = of(result, NAME)
    assert f.severity == "error" and f.step == 121
    assert f.data["lr_after"] == pytest.approx(warmup_cosine(np.array([0]))[0])
    assert f.data["lr_before"] == pytest.approx(warmup_cosine(np.array([119]))[0])
    assert f.data["lr_expected"] == pytest.approx(warmup_cosine(np.array([120]))[0], rel=0.02)
    assert "step 121" in f.message and f"{f.data['lr_after']:.3g}" in f.message


@pytest.mark.parametrize("resume", [3, 7, 40, 120, 190])
@pytest.mark.parametrize("every", [1, 5])
def test_restored_scheduler_is_silent_through_warmup_and_decay(resume, every):
    assert of(lr_run(restart=False, resume=resume, every=every), NAME) == []


@pytest.mark.parametrize("every", [5, 10])
def test_restart_is_found_when_the_run_logs_every_n_steps(every):
    [f] = of(lr_run(restart=True, every=every), NAME)
    assert f.severity == "error" and f.step == 121


def test_rewind_with_restored_scheduler_is_silent_and_with_restarted_one_is_found():
    assert of(lr_run(restart=False, resume=130, rewind_to=100), NAME) == []
    [f] = of(lr_run(restart=True, resume=130, rewind_to=100), NAME)
    assert f.step == 101 and f.severity == "error"


@pytest.mark.parametrize("config", [{"lr_scheduler_type": "cosine_with_restarts"},
                                    {"optim": {"scheduler": "CosineAnnealingWarmRestarts"}}])
def test_schedule_with_restarts_declared_in_config_is_silent(config):
    assert of(lr_run(restart=True, config=config), NAME) == []


def test_schedule_that_restarts_inside_a_piece_is_silent():
    def hard_restarts(k):  # cosine cycles of 50 steps, each starting again at the peak
        return warmup_cosine(np.asarray(k) % 50, total=50, warmup=0)

    assert of(lr_run(restart=False, schedule=hard_restarts), NAME) == []
    assert of(lr_run(restart=True, schedule=hard_restarts), NAME) == []


def test_constant_lr_cannot_show_a_restart_and_is_silent():
    assert of(lr_run(restart=True, schedule=lambda k: np.full(len(k), 1e-5)), NAME) == []


@pytest.mark.parametrize("metric", ["actor/lr", "train/learning_rate", "learning_rate", "optim/lr", "lr-AdamW",
                                    "train/lr_group_0"])
def test_lr_names_of_other_frameworks_are_recognised(metric):
    [f] = of(lr_run(restart=True, metric=metric), NAME)
    assert f.data["metric"] == metric


def test_a_stricter_config_is_honoured():
    strict = LrScheduleRestart(config=LrScheduleRestartConfig(min_jump=5.0))
    assert strict.detect(lr_run(restart=True)) == []


def test_fires_on_the_generated_lr_restart_at_the_resume(sample, manifest):
    [f] = of(sample("lr-restart"), NAME)
    assert f.severity == "error" and f.step == planted_step(manifest("lr-restart"), NAME)
    assert f.data["lr_after"] == pytest.approx(f.data["lr_opening"], rel=0.05)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if FAULTS.get(s) != NAME])
def test_silent_on_the_other_generated_runs(sample, scenario):
    assert of(sample(scenario), NAME) == []
