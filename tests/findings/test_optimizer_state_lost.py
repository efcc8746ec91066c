from __future__ import annotations

import json

import numpy as np
import pytest
from finding_helpers import FAULTS, SCENARIOS, judge, odd_processes, odd_results, of, planted_step
from hypothesis import HealthCheck, given, settings

from klwatch.findings.optimizer_state_lost import OptimizerStateLost, OptimizerStateLostConfig

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


def adam_policy_steps(*, seed: int, lose_moments: bool, restart_schedule: str | None = None, log_lr: bool = True,
                      steps: int = 300, resume: int = 200, lr: float = 0.05, warmup: int = 20):
    """A real Adam on the noisy regression with a warm-up + cosine LR schedule, resumed after ``resume``
    steps with its moments lost or restored, and its scheduler restored, re-created (``"warmup"``: back
    through warm-up) or replaced by a constant peak LR (``"no-warmup"``). Logs the LR and the KL between
    the model's predictive distributions (Gaussian, the data's noise) before and after each update, on
    that update's minibatch: the approx-KL between old and new policy that RL frameworks log."""
    rng = np.random.default_rng(seed)
    dim, n, noise = 50, 4000, 0.5
    w_true = rng.normal(size=dim)
    x_all = rng.normal(size=(n, dim))
    y_all = x_all @ w_true + noise * rng.normal(size=n)
    w, m, v, t = np.zeros(dim), np.zeros(dim), np.zeros(dim), 0

    def schedule(s: int) -> float:
        if s < warmup:
            return lr * (s + 1) / warmup
        return lr * (0.1 + 0.45 * (1 + np.cos(np.pi * (s - warmup) / (steps - warmup))))

    start, logs = 0, []
    for step in range(1, steps + 1):
        if step == resume + 1 and lose_moments:
            m, v, t = np.zeros(dim), np.zeros(dim), 0
        if step == resume + 1 and restart_schedule == "warmup":
            start = resume
        a = lr if restart_schedule == "no-warmup" and step > resume else schedule(step - 1 - start)
        idx = rng.integers(0, n, 32)
        g = 2 * x_all[idx].T @ (x_all[idx] @ w - y_all[idx]) / len(idx)
        t += 1
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        dw = -a * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        w = w + dw
        logs.append((step, a, float(np.mean((x_all[idx] @ dw) ** 2) / (2 * noise**2))))
    arr = np.array(logs)
    procs = []
    for lo, hi in ((1, resume), (resume + 1, steps)):
        sel = (arr[:, 0] >= lo) & (arr[:, 0] <= hi)
        proc = {"actor/ppo_kl": (arr[sel, 0], arr[sel, 2])}
        if log_lr:
            proc["actor/lr"] = (arr[sel, 0], arr[sel, 1])
        procs.append(proc)
    return procs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fresh_adam_moments_show_as_a_policy_step_far_beyond_the_runs_own(seed):
    [f] = of(judge(adam_policy_steps(seed=seed, lose_moments=True), seed=seed), NAME)
    assert f.severity == "error" and f.step == 201
    [s] = f.data["spikes"]
    assert s["metric"] == "actor/ppo_kl" and s["lr_corrected"] and s["z"] > s["null_max"] and s["fold"] > 2
    assert "actor/lr accounted for" in f.message


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("schedule", ["warmup", "no-warmup"])
def test_a_restarted_lr_schedule_with_the_moments_restored_is_not_blamed_on_the_optimizer(seed, schedule):
    """A re-created scheduler changes the LR (down into warm-up, or up to the peak), not Adam's
    normalised step: the approx-KL per unit of LR² carries on."""
    procs = adam_policy_steps(seed=seed, lose_moments=False, restart_schedule=schedule)
    assert of(judge(procs, seed=seed), NAME) == []


@pytest.mark.parametrize("seed", range(4))
def test_restored_moments_with_the_lr_logged_or_not_are_silent(seed):
    assert of(judge(adam_policy_steps(seed=seed, lose_moments=False), seed=seed), NAME) == []
    assert of(judge(adam_policy_steps(seed=seed, lose_moments=False, log_lr=False), seed=seed), NAME) == []


def test_without_a_logged_lr_a_step_spike_alone_is_only_a_warning():
    [f] = of(judge(adam_policy_steps(seed=1, lose_moments=True, log_lr=False), seed=1), NAME)
    assert f.severity == "warning" and f.step == 201 and "LR is not logged" in f.message
    assert not f.data["spikes"][0]["lr_corrected"]


def noisy_step_run(*, seed: int, spike_at: int | None, spike: float = 30.0, lr_after: float = 1e-3,
                   metric: str = "policy/approxkl_avg", clip: bool = False, scale: float = 0.4):
    """Heavy-tailed approx-KL (Student-t in log space, ``scale`` its spread) or a clip fraction (a
    binomial count of clipped tokens out of 4096, rate heavy-tailed too) with a constant logged LR,
    ``lr_after`` after the resume; an optional rise lasting three steps; two processes split at 150."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 301)
    level = np.exp(scale * rng.standard_t(3, len(steps)))
    if spike_at is not None:
        level[(steps >= spike_at) & (steps < spike_at + 3)] *= spike
    values = rng.binomial(4096, np.clip(0.004 * level, 0, 1)) / 4096 if clip else 2e-4 * level
    lr = np.where(steps <= 150, 1e-3, lr_after)
    proc = lambda sel: {metric: (steps[sel], values[sel]), "train/lr": (steps[sel], lr[sel])}  # noqa: E731
    return judge([proc(steps <= 150), proc(steps > 150)], seed=seed)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("clip", [False, True])
def test_heavy_tailed_step_sizes_with_spikes_away_from_the_resume_are_silent(seed, clip):
    metric = "policy/clipfrac_avg" if clip else "policy/approxkl_avg"
    assert of(noisy_step_run(seed=seed, spike_at=None, metric=metric, clip=clip), NAME) == []
    assert of(noisy_step_run(seed=seed, spike_at=80, metric=metric, clip=clip), NAME) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_clip_fraction_spike_at_the_resume_with_the_lr_unchanged_is_an_error(seed):
    [f] = of(noisy_step_run(seed=seed, spike_at=151, metric="actor/pg_clipfrac", clip=True, scale=0.25), NAME)
    assert f.severity == "error" and f.step == 151 and "train/lr did not rise" in f.message
    assert [s["metric"] for s in f.data["spikes"]] == ["actor/pg_clipfrac"]


@pytest.mark.parametrize("seed", range(4))
def test_a_clip_fraction_spike_where_the_lr_rose_is_left_to_the_lr(seed):
    """A clip fraction is not corrected for the LR: when the LR itself rose at the resume, a larger
    step is what the LR should do, and the LR-schedule detector speaks for it."""
    run = noisy_step_run(seed=seed, spike_at=151, metric="actor/pg_clipfrac", clip=True, scale=0.25, lr_after=3e-3)
    assert of(run, NAME) == []


@pytest.mark.parametrize("seed", range(4))
def test_an_approx_kl_spike_at_the_resume_beyond_what_the_lr_explains_is_an_error(seed):
    """A 300-fold approx-KL where the LR rose 3-fold is still 33-fold per unit of LR²."""
    [f] = of(noisy_step_run(seed=seed, spike_at=151, spike=300.0, scale=0.25, lr_after=3e-3), NAME)
    assert f.severity == "error" and f.data["spikes"][0]["lr_corrected"] and f.data["lr_rose"]


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


def test_fires_on_the_generated_optimizer_reset_at_the_resume(sample, manifest):
    """The generator re-creates Adam at the resume (fresh moments, nothing else touched): grad norm and
    loss stay within their noise, but the first step after the resume moves the policy ~10x further."""
    [f] = of(sample("optimizer-reset"), NAME)
    assert f.step == planted_step(manifest("optimizer-reset"), NAME)
    assert f.severity == "error" and "train/approxkl" in f.message and "not a restarted LR schedule" in f.message
    [s] = [s for s in f.data["spikes"] if s["metric"] == "train/approxkl"]
    assert s["lr_corrected"] and s["peak_step"] == f.step and s["fold"] > 4 and s["z"] > 3 * s["null_max"]


def test_the_generated_optimizer_reset_stands_far_above_a_healthy_resume(sample):
    """The same statistic, every threshold off, at the healthy resume of the same run and seed."""
    probe = OptimizerStateLost(config=OptimizerStateLostConfig(
        min_z=-np.inf, null_margin=-np.inf, min_step_fold=0.0, alone_min_z=-np.inf, alone_margin=-np.inf))

    def z(name: str) -> float:
        [f] = probe.detect(sample(name))
        return next(s["z"] for s in f.data["spikes"] if s["metric"] == "train/approxkl")

    fixed, lost = z("resume-fixed"), z("optimizer-reset")
    assert fixed < OptimizerStateLostConfig().min_z < 3 * OptimizerStateLostConfig().min_z < lost


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if FAULTS.get(s) != NAME])
def test_silent_on_the_other_generated_runs(sample, scenario):
    assert of(sample(scenario), NAME) == []


_ODD_NAMES = ["actor/ppo_kl", "policy/clipfrac_avg", "actor/lr", "train/grad_norm", "train/loss"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_processes(_ODD_NAMES, processes=(2, 3), constant=1e-4))
def test_never_fails_on_odd_step_size_series(procs):
    for result in odd_results(procs):
        for f in OptimizerStateLost().detect(result):
            json.dumps(f.data, allow_nan=False)