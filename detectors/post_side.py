"""Post-side evidence: a reset seen only after the resume, the launch before it absent from the logs.

verl's ``file`` logger reopens its JSONL with ``"wb"`` at every launch, so the file holds the last launch
alone, starting at the resumed step; an export or a cleaned-up tracker can keep only the later launch too.
No boundary is in such logs, but the bug still shows: the frameworks compute the logged KL (and a preference
trainer's implicit rewards) inside the step's loss, before the update, so a launch whose reference was
rebuilt from the weights it resumed with logs the value of a policy equal to its reference, 0, at its first
step, then regrows. A healthy launch that starts past the run's first step logs its KL where it was, many
updates away from the base model: never ~0, never 100x under its own level.

This is a signal the detectors read (``late_opening``); they report what it finds as a verdict at the
launch's first step, saying the earlier side was not in the logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Series

STARTS_PAST_FIRST_STEP = "starts_past_first_step"
"""The evidence of a boundary read from the launch after it alone: its logs start past the run's first step."""


@dataclass(frozen=True)
class PostSideConfig:
    """When a launch starts past the first step, and what its opening must look like to be a reset."""

    min_first_step: int = 5
    """A launch whose first logged step is at least this (a run logs from step 0 or 1, or 1 logging interval
    in) started past the run's first step."""
    floor_fraction: float = 0.01
    """The first point is at the floor when under this share of the launch's level ..."""
    next_fraction: float = 0.2
    """... and of the next point. Not 1%: PPO-style trainers (verl, NeMo-RL, our sample loop) take several
    mini-batch updates per step and log the step's mean, so the first step after a reset averages a KL of 0
    (the first mini-batch) with those after one or more updates: small, a few times under the next step's."""
    floor_absolute: float = 1e-9
    regrowth_points: int = 2
    """Points after the first that must be off the floor and under the launch's later level."""
    min_points: int = 8
    """Points the launch needs: its later level must be readable."""


@dataclass(frozen=True)
class LateOpening:
    """A launch that opens at the floor past the run's first step and regrows."""

    first_step: int
    value: float
    next_value: float
    level: float

    def describe(self, quantity: str) -> str:
        return (f"The logs start at step {self.first_step} with {quantity} at {self.value:.3g}, the value of a policy "
                f"equal to its reference, then {self.next_value:.3g} and regrowing to {self.level:.3g}; a launch that "
                "starts this far into a run resumed from a checkpoint, and one whose reference was the base model "
                "would have logged its KL where it was. The launch before it is not in the logs")


def _may_start_late(first: Series, config: PostSideConfig) -> bool:
    """Whether the first finite points sit where ``late_opening`` looks (past the run's first steps, then the
    next step): read off the head of the series, so a watched run's poll does not copy its whole KL to learn
    that its logs start at step 1."""
    for head in (64, len(first)):
        at = np.flatnonzero(np.isfinite(first.values[:head]))
        if len(at) >= 2 or head >= len(first):
            break
    if len(at) < 2:
        return False
    step = int(first.steps[at[0]])
    return step >= max(config.min_first_step, 3) and int(first.steps[at[1]]) == step + 1


def late_opening(first: Series, *, cadence: int, config: PostSideConfig = PostSideConfig()) -> LateOpening | None:
    """The reset a launch's own opening shows, or None. ``first`` is the judged series (KL or margin) of the
    earliest piece in the logs; ``cadence`` its logging interval (only a point of a single step can sit at
    the floor: a window mean of a regrowth does not)."""
    if cadence != 1 or not _may_start_late(first, config):
        return None
    s = first.take(np.isfinite(first.values))
    if len(s) < config.min_points:
        return None
    steps, vals = s.steps, np.abs(s.values)
    first_step = int(steps[0])
    if first_step < max(config.min_first_step, 2 * cadence + 1) or steps[1] != first_step + 1:
        return None
    level = float(np.percentile(vals, 90))
    nxt = vals[1:1 + config.regrowth_points]
    tol = max(config.floor_absolute, min(config.floor_fraction * level, config.next_fraction * float(nxt[0])))
    if vals[0] > tol or np.any(nxt <= config.floor_absolute) or np.any(nxt >= level):
        return None
    # and regrowing: the launch's later points stand well above its first steps
    if float(np.median(vals[-config.min_points // 2:])) < 2.0 * float(np.max(nxt)):
        return None
    return LateOpening(first_step, float(s.values[0]), float(s.values[1]), level)
