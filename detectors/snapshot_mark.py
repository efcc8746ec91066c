"""The snapshot mark: the strongest trace a reference rebuilt from the resumed weights leaves.

Frameworks compute the logged KL (TRL ``compute_loss``, NeMo-RL's loss function, verl's ``update_policy``)
and the implicit rewards of DPO-style trainers (``beta * (log pi - log pi_ref)``) inside the step's loss,
before the step's update. At the first step after a buggy resume the policy *is* the reference, so the
logged value is the estimator's value at equality: 0 (within float noise) for the k1/k3/MSE estimators
and for the implicit rewards and their margin. A healthy resume cannot log it: the policy carried on
from the checkpoint is many updates away from the base model. So when the resume is logged at the very
first step after the checkpoint, a value at that floor where the run had clearly left it, followed by a
regrowth that retraces the run's own opening, is a reset even where the regrowth statistic cannot tell
yet (an early resume, before the KL has grown far above its opening level).

This is a signal the detectors read (``snapshot_mark``), not a detector: the KL detector and the
preference detector consult it for a boundary their statistic leaves ``inconclusive``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Series
from .progress import retraced_points


@dataclass(frozen=True)
class SnapshotMarkConfig:
    """How exact the floor must be and how closely the regrowth must retrace the opening."""

    floor_fraction: float = 0.01
    """The first point after the resume is at the floor when under this share of the level before."""
    floor_absolute: float = 1e-9
    """... and never needs to be smaller than this (an exact 0 in float arithmetic)."""
    clear_points: int = 10
    """The last points before the resume (this many, or the later half of them, at least ``min_points``)
    must all lie above the floor: the run had left it (a clamped estimator, KTO's, touching 0 now and then never
    qualifies)."""
    min_points: int = 3
    clear_factor: float = 10.0
    """... by this factor over the floor tolerance, so a KL flickering at ~0 never qualifies."""
    regrowth_points: int = 2
    """Points after the first that must show the regrowth: off the floor, the first of them under
    ``low_fraction`` of the level before and all under it (a dropout returns to the level at once)."""
    low_fraction: float = 0.5
    progress_band: float = 2.0
    """A regrowth that reaches the level at once is still one when each point lies within this factor of the
    opening at the same progress in learning-rate units (``klwatch.progress``)."""
    retrace_factor: float = 4.0
    """No regrowth point lies this factor below the run's opening at the same offset (where the opening has
    left the floor). Faster is allowed: a reset inside a warm-up regrows at the lr it reached, the opening
    at the warm-up's first."""


@dataclass(frozen=True)
class SnapshotMark:
    """The mark found at a resume: the value at the floor, the level it fell from, the reset step."""

    value: float
    level: float
    reset_step: int
    first_step: int

    def describe(self, quantity: str) -> str:
        return (f"{quantity} was {self.value:.3g} at step {self.first_step}, the first step after the checkpoint "
                f"of step {self.reset_step}, down from {self.level:.3g}: the value a policy equal to its reference "
                "gives, and it regrows from there along the run's own opening")


def _finite(s: Series) -> Series:
    return s.take(np.isfinite(s.values))


def _opening_at(opening: Series, offsets: np.ndarray) -> np.ndarray:
    """The opening's value ``k`` steps into the run (its steps taken as offsets from step 0)."""
    steps = opening.steps.astype(float)
    order = np.argsort(steps, kind="stable")
    return np.interp(offsets, steps[order], np.abs(opening.values[order]))


def snapshot_mark(before: Series, after: Series, *, reset_step: int | None, opening: Series | None,
                  lr: Series | None = None, config: SnapshotMarkConfig = SnapshotMarkConfig()) -> SnapshotMark | None:
    """The snapshot mark at a resume, or None. ``before``/``after`` are the judged series (a KL, or a
    preference margin) on each side; ``reset_step`` the checkpoint's step (else the last logged step
    before); ``opening`` the run's opening, logged from its first steps (None: no mark can be read);
    ``lr`` the run's learning rate (``klwatch.progress.run_lr``), which can explain a regrowth faster than
    the opening's (a reset late in a warm-up regrows at the rate the warm-up reached)."""
    pre, post = _finite(before), _finite(after)
    if opening is None or len(pre) < config.min_points or len(post) < 1 + config.regrowth_points:
        return None
    r = int(reset_step) if reset_step is not None else int(pre.steps[-1])
    first_step = int(post.steps[0])
    if first_step != r + 1 or int(post.steps[1]) != first_step + 1 or int(pre.steps[-1]) - int(pre.steps[-2]) != 1:
        return None  # not logged every step at the first step after the checkpoint: a window mean, no mark
    # the run's own opening (its first step is at the floor too) is not in the window: at most half of it
    recent = np.abs(pre.values[-min(config.clear_points, max(config.min_points, len(pre) // 2)):])
    level = float(np.median(recent[-config.min_points:]))
    tol = max(config.floor_absolute, config.floor_fraction * level)
    first = float(post.values[0])
    if abs(first) > tol or np.any(recent <= config.clear_factor * tol):
        return None
    rest = post.take(slice(1, 1 + config.regrowth_points))
    grown, top = np.abs(rest.values), float(np.max(recent[-config.min_points:]))  # a growing KL's level: its last
    if np.any(grown <= config.floor_absolute):
        return None  # stays at zero (a penalty switched off)
    if (np.any(grown >= top) or grown[0] >= config.low_fraction * top) and not (
            lr is not None and retraced_points(opening, post.take(slice(0, 1 + config.regrowth_points)), lr=lr,
                                               reset_step=r, band=float(np.log(config.progress_band))) >= 1):
        return None  # returns at once (a dropout), unless the learning rate explains a regrowth that fast
    # off the floor again, at least as fast as the run's own opening at the same offsets (a regrowth still
    # under the floor tolerance, as a warm-up's is, must match its opening there: the same small values)
    expected = _opening_at(_finite(opening), (rest.steps - r).astype(float))
    if np.any(grown < expected / config.retrace_factor) or np.any((grown <= tol) & (expected > tol)):
        return None
    return SnapshotMark(first, level, r, first_step)


def off_the_floor(before: Series, after: Series, *, reset_step: int | None, opening: Series | None,
                  config: SnapshotMarkConfig = SnapshotMarkConfig()) -> str | None:
    """The converse of the mark, in words, or None: where the run's own first step shows the estimator at
    its floor when policy equals reference, and the resume is logged at the very first step after a
    checkpoint whose step the logs name (``reset_step``, never a guess: a tracker that drops re-logged
    steps would hide an older one), a value there at half the level before or more cannot come from a
    reference rebuilt at that checkpoint."""
    pre, post = _finite(before), _finite(after)
    start = _finite(opening) if opening is not None else None
    if reset_step is None or start is None or not len(start) or int(start.steps[0]) > 1:
        return None  # the run's own first step is not in the logs: the floor is unknown
    if len(pre) < config.min_points or len(post) < 2:
        return None
    first_step = int(post.steps[0])
    if first_step != int(reset_step) + 1 or int(post.steps[1]) != first_step + 1 \
            or int(pre.steps[-1]) - int(pre.steps[-2]) != 1:
        return None  # not logged every step at the first step after the checkpoint: a window mean
    recent = np.abs(pre.values[-min(config.clear_points, max(config.min_points, len(pre) // 2)):])
    level = float(np.median(recent[-config.min_points:]))
    tol = max(config.floor_absolute, config.floor_fraction * level)
    floor, first = float(start.values[0]), float(post.values[0])
    if abs(floor) > tol or np.any(recent <= config.clear_factor * tol) or abs(first) < config.low_fraction * level:
        return None
    return (f"{first:.3g} at step {first_step}, the first step after the checkpoint of step {reset_step}, where a reference "
            f"rebuilt from those weights gives the floor the run's own first step shows ({floor:.3g} at step "
            f"{int(start.steps[0])})")
