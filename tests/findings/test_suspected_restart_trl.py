"""``suspected_restart`` on TRL-GRPO-shaped runs: quiet through the natural regime changes of healthy
runs (issue 10, class 6: it raised 5 alarms on 4 healthy real TRL runs), loud on an unlogged
restart that rebuilt the reference or lost the weights."""

from __future__ import annotations

import numpy as np
import pytest
from finding_helpers import alarms, of
from hypothesis import given, settings
from hypothesis import strategies as st
from trl_like import TrlRun, healthy_variant, judge_trl

from klwatch.findings import DETECTORS
from klwatch.findings.suspected_restart import family_of
from klwatch.metrics import GRAD_NORM, LOSS, find_metrics, kl_candidates

NAME = "suspected_restart"


STYLES = ("trl", "trl-wandb", "verl")


def _assert_quiet(run: TrlRun, *, style: str = "trl") -> None:
    result = judge_trl(run, style=style)
    assert of(result, NAME) == [], [f.message for f in of(result, NAME)]
    assert alarms(result) & set(DETECTORS) == set(), [f.message for f in result.findings]


# ------------------------------------------------------------------------- healthy: quiet


@pytest.mark.parametrize("seed", range(40))
def test_healthy_trl_runs_of_every_shape_raise_no_finding(seed):
    """Drawn shapes: logging every 1, 5 or 10 steps, 4-16 generations, 1-8 prompts, one to three reward
    functions, KL on or off, clipping on or off, abrupt or slow learning, lengths hitting the max,
    saturation, entropy collapse, grad-norm spikes; keys as TRL writes them to MLflow/TensorBoard or
    W&B, or as verl names the same quantities (with its timers)."""
    _assert_quiet(healthy_variant(seed), style=STYLES[seed % 3])


@settings(max_examples=40)
@given(seed=st.integers(0, 2**31 - 1), logging_steps=st.sampled_from([1, 5, 10]),
       learn_at=st.floats(0.15, 0.85), learn_width=st.sampled_from([1.0, 2.0, 5.0, 20.0, 60.0]),
       hit_max_at=st.one_of(st.none(), st.floats(0.15, 0.9)), hit_max_width=st.sampled_from([1.0, 2.0, 8.0]),
       saturate=st.booleans(), entropy_collapse_at=st.one_of(st.none(), st.floats(0.15, 0.9)),
       beta=st.sampled_from([0.0, 0.04]), num_iterations=st.sampled_from([1, 2]),
       group=st.sampled_from([(4, 1), (8, 2), (8, 4), (16, 8)]),
       reward_fns=st.sampled_from([("format",), ("accuracy",), ("format", "accuracy"), ("length",),
                                   ("format", "accuracy", "length")]))
def test_no_natural_regime_change_of_a_healthy_trl_run_is_a_suspected_restart(
        seed, logging_steps, learn_at, learn_width, hit_max_at, hit_max_width, saturate, entropy_collapse_at,
        beta, num_iterations, group, reward_fns):
    run = TrlRun(seed=seed, steps=30 * logging_steps if logging_steps > 1 else 200, logging_steps=logging_steps,
                 num_generations=group[0], prompts_per_step=group[1], beta=beta, num_iterations=num_iterations,
                 reward_fns=reward_fns, learn_at=learn_at, learn_width=learn_width, hit_max_at=hit_max_at,
                 hit_max_width=hit_max_width, saturate=saturate, entropy_collapse_at=entropy_collapse_at)
    assert of(judge_trl(run), NAME) == []


def test_completions_hitting_the_max_length_while_the_format_reward_falls_back_is_not_a_restart():
    """Every ``completions/*`` key and the clipped ratio jump at once and the format reward (which needs
    the closing tag) drops back toward its opening: the lengths move *away* from their opening."""
    for seed in range(5):
        _assert_quiet(TrlRun(seed=seed, reward_fns=("format",), learn_at=0.2, learn_width=3.0, hit_max_at=0.6,
                             hit_max_width=1.0))


def test_rewards_saturating_with_their_spread_and_zero_spread_fraction_is_not_a_restart():
    """``reward``, ``reward_std`` and ``frac_reward_zero_std`` are one family: they move together."""
    for seed in range(5):
        _assert_quiet(TrlRun(seed=seed, prompts_per_step=1, num_generations=4, reward_fns=("accuracy",),
                             learn_at=0.4, learn_width=2.0, saturate=True, hit_max_at=None))


def test_sudden_learning_with_an_entropy_collapse_is_not_a_restart():
    """Reward up, entropy down, lengths up, all at one step: state moves, but away from the opening."""
    for seed in range(5):
        _assert_quiet(TrlRun(seed=seed, learn_at=0.5, learn_width=1.0, entropy_collapse_at=0.5,
                             hit_max_at=0.5, hit_max_width=1.0))


def test_rare_successes_logged_as_fractions_near_zero_are_not_shifts():
    """One success in 32 completions moves a [0, 1] fraction by one quantum; on a log scale it looked like
    a jump. Read linearly, with one quantum as the floor, it is noise."""
    for seed in range(5):
        _assert_quiet(TrlRun(seed=seed, reward_fns=("accuracy",), learn_at=0.9, learn_width=40.0,
                             num_iterations=2, hit_max_at=None))


@pytest.mark.parametrize("logging_steps", [5, 10])
def test_window_averaged_sparse_logging_of_a_healthy_run_is_quiet(logging_steps):
    for seed in range(5):
        _assert_quiet(TrlRun(seed=seed, steps=60 * logging_steps, logging_steps=logging_steps, learn_width=5.0,
                             hit_max_at=0.7, hit_max_width=2.0, saturate=True))


# ------------------------------------------------------------------------- faulty: loud


@pytest.mark.parametrize("logging_steps", [1, 5])
def test_reference_rebuilt_at_an_unlogged_restart_of_a_trl_run_is_suspected_at_its_step(logging_steps):
    caught = 0
    for seed in range(10):
        steps = 300 if logging_steps == 1 else 60 * logging_steps
        at = int(0.55 * steps) + 1
        result = judge_trl(TrlRun(seed=seed, steps=steps, logging_steps=logging_steps, learn_at=0.25,
                                  learn_width=10.0 * logging_steps, hit_max_at=None, reference_at=at))
        found = of(result, NAME)
        assert all(abs(f.step - at) <= 2 * logging_steps for f in found), [f.message for f in found]
        caught += any(f.data["kl_collapse"] for f in found)
    assert caught >= 8


@pytest.mark.parametrize("seed", range(5))
def test_every_unlogged_rebuild_of_a_reference_ratcheting_every_few_steps_is_suspected(seed):
    """What the real-TRL corpus shows when the resumes are not logged: ``kl`` is exactly 0.0 at the first
    step against each rebuilt reference (the policy *is* the reference), then regrows for a few steps."""
    result = judge_trl(TrlRun(seed=seed, steps=50, reference_every=10, hit_max_at=None, grad_spikes=0))
    assert [f.step for f in of(result, NAME)] == [11, 21, 31, 41]
    assert all(f.data["kl_collapse"] for f in of(result, NAME))


@pytest.mark.parametrize(("logging_steps", "beta"), [(1, 0.0), (5, 0.0), (10, 0.0), (1, 0.04)])
def test_weights_lost_at_an_unlogged_restart_of_a_trl_run_is_suspected_at_its_step(logging_steps, beta):
    """TRL's default ``beta=0`` logs no KL: the restart shows only as reward and entropy (and the lengths)
    going back to where the run started."""
    caught = 0
    for seed in range(10):
        steps = 300 if logging_steps == 1 else 60 * logging_steps
        at = int(0.55 * steps) + 1
        result = judge_trl(TrlRun(seed=seed, steps=steps, logging_steps=logging_steps, beta=beta, learn_at=0.25,
                                  learn_width=10.0 * logging_steps, hit_max_at=None, weights_lost_at=at))
        found = of(result, NAME)
        assert all(abs(f.step - at) <= 2 * logging_steps for f in found), [f.message for f in found]
        caught += bool(found)
    assert caught >= 7


# ------------------------------------------------------------------------- families


def _family(name: str, names: list[str]) -> tuple[str, bool]:
    kl = set(kl_candidates(names))
    return family_of(name=name, kl=kl, loss=set(find_metrics(names, family=LOSS)) - kl,
                     grad_norm=set(find_metrics(names, family=GRAD_NORM)))


TRL_KEYS = ["kl", "loss", "grad_norm", "learning_rate", "entropy", "reward", "reward_std", "rewards/format/mean",
            "rewards/format/std", "frac_reward_zero_std", "completions/mean_length", "completions/min_length",
            "completions/max_length", "completions/clipped_ratio", "completions/mean_terminated_length",
            "clip_ratio/region_mean", "clip_ratio/low_mean", "num_tokens"]


@pytest.mark.parametrize("prefix", ["", "train/"])
def test_trl_keys_fall_into_families_with_only_state_series_counting_as_state(prefix):
    names = [prefix + k for k in TRL_KEYS]
    fam = {k: _family(prefix + k, names) for k in TRL_KEYS}
    assert {k for k, (f, _) in fam.items() if f == "completions"} == {k for k in TRL_KEYS if k.startswith("completions/")}
    assert {k for k, (f, _) in fam.items() if f == "reward"} == {
        "reward", "reward_std", "rewards/format/mean", "rewards/format/std", "frac_reward_zero_std"}
    assert {k for k, (_, state) in fam.items() if state} == {
        "kl", "loss", "grad_norm", "entropy", "reward", "rewards/format/mean"}
    assert fam["clip_ratio/region_mean"][0] == fam["clip_ratio/low_mean"][0] == "clip_ratio"


def test_trl_profiling_timers_are_one_family_though_their_names_hold_dots():
    names = ["profiling/Time taken: GRPOTrainer._prepare_inputs", "profiling/Time taken: GRPOTrainer.transformers.generate",
             "profiling/Time taken: GRPOTrainer.compute_loss", "step_time"]
    assert {_family(n, names) for n in names[:3]} == {("profiling", False)}
    assert _family("step_time", names) == ("step_time", False)


def test_verl_keys_under_one_logger_namespace_keep_their_own_families():
    names = ["actor/kl_loss", "actor/entropy", "actor/pg_loss", "actor/grad_norm", "critic/score/mean",
             "critic/score/max", "response_length/mean", "response_length/clip_ratio", "timing_s/gen"]
    fam = {n: _family(n, names) for n in names}
    assert fam["actor/kl_loss"] == ("kl", True) and fam["actor/entropy"] == ("entropy", True)
    assert fam["actor/pg_loss"] == ("loss", True) and fam["actor/grad_norm"] == ("grad_norm", True)
    assert fam["critic/score/mean"] == ("reward", True) and fam["critic/score/max"] == ("reward", False)
    assert fam["response_length/mean"][0] == fam["response_length/clip_ratio"][0] == "response_length"
    assert not fam["timing_s/gen"][1]


def test_a_statistic_standardised_by_its_own_spread_rarely_reaches_the_threshold_on_noise():
    """On white noise the statistic's own robust spread is its unit, so ``min_z`` is a true
    many-sigma threshold, not ~4 sigma as in per-point noise units."""
    from klwatch.findings.suspected_restart import SuspectedRestart
    from klwatch.model import Series

    det = SuspectedRestart()
    rng = np.random.default_rng(0)
    peak = []
    for _ in range(50):
        s = Series(np.arange(1, 301), 120 + rng.normal(0, 3, 300), None)
        sig = det._signal(s=s, family="completions", state=False)
        peak.append(float(np.max(np.abs(det._statistic(x=sig.x)) / sig.scale)))
    assert max(peak) < det.config.min_z


def test_the_reviewers_trl_shaped_healthy_run_raises_no_suspicion():
    """Design review e6: completions reach the max length at step 150 (four lengths and the clipped
    ratio jump), and at step 220 ``reward_std`` and ``frac_reward_zero_std`` move together; the old
    detector raised 3 warnings here, one of them on a near-zero fraction's noise (step 87)."""
    from klwatch.model import Segment, Series
    from klwatch.pipeline import ScanConfig, build_lineages, judge_lineage

    rng = np.random.default_rng(6)
    n = 300
    s = np.arange(1, n + 1)
    wall = 1_700_000_000.0 + s * 10.0
    kl = 0.02 * (1 - np.exp(-s / 40)) * np.exp(rng.normal(0, 0.1, n))
    regime = s >= 150
    values = {
        "completions/mean_length": np.where(regime, 250, 120) + rng.normal(0, 3, n),
        "completions/max_length": np.where(regime, 256, 200) + rng.normal(0, 2, n),
        "completions/min_length": np.where(regime, 200, 40) + rng.normal(0, 3, n),
        "completions/mean_terminated_length": np.where(regime, 240, 118) + rng.normal(0, 3, n),
        "completions/clipped_ratio": np.clip(np.where(regime, 0.6, 0.02) + rng.normal(0, 0.01, n), 0, 1),
        "frac_reward_zero_std": np.clip(np.where(s >= 220, 0.5, 0.1) + rng.normal(0, 0.02, n), 0, 1),
    }
    series = {"kl": Series(s, kl, wall), "loss": Series(s, 0.02 * kl + rng.normal(0, 1e-4, n), wall),
              "reward": Series(s, 0.5 + 0.3 * (1 - np.exp(-s / 80)) + rng.normal(0, 0.03, n), wall),
              **{k: Series(s, v, wall) for k, v in values.items()},
              "reward_std": Series(s, np.where(s >= 220, 0.1, 0.3) + rng.normal(0, 0.01, n), wall)}
    seg = Segment(kind="mlflow", ref="r", source="src", run_id="r", name="trl", store="/d/m", series=series)
    [lineage] = build_lineages([seg], config=ScanConfig())
    assert of(judge_lineage(lineage, config=ScanConfig()), NAME) == []
