"""The reference's own log-probs, read back from what a DPO-style trainer logs: a direct look at the reference.

TRL's ``DPOTrainer`` logs, per step, the batch means of the policy's log-probs of the chosen and rejected
answers (``logps/chosen``, ``logps/rejected``) and of their implicit rewards ``beta * (log pi - log pi_ref)``
(``rewards/chosen``, ``rewards/rejected``), both over the same answers. So the batch mean of the
reference's log-probs is ``logps - rewards / beta``, exactly, for window means (N-step logging) too: it is
linear. A frozen reference gives a series with no trend, only the batch-to-batch spread of the answers. A
reference rebuilt from the resumed weights moves it at once, and for good, to where the policy's log-probs
stood at the checkpoint: ``rewards / beta`` away, the whole distance the policy had travelled.

So where a resume has a few points on each side, the share of that distance the reference's log-probs
covered across it tells a kept reference (about 0) from a rebuilt one (about 1), without any model of how
fast the margin regrows, which an early resume or sparse logging leaves open. Read only where the distance is
far above the spread and both answers agree. This is a signal the preference detector reads
(``reference_shift``), not a detector.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .model import Series


@dataclass(frozen=True)
class ReferenceLogpsConfig:
    """How many points are read on each side and how clear the move must be."""

    points_before: int = 8
    """The reference's log-probs before the resume: its last this many points (at least ``min_points_before``)."""
    min_points_before: int = 3
    points_after: int = 3
    min_points_after: int = 2
    separation_sigmas: float = 5.0
    """The distance a rebuilt reference would move (the policy's log-probs at the checkpoint minus the
    reference's level) must exceed this many times the larger spread of the two sides' reference log-probs."""
    decided_fraction: float = 0.25
    """Kept when the reference log-probs moved less than this share of that distance, rebuilt when they
    moved within it of all of it; anything between is left undecided."""


@dataclass(frozen=True)
class SideShift:
    """One answer's reference log-probs across a resume."""

    answer: str
    level_before: float
    level_after: float
    policy_at_checkpoint: float
    spread: float

    @property
    def fraction(self) -> float:
        """The share of the way to the policy's log-probs the reference's covered (0 kept, 1 rebuilt)."""
        return (self.level_after - self.level_before) / (self.policy_at_checkpoint - self.level_before)


@dataclass(frozen=True)
class ReferenceShift:
    """What the reference log-probs say about one resume: ``kept`` or ``rebuilt``, and each answer's numbers."""

    reading: Literal["kept", "rebuilt"]
    sides: tuple[SideShift, ...]

    def describe(self) -> str:
        parts = [f"{s.answer} {s.level_before:.4g} before, {s.level_after:.4g} after (the policy's were "
                 f"{s.policy_at_checkpoint:.4g})" for s in self.sides]
        moved = "stayed where they were" if self.reading == "kept" else "jumped to the policy's own"
        return (f"the reference's log-probs (logps - rewards / beta, batch means) {moved} across the resume: "
                + "; ".join(parts))


def reference_logprobs(logps: Series, rewards: Series, *, beta: float) -> Series:
    """The reference's batch-mean log-probs, ``logps - rewards / beta``, on the steps both series log."""
    common, li, ri = np.intersect1d(logps.steps, rewards.steps, return_indices=True)
    values = logps.values[li] - rewards.values[ri] / beta
    keep = np.isfinite(values)
    return Series(common[keep], values[keep])


def _side(answer: str, logps: tuple[Series, Series], rewards: tuple[Series, Series], beta: float,
          config: ReferenceLogpsConfig) -> SideShift | None:
    pre = reference_logprobs(logps[0], rewards[0], beta=beta)
    post = reference_logprobs(logps[1], rewards[1], beta=beta)
    policy_pre = logps[0].take(np.isfinite(logps[0].values))
    if len(pre) < config.min_points_before or len(post) < config.min_points_after or not len(policy_pre):
        return None
    pre_v, post_v = pre.values[-config.points_before:], post.values[:config.points_after]
    spread = max(float(np.std(pre_v, ddof=1)), float(np.std(post_v, ddof=1)))
    return SideShift(answer, float(np.median(pre_v)), float(np.median(post_v)), float(policy_pre.values[-1]), spread)


def reference_shift(logps: Mapping[str, tuple[Series, Series]], rewards: Mapping[str, tuple[Series, Series]], *,
                    beta: float | None, config: ReferenceLogpsConfig = ReferenceLogpsConfig()) -> ReferenceShift | None:
    """Whether the reference was kept or rebuilt at a resume, read from each answer (``chosen``,
    ``rejected``) whose policy log-probs and rewards are logged on both sides (before, after); None when
    ``beta`` is unknown, no answer reads clearly, or the answers disagree."""
    if beta is None or not beta > 0:
        return None
    sides = [s for a in ("chosen", "rejected") if a in logps and a in rewards
             and (s := _side(a, logps[a], rewards[a], beta, config)) is not None]
    clear = [s for s in sides
             if abs(s.policy_at_checkpoint - s.level_before) > config.separation_sigmas * s.spread]
    if not clear or len(clear) < len(sides):
        return None  # an answer whose reference log-probs spread too widely to read leaves it open
    if all(abs(s.fraction) <= config.decided_fraction for s in clear):
        return ReferenceShift("kept", tuple(clear))
    if all(abs(s.fraction - 1.0) <= config.decided_fraction for s in clear):
        return ReferenceShift("rebuilt", tuple(clear))
    return None
