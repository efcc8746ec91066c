"""The snapshot mark: a first point at the estimator's floor right after the checkpoint, then the opening
retraced, decides early resumes the regrowth statistic leaves open; nothing else earns it."""

from __future__ import annotations

import numpy as np
import pytest

from klwatch.model import Boundary, Lineage, Series
from klwatch.reference_reset import ReferenceResetDetector
from klwatch.snapshot_mark import snapshot_mark


def opening_kl(k: np.ndarray, *, tau: float) -> np.ndarray:
    """A k3 KL k steps into a run (or after a reset): exactly 0 at k = 1, where the loss is computed before the
    first update with the policy equal to its reference, then growing (slowly: a long run's opening)."""
    return 0.9 * (1 - np.exp(-(k - 1.0) / tau))


def early_run(*, resume: int, buggy: bool, seed: int, last: int = 600, tau: float = 300.0,
              noise: float = 0.15) -> Lineage:
    rng = np.random.default_rng(seed)
    steps = np.arange(1, last + 1)
    k = steps - (resume if buggy else 0) * (steps > resume)
    kl = opening_kl(k.astype(float), tau=tau) * np.exp(rng.normal(0, noise, len(steps)))
    pieces = [{"kl": Series(steps[:resume], kl[:resume])}, {"kl": Series(steps[resume:], kl[resume:])}]
    return Lineage(id="r", name="r", segments=[], pieces=pieces, piece_segments=[0, 1], kl_metric="kl",
                   boundaries=[Boundary(step=resume + 1, resumed_from_step=resume, evidence=["checkpoint"], piece_index=1)])


@pytest.mark.parametrize("seed", range(8))
def test_an_early_buggy_resume_is_a_reset_and_a_healthy_one_is_not(seed):
    resume = 30 + 5 * seed  # 5-12% of the run, while the KL is still near its opening level
    buggy = ReferenceResetDetector().judge(early_run(resume=resume, buggy=True, seed=seed))
    healthy = ReferenceResetDetector().judge(early_run(resume=resume, buggy=False, seed=seed))
    assert buggy.status == "reference_reset"
    assert healthy.status != "reference_reset"


def _mark(pre: list[float], post: list[float], *, opening: list[float] | None = None, first_post: int = 11):
    before = Series(np.arange(first_post - len(pre), first_post), np.array(pre))
    after = Series(np.arange(first_post, first_post + len(post)), np.array(post))
    start = Series(np.arange(1, len(opening) + 1), np.array(opening)) if opening is not None else before
    return snapshot_mark(before, after, reset_step=first_post - 1, opening=start)


OPENING = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09]


def test_the_floor_then_the_opening_retraced_is_the_mark():
    mark = _mark(OPENING, [0.0, 0.011, 0.019], opening=OPENING)
    assert mark is not None and mark.reset_step == 10 and mark.first_step == 11


def test_a_kl_that_stays_at_zero_is_a_penalty_switched_off_not_the_mark():
    assert _mark(OPENING, [0.0, 0.0, 0.0], opening=OPENING) is None


def test_a_zero_that_returns_at_once_to_the_level_is_a_dropout_not_the_mark():
    assert _mark(OPENING, [0.0, 0.09, 0.1], opening=OPENING) is None


def test_a_regrowth_far_faster_or_slower_than_the_opening_is_not_the_mark():
    assert _mark(OPENING, [0.0, 0.08, 0.085], opening=OPENING) is None  # 8x the opening at offset 2
    assert _mark(OPENING, [0.0, 0.001, 0.002], opening=OPENING) is None  # 10x slower


def test_a_kl_that_had_not_left_zero_gives_no_mark():
    assert _mark([0.0, 0.0, 0.0001, 0.0, 0.0], [0.0, 0.01, 0.02], opening=OPENING) is None


def test_a_first_point_after_a_skipped_step_gives_no_mark():
    # the first logged point is not the first step after the checkpoint: a window mean, not the floor
    before = Series(np.arange(1, 11), np.array(OPENING))
    after = Series(np.array([13, 14, 15]), np.array([0.0, 0.01, 0.02]))
    assert snapshot_mark(before, after, reset_step=10, opening=before) is None


def test_no_opening_in_the_logs_gives_no_mark():
    before = Series(np.arange(1, 11), np.array(OPENING))
    after = Series(np.arange(11, 14), np.array([0.0, 0.01, 0.02]))
    assert snapshot_mark(before, after, reset_step=10, opening=None) is None
