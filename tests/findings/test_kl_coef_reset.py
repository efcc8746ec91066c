from __future__ import annotations

import numpy as np
import pytest
from finding_helpers import FAULTS, SCENARIOS, judge, of, planted_step

NAME = "kl_coef_reset"


class AdaptiveKL:
    """verl's AdaptiveKLController: a proportional update, clipped to +-20% error, per step."""

    def __init__(self, init: float, *, target: float = 0.05, horizon: int = 10000) -> None:
        self.value, self.target, self.horizon = init, target, horizon

    def update(self, kl: float, n: int = 256) -> None:
        err = float(np.clip(kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + err * n / self.horizon


def coef_run(*, reset: bool, resume: int = 120, total: int = 200, init: float = 0.2, new_init: float | None = None,
             metric: str = "actor/kl_coef", adaptive: bool = True, seed: int = 0):
    """Two processes of a run whose KL sits below target (so the coefficient falls); the second
    resumes the controller's value, or re-creates it at ``new_init`` (default: the config's ``init``)."""
    rng = np.random.default_rng(seed)
    ctl = AdaptiveKL(init)
    procs = []
    for lo, hi in ((1, resume), (resume + 1, total)):
        if lo > 1 and reset:
            ctl = AdaptiveKL(init if new_init is None else new_init)
        steps, values = np.arange(lo, hi + 1), []
        for _ in steps:
            values.append(ctl.value)
            if adaptive:
                ctl.update(0.02 * np.exp(rng.normal(0, 0.3)))
        procs.append({metric: (steps, np.array(values))})
    return judge(procs, seed=seed)


def test_recreated_controller_is_an_error_with_the_numbers():
    [f] = of(coef_run(reset=True), NAME)
    assert f.severity == "error" and f.step == 121
    assert f.data["coef_after"] == pytest.approx(0.2) and f.data["coef_opening"] == pytest.approx(0.2)
    assert f.data["coef_before"] < 0.2 * 0.75
    assert "0.2" in f.message and "step 121" in f.message


@pytest.mark.parametrize("resume", [10, 60, 120, 190])
@pytest.mark.parametrize("seed", [0, 1])
def test_restored_controller_is_silent(resume, seed):
    assert of(coef_run(reset=False, resume=resume, seed=seed), NAME) == []


def test_fixed_coefficient_is_silent_even_when_recreated():
    assert of(coef_run(reset=True, adaptive=False), NAME) == []


def test_reset_before_the_coefficient_moved_cannot_be_told_and_is_silent():
    assert of(coef_run(reset=True, resume=2), NAME) == []


def test_jump_to_another_value_is_a_warning():
    [f] = of(coef_run(reset=True, new_init=0.5), NAME)
    assert f.severity == "warning" and f.data["coef_after"] == pytest.approx(0.5)


@pytest.mark.parametrize("metric", ["critic/kl_coef", "kl_coef", "train/kl_coef", "objective/kl_coef", "kl_ctl"])
def test_kl_coefficient_names_of_other_frameworks_are_recognised(metric):
    [f] = of(coef_run(reset=True, metric=metric), NAME)
    assert f.data["metric"] == metric


def test_fires_on_the_generated_kl_coef_reset_at_the_resume(sample, manifest):
    result = sample("kl-coef-reset")
    [f] = of(result, NAME)
    assert f.severity == "error" and f.step == planted_step(manifest("kl-coef-reset"), NAME)
    assert f.data["coef_after"] == pytest.approx(result.lineage.config["kl_coef"])


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if FAULTS.get(s) != NAME])
def test_silent_on_the_other_generated_runs(sample, scenario):
    assert of(sample(scenario), NAME) == []
