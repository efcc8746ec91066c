"""The preference-reference detector on DPO-style runs shaped as trainers log them.

The runs are built from the implicit-reward mechanics, not from any sample's numbers: a margin that grows
from 0 as the policy leaves its reference, chosen and rejected rewards that move apart, the sigmoid loss
log(1 + exp(-margin)) and an accuracy that rises from 0. A reference rebuilt from the resumed weights starts
all of them again from the values of a policy equal to its reference at the first step after the resume.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from klwatch.model import Boundary, Lineage, Series
from klwatch.preference_reset import (DERIVED_MARGIN, PreferenceResetDetector, equal_policy_loss, margin_of)

NAMES = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "loss")


def dpo_piece(steps: np.ndarray, ref_step: int, *, rng: np.random.Generator, amplitude: float = 3.0,
              tau: float = 25.0, noise: float = 0.1, every: int = 1) -> dict[str, Series]:
    """One launch's logged implicit rewards: the margin grows from 0 at ``ref_step + 1`` (the step whose loss
    is computed with the policy still equal to the reference); logged every ``every`` steps as window means."""
    k = steps - ref_step - 1.0
    margin = amplitude * (1 - np.exp(-k / tau)) * np.exp(rng.normal(0, noise, len(steps)))
    margin[k == 0] = 0.0
    chosen = -0.2 * margin
    rejected = chosen - margin
    acc = np.clip(margin / amplitude * 1.5, 0, 1) * (margin > 0)
    loss = np.log1p(np.exp(-margin))
    keep = steps % every == 0
    cols = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": margin,
            "rewards/accuracies": acc, "loss": loss}
    out = {}
    for name, v in cols.items():
        logged = [float(np.mean(v[(steps > s - every) & (steps <= s)])) for s in steps[keep]]
        out[name] = Series(steps[keep], np.array(logged))
    return out


def dpo_run(*, last: int = 120, resume: int = 60, buggy: bool, seed: int = 0, every: int = 1,
            config: dict | None = None, drop: tuple[str, ...] = ()) -> Lineage:
    rng = np.random.default_rng(seed)
    first = dpo_piece(np.arange(1, resume + 1), 0, rng=rng, every=every)
    second = dpo_piece(np.arange(resume + 1, last + 1), resume if buggy else 0, rng=rng, every=every)
    pieces = [{k: v for k, v in p.items() if k not in drop} for p in (first, second)]
    step = int(pieces[1]["loss"].steps[0])
    return Lineage(id="dpo", name="dpo", segments=[], pieces=pieces, piece_segments=[0, 1],
                   boundaries=[Boundary(step=step, resumed_from_step=resume, evidence=["new_tracker_run"], piece_index=1)],
                   config=dict(config or {"loss_type": "sigmoid", "beta": 0.1}))


@pytest.mark.parametrize("seed", range(5))
def test_a_reference_rebuilt_at_the_resume_is_caught_from_the_implicit_rewards(seed):
    result = PreferenceResetDetector().judge(dpo_run(buggy=True, seed=seed))
    assert result.status == "reference_reset"
    (v,) = result.verdicts
    assert v.verdict == "reference_reset" and v.boundary.step == 61
    assert "ln 2" in v.explanation and "accuracy 0" in v.explanation


@pytest.mark.parametrize("seed", range(5))
def test_a_margin_that_goes_on_across_the_resume_is_ok(seed):
    result = PreferenceResetDetector().judge(dpo_run(buggy=False, seed=seed))
    assert result.status == "ok" and [v.verdict for v in result.verdicts] == ["ok"]


def test_sparse_logging_catches_the_window_mean_after_a_reset_and_passes_a_correct_resume():
    assert PreferenceResetDetector().judge(dpo_run(buggy=True, every=5)).status == "reference_reset"
    assert PreferenceResetDetector().judge(dpo_run(buggy=False, every=5)).status == "ok"


def test_chosen_minus_rejected_is_the_margin_when_none_is_logged():
    lin = dpo_run(buggy=True, drop=("rewards/margins",))
    result = PreferenceResetDetector().judge(lin)
    assert result.metric == DERIVED_MARGIN and result.status == "reference_reset"
    derived = margin_of(lin.pieces[0], {"chosen": "rewards/chosen", "rejected": "rewards/rejected"})
    assert derived is not None and np.allclose(derived.values, lin.pieces[0]["rewards/chosen"].values
                                               - lin.pieces[0]["rewards/rejected"].values)


def _rewards_shifted(lin: Lineage, by: float) -> Lineage:
    """The same margin collapse after the resume, but both rewards moved far from 0 together: not what a policy
    equal to its reference logs."""
    after = lin.pieces[1]
    lin.pieces[1] = {**after, **{k: Series(after[k].steps, after[k].values + by) for k in ("rewards/chosen", "rewards/rejected")}}
    return lin


def test_a_margin_falling_while_chosen_and_rejected_stay_put_is_not_a_reset():
    (v,) = PreferenceResetDetector().judge(_rewards_shifted(dpo_run(buggy=True, every=5), -5.0)).verdicts
    assert v.verdict == "inconclusive" and "reward stayed at" in v.explanation


def _fast_regrowth(*, rejected_kept: bool = False) -> Lineage:
    """A buggy resume at step 30, logged every 10 steps, whose margin saturates within two windows (tau 4.5): the first
    window after the checkpoint averages a regrowth from 0 to about half the level, and the rewards with it; with
    ``rejected_kept``, the rejected reward's first window stays where it was before."""
    rng = np.random.default_rng(3)
    first = dpo_piece(np.arange(1, 31), 0, rng=rng, tau=4.5, every=10)
    second = dpo_piece(np.arange(31, 151), 30, rng=rng, tau=4.5, every=10)
    if rejected_kept:
        r = second["rewards/rejected"]
        second["rewards/rejected"] = Series(r.steps, np.r_[first["rewards/rejected"].values[-1], r.values[1:]])
    return Lineage(id="dpo", name="dpo", segments=[], pieces=[first, second], piece_segments=[0, 1],
                   boundaries=[Boundary(step=40, resumed_from_step=30, evidence=["new_tracker_run"], piece_index=1)],
                   config={"loss_type": "sigmoid", "beta": 0.1})


def test_window_means_of_rewards_falling_with_the_margin_are_a_reset_s_collapse():
    lin = _fast_regrowth()
    fell_to = lin.pieces[1]["rewards/margins"].values[0] / lin.pieces[0]["rewards/margins"].values[-1]
    assert 0.5 < fell_to < 0.6  # over the 1-step rule's share (0.5), as the rewards' are
    (v,) = PreferenceResetDetector().judge(lin).verdicts
    assert v.verdict == "reference_reset", v.explanation


def test_a_window_mean_reward_that_stayed_while_the_margin_fell_is_not_a_reset():
    (v,) = PreferenceResetDetector().judge(_fast_regrowth(rejected_kept=True)).verdicts
    assert v.verdict == "inconclusive" and "rejected reward stayed at" in v.explanation


def test_rewards_off_zero_at_the_first_step_after_the_checkpoint_rule_a_reset_out():
    # logged every step, the first step after the checkpoint is computed before its update: a reset logs 0 there
    (v,) = PreferenceResetDetector().judge(_rewards_shifted(dpo_run(buggy=True), -5.0)).verdicts
    assert v.verdict == "inconclusive" and "not 0" in v.explanation


def test_a_pause_inside_one_tracker_piece_is_confirmed_only_by_the_equal_policy_rewards():
    buggy, healthy = dpo_run(buggy=True), dpo_run(buggy=False)
    for lin in (buggy, healthy):
        lin.boundaries[0].tentative = True
    assert PreferenceResetDetector().confirms_reset(buggy, buggy.boundaries[0])
    assert not PreferenceResetDetector().confirms_reset(healthy, healthy.boundaries[0])
    sparse = dpo_run(buggy=True, every=5)  # a window mean is never the exact mark: no restart evidence, no boundary
    assert not PreferenceResetDetector().confirms_reset(sparse, sparse.boundaries[0])


def test_a_declared_reference_sync_is_intentional():
    config = {"loss_type": "sigmoid", "beta": 0.1, "sync_ref_model": True, "ref_model_sync_steps": 60,
              "ref_model_mixup_alpha": 1.0}
    result = PreferenceResetDetector().judge(dpo_run(buggy=True, config=config))
    assert result.status == "intentional"


@pytest.mark.parametrize(("config", "value", "said"), [
    ({}, math.log(2), "ln 2"),
    ({"loss_type": "sigmoid", "beta": 0.5, "label_smoothing": 0.1}, math.log(2), "ln 2"),
    ({"loss_type": ["ipo"], "beta": 0.1}, 25.0, "1/(4 beta^2)"),
    ({"loss_type": "hinge", "beta": 0.2}, 1.0, "1"),
])
def test_the_equal_policy_loss_follows_the_declared_loss(config, value, said):
    got = equal_policy_loss(config)
    assert got is not None and got[0] == pytest.approx(value) and got[1] == said


def test_a_loss_without_a_fixed_equal_policy_value_is_not_named():
    assert equal_policy_loss({"loss_type": ["sigmoid", "sft"], "beta": 0.1}) is None
    assert equal_policy_loss({"loss_type": "exo_pair", "beta": 0.1}) is None


def test_the_stream_gives_the_scans_verdict_at_the_third_point_after_the_resume():
    lin = dpo_run(buggy=True, seed=3)
    stream = PreferenceResetDetector().stream(config=lin.config)
    first, second = lin.pieces
    for i, step in enumerate(first["loss"].steps):
        assert stream.update(int(step), {f"train/{k}": float(first[k].values[i]) for k in NAMES}) is None
    stream.resume(resumed_from_step=60)
    got = [stream.update(int(step), {f"train/{k}": float(second[k].values[i]) for k in NAMES})
           for i, step in enumerate(second["loss"].steps[:3])]
    assert got[:2] == [None, None] and got[2] is not None and got[2].verdict == "reference_reset"
    assert got[2].verdict == PreferenceResetDetector().judge(lin).verdicts[0].verdict


def test_the_stream_stays_silent_on_a_correct_resume():
    lin = dpo_run(buggy=False, seed=3)
    stream = PreferenceResetDetector().stream(config=lin.config)
    for k, piece in enumerate(lin.pieces):
        if k:
            stream.resume(resumed_from_step=60)
        for i, step in enumerate(piece["loss"].steps):
            stream.update(int(step), {k2: float(piece[k2].values[i]) for k2 in NAMES})
    assert [v.verdict for v in stream.verdicts] == ["ok"]
