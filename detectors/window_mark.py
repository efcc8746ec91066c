"""The window mark: the snapshot mark as a run that logs every L > 1 steps shows it.

Trainers that log every ``logging_steps`` log the *mean* of the steps since their last log (TRL clears
its metric buffers at each log, and a new launch starts with empty ones). After a buggy resume the first
logged point therefore averages the steps of a regrowth from the floor, offsets 1..L after the
checkpoint: the same offsets the run's own first logged point averaged. The exact 0 of the snapshot mark
is gone, but the first window falls back to the opening's band, far below where the KL had grown, and
the next windows climb again (``../shared/FRAMEWORKS.md``: "With sparse logging the first logged point is
a mean over the steps since the last log: small, not 0").

Four readings, any one enough:

- a *deep fall*: the first window lies far under where the KL had grown (a third of it at most) and the
  next climbs without returning to it at once;
- a *retrace*: the first windows after the checkpoint repeat the run's own first windows, one for one,
  within the run's noise, while the KL before the resume had clearly left them. This is the mark of a
  resume so early that the regrowth reaches the old level within a window or two. Read from the checkpoint
  the logs name, else from the last log before the resume or a step between it and the first after;
- *at the floor*: the first window is at the estimator's value for a policy equal to its reference (0), where
  the KL had left it: a mean is there only when each of its steps is, so the window held just the first step
  after a checkpoint one step before it (a checkpoint between two logs); the next windows retrace the opening
  from there;
- *re-logged*: a launch that crashed after its checkpoint logged on past it, and the resumed launch re-logs
  those steps far under the values logged there the first time (a correct resume re-logs them about where
  they were: the same checkpoint, the same data).

This decides a boundary the statistic leaves ``inconclusive`` early in a run, where too few points
precede the resume to measure a level against the run's typical KL. A healthy resume continues the
KL (or dips and recovers); a dropout returns at once; a penalty switched off stays at 0. The fall must
also exceed the run's own step-to-step noise, measured before the resume, or after it when too few
points precede it.

A signal the KL and preference detectors read through ``marked``, not a detector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .model import Series, logging_interval, steps_between
from .progress import opening_on_regrowth, retraced_points
from .stats import diff_noise, theil_sen_slope

LAUNCH_EVIDENCE = ("new_tracker_run", "new_event_file", "step_rewind", "duplicate_steps", "runtime_reset",
                   "checkpoint", "model_from_checkpoint")
"""Evidence of a new process: only a new launch starts its logging windows afresh (a pause inside one
process, an evaluation, keeps averaging into the same window)."""


@dataclass(frozen=True)
class WindowMarkConfig:
    """How far the KL must have grown, how deep the first window must fall and how the next must climb."""

    grown_factor: float = 2.5
    """Deep fall: the level before the resume is at least this many times the run's first logged point (the
    KL had left its opening band, so a fall back into it is visible) ..."""
    drop_fraction: float = 0.35
    """... and the first window after the checkpoint lies under this share of it, and under every one of the
    last ``level_points`` points before (a healthy dip of a third does not qualify)."""
    return_fraction: float = 0.8
    """Deep fall: the next window climbs but stays under this share of the level (a dropout returns at once;
    a regrowth of an early resume may reach it a few windows on, as the opening did) ..."""
    next_sigmas: float = 2.0
    """... and, where the run's noise is measured, this many of its SDs under the level."""
    left_factor: float = 1.5
    """Both readings: every point of the level before lies at least this many times the first logged point."""
    level_points: int = 3
    """The last points before (never the run's first) the first window must lie under, each left the opening."""
    fit_points: int = 8
    """The level before: a line through this many last points (never the run's first), read at the last."""
    retrace_points: int = 3
    """Retrace: this many first windows after the checkpoint (as many as the opening has, at least two) ..."""
    retrace_band: float = 1.5
    """... each within this factor of the run's opening at the same progress (``klwatch.progress``: the same
    offsets at a constant learning rate), or ``retrace_sigmas`` of the run's noise if wider; the first
    under ``retrace_fraction`` of the level."""
    retrace_sigmas: float = 2.5
    retrace_fraction: float = 0.6
    relogged_fraction: float = 0.6
    """Re-logged: the first window, and the first windows' geometric mean, under this share of what the launch
    before logged at the same steps (each of them under it)."""
    noise_points: int = 6
    """Points (before the resume, else after its regrowth) whose step-to-step noise the fall must exceed
    ``drop_sigmas`` times (log space), so a noisy KL's low outlier is not a mark. The retrace needs it."""
    noise_window: int = 30
    drop_sigmas: float = 4.0
    regrowth_points: int = 2
    """Windows after the first that must not fall below it (a penalty switched off stays at 0)."""
    between_points: int = 3
    """Checkpoints weighed from the last log before the resume to the step before the first after it, where no
    checkpoint folder names one (a ``save_steps`` that is not a multiple of ``logging_steps``), as the KL statistic
    weighs them."""
    floor_fraction: float = 1e-3
    """A first window at the estimator's floor (policy equal to reference): under this share of the level (float
    noise of a bf16 forward; a regrowth's first full window is far above it) ..."""
    floor_absolute: float = 1e-9
    """... and of this (an exact 0 in float arithmetic). Only a window of the one step after the checkpoint can
    be there: a mean is at the floor only when each of its steps is."""


@dataclass(frozen=True)
class WindowMark:
    """The mark found at a resume: the first window's value, the level it fell from, the run's first point."""

    value: float
    level: float
    opening_first: float
    reset_step: int
    first_step: int
    cadence: int
    retraced: int = 0
    """How many first windows repeated the run's own (0: read otherwise)."""
    relogged: int = 0
    """How many first windows lay far under the same steps as the launch before logged them (0: not read so)."""
    floored: bool = False
    """The first window was at the estimator's floor: it held only the step after the checkpoint."""

    def describe(self, quantity: str) -> str:
        if self.floored:
            return (f"{quantity} was {self.value:.3g} at step {self.first_step}, the first step after the checkpoint "
                    f"of step {self.reset_step} (its logging window held that step alone), down from {self.level:.3g}: "
                    "the value a policy equal to its reference gives, and the next window(s) regrow along the run's "
                    "own opening")
        how = (f"and the next {self.retraced - 1} window(s) repeat the run's own first ones" if self.retraced else
               f"far under what the launch before logged at the same {self.relogged} steps before it crashed"
               if self.relogged else "and it climbs again from there")
        return (f"{quantity} averaged {self.value:.3g} over the first logging window after the checkpoint of step "
                f"{self.reset_step} (logged at step {self.first_step}, every {self.cadence} steps), down from "
                f"{self.level:.3g}, back in the band of the run's own first window ({self.opening_first:.3g}), "
                f"{how}: a regrowth from a policy equal to its reference")


def _finite(s: Series) -> Series:
    return s.take(np.isfinite(s.values))


def _before_window(pre: Series, post: Series, cadence: int) -> Series | None:
    """The points logged before the first post point (a crashed launch may have logged past its checkpoint;
    the resumed one re-logs those steps), when that point's window lies wholly after the last of them."""
    kept = pre.take(pre.steps < post.steps[0])
    return kept if len(kept) >= 2 and 1 <= int(post.steps[0]) - int(kept.steps[-1]) <= cadence else None


def _reached(pre: Series, points: int) -> float:
    """Where the KL had got to at the resume: a Theil-Sen line in log space through the last ``points``
    points (never the run's first), read at the last, so a growing opening's level is its last value and
    one outlier among them moves it little."""
    recent = pre.take(slice(-min(points, len(pre) - 1), None))
    x, y = recent.steps.astype(float), np.log(np.clip(recent.values, 1e-300, None))
    slope = theil_sen_slope(x, y)
    return float(np.exp(np.median(y - slope * x) + slope * x[-1]))


def _noise_windows(pre: Series, post: Series, config: WindowMarkConfig) -> tuple[np.ndarray, np.ndarray]:
    """The points the run's noise is read from: the last before the resume, and those after its regrowth."""
    start = 1 + config.regrowth_points
    return pre.values[-config.noise_window:], post.values[start:start + config.noise_window]


def _noise(pre: Series, post: Series, config: WindowMarkConfig) -> float | None:
    """The run's step-to-step noise in log space: from the points before the resume, else from the points
    after its regrowth (too few before to measure it), else None."""
    for values in _noise_windows(pre, post, config):
        if len(values) >= config.noise_points and np.all(values > 0):
            return diff_noise(np.log(values))
    return None


def _crosses_zero(pre: Series, post: Series, config: WindowMarkConfig) -> bool:
    """Whether the windows the run's noise is read from reach 0 or under: a noisy DPO margin around 0, whose
    step-to-step noise cannot be measured in log space and is as large as its level, so a low first window is one
    more draw of it."""
    return any(bool(np.any(values <= 0)) for values in _noise_windows(pre, post, config))


def _deep_fall(level: float, recent: np.ndarray, origin: float, post: np.ndarray, sigma: float | None,
               config: WindowMarkConfig) -> bool:
    """The first window far under the level, the next climbing but still clearly under it: two windows of
    evidence, so one low outlier (the next window back at the level) never reads as a fall."""
    first, nxt = float(post[0]), float(post[1])
    under = 1.0 if sigma is None else min(1.0, float(np.exp(-config.next_sigmas * sigma)))
    ceiling = config.return_fraction * level * under
    return (level > config.grown_factor * origin and abs(first) < config.drop_fraction * level
            and first < float(np.min(recent)) and first < nxt < ceiling)


def _floored(post: Series, *, level: float, config: WindowMarkConfig) -> bool:
    """Whether the first window after the checkpoint is at the estimator's floor, where a policy equal to its
    reference puts it: then it held only the first step after a checkpoint one step before it."""
    return abs(float(post.values[0])) <= max(config.floor_absolute, config.floor_fraction * level)


def _retraced(start: Series, post: Series, *, level: float, sigma: float | None, lr: Series | None,
              resets: Sequence[int], config: WindowMarkConfig) -> tuple[int, int] | None:
    """How many first windows after the checkpoint repeat the run's own opening at the same progress (the same
    offsets when the learning rate is not logged or constant) and the checkpoint's step they retrace from, None
    when they do not: a reference taken at the checkpoint makes the KL climb the opening's curve again, at the pace
    the learning rate sets. A first window at the floor is the strongest mark: it dates the checkpoint (the step
    before it), and one more window on the curve from there does."""
    m = min(config.retrace_points, len(post))
    band = max(float(np.log(config.retrace_band)), config.retrace_sigmas * (sigma or 0.0))
    first_step = int(post.steps[0])
    if m >= 2 and _floored(post, level=level, config=config):
        seen = retraced_points(start, post.take(slice(0, m)), lr=lr, reset_step=first_step - 1, band=band)
        if seen >= 1:
            return 1 + seen, first_step - 1
    if sigma is None or m < 2 or not 0 < float(post.values[0]) < config.retrace_fraction * level:
        return None  # a first window under 0, or not clearly down, is not on the curve
    for r in resets:
        seen = retraced_points(start, post.take(slice(0, m)), lr=lr, reset_step=r, band=band)
        if seen >= 2:
            return seen, r
        # only the first window is within the opening's reach (a regrowth faster than it): the opening's own
        # windows must then lie on the regrowth's curve, all of them it reaches, two at least
        if seen == 1 and opening_on_regrowth(start, post.take(slice(0, m)), lr=lr, reset_step=r, band=band) >= 2:
            return 2, r
    return None


def _between(last: int, first: int, *, fall: float, sigma: float | None, cadence: int,
             config: WindowMarkConfig) -> list[int]:
    """Checkpoints after the last log before the resume and before the first after it that the retrace may
    start from when no checkpoint folder names one: those from which the first window, cut short to the steps
    after them (noisier by sqrt(L / k)), still fell by ``drop_sigmas`` of the run's noise."""
    if sigma is None:
        return []
    return [r for r in steps_between(last, first - 1, config.between_points)
            if r != last and fall >= config.drop_sigmas * sigma * float(np.sqrt(cadence / (first - r)))]


def _under_relogged(pre: Series, post: Series, *, sigma: float | None, short: float, config: WindowMarkConfig) -> int:
    """How many first windows after the resume lie far under what the launch before logged at the very same steps
    (it ran on past its checkpoint before it crashed, and the resumed launch re-logs those steps): a correct resume
    re-logs them about where they were, a rebuilt reference from ~0. The first under ``relogged_fraction`` of its
    twin by ``drop_sigmas`` of the run's noise, each under its twin and all of them, as a geometric mean, under
    ``relogged_fraction`` (the regrowth closes in on the crashed launch's values window by window), and the windows
    after the first clearly under theirs too; 0 when fewer than two pairs say so."""
    crashed = {int(s): float(v) for s, v in zip(pre.steps, pre.values) if s >= post.steps[0]}
    m = min(config.retrace_points, len(post))
    pairs = np.array([(float(v), crashed[int(s)]) for s, v in zip(post.steps[:m], post.values[:m])
                      if int(s) in crashed]).reshape(-1, 2)
    if sigma is None or len(pairs) < 2 or not np.all((pairs[:, 0] > 0) & (pairs[:, 0] < pairs[:, 1])) or \
            pairs[0, 0] >= config.relogged_fraction * pairs[0, 1] or \
            float(np.mean(np.log(pairs[:, 0] / pairs[:, 1]))) >= float(np.log(config.relogged_fraction)):
        return 0
    if float(np.log(pairs[0][1] / pairs[0][0])) < config.drop_sigmas * sigma * short:
        return 0
    # two windows of evidence, as for a deep fall: the later pairs, together, under their twins by more than the
    # noise of a mean of differences of two points (sigma * sqrt(2 / n)), so a dip with one low first window
    # (its window cut short by a checkpoint no folder names, noisier than its twin) never reads as a regrowth
    later = np.log(pairs[1:, 0] / pairs[1:, 1])
    return len(pairs) if float(np.mean(later)) <= -config.next_sigmas * sigma * float(np.sqrt(2.0 / len(later))) else 0


def window_mark(before: Series, after: Series, *, reset_step: int | None, opening: Series | None,
                evidence: Sequence[str], lr: Series | None = None,
                config: WindowMarkConfig = WindowMarkConfig()) -> WindowMark | None:
    """The window mark at a resume, or None. ``before``/``after`` are the judged series (a KL or a preference
    margin) on each side; ``reset_step`` the checkpoint's step when the logs name it (``named_reset_step``; else
    the last logged step before, where trainers that save at multiples of their logging interval save);
    ``opening`` the run's first logged points, from its first window; ``evidence`` the boundary's; ``lr`` the
    learning rate the run applied (``klwatch.progress.run_lr``), if logged."""
    if not any(e in LAUNCH_EVIDENCE for e in evidence):
        return None
    pre, post = _finite(before), _finite(after)
    start = _finite(opening if opening is not None else before)  # two points of an opening are one too
    if len(pre) < 2 or len(post) < 1 + config.regrowth_points or len(start) < 2:
        return None
    cadence = logging_interval([start, pre, post])
    kept = _before_window(pre, post, cadence) if cadence >= 2 and int(start.steps[0]) <= cadence else None
    if kept is None:
        return None  # logged every step (the snapshot mark's case), or the first windows are not in the logs
    level, recent = _reached(kept, config.fit_points), kept.values[-min(config.level_points, len(kept) - 1):]
    origin, first, rest = float(start.values[0]), float(post.values[0]), post.values[1:1 + config.regrowth_points]
    if origin < 0 or np.any(recent <= config.left_factor * origin) or not np.all(rest >= first):
        return None  # the KL had not left its opening band, or stays down after the resume (a penalty off)
    sigma = _noise(kept, post, config)
    if _crosses_zero(kept, post, config):
        return None  # windows at or under 0 around the resume: the noise is as large as the level, no fall is told
    resets = [int(kept.steps[-1])] + ([int(reset_step)] if reset_step is not None
                                      and int(kept.steps[-1]) < reset_step < int(post.steps[0]) else [])
    # a first window cut short by a checkpoint between two logs averages fewer steps: noisier by sqrt(L / k)
    short = float(np.sqrt(cadence / max(1, min(cadence, int(post.steps[0]) - resets[-1]))))
    relogged = _under_relogged(pre, post, sigma=sigma, short=short, config=config)
    fall = float(np.log(level / first)) if first > 0 else float("inf")
    if not relogged and sigma is not None and fall < config.drop_sigmas * sigma * short:
        return None  # a fall within the run's own noise
    between = [] if reset_step is not None else _between(int(kept.steps[-1]), int(post.steps[0]), fall=fall,
                                                         sigma=sigma, cadence=cadence, config=config)
    found = _retraced(start, post, level=level, sigma=sigma, lr=lr, resets=resets + between, config=config)
    retraced, at = found or (0, resets[-1])
    if not relogged and not retraced and not _deep_fall(level, recent, origin, post.values, sigma, config):
        return None
    floored = bool(retraced) and at == int(post.steps[0]) - 1 and _floored(post, level=level, config=config)
    return WindowMark(first, level, origin, at, int(post.steps[0]), cadence, retraced, relogged, floored)
