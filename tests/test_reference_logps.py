"""The reference's own log-probs (logps - rewards / beta) across a resume: kept, rebuilt, or left open.

The runs are built from how TRL's DPOTrainer logs a batch: the policy's mean log-probs of the chosen and
rejected answers drift as it trains, the reference's stay where the base model has them (only the batch's
answers vary), and the rewards are beta times the difference. A reference rebuilt from the resumed weights has
the policy's log-probs at the checkpoint from then on. Logged every 3 steps as window means, early in a run:
the case the margin's regrowth statistic cannot decide.
"""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.model import Boundary, Lineage, Segment, Series
from klwatch.preference_reset import PreferenceResetDetector
from klwatch.reference_logps import reference_logprobs, reference_shift

BETA = 0.1


def logged(*, resume: int, last: int, rebuilt: bool, seed: int, every: int = 3, spread: float = 0.3,
           drift: float = 0.8) -> list[dict[str, Series]]:
    """Two launches' window means of logps/rewards for both answers; the policy's chosen log-probs rise by
    ``drift`` nats a step from -14, the rejected fall by as much from -14."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, last + 1)
    pieces: list[dict[str, Series]] = [{}, {}]
    for answer, sign in (("chosen", 1.0), ("rejected", -1.0)):
        batch = rng.normal(0, spread, len(steps))  # the batch's answers: the same for policy and reference
        policy = -14.0 + sign * drift * np.sqrt(steps - 1.0) * 3 + batch
        reference = -14.0 + batch
        if rebuilt:
            reference = np.where(steps > resume, policy[resume - 1] - batch[resume - 1] + batch, reference)
        reward = BETA * (policy - reference)
        for k, keep in enumerate((steps <= resume, steps > resume)):
            s = steps[keep]
            ends = s[s % every == 0]
            mean = lambda v: np.array([v[keep][(s > e - every) & (s <= e)].mean() for e in ends])  # noqa: E731
            pieces[k][f"train/logps/{answer}"] = Series(ends, mean(policy))
            pieces[k][f"train/rewards/{answer}"] = Series(ends, mean(reward))
    return pieces


def sides(pieces, answer: str, metric: str) -> tuple[Series, Series]:
    return pieces[0][f"train/{metric}/{answer}"], pieces[1][f"train/{metric}/{answer}"]


def shift(pieces, *, beta: float | None = BETA):
    answers = ("chosen", "rejected")
    return reference_shift({a: sides(pieces, a, "logps") for a in answers},
                           {a: sides(pieces, a, "rewards") for a in answers}, beta=beta)


def test_the_reference_logprobs_are_logps_minus_rewards_over_beta():
    logps, rewards = Series(np.array([1, 2, 3]), np.array([-10.0, -9.0, -8.0])), Series(np.array([2, 3]), np.array([0.1, 0.2]))
    ref = reference_logprobs(logps, rewards, beta=0.1)
    assert ref.steps.tolist() == [2, 3] and np.allclose(ref.values, [-10.0, -10.0])


@pytest.mark.parametrize("seed", range(6))
def test_a_kept_reference_reads_kept_and_a_rebuilt_one_rebuilt(seed):
    assert shift(logged(resume=9, last=18, rebuilt=False, seed=seed)).reading == "kept"
    assert shift(logged(resume=9, last=18, rebuilt=True, seed=seed)).reading == "rebuilt"


def test_no_beta_no_reading():
    assert shift(logged(resume=9, last=18, rebuilt=True, seed=0), beta=None) is None


def test_a_spread_as_wide_as_the_distance_leaves_it_open():
    """Very early, the policy has moved less than the batches' answers vary: nothing can be read."""
    assert shift(logged(resume=3, last=12, rebuilt=True, seed=0, every=1, spread=2.0, drift=0.2)) is None


def test_halfway_is_neither():
    pieces = logged(resume=9, last=18, rebuilt=False, seed=1)
    for answer in ("chosen", "rejected"):
        lp, rw = pieces[1][f"train/logps/{answer}"], pieces[1][f"train/rewards/{answer}"]
        pre_ref = reference_logprobs(pieces[0][f"train/logps/{answer}"], pieces[0][f"train/rewards/{answer}"], beta=BETA)
        half = (float(pieces[0][f"train/logps/{answer}"].values[-1]) - float(np.median(pre_ref.values))) / 2
        pieces[1][f"train/rewards/{answer}"] = Series(rw.steps, rw.values - BETA * half)
        assert lp is pieces[1][f"train/logps/{answer}"]
    assert shift(pieces) is None


def dpo_lineage(pieces, *, config: dict) -> Lineage:
    for p in pieces:  # the margin, as TRL logs it
        p["train/rewards/margins"] = Series(p["train/rewards/chosen"].steps,
                                            p["train/rewards/chosen"].values - p["train/rewards/rejected"].values)
    step = int(pieces[1]["train/rewards/chosen"].steps[0])
    segs = [Segment(kind="tensorboard", ref=f"events.{k}", source=".", config=config) for k in range(2)]
    return Lineage(id="dpo", name="dpo", segments=segs, pieces=pieces, piece_segments=[0, 1], config=config,
                   boundaries=[Boundary(step=step, resumed_from_step=9, evidence=["new_event_file", "checkpoint"],
                                        piece_index=1)])


@pytest.mark.parametrize("seed", range(4))
def test_the_detector_decides_an_early_sparse_resume_from_the_reference_logprobs(seed):
    for rebuilt, want in ((False, "ok"), (True, "reference_reset")):
        lin = dpo_lineage(logged(resume=9, last=18, rebuilt=rebuilt, seed=seed), config={"beta": BETA})
        result = PreferenceResetDetector().judge(lin)
        assert [v.verdict for v in result.verdicts] == [want], result.verdicts
        assert "reference's log-probs" in result.verdicts[0].explanation


def test_a_declared_reference_sync_or_two_betas_leave_the_logprobs_unread():
    for config in ({"beta": BETA, "sync_ref_model": True, "ref_model_sync_steps": 9, "ref_model_mixup_alpha": 1.0},
                   {"beta": "0.1"}):
        lin = dpo_lineage(logged(resume=9, last=18, rebuilt=False, seed=0), config=config)
        if "sync_ref_model" not in config:
            lin.segments[1].config = {"beta": 0.2}
        assert PreferenceResetDetector()._reference_shift(PreferenceResetDetector().with_margin(lin),
                                                          lin.boundaries[0]) is None
