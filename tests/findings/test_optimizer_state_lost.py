from __future__ import annotations

import numpy as np
import pytest
from finding_helpers import FAULTS, SCENARIOS, judge, of, planted_step

NAME = "optimizer_state_lost"


def adam_regression(*, lose_moments: bool, seed: int, steps: int = 300, resume: int = 200, lr: float = 0.1,
                    names: tuple[str, str] = ("train/grad_norm", "train/loss")):
    """A real Adam (bias-corrected, as in PyTorch) fitting a noisy linear regression on minibatches,
    checkpointed after ``resume`` steps and resumed in a second process with its moments restored, or
    re-created (zeros, step count 0) when ``lose_moments``. Logs the pre-update grad norm and loss."""
    rng = np.random.default_rng(seed)
    dim, n = 50, 4000
    w_true = rng.normal(size=dim)
    x_all = rng.normal(size=(n, dim))
    y_all = x_all @ w_true + 0.5 * rng.normal(size=n)
    w, m, v, t = np.zeros(dim), np.zeros(dim), np.zeros(dim), 0
    logs = []
    for step in range(1, steps + 1):
        if step == resume + 1 and lose_moments:
            m, v, t = np.zeros(dim), np.zeros(dim), 0
        idx = rng.integers(0, n, 32)
        r = x_all[idx] @ w - y_all[idx]
        g = 2 * x_all[idx].T @ r / len(idx)
        logs.append((step, float(np.linalg.norm(g)), float(np.mean(r * r))))
        t += 1
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w -= lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    a = np.array(logs)
    procs = []
    for lo, hi in ((1, resume), (resume + 1, steps)):
        sel = (a[:, 0] >= lo) & (a[:, 0] <= hi)
        procs.append({names[0]: (a[sel, 0], a[sel, 1]), names[1]: (a[sel, 0], a[sel, 2])})
    return procs


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_fresh_adam_moments_at_a_resume_are_an_error(seed):
    [f] = of(judge(adam_regression(lose_moments=True, seed=seed), seed=seed), NAME)
    assert f.severity == "error" and f.step == 201
    assert {s["metric"] for s in f.data["spikes"]} == {"train/grad_norm", "train/loss"}
    for s in f.data["spikes"]:
        assert s["z"] > s["null_max"] and s["peak"] > 1.5 * s["level"]


@pytest.mark.parametrize("seed", range(8))
def test_restored_adam_moments_are_silent(seed):
    assert of(judge(adam_regression(lose_moments=False, seed=seed), seed=seed), NAME) == []


def test_verl_names_are_recognised():
    procs = adam_regression(lose_moments=True, seed=1, names=("actor/grad_norm", "actor/pg_loss"))
    [f] = of(judge(procs, seed=1), NAME)
    assert {s["metric"] for s in f.data["spikes"]} == {"actor/grad_norm", "actor/pg_loss"}


def noisy_grad_norm_run(*, seed: int, spike_at: int | None, spike: float = 3.0, metric: str = "train/grad_norm"):
    """Heavy-tailed grad norms (Student-t in log space, as real ones) with an optional jump that lasts a
    few steps; two processes split at step 150."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 301)
    gn = 0.8 * np.exp(0.25 * rng.standard_t(3, len(steps)))
    if spike_at is not None:
        gn[(steps >= spike_at) & (steps < spike_at + 5)] *= spike
    return judge([{metric: (steps[:150], gn[:150])}, {metric: (steps[150:], gn[150:])}], seed=seed)


@pytest.mark.parametrize("seed", range(6))
def test_heavy_tailed_grad_norms_with_spikes_away_from_the_resume_are_silent(seed):
    assert of(noisy_grad_norm_run(seed=seed, spike_at=None), NAME) == []
    assert of(noisy_grad_norm_run(seed=seed, spike_at=80), NAME) == []


def test_a_grad_norm_spike_alone_at_the_resume_is_a_warning():
    [f] = of(noisy_grad_norm_run(seed=3, spike_at=151, spike=4.0), NAME)
    assert f.severity == "warning" and f.step == 151


def test_a_loss_spike_alone_accuses_nothing():
    [f] = of(noisy_grad_norm_run(seed=3, spike_at=151, spike=4.0), NAME)  # as a grad norm it is found ...
    assert f.step == 151
    assert of(noisy_grad_norm_run(seed=3, spike_at=151, spike=4.0, metric="train/loss"), NAME) == []  # ... not as a loss


@pytest.mark.xfail(strict=True, reason=(
    "the generator's optimizer-reset leaves no trace beyond the run's own noise: in its tiny GRPO loop "
    "fresh Adam moments move the grad norm and the loss after the resume no more than a correct resume "
    "does (grad-norm z 0.3 vs 0.4 on resume-fixed); when the generator plants a visible fault, drop this"))
def test_fires_on_the_generated_optimizer_reset_at_the_resume(sample, manifest):
    [f] = of(sample("optimizer-reset"), NAME)
    assert f.step == planted_step(manifest("optimizer-reset"), NAME)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if FAULTS.get(s) != NAME])
def test_silent_on_the_other_generated_runs(sample, scenario):
    assert of(sample(scenario), NAME) == []
