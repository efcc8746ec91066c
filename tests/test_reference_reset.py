"""The reference-reset detector on logs with real-world statistics (tests/synthetic.py): it must catch
every reset it can see and stay quiet on healthy resumes, whatever the KL's scale, noise or cadence."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.model import Boundary, Series
from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage
from klwatch.reference_reset import ReferenceResetConfig, judge_boundary
from synthetic import KLRun, segments_for


def judge(run: KLRun, seed: int = 0, config: ScanConfig = ScanConfig(), **kw):
    rng = np.random.default_rng(seed)
    lineages = build_lineages(segments_for(run, rng, **kw), config=config)
    assert len(lineages) == 1
    return judge_lineage(lineages[0], config=config)


def random_run(rng: np.random.Generator, *, buggy: bool, every: int | None = None, mean_window: bool = False,
               early: bool = False) -> KLRun:
    """A run with real-world statistics. ``every``/``mean_window``: logging every L steps, as the step's
    KL or (TRL) the window's mean; ``early``: the first resume while the KL is still growing."""
    tau = float(rng.uniform(5, 60))
    if every is None:
        every = int(rng.choice([1, 1, 2, 5]))
    # a reset must stay visible for a couple of logged points: point samples see it for tau/L points;
    # a window mean already averages the regrowth, and real KL regrows over tens of steps
    tau = max(tau, (2 if mean_window else 4) * every)
    if early:
        first = max(3 * every, int(rng.uniform(0.7, 2.0) * tau))  # >= 3 logged points of the opening
    else:
        first = int(rng.uniform(3, 6) * tau)
    n = int(rng.integers(1, 4))
    resumes = [first + int(i * rng.uniform(2.5, 4) * tau) for i in range(n)]
    if rng.random() < 0.5:  # HF saves at save_steps, usually a multiple of logging_steps
        resumes = [max(every, r // every * every) for r in resumes]
    return KLRun(amplitude=float(10 ** rng.uniform(-4, 0)), tau=tau, noise=float(rng.uniform(0.03, 0.5)),
                 every=every, resumes=resumes, buggy=[buggy] * n, last_step=resumes[-1] + int(3 * tau),
                 outlier_rate=float(rng.choice([0.0, 0.02, 0.05])), mean_window=mean_window)


# How runs log their KL: every step or sampled every few steps (NeMo-RL, verl, older generators), TRL's
# window means every 5 or 10 steps, and each of them with the first resume a few steps into training.
# Each profile: the random_run options and the fewest resets of a buggy sweep that must be caught (per
# boundary). A reset can honestly stay inconclusive (buried in noise, a first window cut short, an opening
# of 3 logged points), so the catch rates are floors measured with margin; calling a reset ok never is.
LOGGING_PROFILES = {
    "every step or sampled every 1-5 steps": ({}, 0.9),
    "TRL means every 5 steps": ({"every": 5, "mean_window": True}, 0.9),
    "TRL means every 10 steps": ({"every": 10, "mean_window": True}, 0.85),
    "early resume, every step or sampled": ({"early": True}, 0.85),
    "early resume, TRL means every 5 steps": ({"early": True, "every": 5, "mean_window": True}, 0.75),
    "early resume, TRL means every 10 steps": ({"early": True, "every": 10, "mean_window": True}, 0.45),
}
SWEEP_RUNS = 150


@pytest.mark.parametrize("profile", LOGGING_PROFILES)
def test_no_false_alarm_on_healthy_resumes_across_scales_noise_and_cadence(profile):
    options, _ = LOGGING_PROFILES[profile]
    rng = np.random.default_rng(1)
    flagged = []
    for i in range(SWEEP_RUNS):
        run = random_run(rng, buggy=False, **options)
        result = judge(run, seed=i)
        if result.status == "reference_reset":
            flagged.append((run, [(v.boundary.step, v.score, v.kl_before, v.kl_after) for v in result.verdicts]))
    assert not flagged, flagged[:3]


@pytest.mark.parametrize("profile", LOGGING_PROFILES)
def test_catches_the_resets_of_a_ratchet_across_scales_noise_and_cadence_and_never_calls_one_ok(profile):
    options, min_caught = LOGGING_PROFILES[profile]
    rng = np.random.default_rng(2)
    verdicts, called_ok = [], []
    for i in range(SWEEP_RUNS):
        run = random_run(rng, buggy=True, **options)
        result = judge(run, seed=1000 + i)
        assert len(result.verdicts) == len(run.resumes), (run, [v.boundary.step for v in result.verdicts])
        verdicts += [v.verdict for v in result.verdicts]
        called_ok += [(run, v.boundary.step, round(v.score, 3)) for v in result.verdicts if v.verdict == "ok"]
    assert not called_ok, called_ok[:3]
    caught = verdicts.count("reference_reset") / len(verdicts)
    assert caught >= min_caught, (caught, verdicts.count("inconclusive"), len(verdicts))


def test_ratchet_of_three_resets_flags_each_boundary():
    run = KLRun(amplitude=0.05, tau=12, noise=0.2, every=1, resumes=[40, 70, 100], buggy=[True] * 3, last_step=130)
    result = judge(run)
    assert result.status == "reference_reset"
    assert [v.boundary.step for v in result.verdicts] == [41, 71, 101]
    assert all(v.verdict == "reference_reset" and v.score > 0.9 for v in result.verdicts)


def test_only_the_buggy_resume_of_a_mixed_run_is_flagged():
    run = KLRun(amplitude=0.02, tau=10, noise=0.15, every=1, resumes=[40, 80], buggy=[False, True], last_step=120)
    verdicts = {v.boundary.step: v.verdict for v in judge(run).verdicts}
    assert verdicts == {41: "ok", 81: "reference_reset"}


def test_kl_zero_for_the_whole_run_is_kl_disabled_not_a_reset():
    run = KLRun(amplitude=0.0, tau=10, noise=0.1, every=1, resumes=[40], buggy=[True], last_step=80)
    assert judge(run).status == "kl_disabled"


def test_resume_before_kl_has_grown_is_inconclusive():
    run = KLRun(amplitude=0.05, tau=30, noise=0.1, every=1, resumes=[3], buggy=[True], last_step=120)
    result = judge(run)
    assert [v.verdict for v in result.verdicts] == ["inconclusive"]
    assert result.status == "inconclusive"  # not ok: nothing says the resume was healthy


def test_reset_declared_in_config_is_intentional():
    run = KLRun(amplitude=0.05, tau=10, noise=0.1, every=1, resumes=[50], buggy=[True], last_step=90)
    rng = np.random.default_rng(0)
    segs = segments_for(run, rng)
    for s in segs:
        s.config = {"loss_fn": {"reference_reset_interval": 50}}
    result = judge_lineage(build_lineages(segs, config=ScanConfig())[0], config=ScanConfig())
    assert result.status == "intentional"
    assert result.verdicts[0].verdict == "intentional"
    assert "reference_reset_interval" in result.verdicts[0].explanation


def test_reset_declared_on_the_command_line_is_intentional():
    run = KLRun(amplitude=0.05, tau=10, noise=0.1, every=1, resumes=[50], buggy=[True], last_step=90)
    result = judge(run, config=ScanConfig(intentional_resets=(51,)))
    assert result.status == "intentional"


def test_single_outlier_near_zero_right_after_a_resume_is_not_a_reset():
    steps_b = np.arange(1, 61)
    before = Series(steps_b, 0.03 * np.ones(60) * np.exp(np.random.default_rng(0).normal(0, 0.1, 60)))
    after_vals = 0.03 * np.ones(20)
    after_vals[0] = 1e-6
    after = Series(np.arange(61, 81), after_vals)
    v = judge_boundary(Boundary(61, 60, ["new_tracker_run"], 1), before, after, start=None, scale=0.03)
    assert v.verdict != "reference_reset"


def test_one_point_after_the_resume_is_not_enough_for_a_verdict():
    before = Series(np.arange(1, 61), np.full(60, 0.03))
    after = Series(np.array([61]), np.array([0.0]))
    v = judge_boundary(Boundary(61, 60, ["new_tracker_run"], 1), before, after, start=None, scale=0.03)
    assert v.verdict == "inconclusive" and v.score > 0.5


def test_exact_zero_after_a_resume_reads_as_penalty_switched_off():
    before = Series(np.arange(1, 61), np.full(60, 0.03))
    after = Series(np.arange(61, 81), np.zeros(20))
    v = judge_boundary(Boundary(61, 60, ["new_tracker_run"], 1), before, after, start=None, scale=0.03)
    assert v.verdict == "inconclusive" and "switched off" in v.explanation


def test_negated_kl_reward_metric_is_judged_as_kl():
    run = KLRun(amplitude=0.05, tau=10, noise=0.1, every=1, resumes=[50], buggy=[True], last_step=90)
    rng = np.random.default_rng(0)
    segs = segments_for(run, rng, metric="ppo_actor/kl_rewards/avg")
    for s in segs:
        s.series["ppo_actor/kl_rewards/avg"].values *= -1
    result = judge_lineage(build_lineages(segs, config=ScanConfig())[0], config=ScanConfig())
    assert result.metric == "ppo_actor/kl_rewards/avg"
    assert result.status == "reference_reset"


@pytest.mark.parametrize("threshold", [0.5, 0.9, 0.99])
def test_scores_stay_in_unit_interval_and_threshold_orders_verdicts(threshold):
    run = KLRun(amplitude=0.05, tau=10, noise=0.3, every=1, resumes=[50, 100], buggy=[True, False], last_step=140)
    cfg = ScanConfig(reference_reset=ReferenceResetConfig(reset_score=threshold))
    result = judge(run, config=cfg)
    for v in result.verdicts:
        assert 0.0 <= v.score <= 1.0
        if v.verdict == "reference_reset":
            assert v.score >= threshold


def test_student_t_density_matches_scipy():
    from scipy import stats

    from klwatch.stats import t_logpdf

    x = np.linspace(-20, 20, 41)
    assert np.allclose(t_logpdf(x, 3.0, 1.5, 0.7), stats.t.logpdf(x, 3.0, loc=1.5, scale=0.7))


def _kl(steps: range, values: list[float]) -> Series:
    return Series(np.array(list(steps)), np.array(values, dtype=float), np.arange(len(values), dtype=float))


def test_an_early_resume_whose_first_kl_is_far_above_the_runs_first_is_a_continuation():
    """Logged every step from the first, the KL of a step is measured in that step's loss: the first step of a
    run, and the first after a reset, see the policy equal to the reference, whatever speed the KL regrows at.
    A first point after an early resume far above the run's own first one is no reset (NeMo-RL corpus shape)."""
    before = _kl(range(1, 4), [0.0, 0.058, 0.039])
    after = _kl(range(4, 10), [0.169, 0.204, 0.131, 0.221, 0.17, 0.139])
    v = judge_boundary(Boundary(4, 3, ["new_tracker_run"], 1), before, after, start=before, scale=0.19)
    assert v.verdict == "ok", v.explanation


def test_an_early_reset_that_retraces_the_opening_is_never_called_a_continuation():
    before = _kl(range(1, 5), [0.0, 0.058, 0.039, 0.169])
    after = _kl(range(5, 11), [0.0, 0.06, 0.045, 0.17, 0.2, 0.14])
    v = judge_boundary(Boundary(5, 4, ["new_tracker_run"], 1), before, after, start=before, scale=0.19)
    assert v.verdict != "ok", v.explanation
